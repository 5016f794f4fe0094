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
type, the first product taken as the start (as ``topos.reference.matmul``
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

from ...element import compute_type, round_to
from .base import Candidate, Pattern, StructureView

IM2COL_ORDER = (0, 2, 4, 1, 3, 5)


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


class Convolution(Pattern):
    """A conv2d recording (pads through the matmul) run as one kernel that never builds the im2col matrix."""

    kind = "convolution"
    bit_identical = True

    def _match(self, view: StructureView, root: int) -> Candidate | None:
        if view.opcode(root) != "matmul":
            return None
        columns_node, kernel = view.operands(root)
        if view.opcode(columns_node) != "reshape":
            return None
        permuted = view.operands(columns_node)[0]
        if view.opcode(permuted) != "permute" or view.attributes(permuted)["order"] != IM2COL_ORDER:
            return None
        windows = match_windows(view, view.operands(permuted)[0])
        if windows is None:
            return None
        source, pads, padding = self._absorb_pads(view, windows)
        batch, channels = view.spec(source).shape[:2]
        (kh, kw), (oh, ow) = windows.size, windows.count
        if view.spec(columns_node).shape != (batch * oh * ow, channels * kh * kw):
            return None  # the same volume laid out differently is another computation
        filters = view.spec(kernel).shape[1]
        interior = (*pads, windows.rows, windows.columns, permuted, columns_node)
        if not view.closed(root, interior):
            return None
        saved = sum(view.nbytes(n) for n in (windows.rows, windows.columns, permuted, columns_node))
        return Candidate(
            self.kind,
            root,
            tuple(sorted((*interior, root))),
            f"im2col chain of a {kh}x{kw} convolution, stride {windows.stride}, "
            f"padding {padding}, into a [{channels * kh * kw}, {filters}] kernel",
            saved,
            {
                "input": source,
                "kernel": kernel,
                "batch": batch,
                "channels": channels,
                "filters": filters,
                "kernel_size": windows.size,
                "stride": windows.stride,
                "dilation": windows.dilation,
                "padding": padding,  # ((top, bottom), (left, right)), zeros
                "out_shape": (batch, filters, oh, ow),  # NCHW; the root holds it as [B*OH*OW, F]
            },
        )

    @staticmethod
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

    def execute(self, candidate: Candidate, value, network, kernel_of):
        details = candidate.details
        x = value(details["input"])
        dtype = network._specs[candidate.root].dtype
        work = compute_type(dtype)
        (top, bottom), (left, right) = details["padding"]
        batch, channels, height, width = x.shape
        padded = np.zeros((batch, channels, height + top + bottom, width + left + right), dtype=work)
        padded[:, :, top : top + height, left : left + width] = x
        kernel = value(details["kernel"]).astype(work, copy=False)
        kh, kw = details["kernel_size"]
        sh, sw = details["stride"]
        dh, dw = details["dilation"]
        _, filters, oh, ow = details["out_shape"]
        # The accumulator's layout changes nothing but speed: NumPy is fastest
        # when the innermost loop is long, so filters go last when there are
        # at least as many filters as output columns ([B, OH, OW, F]), first
        # otherwise ([F, B, OH, OW]).
        filters_last = filters >= ow
        out: np.ndarray | None = None
        product_buffer: np.ndarray | None = None
        for k, (c, i, j) in enumerate(product(range(channels), range(kh), range(kw))):
            rows = slice(i * dh, i * dh + sh * (oh - 1) + 1, sh)
            columns = slice(j * dw, j * dw + sw * (ow - 1) + 1, sw)
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
