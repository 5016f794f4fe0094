"""Batch normalization (training and inference forms): discovered and offered, raised by the emission.

Both patterns share the formula's tail over ``[batch, features]``, every
per-feature vector broadcast along axis 0 to the batch::

    centered   = sub(x, broadcast(mean))
    normalized = div(centered, broadcast(sqrt(variance + eps)))   eps: a uniform leaf
    root       = add(mul(normalized, broadcast(scale)), broadcast(shift))

(the final mul and add may have their operands either way round: IEEE
multiplication and addition commute exactly). The training form also
computes the statistics from x, as ``topos.nn.batch_norm`` records them::

    mean     = div(sum_along(x, 0), N)                 N: a uniform leaf equal to the batch
    variance = div(sum_along(mul(centered, centered), 0), N)

The inference form takes mean and variance as ordinary operands.

Both are raise-only (``executes = False``): the NumPy plan never elects
them and runs the recorded composition; the MLIR emission serves them as
``stablehlo.batch_norm_training`` / ``stablehlo.batch_norm_inference``.
Why not a home executor for training: its mean and variance are *named
results*. They may be declared (observed, or returned for running
averages) and read outside the group, and the group must then hand them
back, as ``stablehlo.batch_norm_training`` does with its three results.
A home executor returns one value per group (its root), so it could not;
the matcher still offers such groups, for the emission.

Legality: every claimed node other than the root and the named results
obeys ``StructureView.closed`` (undeclared, read only inside the group);
the named results may be declared and may have readers outside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from topos.readings.plan.patterns.base import Candidate, Pattern, StructureView


@dataclass(frozen=True)
class _Tail:
    """Node indices of the shared formula tail."""

    root: int
    x: int
    centered: int  # x - broadcast(mean)
    mean: int
    variance: int
    scale: int
    shift: int
    epsilon: float
    interior: tuple[int, ...]  # claimed nodes of the tail, root excluded


def _uniform_leaf(view: StructureView, n: int) -> float | None:
    """The one value a constant leaf holds everywhere, or None."""
    if view.opcode(n) != "leaf":
        return None
    payload = view.network.columns.payloads.get(n)
    if payload is None or payload.size == 0:
        return None
    flat = payload.reshape(-1).astype(np.float64)
    return float(flat[0]) if np.all(flat == flat[0]) else None


def _spread(view: StructureView, n: int, batch: int) -> int | None:
    """The per-feature vector that ``n`` broadcasts along axis 0 to the batch, or None."""
    if view.opcode(n) != "broadcast_along" or view.attributes(n) != {"axis": 0, "extent": batch}:
        return None
    return view.operands(n)[0]


def _either_way(view: StructureView, n: int, opcode: str, batch: int):
    """(other operand, broadcast node, vector) of a commutative node with one batch broadcast."""
    if view.opcode(n) != opcode:
        return None
    left, right = view.operands(n)
    for other, spread in ((left, right), (right, left)):
        vector = _spread(view, spread, batch)
        if vector is not None and view.opcode(other) != "broadcast_along":
            return other, spread, vector
    return None


def _match_tail(view: StructureView, root: int) -> _Tail | None:
    shape = view.spec(root).shape
    if len(shape) != 2:
        return None
    batch = shape[0]
    affine = _either_way(view, root, "add", batch)
    if affine is None:
        return None
    scaled, shift_spread, shift = affine
    scaling = _either_way(view, scaled, "mul", batch)
    if scaling is None:
        return None
    normalized, scale_spread, scale = scaling
    if view.opcode(normalized) != "div":
        return None
    centered, deviation_spread = view.operands(normalized)
    deviation = _spread(view, deviation_spread, batch)
    if deviation is None or view.opcode(centered) != "sub":
        return None
    if view.opcode(deviation) != "map" or view.attributes(deviation)["function"] != "sqrt":
        return None
    shifted = view.operands(deviation)[0]
    if view.opcode(shifted) != "add":
        return None
    variance, eps_leaf = view.operands(shifted)
    epsilon = _uniform_leaf(view, eps_leaf)
    if epsilon is None:
        return None
    x, mean_spread = view.operands(centered)
    mean = _spread(view, mean_spread, batch)
    if mean is None:
        return None
    interior = (mean_spread, centered, shifted, deviation, deviation_spread, normalized,
                scale_spread, scaled, shift_spread)
    return _Tail(root, x, centered, mean, variance, scale, shift, epsilon, interior)


def _batch_mean(view: StructureView, n: int, batch: int) -> tuple[int, int] | None:
    """(sum_along node, its operand) when ``n`` is ``sum_along(operand, 0) / batch``, else None."""
    if view.opcode(n) != "div":
        return None
    total, count = view.operands(n)
    if view.opcode(total) != "sum_along" or view.attributes(total)["axis"] != 0:
        return None
    # A divisor that is not exactly the batch (N - 1, or a batch that
    # bfloat16 cannot hold) spells another statistic than batch norm's.
    if _uniform_leaf(view, count) != batch:
        return None
    return total, view.operands(total)[0]


def _closed_with_results(view: StructureView, root: int, interior, named) -> bool:
    """``closed`` for a group that also hands back ``named`` results (declared or read outside)."""
    group = {root, *interior, *named}
    return all(n in view.wanted for n in named) and all(
        n in view.wanted and n not in view.readable and set(view.consumers[n]) <= group
        for n in interior
    )


class _RaiseOnly(Pattern):
    """A pattern the NumPy plan never runs: discovery only, served by the MLIR emission."""

    executes = False
    # No home executor, so nothing to be bit-identical; the emission's
    # stablehlo op computes the statistics its own way (fast posture).
    bit_identical = False

    def discover(self, view: StructureView) -> list[Candidate]:
        found = []
        for n in sorted(view.wanted):
            tail = _match_tail(view, n)
            candidate = None if tail is None else self._match(view, tail)
            if candidate is not None:
                found.append(candidate)
        return found

    def _match(self, view: StructureView, tail: _Tail) -> Candidate | None:  # type: ignore[override]
        raise NotImplementedError

    def execute(self, candidate, value, network, kernel_of):
        raise NotImplementedError(
            f"{self.kind} is raise-only: the MLIR emission serves it; the NumPy plan runs the composition"
        )


class BatchNormTraining(_RaiseOnly):
    """Batch norm with batch statistics (output, mean, variance), offered for the emission to raise."""

    kind = "batch_norm_training"

    def _match(self, view: StructureView, tail: _Tail) -> Candidate | None:  # type: ignore[override]
        batch, features = view.spec(tail.root).shape
        mean_parts = _batch_mean(view, tail.mean, batch)
        variance_parts = _batch_mean(view, tail.variance, batch)
        if mean_parts is None or variance_parts is None or mean_parts[1] != tail.x:
            return None
        squares = variance_parts[1]
        if view.opcode(squares) != "mul" or view.operands(squares) != (tail.centered, tail.centered):
            return None
        interior = (*tail.interior, mean_parts[0], squares, variance_parts[0])
        named = (tail.mean, tail.variance)
        if not _closed_with_results(view, tail.root, interior, named):
            return None
        return Candidate(
            self.kind,
            tail.root,
            tuple(sorted((*interior, *named, tail.root))),
            f"batch statistics and normalization of [{batch}, {features}], eps {tail.epsilon:g}",
            sum(view.nbytes(n) for n in interior),
            {
                **_common_details(tail, batch, features),
                # Named results, (mean, variance): produced by the group and handed
                # back by the raise, whose results are (output, mean, variance).
                "results": (tail.mean, tail.variance),
            },
        )


def _common_details(tail: _Tail, batch: int, features: int) -> dict:
    """What both batch-norm raises need: the operands, the extents and epsilon."""
    return {
        "input": tail.x,
        "scale": tail.scale,
        "shift": tail.shift,
        "batch": batch,
        "features": features,
        "feature_index": 1,
        "epsilon": tail.epsilon,
    }


class BatchNormInference(_RaiseOnly):
    """Batch norm with supplied statistics, offered for the emission to raise."""

    kind = "batch_norm_inference"

    def _match(self, view: StructureView, tail: _Tail) -> Candidate | None:  # type: ignore[override]
        if not view.closed(tail.root, tail.interior):
            return None
        batch, features = view.spec(tail.root).shape
        return Candidate(
            self.kind,
            tail.root,
            tuple(sorted((*tail.interior, tail.root))),
            f"normalization of [{batch}, {features}] by supplied statistics, eps {tail.epsilon:g}",
            sum(view.nbytes(n) for n in tail.interior),
            {**_common_details(tail, batch, features), "mean": tail.mean, "variance": tail.variance},
        )
