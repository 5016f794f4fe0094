"""The two folds a window gradient ends in (width, then height), run as strided adds of per-tap values.

A gradient that flows back through ``unfold(axis 2)`` then ``unfold(axis
4)`` (a convolution's input gradient, a max-pool's gradient) is recorded
as the adjoints in reverse: a permute to ``[B, C, OH, kh, OW, kw]``, then
``fold(axis 4, kw, sw, dw, W)``, then ``fold(axis 2, kh, sh, dh, H)``.
Each fold adds its windows onto zeros lane by lane (``Fold.kernel``), in
the compute type, and rounds once. So an input element (h, w) gets

    height fold:  0 + P_0 + P_1 + ... + P_{kh-1}      (lanes i ascending)
    width fold:   P_i = round(0 + t(i, 0) + ... + t(i, kw-1))   (lanes j ascending)

where t(i, j) is tap (i, j)'s value at the one window that lane meets
there (a lane's windows never overlap each other, so each lane adds at
most once). ``fold_taps`` makes those very additions, in that order,
with the same zero starts and the same roundings, only reading each
tap's values from a function instead of from the permuted tensor, so
the ``[B, C, OH, kh, OW, kw]`` tensor and the width fold's output never
exist whole: the bits are the composition's.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from topos.base.element import compute_type, round_to
from topos.readings.plan.patterns.base import StructureView


def fold_taps(tap: Callable[[int, int], np.ndarray], size, stride, dilation, count, extent, dtype) -> np.ndarray:
    """``fold(axis 2)`` of ``fold(axis 4)`` of the windows whose tap (i, j) is ``tap(i, j)``: [B, C, OH, OW]."""
    work = compute_type(dtype)
    (kh, kw), (sh, sw), (dh, dw), (oh, ow), (height, width) = size, stride, dilation, count, extent
    out: np.ndarray | None = None
    partial: np.ndarray | None = None
    for i in range(kh):
        for j in range(kw):
            values = tap(i, j).astype(work, copy=False)
            if out is None:
                batch, channels = values.shape[:2]
                out = np.zeros((batch, channels, height, width), dtype=work)
                partial = np.empty((batch, channels, oh, width), dtype=work)
            assert partial is not None
            if j == 0:
                partial.fill(0)
            partial[:, :, :, j * dw : j * dw + sw * (ow - 1) + 1 : sw] += values
        assert out is not None and partial is not None
        # The width fold rounds its result before the height fold reads it.
        out[:, :, i * dh : i * dh + sh * (oh - 1) + 1 : sh, :] += round_to(partial, dtype).astype(work, copy=False)
    assert out is not None  # a window has at least one tap
    return round_to(out, dtype)


def match_folds(view: StructureView, root: int, permute_order) -> dict | None:
    """``fold(axis 2)`` of ``fold(axis 4)`` of ``permute(order)`` ending at ``root`` -> its pieces, or None.

    The interior (the width fold and the permute) must be read only by the
    chain. Returns the nodes (``permuted``, ``columns_fold``), the permute's
    operand (``operand``) and the window attributes.
    """
    if view.opcode(root) != "fold" or view.attributes(root)["axis"] != 2:
        return None
    columns_fold = view.operands(root)[0]
    if view.opcode(columns_fold) != "fold" or view.attributes(columns_fold)["axis"] != 4:
        return None
    permuted = view.operands(columns_fold)[0]
    if view.opcode(permuted) != "permute" or view.attributes(permuted)["order"] != tuple(permute_order):
        return None
    if not (view.interior_ok(columns_fold) and view.interior_ok(permuted)):
        return None
    rows, columns = view.attributes(root), view.attributes(columns_fold)
    batch, channels, oh, kh, ow, kw = view.spec(permuted).shape
    return {
        "permuted": permuted,
        "columns_fold": columns_fold,
        "operand": view.operands(permuted)[0],
        "batch": batch,
        "channels": channels,
        "kernel_size": (rows["size"], columns["size"]),
        "stride": (rows["step"], columns["step"]),
        "dilation": (rows["dilation"], columns["dilation"]),
        "count": (oh, ow),
        "extent": (rows["extent"], columns["extent"]),
    }
