"""The fusion catalog: patterns discovered over the frozen structure, offered as data.

A pattern never rewrites the spec. Discovery finds candidates (they may
overlap); each consumer (the NumPy plan executor, the MLIR emission)
elects the ones it can serve, first come first served in catalog order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from topos.readings.plan.patterns.base import Candidate, Pattern, StructureView
from topos.readings.plan.patterns.batchnorm import BatchNormInference, BatchNormTraining
from topos.readings.plan.patterns.convolution import Convolution
from topos.readings.plan.patterns.convolution_gradients import ConvolutionInputGradient, ConvolutionWeightGradient
from topos.readings.plan.patterns.elementwise import ElementwiseChain
from topos.readings.plan.patterns.pooling import MaxPool
from topos.readings.plan.patterns.pooling_gradient import MaxPoolGradient

CATALOG: list[Pattern] = [
    Convolution(), ConvolutionWeightGradient(), ConvolutionInputGradient(), MaxPool(), MaxPoolGradient(),
    BatchNormTraining(), BatchNormInference(), ElementwiseChain(),
]


def register_pattern(pattern: Pattern, *, before: str | None = None) -> None:
    """Add a pattern to the catalog (priority order: earlier patterns claim nodes first)."""
    if any(p.kind == pattern.kind for p in CATALOG):
        raise ValueError(f"a pattern of kind {pattern.kind!r} is already in the catalog")
    position = len(CATALOG)
    if before is not None:
        position = next(i for i, p in enumerate(CATALOG) if p.kind == before)
    CATALOG.insert(position, pattern)


def pattern(kind: str) -> Pattern:
    return next(p for p in CATALOG if p.kind == kind)


def discover(view: StructureView) -> tuple[Candidate, ...]:
    """Every candidate every pattern finds, in catalog order then root order.

    Two rounds when some offer recomputes nodes (a gradient rebuilding the
    forward windows it reads): the second tells every pattern which
    readers recompute what, so a forward group whose interior they read
    may still be offered, lending that interior (``Candidate.lends``).
    """
    found = _discover_once(view)
    recomputed: dict[int, set[int]] = {}
    for candidate in found:
        for n in candidate.recomputes:
            readers = {r for r in candidate.nodes if n in view.operands(r)}
            recomputed.setdefault(n, set()).update(readers)
    if not recomputed:
        return found
    return _discover_once(view.recomputing({n: frozenset(r) for n, r in recomputed.items()}))


def _discover_once(view: StructureView) -> tuple[Candidate, ...]:
    found: list[Candidate] = []
    for p in CATALOG:
        found.extend(sorted(p.discover(view), key=lambda c: c.root))
    return tuple(found)


def elect(candidates: Sequence[Candidate], supports: Callable[[Candidate], bool]) -> tuple[Candidate, ...]:
    """The candidates a consumer takes: supported ones, first wins, no node claimed twice.

    An offer that lends interior nodes stands only if every reader it
    lends to is claimed by an elected group that recomputes the node;
    otherwise the node would have to be materialized. Such an offer is
    dropped and the election rerun without it, until every lend is met.
    """
    dropped: set[int] = set()
    while True:
        claimed: set[int] = set()
        elected: list[tuple[int, Candidate]] = []
        for k, candidate in enumerate(candidates):
            if k in dropped or not supports(candidate) or claimed.intersection(candidate.nodes):
                continue
            claimed.update(candidate.nodes)
            elected.append((k, candidate))
        owner = {n: c for _, c in elected for n in c.nodes}
        unmet = {k for k, c in elected if not all(
            r in owner and n in owner[r].recomputes for n, readers in c.lends.items() for r in readers)}
        if not unmet:
            return tuple(sorted((c for _, c in elected), key=lambda c: c.root))
        dropped |= unmet


__all__ = ["CATALOG", "Candidate", "Pattern", "StructureView", "discover", "elect", "pattern", "register_pattern"]
