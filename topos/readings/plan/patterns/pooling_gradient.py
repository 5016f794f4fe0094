"""A max-pool's recorded gradient, run from the pool's input without stacking, padding or folding lanes.

``tape.differentiate`` through ``topos.nn.max_pool`` records, for each
fold step ``best_s = maximum(best_{s-1}, lane_s)``, the maximum rule:
``left = step(best_{s-1}, lane_s)``, ``g * left`` to the left and
``g * (1 - left)`` to lane s. Then each lane's gradient ``G_p`` is padded
back into the lane stack (the narrow's adjoint), the pads are added, and
the stack goes back through the unfolds' adjoints::

    region: step / sub / mul nodes reading the pool's lanes and maxima   -> G_p, [B, C, OH, OW, 1]
    pad(G_p, axis 4, start p, extent sh*sw), added in any tree           -> [B, C, OH, OW, sh*sw]
    reshape [B, C, OH, OW, sh, sw], permute [0, 1, 2, 4, 3, 5]
    fold(axis 4, sw, tw, dw, W), fold(axis 2, sh, th, dh, H)             (the group's root)

The group claims all of that and *recomputes* the forward chain's lanes
and maxima (``Candidate.recomputes``) from the pool's input: a lane is a
strided view, a maximum is its own node's kernel on the same operands.
The region's nodes then run with their own kernels, in recording order,
on the same values: the same bits (maximum, step, sub and mul are each
one IEEE operation or a compare and a select).

The lane stack: at each position only the pad of its own lane is
nonzero, the others add +0, so the stack holds ``G_p + 0`` (``-0``
turns into ``+0``, every other value is kept). The width fold starts
from +0 and adds each lane's value once, which turns ``-0`` into ``+0``
by itself: reading ``G_p`` instead of the stack changes no bit. The
folds then run as ``fold_taps`` (see ``folding.py``).

Not matched: a region node read outside the group (a second gradient of
the same pool), a lane missing from the pad sum, a non-elementwise node
between the lanes and their gradients.
"""

from __future__ import annotations

import numpy as np

from topos.readings.plan.patterns.base import Candidate, Pattern, StructureView
from topos.readings.plan.patterns.elementwise import ELEMENTWISE
from topos.readings.plan.patterns.folding import fold_taps, match_folds
from topos.readings.plan.patterns.pooling import LANE_ORDER, PoolChain, lane_view, match_pool


