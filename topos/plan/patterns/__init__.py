"""The fusion catalog: patterns discovered over the frozen structure, offered as data.

A pattern never rewrites the spec. Discovery finds candidates (they may
overlap); each consumer (the NumPy plan executor, the MLIR emission)
elects the ones it can serve, first come first served in catalog order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .base import Candidate, Pattern, StructureView
from .batchnorm import BatchNormInference, BatchNormTraining
from .convolution import Convolution
from .elementwise import ElementwiseChain
from .pooling import MaxPool

CATALOG: list[Pattern] = [
    Convolution(), MaxPool(), BatchNormTraining(), BatchNormInference(), ElementwiseChain(),
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
    """Every candidate every pattern finds, in catalog order then root order."""
    found: list[Candidate] = []
    for p in CATALOG:
        found.extend(sorted(p.discover(view), key=lambda c: c.root))
    return tuple(found)


def elect(candidates: Sequence[Candidate], supports: Callable[[Candidate], bool]) -> tuple[Candidate, ...]:
    """The candidates a consumer takes: supported ones, first wins, no node claimed twice."""
    claimed: set[int] = set()
    elected = []
    for candidate in candidates:
        if not supports(candidate) or claimed.intersection(candidate.nodes):
            continue
        claimed.update(candidate.nodes)
        elected.append(candidate)
    return tuple(sorted(elected, key=lambda c: c.root))


__all__ = ["CATALOG", "Candidate", "Pattern", "StructureView", "discover", "elect", "pattern", "register_pattern"]
