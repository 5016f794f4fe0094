"""Symbols: the detached names of nodes, valid across sealing and reopening."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass

from topos.base.errors import SymbolError

_families = itertools.count(1)


class Family:
    """The identity shared by a tape and every network sealed or reopened from it."""

    __slots__ = ("number", "reopened_at", "_lock")

    def __init__(self):
        self.number = next(_families)
        # Lengths of the networks already reopened: history stays linear, so
        # each sealed prefix may be continued once.
        self.reopened_at: set[int] = set()
        self._lock = threading.Lock()

    def claim_reopening(self, length: int) -> bool:
        """Mark the network of ``length`` nodes reopened; False if it already was (atomic across threads)."""
        with self._lock:
            if length in self.reopened_at:
                return False
            self.reopened_at.add(length)
            return True

    def __repr__(self) -> str:
        return f"family {self.number}"

    # The family is an identity: a copy would be another family, and every Symbol copied with it
    # would stop naming its network's nodes. So copies (of a dict of Symbols, of Updates) share it.
    def __copy__(self) -> Family:
        return self

    def __deepcopy__(self, memo) -> Family:
        return self

    def __reduce__(self):
        raise SymbolError(
            "Symbols are not pickled: a Symbol names a node of a network in this process, and its family "
            "means nothing in another; save the node's name or index (network.named(name) and "
            "network.symbol(index) find it again), and write parameters with topos.checkpoint"
        )


@dataclass(frozen=True, eq=True)
class Symbol:
    """The name of one node: its tape family and its index. Nodes never move."""

    family: Family
    index: int

    def __repr__(self) -> str:
        return f"%{self.index}"

    def __hash__(self) -> int:
        return hash((id(self.family), self.index))
