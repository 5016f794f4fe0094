"""A convolution's recorded gradients: the weight gradient and the input gradient, run without im2col.

``tape.differentiate`` records the adjoints of conv2d's matmul and of its
im2col chain with the same opcodes as everything else. Two shapes come
out, and each is a pattern here.

**Weight gradient** (``convolution_weight_gradient``)::

    permute(columns, [1, 0])                  the im2col matrix transposed, [C*kh*kw, B*OH*OW]
    matmul(that, dY)                          dY: [B*OH*OW, F]              (the group's root)

The group claims the two nodes and *recomputes* the im2col chain
(``Candidate.recomputes``): it reads the convolution's input (past the
pads it absorbs, as the forward pattern does) and slides the windows
itself, so the forward convolution may still be elected and the matrix
never exist. Output element (k, f), k = (c, i, j), is the matmul's chain
``sum over m = (b, oh, ow) ascending of column[m, k] * dY[m, f]``.

- EXACT walks m in that order for every (k, f) at once: the window of
  output position m is a strided view ``[C, kh, kw]`` of the padded
  input, which *is* row m of the matrix; the first product is the start,
  then one multiply and one add per m in the compute type, rounded once,
  exactly as ``topos.base.reference.matmul`` does: the same IEEE operations
  in the same order, so the same bits.
- FAST runs the root's own FAST kernel (BLAS) once per kernel tap (i, j)
  on that tap's ``[C, B*OH*OW]`` slab: every output element is one
  complete dot product over the same terms, within the matmul envelope.

**Input gradient** (``convolution_input_gradient``)::

    matmul(dY, kernel)                        kernel: [F, C*kh*kw] -> [B*OH*OW, C*kh*kw]
    reshape [B, OH, OW, C, kh, kw]
    permute [0, 3, 1, 4, 2, 5]                -> [B, C, OH, kh, OW, kw]
    fold(axis 4, kw, sw, dw, W'), fold(axis 2, kh, sh, dh, H')
    narrow? (axis 3, axis 2: the pads' adjoints, at most one per axis)   (the last is the root)

Per tap (i, j) the executor runs the matmul node's own kernel (under the
plan's posture) on ``dY @ kernel[:, (c, i, j) for c]``: each element of
that ``[B*OH*OW, C]`` block is the composition's element, a complete
chain over f (EXACT: the reference's ascending order; FAST: BLAS within
the matmul envelope), rounded as the matmul rounds it. ``fold_taps``
then adds the taps in the two folds' own order (see ``folding.py``) and
the crop copies: the ``[B*OH*OW, C*kh*kw]`` matrix never exists.
"""

from __future__ import annotations

from itertools import product

import numpy as np
from numpy.lib.stride_tricks import as_strided

from topos.base.element import compute_type, round_to
from topos.readings.plan.numerics import Fidelity, Numerics
from topos.readings.plan.patterns.base import Candidate, Pattern, StructureView
from topos.readings.plan.patterns.convolution import match_im2col, padded_input, tap_slices
from topos.readings.plan.patterns.folding import fold_taps, match_folds

# The input gradient's permute: [B, OH, OW, C, kh, kw] -> [B, C, OH, kh, OW, kw].
COLUMNS_TO_WINDOWS = (0, 3, 1, 4, 2, 5)


class ConvolutionWeightGradient(Pattern):
    """``im2col^T @ dY``, the kernel's gradient, run from the convolution's input without the im2col matrix."""

    kind = "convolution_weight_gradient"
    bit_identical = True

    def _match(self, view: StructureView, root: int) -> Candidate | None:
        if view.opcode(root) != "matmul":
            return None
        transposed, gradient = view.operands(root)
        if view.opcode(transposed) != "permute" or view.attributes(transposed)["order"] != (1, 0):
            return None
        if not view.interior_ok(transposed):
            return None
        im2col = match_im2col(view, view.operands(transposed)[0])
        if im2col is None:
            return None
        (kh, kw), (oh, ow) = im2col.windows.size, im2col.windows.count
        filters = view.spec(gradient).shape[1]
        return Candidate(
            self.kind,
            root,
            tuple(sorted((transposed, root))),
            f"weight gradient of a {kh}x{kw} convolution, stride {im2col.windows.stride}, "
            f"padding {im2col.padding}: [{im2col.channels * kh * kw}, {filters}] from its windows and dY",
            view.nbytes(transposed),
            {**im2col.details(), "gradient": gradient, "filters": filters, "count": (oh, ow)},
            recomputes=tuple(sorted(im2col.chain)),
        )

    def execute(self, candidate: Candidate, value, network, kernel_of):
        details = candidate.details
        x, dy = value(details["input"]), value(details["gradient"])
        dtype = network.columns.specs[candidate.root].dtype
        channels, filters = details["channels"], details["filters"]
        kh, kw = details["kernel_size"]
        oh, ow = details["count"]
        # A posture that takes kernels within an envelope gets the root's own (BLAS) kernel per tap.
        if getattr(kernel_of, "numerics", Numerics.EXACT).accepts(Fidelity.ENVELOPE):
            padded = padded_input(x, details["padding"], x.dtype)
            matmul = kernel_of(candidate.root)
            out = np.empty((channels, kh, kw, filters), dtype=dtype)
            for i, j in product(range(kh), range(kw)):
                rows, columns = tap_slices((i, j), details["stride"], details["dilation"], (oh, ow))
                slab = padded[:, :, rows, columns].transpose(1, 0, 2, 3).reshape(channels, -1)
                out[:, i, j, :] = matmul(slab, dy)
            return out.reshape(channels * kh * kw, filters)
        work = compute_type(dtype)
        padded = padded_input(x, details["padding"], work)
        (sh, sw), (dh, dw) = details["stride"], details["dilation"]
        b_, c_, h_, w_ = padded.strides
        # Row m = (b, oh, ow) of the im2col matrix is the window of output position m: a strided
        # view [C, kh, kw] of the padded input (never a copy), with an axis for the filters.
        windows = as_strided(padded, (x.shape[0], oh, ow, channels, kh, kw, 1),
                             (b_, sh * h_, sw * w_, c_, dh * h_, dw * w_, 0), writeable=False)
        rows = dy.astype(work, copy=False).reshape(x.shape[0], oh, ow, filters)
        accumulated: np.ndarray | None = None
        products = np.empty((channels, kh, kw, filters), dtype=work)
        for b in range(x.shape[0]):
            for r in range(oh):
                window_row, gradient_row = windows[b, r], rows[b, r]
                for c in range(ow):
                    if accumulated is None:  # the first product is the start, as in the matmul
                        accumulated = window_row[c] * gradient_row[c]
                    else:
                        np.multiply(window_row[c], gradient_row[c], out=products)
                        np.add(accumulated, products, out=accumulated)
        assert accumulated is not None  # at least one output position
        return round_to(accumulated.reshape(channels * kh * kw, filters), dtype)


