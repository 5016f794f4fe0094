"""Max-pooling: a left fold of ``maximum`` over window lanes, run as a direct window walk.

The chain (what ``topos.nn.max_pool`` records, or any recording with the
same structure)::

    unfold(axis 2, sh, th, dh), unfold(axis 4, sw, tw, dw)  -> [B, C, OH, sh, OW, sw]
    permute [0, 1, 2, 4, 3, 5]                              -> [B, C, OH, OW, sh, sw]
    reshape [B, C, OH, OW, sh*sw]
    narrow(axis 4, lane, 1) for lane = 0, 1, ..., sh*sw - 1
    maximum(...maximum(maximum(lane 0, lane 1), lane 2)..., lane sh*sw - 1)
    reshape [B, C, OH, OW]                                  (the group's root)

Lane ``i * sw + j`` is window element (i, j). The executor reads those
elements straight from the input as strided views and folds them in the
same lane order with each fold step's own ``maximum`` kernel, so ties
(and NaNs) resolve exactly as in the composition: maximum is exact, and
only the order could change which of two equal values (+0 and -0) wins.

Not matched (documented false negatives): a balanced tree of maxima,
lanes folded out of order, a fold without the final squeeze reshape,
and a 1x1 window (no maximum to fold).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from topos.readings.plan.patterns.base import Candidate, Pattern, StructureView
from topos.readings.plan.patterns.convolution import Windows, match_laid_out_windows

LANE_ORDER = (0, 1, 2, 4, 3, 5)


@dataclass(frozen=True)
class PoolChain:
    """A max_pool recording's nodes: the windows, the lane stack, its lanes and the fold of maxima."""

    root: int  # the final reshape to [B, C, OH, OW]
    windows: Windows
    permuted: int
    stacked: int  # [B, C, OH, OW, sh*sw]
    lanes: tuple[int, ...]  # narrows, lane 0 first
    maxima: tuple[int, ...]  # fold steps, first first
    batch: int
    channels: int

    @property
    def interior(self) -> tuple[int, ...]:
        w = self.windows
        return (w.rows, w.columns, self.permuted, self.stacked, *self.lanes, *self.maxima)


def match_pool(view: StructureView, root: int) -> PoolChain | None:
    """The max_pool chain ending at ``root`` by structure alone (who else reads it is not checked), or None."""
    if view.opcode(root) != "reshape":
        return None
    last = view.operands(root)[0]
    if view.opcode(last) != "maximum":
        return None
    maxima, lanes = _unfold_fold(view, last)
    stacked = view.operands(lanes[0])[0] if view.opcode(lanes[0]) == "narrow" else None
    for position, lane in enumerate(lanes):
        if (
            view.opcode(lane) != "narrow"
            or view.operands(lane)[0] != stacked
            or view.attributes(lane) != {"axis": 4, "start": position, "length": 1}
        ):
            return None
    assert stacked is not None
    laid_out = match_laid_out_windows(view, stacked, LANE_ORDER)
    if laid_out is None:
        return None
    permuted, windows = laid_out
    batch, channels = view.spec(windows.source).shape[:2]
    (sh, sw), (oh, ow) = windows.size, windows.count
    if (
        len(lanes) != sh * sw
        or view.spec(stacked).shape != (batch, channels, oh, ow, sh * sw)
        or view.spec(root).shape != (batch, channels, oh, ow)
    ):
        return None
    return PoolChain(root, windows, permuted, stacked, tuple(lanes), tuple(maxima), batch, channels)


def _unfold_fold(view: StructureView, last: int) -> tuple[list[int], list[int]]:
    """Maxima of a left fold (first step first) and the lanes they fold, in fold order."""
    maxima, rights = [], []
    node = last
    while view.opcode(node) == "maximum":
        left, right = view.operands(node)
        maxima.append(node)
        rights.append(right)
        node = left
    return maxima[::-1], [node, *rights[::-1]]


def lane_view(x: np.ndarray, index: int, window, stride, dilation, count) -> np.ndarray:
    """Lane ``index`` (window element (i, j), row-major) of every window of ``x``: a strided view [B, C, OH, OW]."""
    i, j = divmod(index, window[1])
    (th, tw), (dh, dw), (oh, ow) = stride, dilation, count
    return x[:, :, i * dh : i * dh + th * (oh - 1) + 1 : th, j * dw : j * dw + tw * (ow - 1) + 1 : tw]


class MaxPool(Pattern):
    """A max_pool recording (the lane fold of maximum) run as one walk over the input's windows.

    Its lanes and maxima may also be read by the pool's recorded gradient
    (``max_pool_gradient``), which recomputes them; they are then lent to
    it and election keeps this group only alongside that one.
    """

    kind = "max_pool"
    bit_identical = True

    def _match(self, view: StructureView, root: int) -> Candidate | None:
        chain = match_pool(view, root)
        if chain is None:
            return None
        lends = view.lent(root, chain.interior)
        if lends is None:
            return None
        windows = chain.windows
        (sh, sw), (oh, ow) = windows.size, windows.count
        saved = sum(view.nbytes(n) for n in (windows.rows, windows.columns, chain.permuted, chain.stacked,
                                              *chain.lanes))
        return Candidate(
            self.kind,
            root,
            tuple(sorted((*chain.interior, root))),
            f"left fold of maximum over the {sh * sw} lanes of {sh}x{sw} windows, stride {windows.stride}",
            saved,
            {
                "input": windows.source,
                "batch": chain.batch,
                "channels": chain.channels,
                "window": windows.size,
                "stride": windows.stride,
                "dilation": windows.dilation,
                "out_shape": (chain.batch, chain.channels, oh, ow),
                "maxima": chain.maxima,  # fold steps in lane order
            },
            lends=lends,
        )

    def execute(self, candidate: Candidate, value, network, kernel_of):
        details = candidate.details
        x = value(details["input"])
        count = details["out_shape"][2:]

        def lane(index: int) -> np.ndarray:
            return lane_view(x, index, details["window"], details["stride"], details["dilation"], count)

        best = lane(0)
        for index, step in enumerate(details["maxima"], start=1):
            best = kernel_of(step)(best, lane(index))
        return np.ascontiguousarray(best)