class MaxPoolGradient(Pattern):
    """The recorded gradient of a max_pool, routed from its recomputed lanes straight onto the input."""

    kind = "max_pool_gradient"
    bit_identical = True

    def discover(self, view: StructureView) -> list[Candidate]:
        chains: dict[int, PoolChain] = {}  # lane or maximum node -> its pool
        for n in sorted(view.wanted):
            chain = match_pool(view, n)
            if chain is not None:
                chains.update((m, chain) for m in (*chain.lanes, *chain.maxima))
        if not chains:
            return []
        found = []
        for n in sorted(view.wanted):
            candidate = self._match_gradient(view, n, chains)
            if candidate is not None:
                found.append(candidate)
        return found

    def _match_gradient(self, view: StructureView, root: int, chains: dict[int, PoolChain]) -> Candidate | None:
        folds = match_folds(view, root, LANE_ORDER)
        if folds is None:
            return None
        stacked = folds["operand"]
        (sh, sw), (oh, ow) = folds["kernel_size"], folds["count"]
        lanes_shape = (folds["batch"], folds["channels"], oh, ow)
        if (view.opcode(stacked) != "reshape" or not view.interior_ok(stacked)
                or view.spec(stacked).shape != (*lanes_shape, sh, sw)):
            return None
        total = view.operands(stacked)[0]
        sums = self._sum_of_pads(view, total, (*lanes_shape, sh * sw))
        if sums is None:
            return None
        adds, pads, gradients = sums
        if sorted(gradients) != list(range(sh * sw)):
            return None
        chain = self._pool_behind(view, gradients.values(), chains)
        if chain is None or not self._same_windows(view, chain, folds):
            return None
        region = self._region(view, chain, lanes_shape)
        if region is None or not set(gradients.values()) <= region:
            return None
        interior = (*sorted(region), *pads, *adds, stacked, folds["permuted"], folds["columns_fold"])
        if not view.closed(root, interior):
            return None
        forward = chain.windows
        lanes = {lane: p for p, lane in enumerate(chain.lanes)}
        return Candidate(
            self.kind,
            root,
            tuple(sorted((*interior, root))),
            f"gradient of a {sh}x{sw} max-pool, stride {forward.stride}: "
            f"{sh * sw} lane gradients from {len(region)} recorded nodes, onto the pool's input",
            sum(view.nbytes(n) for n in (*pads, *adds, stacked, folds["permuted"], folds["columns_fold"])),
            {
                "input": forward.source,
                "batch": folds["batch"],
                "channels": folds["channels"],
                "window": (sh, sw),
                "stride": folds["stride"],
                "dilation": folds["dilation"],
                "count": (oh, ow),
                "extent": folds["extent"],
                "lanes": tuple((lane, lanes[lane]) for lane in chain.lanes),  # (node, lane index)
                "maxima": chain.maxima,
                "region": tuple(sorted(region)),
                "lane_gradients": tuple(gradients[p] for p in range(sh * sw)),  # G_p, lane order
            },
            recomputes=tuple(sorted(chain.interior)),
        )

    @staticmethod
    def _sum_of_pads(view: StructureView, total: int, shape) -> tuple[list[int], list[int], dict[int, int]] | None:
        """(adds, pads, lane -> padded gradient) when ``total`` is a sum of pads of distinct lanes."""
        adds: list[int] = []
        pads: list[int] = []
        gradients: dict[int, int] = {}
        stack = [total]
        while stack:
            n = stack.pop()
            if view.spec(n).shape != shape or not view.interior_ok(n):
                return None
            if view.opcode(n) == "add":
                adds.append(n)
                stack.extend(view.operands(n))
                continue
            attributes = view.attributes(n) if view.opcode(n) == "pad" else {}
            if attributes.get("axis") != 4 or attributes["extent"] != shape[4] or attributes["start"] in gradients:
                return None
            (gradient,) = view.operands(n)
            if view.spec(gradient).shape != (*shape[:4], 1):
                return None
            pads.append(n)
            gradients[attributes["start"]] = gradient
        return adds, pads, gradients

    @staticmethod
    def _pool_behind(view: StructureView, gradients, chains: dict[int, PoolChain]) -> PoolChain | None:
        """The one pool whose lanes or maxima the elementwise nodes behind ``gradients`` read, or None."""
        seen: set[int] = set()
        found: set[int] = set()
        stack = list(gradients)
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            if n in chains:
                found.add(chains[n].root)
            elif view.opcode(n) in ELEMENTWISE:
                stack.extend(view.operands(n))
        if len(found) != 1:
            return None
        return next(chain for chain in chains.values() if chain.root in found)

    @staticmethod
    def _same_windows(view: StructureView, chain: PoolChain, folds: dict) -> bool:
        w = chain.windows
        return (w.size == folds["kernel_size"] and w.stride == folds["stride"] and w.dilation == folds["dilation"]
                and w.count == folds["count"] and view.spec(w.source).shape[2:] == folds["extent"]
                and (chain.batch, chain.channels) == (folds["batch"], folds["channels"]))

    @staticmethod
    def _region(view: StructureView, chain: PoolChain, lanes_shape) -> set[int] | None:
        """Elementwise nodes downstream of the pool's lanes and maxima, of the lanes' shape."""
        members = {*chain.interior, chain.root}
        region: set[int] = set()
        stack = [r for n in (*chain.lanes, *chain.maxima) for r in view.consumers[n] if r not in members]
        while stack:
            n = stack.pop()
            if n in region:
                continue
            if view.opcode(n) not in ELEMENTWISE or view.spec(n).shape != (*lanes_shape, 1):
                if view.opcode(n) == "pad":
                    continue  # where the lane gradients leave the region
                return None
            region.add(n)
            stack.extend(view.consumers[n])
        return region

    def execute(self, candidate: Candidate, value, network, kernel_of):
        details = candidate.details
        x = value(details["input"])
        window, stride, dilation, count = details["window"], details["stride"], details["dilation"], details["count"]
        computed: dict[int, np.ndarray] = {
            lane: lane_view(x, index, window, stride, dilation, count)[..., None] for lane, index in details["lanes"]
        }
        operands = network.columns.operands
        for n in (*details["maxima"], *details["region"]):
            computed[n] = np.asarray(kernel_of(n)(*(computed[j] if j in computed else value(j) for j in operands[n])))
        gradients = details["lane_gradients"]

        def tap(i: int, j: int) -> np.ndarray:
            return computed[gradients[i * window[1] + j]][..., 0]

        dtype = network.columns.specs[candidate.root].dtype
        return fold_taps(tap, window, stride, dilation, count, details["extent"], dtype)