class ConvolutionInputGradient(Pattern):
    """``dY @ kernel`` folded back onto the input (then cropped), run tap by tap without the column matrix."""

    kind = "convolution_input_gradient"
    bit_identical = True

    def _match(self, view: StructureView, root: int) -> Candidate | None:
        """The group whose height fold is ``root``, grown forward over the crops after it (the last is its root)."""
        fold = root
        folds = match_folds(view, fold, COLUMNS_TO_WINDOWS)
        if folds is None:
            return None
        shaped = folds["operand"]
        if view.opcode(shaped) != "reshape" or not view.interior_ok(shaped):
            return None
        matmul = view.operands(shaped)[0]
        if view.opcode(matmul) != "matmul" or not view.interior_ok(matmul):
            return None
        gradient, kernel = view.operands(matmul)
        batch, channels = folds["batch"], folds["channels"]
        (kh, kw), (oh, ow) = folds["kernel_size"], folds["count"]
        if (view.spec(shaped).shape != (batch, oh, ow, channels, kh, kw)
                or view.spec(matmul).shape != (batch * oh * ow, channels * kh * kw)):
            return None
        height, width = folds["extent"]
        crop = {2: (0, height), 3: (0, width)}
        narrows: list[int] = []
        root = fold
        while view.interior_ok(root):
            (reader,) = view.consumers[root]
            attributes = view.attributes(reader) if view.opcode(reader) == "narrow" else {}
            axis = attributes.get("axis")
            if axis not in (2, 3) or any(view.attributes(n)["axis"] == axis for n in narrows):
                break
            crop[axis] = (crop[axis][0] + attributes["start"], attributes["length"])
            narrows.append(reader)
            root = reader
        interior = (matmul, shaped, folds["permuted"], folds["columns_fold"], fold, *narrows)
        interior = tuple(n for n in interior if n != root)
        filters = view.spec(gradient).shape[1]
        return Candidate(
            self.kind,
            root,
            tuple(sorted((*interior, root))),
            f"input gradient of a {kh}x{kw} convolution, stride {folds['stride']}: "
            f"dY @ [{filters}, {channels * kh * kw}] folded onto [{height}, {width}]",
            sum(view.nbytes(n) for n in interior),
            {
                "gradient": gradient,
                "kernel": kernel,
                "matmul": matmul,
                "batch": batch,
                "channels": channels,
                "filters": filters,
                "kernel_size": (kh, kw),
                "stride": folds["stride"],
                "dilation": folds["dilation"],
                "count": (oh, ow),
                "extent": (height, width),
                "crop": (crop[2], crop[3]),  # ((top, height), (left, width)) kept of the folded extent
                "out_shape": (batch, channels, crop[2][1], crop[3][1]),
            },
        )

    def execute(self, candidate: Candidate, value, network, kernel_of):
        details = candidate.details
        dy, kernel = value(details["gradient"]), value(details["kernel"])
        batch, channels, filters = details["batch"], details["channels"], details["filters"]
        kh, kw = details["kernel_size"]
        oh, ow = details["count"]
        taps = kernel.reshape(filters, channels, kh, kw)
        matmul = kernel_of(details["matmul"])

        def tap(i: int, j: int) -> np.ndarray:
            block = matmul(dy, np.ascontiguousarray(taps[:, :, i, j]))  # columns (c, i, j) for every c
            return block.reshape(batch, oh, ow, channels).transpose(0, 3, 1, 2)

        dtype = network.columns.specs[candidate.root].dtype
        out = fold_taps(tap, (kh, kw), details["stride"], details["dilation"], (oh, ow), details["extent"], dtype)
        (top, height), (left, width) = details["crop"]
        return np.ascontiguousarray(out[:, :, top : top + height, left : left + width])
