"""Parameters: the caller-owned state, one read-only array per parameter slot.

A training step is a pure transform of this table; the network never
changes. The same type carries gradients by slot and optimizer moments.
Each slot also carries its name (``fc1.weight``, or ``%<index>`` for an
unnamed one) and whether it is trainable or state, so a table can be read,
replaced, saved and moved to another recording by name.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping

import numpy as np

from topos.base.copies import own
from topos.base.element import Overflow, convert_checked, host_array, is_element, short_name
from topos.base.errors import ArgumentError, FeedError, SymbolError
from topos.spec.symbol import Family, Symbol


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


class Parameters:
    """An immutable slot table: ``parameters[symbol]`` is that parameter's array."""

    __slots__ = ("_family", "_symbols", "_arrays", "_position", "_names", "_state")
    # NumPy would read a table as a sequence of Symbols (np.float64(0.1) * table): let it defer to __rmul__.
    __array_ufunc__ = None
    _family: Family
    _symbols: tuple[Symbol, ...]
    _arrays: tuple[np.ndarray, ...]
    _position: dict[int, int]
    _names: tuple[str, ...]
    _state: frozenset[int]

    @classmethod
    def _of(cls, family: Family, pairs, meta=None) -> Parameters:
        """A table of (symbol, array) pairs; ``meta`` is (name per slot, state indices)."""
        self = object.__new__(cls)
        set_ = object.__setattr__
        set_(self, "_family", family)
        set_(self, "_symbols", tuple(s for s, _ in pairs))
        set_(self, "_arrays", tuple(_frozen(np.array(a)) for _, a in pairs))
        set_(self, "_position", {s.index: i for i, s in enumerate(self._symbols)})
        names, state = meta if meta is not None else (tuple(f"%{s.index}" for s in self._symbols), frozenset())
        set_(self, "_names", tuple(names))
        set_(self, "_state", frozenset(state))
        return self

    def _like(self, pairs) -> Parameters:
        """A table over the same slots (and so the same names) as this one."""
        return Parameters._of(self._family, pairs, (self._names, self._state))

    def __setattr__(self, name, value):
        raise TypeError("Parameters are immutable; step, map or zip them into a new table")

    def __reduce__(self):
        raise TypeError(
            "Parameters are not pickled (pickle can run code on load); "
            "write a checkpoint with safetensors instead"
        )

    def __delattr__(self, name):
        raise TypeError("Parameters are immutable; step, map or zip them into a new table")

    def __copy__(self) -> Parameters:
        return self  # immutable, so the table is its own copy

    def __deepcopy__(self, memo) -> Parameters:
        # Fresh arrays, same family: the copy must still serve the same network.
        return self._like(list(zip(self._symbols, self._arrays)))

    # -- reading ---------------------------------------------------------------------------
    def __getitem__(self, symbol: Symbol | str) -> np.ndarray:
        """A read-only copy of a slot's array, by Symbol or by name (``parameters["fc1.weight"]``)."""
        return own(self._arrays[self._slot(symbol)])

    def __contains__(self, symbol) -> bool:
        symbol = getattr(symbol, "symbol", symbol)  # a recorded Value (model.weight) stands for its Symbol
        if isinstance(symbol, str):
            return symbol in self._names
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
        """Read-only copies of every slot's array, in slot order."""
        return tuple(own(a) for a in self._arrays)

    def items(self):
        """(Symbol, read-only copy of its array) per slot."""
        return zip(self._symbols, (own(a) for a in self._arrays))

    def names(self) -> tuple[str, ...]:
        """The name of every slot, in slot order (``%<index>`` for an unnamed one)."""
        return self._names

    def name(self, symbol: Symbol) -> str:
        return self._names[self._slot(symbol)]

    def named(self) -> dict[str, np.ndarray]:
        """A new dict name -> array over every slot, in slot order (read-only copies)."""
        return dict(zip(self._names, (own(a) for a in self._arrays)))

    def symbol(self, name: str) -> Symbol:
        """The Symbol of the slot called ``name``."""
        return self._symbols[self._slot(name)]

    def trainable(self, symbol: Symbol | str) -> bool:
        """True unless the slot is state (``tape.parameter(..., trainable=False)``)."""
        return self._symbols[self._slot(symbol)].index not in self._state

    def _slot(self, symbol: Symbol | str) -> int:
        symbol = getattr(symbol, "symbol", symbol)  # a recorded Value (model.weight) stands for its Symbol
        if isinstance(symbol, (int, np.integer, slice)) and not isinstance(symbol, bool):
            raise SymbolError(f"a table is indexed by Symbol or by name, not by position ({symbol!r}); use "
                              "table[table.names()[0]], or table.arrays()[0] for the first array")
        shown = ", ".join(self._names[:12]) + (", ..." if len(self._names) > 12 else "")
        if isinstance(symbol, str):
            try:
                return self._names.index(symbol)
            except ValueError:
                raise SymbolError(f"no slot is named {symbol!r}; the slots are: {shown}") from None
        if not isinstance(symbol, Symbol) or symbol.family is not self._family:
            raise SymbolError(f"{symbol!r} is not a parameter of this table's network")
        try:
            return self._position[symbol.index]
        except KeyError:
            raise SymbolError(f"{symbol!r} is not a parameter slot of this table: only parameters have slots "
                              f"(here: {shown}); an input or a result is read from a run") from None

    def __repr__(self) -> str:
        slots = ", ".join(f"{n}: {list(a.shape)} {a.dtype}" for n, a in zip(self._names, self._arrays))
        return f"Parameters({{{slots}}})"

    def _repr_html_(self) -> str:
        from topos.views.display import parameters_card  # the Jupyter card, loaded only when a notebook asks

        return parameters_card(self)

    # -- algebra: every result is a new table ---------------------------------------------
    def _rebuilt(self, arrays) -> Parameters:
        """A table of ``arrays``, one per slot: shapes must match, and a float array is converted to the slot's type.

        The conversion rounds once (``element.convert``): a float32 master
        copy feeds a bfloat16 slot, a rule may return float64. A finite
        value the slot's type cannot hold (it would become inf) is refused.
        """
        checked = []
        for name, old, new in zip(self._names, self._arrays, arrays):
            new = _host(name, new)
            if new.shape != old.shape:
                raise FeedError(
                    f"parameter {name}: the update has shape {list(new.shape)}, "
                    f"the slot holds {list(old.shape)}"
                )
            if new.dtype != old.dtype:
                if new.dtype.kind not in "fV":
                    raise FeedError(
                        f"parameter {name}: the update has element type {new.dtype}, the slot holds "
                        f"{short_name(old.dtype)}; hand it floats (convert with .astype(...) first)"
                    )
                converted, overflow = convert_checked(new, old.dtype)
                if overflow is not None:
                    raise _cannot_hold(name, overflow, f"the {new.dtype} value")
                new = converted
            checked.append(new)
        return self._like(list(zip(self._symbols, checked)))

    def _aligned(self, other: Parameters) -> None:
        if not isinstance(other, Parameters) or other._family is not self._family or (
            other._symbols != self._symbols
        ):
            raise SymbolError(
                "the two tables do not hold the same parameter slots; tables combine only when "
                "they come from the same network (network.parameters(), gradients.parameters(table))"
            )

    def map(self, fn: Callable[[np.ndarray], np.ndarray]) -> Parameters:
        """A new table with ``fn`` applied to (a copy of) every slot."""
        if not callable(fn):
            raise ArgumentError(f"map takes a function of one slot's array, got {type(fn).__name__} {fn!r}")
        return self._rebuilt([fn(own(a)) for a in self._arrays])

    def zip(self, *tables_then_fn) -> Parameters:
        """A new table with ``fn(mine, theirs, ...)`` per slot: ``a.zip(b, c, fn)``.

        Any number of tables over the same slots, the function last (for
        example ``g1.zip(g2, g3, lambda a, b, c: (a + b + c) / 3)`` to
        average the gradients of three micro-batches).
        """
        if not tables_then_fn:
            raise ArgumentError("zip takes the tables first and the function last: a.zip(b, fn); no function was given")
        *others, fn = tables_then_fn
        if not callable(fn):
            raise ArgumentError(
                f"zip takes the tables first and the function last: a.zip(b, fn); the last argument is a "
                f"{type(fn).__name__}, not a function"
            )
        for other in others:
            self._aligned(other)
        rows = zip(self._arrays, *(o._arrays for o in others))
        return self._rebuilt([fn(*(own(a) for a in arrays)) for arrays in rows])

    def step(self, direction: Parameters, rule: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Parameters:
        """The next state: ``rule(parameter, direction)`` per slot (for example ``p - g * lr``)."""
        return self.zip(direction, rule)

    def _arithmetic(self, others: tuple[Parameters, ...], fn: Callable[..., np.ndarray], shown: str) -> Parameters:
        """``fn`` of each slot (and the others' same slot) for an operator; a finite value made inf or NaN is refused.

        NumPy computes a float32 slot times a Python float in float32, so
        ``table * 1e39`` would become inf with only a warning, while
        ``table * np.float64(1e39)`` computes in float64 and its conversion
        back is refused: both are refused here, the same way.
        """
        for other in others:
            self._aligned(other)
        results = []
        for name, arrays in zip(self._names, zip(self._arrays, *(o._arrays for o in others))):
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # refused below, not warned about
                result = np.asarray(fn(*arrays))
                finite = np.logical_and.reduce([np.isfinite(a) for a in arrays])
                lost = finite & ~np.isfinite(result)
            if lost.any():
                raise _made_infinite(name, arrays, fn, result, lost, shown)
            results.append(result)
        return self._rebuilt(results)

    def __add__(self, other: Parameters) -> Parameters:
        return self._arithmetic((_table(other, "+"),), lambda a, b: a + b, "table + table")

    __radd__ = __add__  # reached only with a non-table on the left (1.0 + table): refused with the fix

    def __neg__(self) -> Parameters:
        return self.map(lambda a: -a)

    def __mul__(self, scalar) -> Parameters:
        if isinstance(scalar, Parameters):
            return self._arithmetic((scalar,), lambda a, b: a * b, "table * table")
        number = _number(scalar, "*")
        return self._arithmetic((), lambda a: a * number, f"table * {number!r}")

    __rmul__ = __mul__

    def __sub__(self, other: Parameters) -> Parameters:
        return self._arithmetic((_table(other, "-"),), lambda a, b: a - b, "table - table")

    def __rsub__(self, other) -> Parameters:
        return _table(other, "-") - self

    def __truediv__(self, scalar) -> Parameters:
        number = _number(scalar, "/")
        if number == 0:
            raise ArgumentError("Parameters / 0 would fill every slot with inf or nan; divide by a non-zero number")
        return self._arithmetic((), lambda a: a / number, f"table / {number!r}")

    def with_payloads(self, pairs) -> Parameters:
        """A new table with some slots replaced, by Symbol or by name.

        Shapes must match. A float array of another type is converted to
        the slot's type, rounding once (a float32 master copy into a
        bfloat16 slot); an integer array, or a value the slot's type cannot
        hold (``1e300`` into float32), is refused with a FeedError.
        """
        if isinstance(pairs, Parameters) or not isinstance(pairs, (Mapping, list, tuple)):
            fix = ("to take slots by name from another table, use network.parameters(table)"
                   if isinstance(pairs, Parameters) else "e.g. {weight: array} or {'fc1.weight': array}")
            raise ArgumentError(f"with_payloads takes a mapping of Symbol or name to array (or a list of such "
                                f"pairs), got {type(pairs).__name__}; {fix}")
        items = list(pairs.items()) if isinstance(pairs, Mapping) else list(pairs)
        if not all(isinstance(pair, tuple) and len(pair) == 2 for pair in items):
            raise ArgumentError("with_payloads takes (Symbol or name, array) pairs; wrap one pair in a list: "
                                "with_payloads([(weight, array)])")
        replaced, given = list(self._arrays), dict[int, object]()
        for symbol, array in items:
            slot = self._slot(symbol)
            if slot in given:
                raise FeedError(f"with_payloads names slot {self._names[slot]} twice ({given[slot]!r} and "
                                f"{symbol!r}); give it once")
            given[slot] = symbol
            replaced[slot] = array
        return self._rebuilt(replaced)

    def carried(self, network) -> Parameters:
        """This state carried onto a reopened, longer network: new slots take their initials."""
        if not hasattr(network, "parameters") or not hasattr(network, "family"):
            raise ArgumentError(f"carried takes the reopened Network, got {type(network).__name__}")
        fresh = network.parameters()
        if fresh._family is not self._family:
            raise SymbolError("carried: the network belongs to another tape family")
        mine = dict(zip((s.index for s in self._symbols), self._arrays))
        return fresh._like([(s, mine.get(s.index, a)) for s, a in zip(fresh._symbols, fresh._arrays)])


def _cannot_hold(name: str, overflow: Overflow, what: str) -> FeedError:
    return FeedError(f"parameter {name} is {overflow.element}, which cannot hold {what} {overflow}; "
                     "scale the value into range, or record the parameter with a wider element type")


def _made_infinite(name: str, arrays, fn, result: np.ndarray, lost: np.ndarray, shown: str) -> FeedError:
    """The FeedError for an operator that turned a finite value of slot ``name`` into inf or NaN."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        exact = np.asarray(fn(*(a.astype(np.float64) for a in arrays)))  # the value the slot's type could not hold
    _, overflow = convert_checked(exact, arrays[0].dtype)
    if overflow is not None:
        return _cannot_hold(name, overflow, f"what {shown} gives,")
    at = tuple(int(k) for k in np.argwhere(lost)[0])
    where = f" at position {at}" if at else ""
    inputs = " and ".join(repr(float(a[at])) for a in arrays)
    # No single value to name: float64 overflows too, or a scalar the slot's type cannot hold (0 * 1e39 in f32).
    return FeedError(f"parameter {name} is {short_name(arrays[0].dtype)}, and {shown} turns its finite {inputs}"
                     f"{where} into {result[at]}; scale the value into range, or record the parameter with a wider "
                     "element type")


def _host(name: str, value) -> np.ndarray:
    """A slot's new value (a NumPy array, a torch tensor or jax array, a list) as a NumPy array, else a FeedError."""
    try:
        return np.asarray(host_array(value))
    except (TypeError, ValueError, RuntimeError, BufferError, NotImplementedError) as error:
        raise FeedError(
            f"parameter {name}: the {type(value).__name__} handed to it does not convert to a NumPy array "
            f"({error}); hand it a NumPy array, or a tensor with data on the CPU"
        ) from None


def _number(scalar, operator: str):
    """The scalar of ``table * scalar`` or ``table / scalar``: a real number, else an ArgumentError."""
    array = np.asarray(scalar) if isinstance(scalar, (int, float, np.generic, np.ndarray)) else None
    if (isinstance(scalar, (bool, np.bool_)) or array is None or array.ndim != 0
            or not (array.dtype.kind in "iuf" or is_element(array.dtype))):
        raise ArgumentError(
            f"Parameters {operator} takes a number{' or a table over the same slots' if operator == '*' else ''}, got "
            f"{type(scalar).__name__} {scalar!r}; use .map(fn) or .zip(other, fn) for anything else"
        )
    if not np.isfinite(array.astype(np.float64)):
        raise ArgumentError(f"Parameters {operator} {scalar!r} would fill every slot with inf or nan; "
                            "pass a finite number")
    return scalar


def _table(other, operator: str) -> Parameters:
    """The other side of ``table + other`` or ``table - other``: a table, else an ArgumentError with the fix."""
    if not isinstance(other, Parameters):
        raise ArgumentError(
            f"Parameters {operator} takes a table over the same slots, got {type(other).__name__} {other!r}; "
            f"for a number on every slot use table.map(lambda a: a {operator} number)"
        )
    return other


def check_keyed_by_name(source: Mapping, call: str) -> None:
    """Refuse a mapping of slots keyed by anything but names, an ArgumentError naming ``call`` and the first key.

    ``dict(table.items())`` is keyed by Symbol and ``{0: array}`` by position;
    written out or matched by ``str(key)`` they would become names such as
    ``%0`` that no network holds.
    """
    key = next((k for k in source if not isinstance(k, str)), None)
    if key is not None:
        raise ArgumentError(f"{call} takes slots by name, but the source is keyed by {type(key).__name__} "
                            f"({key!r}); pass table.named(), or the Parameters table itself, or key each array "
                            "by its slot name")


def by_names(table: Parameters, source, strict: bool) -> Parameters:
    """``table`` with every slot taken by name from ``source`` (a Parameters table or a mapping)."""
    if not isinstance(source, (Parameters, Mapping)):
        fix = ("for a file, use topos.checkpoint.load(path, network)" if isinstance(source, (str, os.PathLike))
               else "pass a Parameters table or a mapping of slot name to array")
        raise ArgumentError(f"network.parameters(source) takes a Parameters table or a mapping of name to "
                            f"array, got {type(source).__name__}; {fix}")
    named = dict(zip(source._names, source._arrays)) if isinstance(source, Parameters) else dict(source)
    check_keyed_by_name(named, "network.parameters(source)")
    missing, mismatched, arrays = [], [], []
    for name, initial in zip(table._names, table._arrays):
        if name not in named:
            missing.append(name)
            arrays.append(initial)
            continue
        array = _host(name, named[name])  # torch or jax arrays too (bf16 bit for bit)
        if array.shape != initial.shape or array.dtype != initial.dtype:
            mismatched.append(
                f"{name}: the source holds {list(array.shape)} {array.dtype}, "
                f"this network records {list(initial.shape)} {initial.dtype}"
            )
        arrays.append(array)
    problems = []
    if missing and strict:
        problems.append("missing from the source: " + ", ".join(missing))
    problems += mismatched
    if problems:
        raise FeedError(
            "the source does not fit this network's parameters:\n  " + "\n  ".join(problems)
            + "\n  record the same model (same module paths and sizes) in both recordings"
            + ("; pass strict=False to keep the initials of missing slots" if missing and strict else "")
        )
    return table._like(list(zip(table._symbols, arrays)))
