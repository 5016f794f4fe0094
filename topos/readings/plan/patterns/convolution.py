"""Convolution: the im2col chain ending in a matmul, run without building the im2col matrix.

The chain (what ``topos.nn.conv2d`` records, or any recording with the
same structure)::

    pad? (axis 2 or 3, zeros; at most one per axis)
    unfold(axis 2, kh, sh, dh) -> [B, C, OH, kh, W']
    unfold(axis 4, kw, sw, dw) -> [B, C, OH, kh, OW, kw]
    permute [0, 2, 4, 1, 3, 5] -> [B, OH, OW, C, kh, kw]
    reshape [B*OH*OW, C*kh*kw]
    matmul with any [C*kh*kw, F] kernel            (the group's root)

Column k of the im2col matrix is (c, i, j) with c slowest, because the
reshape flattens [C, kh, kw] row-major. The executor walks exactly those
k in ascending order, one multiply then one add per k in the compute
type, the first product taken as the start (as ``topos.base.reference.matmul``
does), and rounds once. Each output element therefore sees the same
IEEE operations in the same order as the composition: the bits cannot
differ, under either posture.

A pad is absorbed only while it is read by nothing but the chain; a
shared pad stays outside and becomes the convolution's input.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

import numpy as np

from topos.base.element import compute_type, round_to
from topos.readings.plan.patterns.base import Candidate, Pattern, StructureView

IM2COL_ORDER = (0, 2, 4, 1, 3, 5)


def match_laid_out_windows(view: StructureView, n: int, order: tuple[int, ...]) -> tuple[int, Windows] | None:
    """(the permute, its windows) when ``n`` is reshape(permute ``order`` (window pair)), or None.

    im2col and max-pool both lay their windows out this way, each with its own axis order.
    """
    if view.opcode(n) != "reshape":
        return None
    permuted = view.operands(n)[0]
    if view.opcode(permuted) != "permute" or view.attributes(permuted)["order"] != order:
        return None
    windows = match_windows(view, view.operands(permuted)[0])
    return None if windows is None else (permuted, windows)


@dataclass(frozen=True)
class Windows:
    """Two unfolds over an NCHW tensor: height windows on axis 2, then width windows on axis 4."""

    source: int  # the unfolded tensor
    rows: int  # unfold of axis 2
    columns: int  # unfold of axis 4
    size: tuple[int, int]
    stride: tuple[int, int]
    dilation: tuple[int, int]
    count: tuple[int, int]  # (OH, OW)


def match_windows(view: StructureView, n: int) -> Windows | None:
    """The window pair feeding node ``n`` (unfold axis 4 of unfold axis 2 of a rank-4 tensor), or None."""
    if view.opcode(n) != "unfold":
        return None
    columns = view.attributes(n)
    if columns["axis"] != 4:
        return None
    rows_node = view.operands(n)[0]
    if view.opcode(rows_node) != "unfold":
        return None
    rows = view.attributes(rows_node)
    source = view.operands(rows_node)[0]
    if rows["axis"] != 2 or len(view.spec(source).shape) != 4:
        return None
    shape = view.spec(n).shape
    return Windows(
        source, rows_node, n,
        (rows["size"], columns["size"]),
        (rows["step"], columns["step"]),
        (rows["dilation"], columns["dilation"]),
        (shape[2], shape[4]),
    )


@dataclass(frozen=True)
class Im2col:
    """The im2col matrix of a convolution: zero pads it absorbed, its windows, permute and reshape."""

    source: int  # the tensor convolved (past the absorbed pads)
    pads: tuple[int, ...]  # absorbed pad nodes, outermost first
    padding: tuple[tuple[int, int], tuple[int, int]]  # ((top, bottom), (left, right)), zeros
    windows: Windows
    permuted: int
    columns: int  # the [B*OH*OW, C*kh*kw] reshape
    batch: int
    channels: int

    @property
    def chain(self) -> tuple[int, ...]:
        """Every node from the pads through the im2col matrix."""
        return (*self.pads, self.windows.rows, self.windows.columns, self.permuted, self.columns)

    def details(self) -> dict:
        """What every convolution-shaped group says about its windows (a candidate's details)."""
        w = self.windows
        return {"input": self.source, "batch": self.batch, "channels": self.channels,
                "kernel_size": w.size, "stride": w.stride, "dilation": w.dilation, "padding": self.padding}


def match_im2col(view: StructureView, columns: int) -> Im2col | None:
    """The im2col chain ending at ``columns`` (reshape of permute [0,2,4,1,3,5] of two unfolds), or None."""
    laid_out = match_laid_out_windows(view, columns, IM2COL_ORDER)
    if laid_out is None:
        return None
    permuted, windows = laid_out
    source, pads, padding = _absorb_pads(view, windows)
    batch, channels = view.spec(source).shape[:2]
    (kh, kw), (oh, ow) = windows.size, windows.count
    if view.spec(columns).shape != (batch * oh * ow, channels * kh * kw):
        return None  # the same volume laid out differently is another computation
    return Im2col(source, pads, padding, windows, permuted, columns, batch, channels)


def _absorb_pads(view: StructureView, windows: Windows):
    """Walk back over zero pads of height/width that only the chain reads."""
    padding = {2: (0, 0), 3: (0, 0)}
    pads: list[int] = []
    absorbed: set[int] = set()  # axes already padded: a second pad stays outside
    source = windows.source
    while view.opcode(source) == "pad":
        attributes = view.attributes(source)
        axis = attributes["axis"]
        if axis not in padding or axis in absorbed or not view.interior_ok(source):
            break  # a pad someone else reads (or declared) is the convolution's input
        operand = view.operands(source)[0]
        before = attributes["start"]
        after = attributes["extent"] - before - view.spec(operand).shape[axis]
        padding[axis] = (before, after)
        absorbed.add(axis)
        pads.append(source)
        source = operand
    return source, tuple(pads), (padding[2], padding[3])


def padded_input(x: np.ndarray, padding, work) -> np.ndarray:
    """``x`` in the compute type inside its zero padding: the tensor the windows slide over."""
    (top, bottom), (left, right) = padding
    batch, channels, height, width = x.shape
    padded = np.zeros((batch, channels, height + top + bottom, width + left + right), dtype=work)
    padded[:, :, top : top + height, left : left + width] = x
    return padded


def tap_slices(tap: tuple[int, int], stride, dilation, count) -> tuple[slice, slice]:
    """Rows and columns of the padded input that kernel tap (i, j) meets, one per output position."""
    (i, j), (sh, sw), (dh, dw), (oh, ow) = tap, stride, dilation, count
    return slice(i * dh, i * dh + sh * (oh - 1) + 1, sh), slice(j * dw, j * dw + sw * (ow - 1) + 1, sw)


class Convolution(Pattern):
    """A conv2d recording (pads through the matmul) run as one kernel that never builds the im2col matrix.

    The im2col matrix may also be read by the kernel's weight gradient
    (``convolution_weight_gradient``), which recomputes the windows itself;
    the matrix is then lent to it (``Candidate.lends``) and election keeps
    this group only alongside that one.
    """

    kind = "convolution"
    bit_identical = True

    def _match(self, view: StructureView, root: int) -> Candidate | None:
        if view.opcode(root) != "matmul":
            return None
        columns_node, kernel = view.operands(root)
        im2col = match_im2col(view, columns_node)
        if im2col is None:
            return None
        windows = im2col.windows
        (kh, kw), (oh, ow) = windows.size, windows.count
        filters = view.spec(kernel).shape[1]
        interior = im2col.chain
        lends = view.lent(root, interior)
        if lends is None:
            return None
        saved = sum(view.nbytes(n) for n in (windows.rows, windows.columns, im2col.permuted, columns_node))
        return Candidate(
            self.kind,
            root,
            tuple(sorted((*interior, root))),
            f"im2col chain of a {kh}x{kw} convolution, stride {windows.stride}, "
            f"padding {im2col.padding}, into a [{im2col.channels * kh * kw}, {filters}] kernel",
            saved,
            {
                "input": im2col.source,
                "kernel": kernel,
                "batch": im2col.batch,
                "channels": im2col.channels,
                "filters": filters,
                "kernel_size": windows.size,
                "stride": windows.stride,
                "dilation": windows.dilation,
                "padding": im2col.padding,  # ((top, bottom), (left, right)), zeros
                "out_shape": (im2col.batch, filters, oh, ow),  # NCHW; the root holds it as [B*OH*OW, F]
            },
            lends=lends,
        )

    def execute(self, candidate: Candidate, value, network, kernel_of):
        details = candidate.details
        x = value(details["input"])
        dtype = network.columns.specs[candidate.root].dtype
        work = compute_type(dtype)
        padded = padded_input(x, details["padding"], work)
        batch, channels = x.shape[:2]
        kernel = value(details["kernel"]).astype(work, copy=False)
        kh, kw = details["kernel_size"]
        _, filters, oh, ow = details["out_shape"]
        # The accumulator's layout changes nothing but speed: NumPy is fastest
        # when the innermost loop is long, so filters go last when there are
        # at least as many filters as output columns ([B, OH, OW, F]), first
        # otherwise ([F, B, OH, OW]).
        filters_last = filters >= ow
        out: np.ndarray | None = None
        product_buffer: np.ndarray | None = None
        for k, (c, i, j) in enumerate(product(range(channels), range(kh), range(kw))):
            rows, columns = tap_slices((i, j), details["stride"], details["dilation"], (oh, ow))
            slab = padded[:, c, rows, columns]  # column k of the im2col matrix, as [B, OH, OW]
            if filters_last:
                slab, weights = slab[..., None], kernel[k]
            else:
                slab, weights = slab[None], kernel[k][:, None, None, None]
            if out is None:
                out = slab * weights
                product_buffer = np.empty_like(out)
            else:
                assert product_buffer is not None
                np.multiply(slab, weights, out=product_buffer)
                np.add(out, product_buffer, out=out)
        assert out is not None  # the kernel has at least one offset
        if not filters_last:
            out = np.ascontiguousarray(out.transpose(1, 2, 3, 0))
        result = out.reshape(batch * oh * ow, filters)
        return round_to(result, dtype)
