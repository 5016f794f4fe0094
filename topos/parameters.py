"""Parameters: the caller-owned state, one read-only array per parameter slot.

A training step is a pure transform of this table; the network never
changes. The same type carries gradients by slot and optimizer moments.
"""

from __future__ import annotations

from typing import Callable, Iterator

import numpy as np

from .errors import FeedError, SymbolError
from .symbol import Family, Symbol


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


class Parameters:
    """An immutable slot table: ``parameters[symbol]`` is that parameter's array."""

    __slots__ = ("_family", "_symbols", "_arrays", "_position")

    @classmethod
    def _of(cls, family: Family, pairs) -> "Parameters":
        self = object.__new__(cls)
        object.__setattr__(self, "_family", family)
        object.__setattr__(self, "_symbols", tuple(s for s, _ in pairs))
        object.__setattr__(self, "_arrays", tuple(_frozen(np.array(a)) for _, a in pairs))
        object.__setattr__(self, "_position", {s.index: i for i, s in enumerate(self._symbols)})
        return self

    def __setattr__(self, name, value):
        raise TypeError("Parameters are immutable; step, map or zip them into a new table")

    def __reduce__(self):
        raise TypeError(
            "Parameters are not pickled (pickle can run code on load); "
            "write a checkpoint with safetensors instead"
        )

    def __delattr__(self, name):
        raise TypeError("Parameters are immutable; step, map or zip them into a new table")

    def __copy__(self) -> "Parameters":
        return self  # immutable, so the table is its own copy

    def __deepcopy__(self, memo) -> "Parameters":
        # Fresh arrays, same family: the copy must still serve the same network.
        return Parameters._of(self._family, list(self.items()))

    # -- reading ---------------------------------------------------------------------------
    def __getitem__(self, symbol: Symbol) -> np.ndarray:
        return self._arrays[self._slot(symbol)]

    def __contains__(self, symbol) -> bool:
        return (
            isinstance(symbol, Symbol)
            and symbol.family is self._family
            and symbol.index in self._position
        )

    def __len__(self) -> int:
        return len(self._symbols)

    def __iter__(self) -> Iterator[Symbol]:
        return iter(self._symbols)

    def symbols(self) -> tuple[Symbol, ...]:
        return self._symbols

    def arrays(self) -> tuple[np.ndarray, ...]:
        return self._arrays

    def items(self):
        return zip(self._symbols, self._arrays)

    def _slot(self, symbol: Symbol) -> int:
        if not isinstance(symbol, Symbol) or symbol.family is not self._family:
            raise SymbolError(f"{symbol!r} is not a parameter of this table's network")
        try:
            return self._position[symbol.index]
        except KeyError:
            raise SymbolError(f"{symbol!r} is not a parameter slot of this table") from None

    def __repr__(self) -> str:
        slots = ", ".join(f"{s!r}: {list(a.shape)} {a.dtype}" for s, a in self.items())
        return f"Parameters({{{slots}}})"

    # -- algebra: every result is a new table ---------------------------------------------
    def _rebuilt(self, arrays) -> "Parameters":
        checked = []
        for symbol, old, new in zip(self._symbols, self._arrays, arrays):
            new = np.asarray(new)
            if new.shape != old.shape:
                raise FeedError(
                    f"parameter {symbol!r}: the update has shape {list(new.shape)}, "
                    f"the slot holds {list(old.shape)}"
                )
            if new.dtype != old.dtype:
                if new.dtype.kind not in "fV":
                    raise FeedError(f"parameter {symbol!r}: the update has element type {new.dtype}")
                new = new.astype(old.dtype)
            checked.append(new)
        return Parameters._of(self._family, list(zip(self._symbols, checked)))

    def _aligned(self, other: "Parameters") -> None:
        if not isinstance(other, Parameters) or other._family is not self._family or (
            other._symbols != self._symbols
        ):
            raise SymbolError("the two tables do not hold the same parameter slots")

    def map(self, fn: Callable[[np.ndarray], np.ndarray]) -> "Parameters":
        """A new table with ``fn`` applied to every slot."""
        return self._rebuilt([fn(a) for a in self._arrays])

    def zip(self, other: "Parameters", fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> "Parameters":
        """A new table with ``fn(mine, theirs)`` per slot."""
        self._aligned(other)
        return self._rebuilt([fn(a, b) for a, b in zip(self._arrays, other._arrays)])

    def step(self, direction: "Parameters", rule: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> "Parameters":
        """The next state: ``rule(parameter, direction)`` per slot (for example ``p - g * lr``)."""
        return self.zip(direction, rule)

    def __add__(self, other: "Parameters") -> "Parameters":
        return self.zip(other, lambda a, b: a + b)

    def __mul__(self, scalar) -> "Parameters":
        if isinstance(scalar, Parameters):
            return self.zip(scalar, lambda a, b: a * b)
        return self.map(lambda a: a * scalar)

    __rmul__ = __mul__

    def with_payloads(self, pairs) -> "Parameters":
        """A new table with some slots replaced (shape and element type checked)."""
        replaced = list(self._arrays)
        for symbol, array in dict(pairs).items():
            replaced[self._slot(symbol)] = array
        return self._rebuilt(replaced)

    def carried(self, network) -> "Parameters":
        """This state carried onto a reopened, longer network: new slots take their initials."""
        fresh = network.parameters()
        if fresh._family is not self._family:
            raise SymbolError("carried: the network belongs to another tape family")
        mine = {s.index: a for s, a in self.items()}
        return Parameters._of(
            self._family, [(s, mine.get(s.index, a)) for s, a in fresh.items()]
        )
