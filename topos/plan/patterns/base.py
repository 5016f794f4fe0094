"""What a fusion pattern is, and the read-only view of the structure it matches against."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Candidate:
    """One fusion offer: a group of nodes a consumer may run as one kernel."""

    kind: str
    root: int  # the node whose value the group produces
    nodes: tuple[int, ...]  # every claimed node, root included, ascending
    reason: str
    bytes_saved: int  # temporaries the group never materializes
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def interior(self) -> tuple[int, ...]:
        return tuple(n for n in self.nodes if n != self.root)


class StructureView:
    """The frozen structure as a matcher sees it: the wanted closure, what is declared, who reads what."""

    def __init__(self, network, wanted: frozenset[int], readable: frozenset[int]):
        self.network = network
        self.wanted = wanted
        self.readable = readable
        consumers = network.consumers()
        self.consumers = {n: tuple(c for c in consumers[n] if c in wanted) for n in wanted}

    def opcode(self, n: int) -> str:
        return self.network._opcodes[n].name

    def operands(self, n: int) -> tuple[int, ...]:
        return self.network._operands[n]

    def attributes(self, n: int) -> dict:
        return dict(self.network._attributes[n])

    def spec(self, n: int):
        return self.network._specs[n]

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


class Pattern:
    """A matcher over the frozen structure, plus how the NumPy plan executes a match."""

    kind: str = ""
    bit_identical: bool = True  # the home executor reproduces the composition's bits
    executes: bool = True  # False for raise-only patterns (served by emission, not by NumPy)

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
