"""Recording: a tape appends nodes, a Value proxies one node while the tape is open.

Shapes and element types are inferred at the recording line; a mismatch
raises there, naming the line, the opcode, both shapes and a fix.
Sealing freezes the tape into a :class:`~topos.network.Network`.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .element import Selection, SelectionType, is_element, short_name
from .errors import SealedError, ShapeError, SymbolError
from .opcodes import Opcode, Refusal, Spec, by_name
from .provenance import Site, user_site
from .recordable import Recordable
from .symbol import Family, Symbol

_LEAF, _PARAMETER, _INPUT = by_name("leaf"), by_name("parameter"), by_name("input")


class Value(Recordable):
    """A recording proxy for one node on an open tape; arithmetic on it records nodes."""

    __slots__ = ("_tape", "_index")

    def __init__(self, tape: "Tape", index: int):
        self._tape = tape
        self._index = index

    @property
    def shape(self) -> tuple[int, ...]:
        return self._tape._specs[self._index].shape

    @property
    def dtype(self):
        return self._tape._specs[self._index].dtype

    @property
    def symbol(self) -> Symbol:
        return Symbol(self._tape._family, self._index)

    @property
    def tape(self) -> "Tape":
        return self._tape

    def _express(self, opcode, operands, attributes):
        return self._tape._append(opcode, operands, attributes)

    def _constant(self, array):
        return self._tape.leaf(array)

    def __repr__(self) -> str:
        spec = self._tape._specs[self._index]
        return f"Value(%{self._index} {self._tape._opcodes[self._index].name} {spec})"

    def __bool__(self):
        raise TypeError("a Value has no truth value while recording; shapes are static, so branch on .shape")

    __hash__ = object.__hash__


class Tape:
    """An open recording: append-only nodes with static shapes.

    Use :meth:`record` to build and seal in one call, or create a tape,
    record on it, and call :meth:`seal`.
    """

    def __init__(self, _family: Family | None = None):
        self._family = _family or Family()
        self._opcodes: list[Opcode] = []
        self._operands: list[tuple[int, ...]] = []
        self._attributes: list[tuple[tuple[str, Any], ...]] = []
        self._specs: list[Spec] = []
        self._sites: list[Site] = []
        self._payloads: dict[int, np.ndarray] = {}
        self._sealed = False

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def record(cls, fn: Callable[["Tape"], Any]):
        """Record ``fn(tape)``, seal, and return ``(network, symbols)``.

        Whatever ``fn`` returns is detached: any nesting of tuples, lists and
        dicts of Values becomes the same structure of Symbols.
        """
        tape = cls()
        result = fn(tape)
        return tape.seal(), detach(result)

    def leaf(self, value) -> Value:
        """A constant node holding ``value`` (an array, a number, or a selection)."""
        return self._source(_LEAF, value)

    def parameter(self, initial) -> Value:
        """A trainable node; ``initial`` fills its slot in ``network.parameters()``."""
        return self._source(_PARAMETER, initial)

    def input(self, default) -> Value:
        """A node fed per run; ``default`` fixes its shape and element type and is used when not fed."""
        return self._source(_INPUT, default)

    def resolve(self, symbol: Symbol) -> Value:
        """The Value of ``symbol`` on this tape (for example after ``network.reopen()``)."""
        self._check_open()
        self._check_symbol(symbol)
        return Value(self, symbol.index)

    def seal(self):
        """Freeze the recording into an immutable Network; this tape cannot record again."""
        from .network import Network

        self._check_open()
        self._sealed = True
        return Network._from_tape(self)

    # -- differentiation ----------------------------------------------------------------------
    def differentiate(self, loss, wrt):
        """Append d loss / d wrt as ordinary nodes (recorded reverse mode) -> Adjoints.

        ``loss`` must be rank 0. ``wrt`` lists parameters or inputs (Values
        or Symbols); one that the loss does not depend on gets a recorded zero.
        """
        from .differentiate import record_vjp

        return record_vjp(self, loss, None, list(wrt), require_scalar=True)

    def vjp(self, target, seed, wrt):
        """Append the vector-Jacobian product seed^T * d target / d wrt -> Adjoints.

        ``seed`` has the target's shape: an array (recorded as a leaf) or a
        Value, which may itself be computed (a gradient gives a
        Hessian-vector product).
        """
        from .differentiate import record_vjp

        return record_vjp(self, target, seed, list(wrt), require_scalar=False)

    # -- introspection ----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._opcodes)

    @property
    def sealed(self) -> bool:
        return self._sealed

    def describe(self) -> str:
        """One line per node recorded so far, then a summary."""
        from .network import describe_columns

        return describe_columns(self, "tape")

    # -- internals ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._sealed:
            raise SealedError(
                "this tape is sealed; reopen the network (network.reopen()) and "
                "resolve symbols on the new tape to record more"
            )

    def _check_symbol(self, symbol: Symbol) -> None:
        if not isinstance(symbol, Symbol) or symbol.family is not self._family:
            raise SymbolError(f"{symbol!r} does not belong to this tape's family")
        if not 0 <= symbol.index < len(self._opcodes):
            raise SymbolError(f"{symbol!r} is beyond this tape's {len(self._opcodes)} nodes")

    def _source(self, opcode: Opcode, value) -> Value:
        self._check_open()
        site = user_site()
        array, dtype = _payload(value, opcode.name, site)
        return self._push(opcode, (), (), Spec(array.shape, dtype), site, array)

    def _append(self, opcode: Opcode, operands, attributes: dict) -> Value:
        self._check_open()
        indices = []
        for position, operand in enumerate(operands):
            if not isinstance(operand, Value):
                raise SymbolError(
                    f"{user_site()}: {opcode.name}: operand {position} is a "
                    f"{type(operand).__name__}, not a Value of this tape"
                )
            if operand._tape is not self:
                if operand._tape._sealed and operand._tape._family is self._family:
                    raise SealedError(
                        f"{user_site()}: {opcode.name}: operand {position} is a Value of a sealed tape; "
                        "use tape.resolve(symbol) to bring it onto the reopened tape"
                    )
                raise SymbolError(
                    f"{user_site()}: {opcode.name}: operand {position} belongs to another tape; "
                    "values of two tapes cannot be mixed"
                )
            indices.append(operand._index)
        ordered = tuple(
            (name, _freeze(attributes[name])) for name in opcode.attribute_names if name in attributes
        )
        unknown = set(attributes) - set(opcode.attribute_names)
        site = user_site()
        if unknown or len(ordered) != len(opcode.attribute_names):
            raise ShapeError(
                f"{site}: {opcode.name}: attributes {sorted(attributes)} given, "
                f"expected exactly {list(opcode.attribute_names)}"
            )
        specs = [self._specs[i] for i in indices]
        try:
            spec = opcode.infer(*specs, **dict(ordered))
        except Refusal as refusal:
            shapes = ", ".join(str(s) for s in specs)
            message = f"{site}: {opcode.name}: {refusal.detail} (operands: {shapes})"
            if refusal.hint:
                message += f"\n  hint: {refusal.hint}"
            raise ShapeError(message) from None
        if any(d < 1 for d in spec.shape):
            raise ShapeError(f"{site}: {opcode.name}: result shape {list(spec.shape)} is empty")
        return self._push(opcode, tuple(indices), ordered, spec, site, None)

    def _push(self, opcode, operands, attributes, spec, site, payload) -> Value:
        index = len(self._opcodes)
        self._opcodes.append(opcode)
        self._operands.append(operands)
        self._attributes.append(attributes)
        self._specs.append(spec)
        self._sites.append(site)
        if payload is not None:
            self._payloads[index] = payload
        return Value(self, index)


def _freeze(value):
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, np.integer):
        return int(value)
    return value


def _payload(value, kind: str, site: Site) -> tuple[np.ndarray, Any]:
    """Turn a recorded payload into a read-only array and its element type."""
    if isinstance(value, Selection):
        array = value.indices.copy()
        dtype = SelectionType(value.extent)
    elif isinstance(value, Recordable):
        raise ShapeError(f"{site}: {kind}: payload is a Value; sources take arrays or numbers")
    else:
        array = np.array(value)
        if array.dtype.kind in "iub" and not isinstance(value, np.ndarray):
            array = array.astype(np.float64)  # a bare Python number or list means float64
        if not is_element(array.dtype):
            raise ShapeError(
                f"{site}: {kind}: element type {array.dtype} is not supported; "
                "use float32, float64 or ml_dtypes.bfloat16 (integer indices go in topos.selection)"
            )
        dtype = array.dtype
    if array.size == 0:
        raise ShapeError(f"{site}: {kind}: empty tensors (shape {list(array.shape)}) are not allowed")
    array.flags.writeable = False
    return array, dtype


def detach(result):
    """Replace every Value in a nest of tuples, lists and dicts by its Symbol."""
    if isinstance(result, Value):
        return result.symbol
    if isinstance(result, tuple):
        return tuple(detach(r) for r in result)
    if isinstance(result, list):
        return [detach(r) for r in result]
    if isinstance(result, dict):
        return {k: detach(v) for k, v in result.items()}
    if hasattr(result, "detach") and not isinstance(result, type):
        return result.detach()
    return result


__all__ = ["Tape", "Value", "detach", "short_name"]
