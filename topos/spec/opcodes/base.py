"""What an opcode is: a shape rule, a reference kernel, a derivative rule, and its reads.

Every opcode of the closed vocabulary is one subclass of :class:`Opcode`,
defined once, in the family module beside its relatives. The rule body is
written against the *recordable vocabulary* (operators and methods that
every payload speaks), so the same body computes gradients on arrays in the
backward scan and records them as new nodes in ``differentiate``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import numpy as np

from topos.base.element import SelectionType, is_element, short_name
from topos.base.errors import ShapeError


class Refusal(Exception):
    """A shape rule's verdict; the tape turns it into a ShapeError at the user's line."""

    def __init__(self, detail: str, hint: str = ""):
        super().__init__(detail)
        self.detail = detail
        self.hint = hint


@dataclass(frozen=True)
class Spec:
    """What record time knows about a node: its static shape and element type."""

    shape: tuple[int, ...]
    dtype: Any  # np.dtype or SelectionType

    def __str__(self) -> str:
        return f"{list(self.shape)} {short_name(self.dtype)}"


OUTPUT = "output"

# What a 64-bit size (NumPy's, MLIR's element count) can count: no array holds more bytes, so a
# spec beyond it is refused where it is recorded rather than by NumPy or the MLIR binding later.
MAX_BYTES = 2**63 - 1


def spec_bytes(spec: Spec) -> int:
    """Bytes of a value of ``spec`` (a selection's indices are int64)."""
    itemsize = spec.dtype.itemsize if isinstance(spec.dtype, np.dtype) else 8
    return math.prod(spec.shape) * itemsize  # Python ints: no wrap-around for huge tensors


def check_size(spec: Spec, prefix: str) -> None:
    """A ShapeError, its message starting with ``prefix``, when no array can hold a value of ``spec``."""
    size = spec_bytes(spec)
    if size > MAX_BYTES:
        raise ShapeError(
            f"{prefix}shape {list(spec.shape)} {short_name(spec.dtype)} would hold about 2**{size.bit_length() - 1} "
            "bytes, more than any array can (2**63 - 1, what a 64-bit size counts); record a smaller shape"
        )


class Opcode:
    """One instruction of the closed vocabulary (payload-free; a singleton per opcode)."""

    name: ClassVar[str]
    arity: ClassVar[int]
    attribute_names: ClassVar[tuple[str, ...]] = ()
    # Which payloads the derivative rule reads: operand positions and/or OUTPUT. The
    # checkpointed backward (topos.readings.recompute) hands a rule exactly these, so a missing one fails.
    READS: ClassVar[frozenset] = frozenset()

    @property
    def is_source(self) -> bool:
        return self.arity == 0

    def reads(self, **attributes) -> frozenset:
        """Operand positions (and ``"output"``) the derivative rule reads."""
        return self.READS

    def infer(self, *specs: Spec, **attributes) -> Spec:
        """The shape rule: the output spec, or a Refusal naming the mismatch."""
        raise NotImplementedError

    def checked(self, specs, attributes: dict, site=None) -> Spec:
        """``infer``'s spec, or a ShapeError naming the operands: what every payload is held to.

        The message starts with ``site`` when given (the tape's, found once
        per node anyway); otherwise ShapeError finds the user's line itself,
        so an Eager expression walks the frames only when it fails.
        """
        prefix = "" if site is None else f"{site}: "
        try:
            spec = self.infer(*specs, **attributes)
        except Refusal as refusal:
            message = f"{prefix}{self.name}: {refusal.detail} (operands: {', '.join(str(s) for s in specs)})"
            if refusal.hint:
                message += f"\n  hint: {refusal.hint}"
            raise ShapeError(message) from None
        if any(d < 1 for d in spec.shape):
            raise ShapeError(f"{prefix}{self.name}: result shape {list(spec.shape)} is empty")
        check_size(spec, f"{prefix}{self.name}: the result's ")
        return spec

    def kernel(self, *arrays: np.ndarray, **attributes) -> np.ndarray:
        """The reference kernel: the oracle's bits for this opcode."""
        raise NotImplementedError

    def rule(self, *args, **attributes):
        """The derivative rule: ``rule(*operands, output, seed)`` -> one cotangent or None per operand."""
        raise NotImplementedError

    def express(self, operands, attributes=None):
        """Run this opcode on arrays, or record it on a tape, depending on the payload.

        Arrays go through the reference kernel and give the oracle's bits
        (inside ``with topos.posture(Numerics.FAST):`` a fast kernel may serve);
        tape Values record one node; any other payload that speaks the
        recordable vocabulary (for example a dual number) handles it itself.
        """
        attributes = dict(attributes or {})
        operands = tuple(operands)
        if self.is_source:
            raise TypeError(f"{self.name} is a source; it has no operands to express over")
        if len(operands) != self.arity:
            raise TypeError(f"{self.name} takes {self.arity} operands, got {len(operands)}")
        first = operands[0]
        if isinstance(first, np.ndarray) or np.isscalar(first):
            arrays = tuple(np.asarray(x) for x in operands)
            return _arrays().kernel(self, attributes)(*arrays)  # topos.posture picks it (reference by default)
        return first._express(self, operands, attributes)

    def vjp(self, operands, output, seed, attributes=None):
        """The derivative rule applied once: one cotangent (or None) per operand.

        With array payloads the cotangents are arrays with the oracle's
        bits; with tape Values the rule records its nodes.
        """
        attributes = dict(attributes or {})
        if isinstance(seed, np.ndarray) or np.isscalar(seed):  # the rule speaks the recordable vocabulary
            reading = _arrays()
            wrapped = [reading.wrap(x) for x in (*operands, output, seed)]
            result = self.rule(*wrapped, **attributes)
            return tuple(None if c is None else reading.unwrap(c) for c in result)
        return tuple(self.rule(*operands, output, seed, **attributes))

    def __repr__(self) -> str:
        return f"Opcode({self.name})"

    def __reduce__(self):
        return (by_name, (self.name,))


class ArrayReading(NamedTuple):
    """How plain arrays are read: the kernel ``express`` runs on them, the payload ``vjp`` wraps them in."""

    kernel: Callable[[Opcode, dict], Callable[..., np.ndarray]]
    wrap: Callable[[Any], Any]
    unwrap: Callable[[Any], np.ndarray]


# Evaluation on arrays is a reading of the same rules, as JAX's evaluation is one more trace. This
# layer knows no reading, so the reading installs itself here when it loads (topos.readings.eager,
# which import topos loads), and the dependency points up from it, not down from here.
_array_reading: ArrayReading | None = None


def evaluate_arrays_with(reading: ArrayReading) -> None:
    """Install the reading that ``Opcode.express`` and ``Opcode.vjp`` apply to plain arrays."""
    global _array_reading
    _array_reading = reading


def _arrays() -> ArrayReading:
    if _array_reading is None:
        raise RuntimeError("no reading of arrays is installed; import topos (it loads topos.readings.eager)")
    return _array_reading


REGISTRY: dict[str, Opcode] = {}


def register(cls: type[Opcode]) -> Opcode:
    """Create the one instance of an opcode class and enter it in the vocabulary."""
    instance = cls()
    if cls.name in REGISTRY:
        raise RuntimeError(f"opcode {cls.name} defined twice")
    REGISTRY[cls.name] = instance
    return instance


def by_name(name: str) -> Opcode:
    """The opcode spelled ``name`` (as in describe lines and MLIR op names)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"no opcode named {name!r}; the vocabulary is {sorted(REGISTRY)}") from None


# ---- shared shape-rule helpers -------------------------------------------------------


def element_operand(spec: Spec, role: str = "operand") -> None:
    """Refuse index payloads where a floating tensor is needed."""
    if not is_element(spec.dtype):
        raise Refusal(
            f"{role} has element type {short_name(spec.dtype)}, expected a float tensor",
            "selections can only be the index operand of gather or scatter",
        )


def same_specs(a: Spec, b: Spec) -> Spec:
    """Elementwise binary rule: equal shapes and equal element types, no implicit broadcast."""
    element_operand(a, "left operand")
    element_operand(b, "right operand")
    if a.shape != b.shape:
        raise Refusal(
            f"shapes {list(a.shape)} and {list(b.shape)} differ",
            "elementwise operations never broadcast implicitly; "
            "use broadcast_to(shape) or broadcast_along(axis, extent) on the smaller operand",
        )
    if a.dtype != b.dtype:
        raise Refusal(
            f"element types {short_name(a.dtype)} and {short_name(b.dtype)} differ",
            "record both operands with the same element type",
        )
    return Spec(a.shape, a.dtype)


def check_axis(axis: Any, rank: int, what: str = "axis") -> int:
    """Validate an axis against a rank (negative axes are not accepted: spell them out)."""
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise Refusal(f"{what} must be an integer, got {axis!r}")
    if not 0 <= axis < rank:
        raise Refusal(
            f"{what} {axis} is out of range for rank {rank}",
            f"valid axes are 0..{rank - 1}" if rank else "a rank-0 tensor has no axes",
        )
    return int(axis)


def check_extent(value: Any, what: str, minimum: int = 1) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise Refusal(f"{what} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_shape(shape: Any, what: str = "shape") -> tuple[int, ...]:
    try:
        dims = tuple(shape)
    except TypeError:
        raise Refusal(f"{what} must be a sequence of positive integers, got {shape!r}") from None
    for d in dims:
        if not isinstance(d, (int, np.integer)) or isinstance(d, bool) or d < 1:
            raise Refusal(
                f"{what} {list(dims)} has an extent that is not a positive integer",
                "empty tensors are not allowed",
            )
    return tuple(int(d) for d in dims)


def selection_operand(spec: Spec) -> int:
    if not isinstance(spec.dtype, SelectionType):
        raise Refusal(
            f"the selection operand has element type {short_name(spec.dtype)}",
            "build the index operand with topos.selection(indices, extent)",
        )
    return spec.dtype.extent


def volume(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
