"""What a fusion pattern is, and the read-only view of the structure it matches against."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from topos.readings.plan.numerics import Fidelity


@dataclass(frozen=True)
class Candidate:
    """One fusion offer: a group of nodes a consumer may run as one kernel."""

    kind: str
    root: int  # the node whose value the group produces
    nodes: tuple[int, ...]  # every claimed node, root included, ascending
    reason: str
    bytes_saved: int  # temporaries the group never materializes
    details: Mapping[str, Any] = field(default_factory=dict)
    # Nodes outside the claim that the executor rebuilds from the group's own
    # inputs instead of reading them (another group's interior, typically):
    # a weight gradient recomputes the forward convolution's windows.
    recomputes: tuple[int, ...] = ()
    # Interior nodes that nodes outside the group read, with those readers.
    # Each reader must be claimed by an elected group that recomputes the
    # node; otherwise the node would have to exist, and this offer is not elected.
    lends: Mapping[int, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self):
        # Executors read ``details``: handed out by plan.candidates() and fusions(), it must not be editable.
        object.__setattr__(self, "details", _frozen(self.details))
        object.__setattr__(self, "lends", _frozen(self.lends))

    @property
    def interior(self) -> tuple[int, ...]:
        return tuple(n for n in self.nodes if n != self.root)


def _frozen(value):
    """``value`` with every mapping read-only and every list or set a tuple, all the way down."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return frozenset(_frozen(v) for v in value)
    if isinstance(value, np.ndarray):
        frozen = value.copy()
        frozen.flags.writeable = False
        return frozen
    return value


class StructureView:
    """The frozen structure as a matcher sees it: the wanted closure, what is declared, who reads what."""

    def __init__(self, network, wanted: frozenset[int], readable: frozenset[int],
                 recomputed: Mapping[int, frozenset[int]] | None = None):
        self.network = network
        self.wanted = wanted
        self.readable = readable
        consumers = network.consumers()
        self.consumers = {n: tuple(c for c in consumers[n] if c in wanted) for n in wanted}
        # node -> the readers of it that some offer recomputes it for (see ``lent``)
        self.recomputed: Mapping[int, frozenset[int]] = recomputed or {}

    def recomputing(self, recomputed: Mapping[int, frozenset[int]]) -> StructureView:
        """The same structure, told which readers of which nodes some offer recomputes them for."""
        view = StructureView.__new__(StructureView)
        view.network, view.wanted, view.readable, view.consumers = (
            self.network, self.wanted, self.readable, self.consumers)
        view.recomputed = recomputed
        return view

    def opcode(self, n: int) -> str:
        return self.network.columns.opcodes[n].name

    def operands(self, n: int) -> tuple[int, ...]:
        return self.network.columns.operands[n]

    def attributes(self, n: int) -> dict:
        return dict(self.network.columns.attributes[n])

    def spec(self, n: int):
        return self.network.columns.specs[n]

    def nbytes(self, n: int) -> int:
        spec = self.spec(n)
        itemsize = spec.dtype.itemsize if isinstance(spec.dtype, np.dtype) else 8
        return int(np.prod(spec.shape, dtype=np.int64)) * itemsize

    def interior_ok(self, n: int) -> bool:
        """May ``n`` disappear inside a group? Wanted, undeclared, and read by exactly one node."""
        return n in self.wanted and n not in self.readable and len(self.consumers[n]) == 1

    def closed(self, root: int, interior) -> bool:
        """Every wanted reader of an interior node lies inside the group (raise legality)."""
        group = set(interior) | {root}
        return all(
            n in self.wanted and n not in self.readable and set(self.consumers[n]) <= group
            for n in interior
        )

    def lent(self, root: int, interior) -> dict[int, tuple[int, ...]] | None:
        """``closed``, except that a reader outside may recompute what it reads -> what is lent, or None.

        An interior node may be read outside the group only by readers that
        an offer recomputes it for (``Candidate.recomputes``); those are
        returned as the candidate's ``lends``, which election checks. Any
        other outside reader, or a declared interior node, makes it None.
        """
        group = set(interior) | {root}
        lends: dict[int, tuple[int, ...]] = {}
        for n in interior:
            if n not in self.wanted or n in self.readable:
                return None
            outside = set(self.consumers[n]) - group
            if not outside <= self.recomputed.get(n, frozenset()):
                return None
            if outside:
                lends[n] = tuple(sorted(outside))
        return lends


class Pattern:
    """A matcher over the frozen structure, plus how the NumPy plan executes a match."""

    kind: str = ""
    bit_identical: bool = True  # the home executor reproduces the composition's bits
    executes: bool = True  # False for raise-only patterns (served by emission, not by NumPy)

    @property
    def fidelity(self):
        """COMPOSED when the home executor walks the composition's IEEE operations in order, else ENVELOPE."""
        return Fidelity.COMPOSED if self.bit_identical else Fidelity.ENVELOPE

    def discover(self, view: StructureView) -> list[Candidate]:
        """Every match in the wanted closure; by default, ``_match`` tried at each node as a root."""
        found = []
        for n in sorted(view.wanted):
            candidate = self._match(view, n)
            if candidate is not None:
                found.append(candidate)
        return found

    def _match(self, view: StructureView, root: int) -> Candidate | None:
        raise NotImplementedError

    def execute(self, candidate: Candidate, value, network, kernel_of):
        """Compute the root's value.

        ``value(n)`` reads an operand computed outside the group;
        ``kernel_of(n)`` is node n's kernel under the plan's posture.
        """
        raise NotImplementedError
