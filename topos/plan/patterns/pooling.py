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

import numpy as np

from .base import Candidate, Pattern, StructureView
from .convolution import match_windows

LANE_ORDER = (0, 1, 2, 4, 3, 5)


class MaxPool(Pattern):
    """A max_pool recording (the lane fold of maximum) run as one walk over the input's windows."""

    kind = "max_pool"
    bit_identical = True

    def _match(self, view: StructureView, root: int) -> Candidate | None:
        if view.opcode(root) != "reshape":
            return None
        last = view.operands(root)[0]
        if view.opcode(last) != "maximum":
            return None
        maxima, lanes = self._unfold_fold(view, last)
        first = lanes[0]
        if view.opcode(first) != "narrow":
            return None
        stacked = view.operands(first)[0]
        for position, lane in enumerate(lanes):
            if (
                view.opcode(lane) != "narrow"
                or view.operands(lane)[0] != stacked
                or view.attributes(lane) != {"axis": 4, "start": position, "length": 1}
            ):
                return None
        if view.opcode(stacked) != "reshape":
            return None
        permuted = view.operands(stacked)[0]
        if view.opcode(permuted) != "permute" or view.attributes(permuted)["order"] != LANE_ORDER:
            return None
        windows = match_windows(view, view.operands(permuted)[0])
        if windows is None:
            return None
        batch, channels = view.spec(windows.source).shape[:2]
        (sh, sw), (oh, ow) = windows.size, windows.count
        if (
            len(lanes) != sh * sw
            or view.spec(stacked).shape != (batch, channels, oh, ow, sh * sw)
            or view.spec(root).shape != (batch, channels, oh, ow)
        ):
            return None
        interior = (windows.rows, windows.columns, permuted, stacked, *lanes, *maxima)
        if not view.closed(root, interior):
            return None
        saved = sum(view.nbytes(n) for n in (windows.rows, windows.columns, permuted, stacked, *lanes))
        return Candidate(
            self.kind,
            root,
            tuple(sorted((*interior, root))),
            f"left fold of maximum over the {sh * sw} lanes of {sh}x{sw} windows, stride {windows.stride}",
            saved,
            {
                "input": windows.source,
                "batch": batch,
                "channels": channels,
                "window": windows.size,
                "stride": windows.stride,
                "dilation": windows.dilation,
                "out_shape": (batch, channels, oh, ow),
                "maxima": tuple(maxima),  # fold steps in lane order
            },
        )

    @staticmethod
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

    def execute(self, candidate: Candidate, value, network, kernel_of):
        details = candidate.details
        x = value(details["input"])
        sh, sw = details["window"]
        th, tw = details["stride"]
        dh, dw = details["dilation"]
        _, _, oh, ow = details["out_shape"]

        def lane(index: int) -> np.ndarray:
            i, j = divmod(index, sw)
            return x[:, :, i * dh : i * dh + th * (oh - 1) + 1 : th, j * dw : j * dw + tw * (ow - 1) + 1 : tw]

        best = lane(0)
        for index, step in enumerate(details["maxima"], start=1):
            best = kernel_of(step)(best, lane(index))
        return np.ascontiguousarray(best)
