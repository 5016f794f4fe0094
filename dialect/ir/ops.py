"""The topos dialect: one MLIR op class per opcode of the closed vocabulary.

Each class is a Python ``OpView`` registered for the op name
``topos.<opcode>`` of the (unregistered) ``topos`` dialect, so
``operation.opview`` hands back, say, a :class:`NarrowOp` with typed
accessors (``op.axis``, ``op.input``, ``op.node``) for ops built here and
for ops parsed from text alike. Ops print in MLIR's generic form.

A class states only what MLIR needs to know beyond the core: its operand
names and how each attribute is encoded. Shapes are never re-derived here:
``verify_op`` turns the MLIR types back into :class:`~topos.spec.opcodes.Spec`
values and asks the core's shape rule (``opcode.infer``), so the dialect
and the recorder cannot disagree about what a valid node is.

Encodings (the contract in ``dialect/README.md``): ``node = <index> : i64``
on every op; an int attribute is an ``i64``; a tuple of ints is
``array<i64: ...>``; map's ``function`` is a string; element types are
``f32``, ``f64``, ``bf16`` or a registered element's ``mlir`` type
(``topos.base.element.register``); a selection (index payload) is ``i64`` and its
source op carries ``extent``. Discardable ``topos.*`` annotations added by
passes are allowed on every op.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from iree.compiler import ir
from iree.compiler._mlir_libs import _mlir as _cext

from topos.base.copies import is_splat, splat, splat_element
from topos.base.element import (
    ELEMENTS,
    Selection,
    SelectionType,
    element_for_mlir,
    element_of,
    short_name,
)
from topos.base.errors import ShapeError
from topos.dialect.ir.diagnostics import Diagnostic, VerificationError
from topos.spec.opcodes import MAP_FUNCTIONS, OPCODES, Opcode, Refusal, Spec, by_name

DIALECT = "topos"
NODE = "node"  # the attribute every op carries: its node index in the spec
ANNOTATION_PREFIX = "topos."  # discardable attributes passes may add


@_cext.register_dialect
class ToposDialect(ir.Dialect):
    """The ``topos`` namespace: ops named after the core's opcodes."""

    DIALECT_NAMESPACE = DIALECT


def _mark_dialect_module_loaded() -> None:
    # Each time the bindings wrap an op in its OpView they look for a Python
    # module named iree.compiler.dialects.<namespace>, and a failed lookup
    # is not remembered: every topos op cost a failed import (measured:
    # 4 import attempts per op, most of the verify time of a 5k-op module).
    # Show them this module once under that name; they cache the success.
    alias = f"iree.compiler.dialects.{DIALECT}"
    previous = sys.modules.get(alias)
    sys.modules[alias] = sys.modules[__name__]
    try:
        _cext.globals._check_dialect_module_loaded(DIALECT)
    finally:
        if previous is None:
            del sys.modules[alias]
        else:
            sys.modules[alias] = previous


_mark_dialect_module_loaded()


# ---- element types and tensor types ----------------------------------------------------

def element_type(dtype: Any) -> ir.Type:
    """The MLIR element type of a registered element type (a selection is ``i64``)."""
    if isinstance(dtype, SelectionType):
        return ir.IntegerType.get_signless(64)
    try:
        element = element_of(dtype)
    except ValueError:
        raise TypeError(f"no MLIR element type for {dtype!r}: it is not a registered element type") from None
    if element.mlir is None:
        raise TypeError(
            f"element {element.name} has no MLIR type; register it with mlir='...' (an MLIR element type "
            "such as f16 or f8E5M2) to emit it"
        )
    try:
        return ir.Type.parse(element.mlir)
    except Exception as error:  # MLIR's parser says why; the element's registration is what to fix
        raise TypeError(f"element {element.name}: MLIR does not parse its type {element.mlir!r}: {error}") from None


_SPELLINGS: dict = {}  # TypeID of a float type -> how MLIR spells it (float types have no parameters)


def registered_element(mlir_type: ir.Type):
    """The registered core element an MLIR element type stands for, or None (integers, unregistered floats).

    Printing a type costs about 13 us and every op's verification and
    lowering asks, so each float type's spelling is kept by its TypeID,
    which is the same in every context.
    """
    if not isinstance(mlir_type, ir.FloatType):
        return None
    typeid = mlir_type.typeid
    spelling = _SPELLINGS.get(typeid)
    if spelling is None:
        spelling = _SPELLINGS[typeid] = str(mlir_type)
    return element_for_mlir(spelling)


def tensor_type(spec: Spec) -> ir.RankedTensorType:
    """``tensor<2x3xf32>`` for a spec (rank 0: ``tensor<f32>``)."""
    # An explicit location: type construction reports errors at one, and
    # callers (verifiers, pattern callbacks) may have none on the stack.
    return ir.RankedTensorType.get(list(spec.shape), element_type(spec.dtype), loc=ir.Location.unknown())


def type_text(spec: Spec) -> str:
    """How MLIR prints the tensor type of ``spec``, without needing a context."""
    dims = "".join(f"{d}x" for d in spec.shape)
    element = "i64" if isinstance(spec.dtype, SelectionType) else short_name(spec.dtype)
    return f"tensor<{dims}{element}>"


class _TypeProblem(Exception):
    pass


def spec_of_type(mlir_type: ir.Type, extent: int | None = None) -> Spec:
    """The spec an MLIR tensor type stands for; ``extent`` completes an ``i64`` selection."""
    if not isinstance(mlir_type, ir.RankedTensorType) or not mlir_type.has_static_shape:
        raise _TypeProblem(f"{mlir_type} is not a tensor with a static shape")
    shape = tuple(mlir_type.shape)
    if any(d < 1 for d in shape):
        raise _TypeProblem(f"{mlir_type} is empty; topos tensors have at least one element")
    element = mlir_type.element_type
    registered = registered_element(element)
    if registered is not None:
        return Spec(shape, registered.dtype)
    if isinstance(element, ir.IntegerType) and element.width == 64 and element.is_signless:
        if extent is None:
            raise _TypeProblem(f"{mlir_type} is a selection whose extent is unknown")
        return Spec(shape, SelectionType(extent))
    raise _TypeProblem(
        f"{mlir_type} has element type {element}; topos tensors hold f32, f64, bf16, a registered "
        "element's type or i64 selections"
    )


def is_selection_type(mlir_type: ir.Type) -> bool:
    """Whether ``mlir_type`` is a tensor of signless i64: how a selection is spelled in MLIR."""
    if not isinstance(mlir_type, ir.RankedTensorType):
        return False
    element = mlir_type.element_type
    return isinstance(element, ir.IntegerType) and element.width == 64 and element.is_signless


def selection_extent(value: ir.Value) -> int | None:
    """The extent of a selection value, read from the source op that defines it."""
    if isinstance(value, ir.OpResult):
        owner = value.owner
        if owner.name in _SOURCE_NAMES and "extent" in owner.attributes:
            extent = owner.attributes["extent"]
            if isinstance(extent, ir.IntegerAttr):
                return extent.value
    return None


# ---- attribute encodings ----------------------------------------------------------------


@dataclass(frozen=True)
class AttributeKind:
    """How one opcode attribute is spelled in MLIR, checked, and read back."""

    name: str
    optional: bool = False
    syntax: ClassVar[str] = ""  # how the value reads in generic form, for the docs
    irdl_base: ClassVar[str] = ""

    def encode(self, value: Any) -> ir.Attribute:
        raise NotImplementedError

    def decode(self, attribute: ir.Attribute) -> Any:
        raise NotImplementedError

    def problem(self, attribute: ir.Attribute) -> str | None:
        """Why ``attribute`` is not a well-formed value of this kind (None when it is)."""
        raise NotImplementedError


def _is_i64(attribute: ir.Attribute) -> bool:
    return (
        isinstance(attribute, ir.IntegerAttr)
        and isinstance(attribute.type, ir.IntegerType)
        and attribute.type.width == 64
        and attribute.type.is_signless
    )


@dataclass(frozen=True)
class Integer(AttributeKind):
    """A Python int as ``<n> : i64``."""

    syntax: ClassVar[str] = "<n> : i64"
    irdl_base: ClassVar[str] = "#builtin.integer"

    def encode(self, value: Any) -> ir.Attribute:
        return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), int(value))

    def decode(self, attribute: ir.Attribute) -> int:
        return int(attribute.value)

    def problem(self, attribute: ir.Attribute) -> str | None:
        return None if _is_i64(attribute) else f"must be an i64 integer (`<n> : i64`), got {attribute}"


@dataclass(frozen=True)
class Integers(AttributeKind):
    """A tuple of ints (a shape, an axis order) as ``array<i64: ...>``."""

    syntax: ClassVar[str] = "array<i64: ...>"
    irdl_base: ClassVar[str] = "#builtin.dense_array"

    def encode(self, value: Any) -> ir.Attribute:
        return ir.DenseI64ArrayAttr.get([int(v) for v in value])

    def decode(self, attribute: ir.Attribute) -> tuple[int, ...]:
        return tuple(int(v) for v in attribute)

    def problem(self, attribute: ir.Attribute) -> str | None:
        if isinstance(attribute, ir.DenseI64ArrayAttr):
            return None
        return f"must be an i64 array (`array<i64: ...>`), got {attribute}"


@dataclass(frozen=True)
class Text(AttributeKind):
    """A string attribute drawn from a closed set of choices."""

    choices: tuple[str, ...] = ()
    syntax: ClassVar[str] = '"<name>"'
    irdl_base: ClassVar[str] = "#builtin.string"

    def encode(self, value: Any) -> ir.Attribute:
        return ir.StringAttr.get(str(value))

    def decode(self, attribute: ir.Attribute) -> str:
        return attribute.value

    def problem(self, attribute: ir.Attribute) -> str | None:
        if not isinstance(attribute, ir.StringAttr):
            return f"must be a string, got {attribute}"
        if self.choices and attribute.value not in self.choices:
            return f"is {attribute}, expected one of {', '.join(self.choices)}"
        return None


@dataclass(frozen=True)
class Elements(AttributeKind):
    """A leaf's payload as ``dense<...>``: the exact bits, splat when uniform."""

    syntax: ClassVar[str] = "dense<...> : tensor<...>"
    irdl_base: ClassVar[str] = "#builtin.dense_typed_elements"

    def encode(self, value: Any) -> ir.Attribute:
        return elements_attribute(np.asarray(value))

    def decode(self, attribute: ir.Attribute) -> np.ndarray:
        return elements_array(attribute)

    def problem(self, attribute: ir.Attribute) -> str | None:
        if isinstance(attribute, ir.DenseElementsAttr):
            return None
        return f"must be a dense<...> elements literal, got {attribute}"


def elements_attribute(array: np.ndarray) -> ir.DenseElementsAttr:
    """A DenseElementsAttr holding exactly ``array``'s bits (float elements or int64 indices).

    A splat payload (one stored element, ``topos.base.copies.splat``) passes that
    one element and the shape: MLIR reads a one-element buffer as a splat,
    so a lifted number never becomes a full-shape buffer on the way.
    """
    shape = list(array.shape)
    if is_splat(array):
        array = splat_element(array).reshape(1)
    elif not array.flags.c_contiguous:
        array = array.copy(order="C")  # not np.ascontiguousarray: it makes rank 0 into rank 1
    if array.dtype.kind in "iu":
        return ir.DenseElementsAttr.get(array.astype(np.int64, copy=False), shape=shape)
    if array.dtype not in ELEMENTS:
        raise TypeError(f"a leaf payload of dtype {array.dtype} has no topos element type")
    if array.dtype.char not in _BUFFER_FLOATS:
        # The bindings read buffers by format character and know no bfloat16 or
        # 8-bit float; the bits travel as unsigned integers under the element's type.
        return ir.DenseElementsAttr.get(array.view(_BITS[array.dtype.itemsize]), type=element_type(array.dtype),
                                        shape=shape)
    return ir.DenseElementsAttr.get(array, shape=shape)


_BUFFER_FLOATS = "efd"  # float16, float32, float64: the float formats the buffer protocol names
_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


_HEX_BLOB = re.compile(r'^dense<"0x([0-9A-Fa-f]*)">')


def elements_array(attribute: ir.DenseElementsAttr) -> np.ndarray:
    """The payload of a DenseElementsAttr as a NumPy array with the same bits."""
    mlir_type = attribute.type
    shape = tuple(mlir_type.shape)
    registered = registered_element(mlir_type.element_type)
    if registered is not None and registered.dtype.char not in _BUFFER_FLOATS:
        return _bits_array(attribute, shape, registered.dtype)
    if registered is not None and attribute.is_splat and math.prod(shape) > 1:
        one = ir.FloatAttr(attribute.get_splat_value()).value  # a Python float: exact for f16, f32, f64 numbers
        if not math.isnan(one):  # a NaN's payload bits are not in the float: read the buffer below
            return splat(np.array(one, dtype=registered.dtype), shape)
    return np.array(attribute, copy=True).reshape(shape)


def _bits_array(attribute: ir.Attribute, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    # The bindings expose no buffer for bf16 or an 8-bit float, so read the printed literal.
    # MLIR prints each element so that it parses back to the same bits
    # (decimal when that is exact, otherwise the hex bit pattern), and large
    # literals as one little-endian hex blob.
    text = str(attribute)
    count = int(np.prod(shape, dtype=np.int64))
    unsigned = _BITS[dtype.itemsize]
    blob = _HEX_BLOB.match(text)
    if blob:
        bits = np.frombuffer(bytes.fromhex(blob.group(1)), dtype=np.dtype(unsigned).newbyteorder("<"))
    else:
        body = text[len("dense<") : text.rindex(">", 0, text.rindex(":"))]
        tokens = body.replace("[", " ").replace("]", " ").replace(",", " ").split()
        bits = np.array([_token_bits(token, dtype) for token in tokens], dtype=unsigned)
    if bits.size == 1 and count != 1:  # a splat stays one element (topos.base.copies.splat)
        return splat(bits.astype(unsigned).view(dtype)[0], shape)
    return bits.astype(unsigned).view(dtype).reshape(shape).copy()


def _token_bits(token: str, dtype: np.dtype) -> int:
    if token.lower().startswith(("0x", "-0x")):
        return int(token, 16) & ((1 << (8 * dtype.itemsize)) - 1)
    # A decimal token is exact (MLIR prints one only then), so float32 holds it and the cast is exact.
    return int(np.array(float(token), dtype=np.float32).astype(dtype).view(_BITS[dtype.itemsize]))


# ---- the op base class -------------------------------------------------------------------


class ToposOp(ir.OpView):
    """Base of every topos op class: builder, accessors and the verifier, driven by class data."""

    OPERATION_NAME: ClassVar[str]
    _ODS_REGIONS = (0, True)

    opcode: ClassVar[Opcode]
    operand_names: ClassVar[tuple[str, ...]] = ()
    attribute_kinds: ClassVar[tuple[AttributeKind, ...]] = ()
    # Every operand and the result have one type (elementwise ops); the
    # IRDL file states this with one shared constraint.
    same_type: ClassVar[bool] = False

    def __init__(
        self,
        *operands: ir.Value,
        node: int,
        result_type: ir.Type | None = None,
        loc: ir.Location | None = None,
        ip: ir.InsertionPoint | None = None,
        **attributes: Any,
    ):
        """Build the op; the result type comes from the core's shape rule unless given."""
        cls = type(self)
        if len(operands) != len(cls.operand_names):
            raise TypeError(
                f"{cls.OPERATION_NAME} takes {len(cls.operand_names)} operands "
                f"({', '.join(cls.operand_names) or 'none'}), got {len(operands)}"
            )
        encoded = cls.encode_attributes(node, attributes)
        if result_type is None:
            result_type = cls.result_type_for(operands, encoded)
        super().__init__(
            self.build_generic(
                results=[result_type], operands=list(operands), attributes=encoded, loc=loc, ip=ip
            )
        )

    # -- class-level helpers -------------------------------------------------------------
    @classmethod
    def encode_attributes(cls, node: int, attributes: dict[str, Any]) -> dict[str, ir.Attribute]:
        """The MLIR attribute dictionary for ``node`` and Python (or MLIR) attribute values."""
        encoded = {NODE: Integer(NODE).encode(node)}
        remaining = dict(attributes)
        for kind in cls.attribute_kinds:
            if kind.name not in remaining:
                if kind.optional:
                    continue
                raise TypeError(f"{cls.OPERATION_NAME} needs attribute {kind.name!r}")
            value = remaining.pop(kind.name)
            if value is None and kind.optional:
                continue
            encoded[kind.name] = value if isinstance(value, ir.Attribute) else kind.encode(value)
        unknown = [k for k in remaining if not k.startswith(ANNOTATION_PREFIX)]
        if unknown:
            raise TypeError(
                f"{cls.OPERATION_NAME} has no attribute {unknown[0]!r}; "
                f"it takes {[k.name for k in cls.attribute_kinds]}"
            )
        for name, value in remaining.items():
            encoded[name] = value
        return encoded

    @classmethod
    def result_type_for(cls, operands, encoded: dict[str, ir.Attribute]) -> ir.Type:
        try:
            specs = [spec_of_type(v.type, selection_extent(v)) for v in operands]
        except _TypeProblem as problem:
            raise ShapeError(f"{cls.OPERATION_NAME}: {problem}") from None
        values = {k.name: k.decode(encoded[k.name]) for k in cls.attribute_kinds if k.name in encoded}
        try:
            return tensor_type(cls.opcode.infer(*specs, **values))
        except Refusal as refusal:
            hint = f"; hint: {refusal.hint}" if refusal.hint else ""
            shapes = ", ".join(str(s) for s in specs)
            raise ShapeError(f"{cls.OPERATION_NAME}: {refusal.detail} (operands: {shapes}){hint}") from None

    # -- accessors -----------------------------------------------------------------------
    @property
    def node(self) -> int:
        """The node index this op stands for in the spec."""
        return int(self.operation.attributes[NODE].value)

    def opcode_attributes(self) -> dict[str, Any]:
        """The opcode's attributes as the core spells them (ints, tuples of ints, strings)."""
        present = self.operation.attributes
        return {k.name: k.decode(present[k.name]) for k in self.attribute_kinds if k.name in present}

    @property
    def spec(self) -> Spec:
        """The result's shape and element type as the core sees them."""
        return spec_of_type(self.operation.results[0].type, self._own_extent())

    def _own_extent(self) -> int | None:
        return None

    # -- verification ---------------------------------------------------------------------
    def verify_op(self) -> None:
        """Check operand count, types and attributes against the opcode; raise VerificationError."""
        problem = next(self._problems(), None)
        if problem is not None:
            raise VerificationError([self.diagnostic(problem)])

    def diagnostic(self, problem: str) -> Diagnostic:
        """An error at this op's location that names the op and its node index."""
        attribute = self.operation.attributes.get(NODE, None)
        node = f"node {attribute.value}" if _is_i64(attribute) else "node ?"
        return Diagnostic.error(f"'{self.OPERATION_NAME}' op {node}: {problem}", self.operation)

    def _problems(self) -> Iterator[str]:
        operation = self.operation
        yield from self._structure_problems(operation)
        attributes = operation.attributes
        if NODE not in attributes:
            yield f"needs the attribute `{NODE} = <index> : i64`"
            return
        node = attributes[NODE]
        if not _is_i64(node) or node.value < 0:
            yield f"attribute '{NODE}' must be a non-negative i64 node index, got {node}"
            return
        yield from self._attribute_problems(attributes)
        yield from self._type_problems(operation)

    def _structure_problems(self, operation: ir.Operation) -> Iterator[str]:
        arity = len(self.operand_names)
        if len(operation.operands) != arity:
            names = f" ({', '.join(self.operand_names)})" if arity else ""
            yield f"expects {arity} operand{'s' if arity != 1 else ''}{names}, got {len(operation.operands)}"
        if len(operation.results) != 1:
            yield f"expects 1 result, got {len(operation.results)}"
        if len(operation.regions) or len(operation.successors):
            yield "takes no regions or successors"

    def _attribute_problems(self, attributes) -> Iterator[str]:
        declared = {k.name for k in self.attribute_kinds}
        for kind in self.attribute_kinds:
            if kind.name not in attributes:
                if not kind.optional:
                    yield f"needs the attribute `{kind.name} = {kind.syntax}`"
                continue
            problem = kind.problem(attributes[kind.name])
            if problem:
                yield f"attribute '{kind.name}' {problem}"
        for name in attributes:
            if name != NODE and name not in declared and not name.startswith(ANNOTATION_PREFIX):
                yield (
                    f"has no attribute '{name}'; it takes {sorted(declared | {NODE})} "
                    f"(pass annotations are spelled '{ANNOTATION_PREFIX}<name>')"
                )

    def _type_problems(self, operation: ir.Operation) -> Iterator[str]:
        specs = []
        for position, value in enumerate(operation.operands):
            try:
                specs.append(spec_of_type(value.type, self._operand_extent(position, value)))
            except _TypeProblem as problem:
                yield f"operand #{position} ({self.operand_names[position]}): {problem}"
                return
        attributes = self.opcode_attributes()
        try:
            expected = self.opcode.infer(*specs, **attributes)
        except Refusal as refusal:
            shapes = ", ".join(str(s) for s in specs)
            hint = f"; hint: {refusal.hint}" if refusal.hint else ""
            yield f"{refusal.detail} (operands: {shapes}){hint}"
            return
        actual_type = operation.results[0].type
        try:
            actual = spec_of_type(actual_type, getattr(expected.dtype, "extent", None))
        except _TypeProblem as problem:
            yield f"result: {problem}"
            return
        if actual != expected:
            yield f"result type {actual_type} differs from {type_text(expected)}, which the operands imply"

    def _operand_extent(self, position: int, value: ir.Value) -> int | None:
        """A selection operand's extent; when no topos source defines it, what the op requires."""
        return selection_extent(value)


# ---- sources -----------------------------------------------------------------------------


class _SourceOp(ToposOp):
    """Shared rules of leaf, parameter and input: no shape rule, the type is the payload's."""

    def _own_extent(self) -> int | None:
        attribute = self.operation.attributes.get("extent", None)
        return attribute.value if _is_i64(attribute) else None

    def _type_problems(self, operation: ir.Operation) -> Iterator[str]:
        result_type = operation.results[0].type
        extent = self._own_extent()
        selection = is_selection_type(result_type)
        if selection and extent is None:
            yield "an i64 (selection) result needs the attribute `extent = <n> : i64`"
            return
        if not selection and "extent" in operation.attributes:
            yield f"only a selection (i64 result) takes 'extent'; the result is {result_type}"
            return
        if extent is not None and extent < 1:
            yield f"extent must be at least 1, got {extent}"
            return
        try:
            spec_of_type(result_type, extent)
        except _TypeProblem as problem:
            yield f"result: {problem}"
            return
        yield from self._payload_problems(operation, result_type)

    def _payload_problems(self, operation, result_type) -> Iterator[str]:
        argument = operation.operands[0]
        if argument.type != result_type:
            yield f"operand type {argument.type} differs from the result type {result_type}"
        elif not isinstance(argument, ir.BlockArgument):
            yield "the operand must be an argument of the enclosing function"


class LeafOp(_SourceOp):
    """A constant, frozen at record time; ``value`` holds its exact bits."""

    opcode = by_name("leaf")
    attribute_kinds = (Elements("value"), Integer("extent", optional=True))

    def __init__(self, payload, *, node: int, loc=None, ip=None, **annotations):
        """Build a leaf from an array, a Selection, or a DenseElementsAttr."""
        extent = annotations.pop("extent", None)
        if isinstance(payload, Selection):
            payload, extent = payload.indices, payload.extent
        value = payload if isinstance(payload, ir.Attribute) else elements_attribute(np.asarray(payload))
        encoded = type(self).encode_attributes(node, {"value": value, "extent": extent, **annotations})
        ir.OpView.__init__(
            self,
            self.build_generic(results=[value.type], operands=[], attributes=encoded, loc=loc, ip=ip),
        )

    @property
    def value(self) -> np.ndarray:
        """The payload with its recorded bits (int64 indices for a selection)."""
        return elements_array(self.operation.attributes["value"])

    @property
    def extent(self) -> int | None:
        """A selection's extent; None for a float leaf."""
        return self._own_extent()

    def _payload_problems(self, operation, result_type) -> Iterator[str]:
        value = operation.attributes["value"]
        if value.type != result_type:
            yield f"value has type {value.type} but the result is {result_type}"
            return
        extent = self._own_extent()
        if extent is not None:
            indices = elements_array(value)
            bad = (indices < 0) | (indices >= extent)
            if bad.any():
                where = tuple(int(i) for i in np.argwhere(bad)[0])
                yield f"selection index {int(indices[where])} at {where} is outside [0, {extent})"


class ParameterOp(_SourceOp):
    """A trainable slot: its value is the function argument the op takes."""

    opcode = by_name("parameter")
    operand_names = ("argument",)
    attribute_kinds = (Integer("extent", optional=True),)

    def __init__(self, argument: ir.Value, *, node: int, extent: int | None = None, loc=None, ip=None):
        encoded = type(self).encode_attributes(node, {"extent": extent})
        ir.OpView.__init__(
            self,
            self.build_generic(
                results=[argument.type], operands=[argument], attributes=encoded, loc=loc, ip=ip
            ),
        )

    @property
    def extent(self) -> int | None:
        return self._own_extent()


class InputOp(ParameterOp):
    """A per-run value: its value is the function argument the op takes."""

    opcode = by_name("input")


_SOURCE_NAMES = frozenset({"topos.leaf", "topos.parameter", "topos.input"})


# ---- computed ops ------------------------------------------------------------------------


def _axis(name: str = "axis") -> Integer:
    return Integer(name)


class _Elementwise(ToposOp):
    same_type = True


class AddOp(_Elementwise):
    opcode = by_name("add")
    operand_names = ("lhs", "rhs")


class SubOp(_Elementwise):
    opcode = by_name("sub")
    operand_names = ("lhs", "rhs")


class MulOp(_Elementwise):
    opcode = by_name("mul")
    operand_names = ("lhs", "rhs")


class DivOp(_Elementwise):
    opcode = by_name("div")
    operand_names = ("lhs", "rhs")


class PowOp(_Elementwise):
    opcode = by_name("pow")
    operand_names = ("lhs", "rhs")


class MaximumOp(_Elementwise):
    opcode = by_name("maximum")
    operand_names = ("lhs", "rhs")


class StepOp(_Elementwise):
    opcode = by_name("step")
    operand_names = ("input", "threshold")


class NegOp(_Elementwise):
    opcode = by_name("neg")
    operand_names = ("input",)


class MapOp(_Elementwise):
    opcode = by_name("map")
    operand_names = ("input",)
    attribute_kinds = (Text("function", choices=tuple(MAP_FUNCTIONS)),)


class GatherOp(ToposOp):
    opcode = by_name("gather")
    operand_names = ("table", "selection")

    def _operand_extent(self, position, value):
        found = selection_extent(value)
        if found is None and position == 1:
            # Defined outside topos (a lowered source, a block argument): the
            # extent cannot be read, so check only what the types say.
            table = self.operation.operands[0].type
            if isinstance(table, ir.RankedTensorType) and table.rank >= 1:
                return table.shape[0]
        return found


class ScatterOp(ToposOp):
    opcode = by_name("scatter")
    operand_names = ("values", "selection")
    attribute_kinds = (Integer("extent"),)

    def _operand_extent(self, position, value):
        found = selection_extent(value)
        if found is None and position == 1 and _is_i64(self.operation.attributes["extent"]):
            return self.operation.attributes["extent"].value
        return found


class MatmulOp(ToposOp):
    opcode = by_name("matmul")
    operand_names = ("lhs", "rhs")


class SumOp(ToposOp):
    opcode = by_name("sum")
    operand_names = ("input",)


class SumAlongOp(ToposOp):
    opcode = by_name("sum_along")
    operand_names = ("input",)
    attribute_kinds = (_axis(),)


class BroadcastOp(ToposOp):
    opcode = by_name("broadcast")
    operand_names = ("input",)
    attribute_kinds = (Integers("shape"),)


class BroadcastAlongOp(ToposOp):
    opcode = by_name("broadcast_along")
    operand_names = ("input",)
    attribute_kinds = (_axis(), Integer("extent"))


class ReshapeOp(ToposOp):
    opcode = by_name("reshape")
    operand_names = ("input",)
    attribute_kinds = (Integers("shape"),)


class PermuteOp(ToposOp):
    opcode = by_name("permute")
    operand_names = ("input",)
    attribute_kinds = (Integers("order"),)


class NarrowOp(ToposOp):
    opcode = by_name("narrow")
    operand_names = ("input",)
    attribute_kinds = (_axis(), Integer("start"), Integer("length"))


class PadOp(ToposOp):
    opcode = by_name("pad")
    operand_names = ("input",)
    attribute_kinds = (_axis(), Integer("start"), Integer("extent"))


class UnfoldOp(ToposOp):
    opcode = by_name("unfold")
    operand_names = ("input",)
    attribute_kinds = (_axis(), Integer("size"), Integer("step"), Integer("dilation"))


class FoldOp(ToposOp):
    opcode = by_name("fold")
    operand_names = ("input",)
    attribute_kinds = (_axis(), Integer("size"), Integer("step"), Integer("dilation"), Integer("extent"))


class LogSoftmaxOp(_Elementwise):
    opcode = by_name("log_softmax")
    operand_names = ("input",)
    attribute_kinds = (_axis(),)


class LogSumExpOp(ToposOp):
    opcode = by_name("logsumexp")
    operand_names = ("input",)
    attribute_kinds = (_axis(),)


# ---- registration ------------------------------------------------------------------------

OP_CLASSES: dict[str, type[ToposOp]] = {}  # opcode name -> op class, in vocabulary order


def _operand_property(position: int, name: str) -> property:
    return property(lambda self: self.operation.operands[position], doc=f"Operand #{position}, {name}.")


def _attribute_property(kind: AttributeKind) -> property:
    def read(self):
        attributes = self.operation.attributes
        return kind.decode(attributes[kind.name]) if kind.name in attributes else None

    return property(read, doc=f"The {kind.name!r} attribute as the core spells it.")


def _register(cls: type[ToposOp]) -> type[ToposOp]:
    opcode = cls.opcode
    declared = tuple(k.name for k in cls.attribute_kinds)
    if not opcode.is_source and declared != opcode.attribute_names:
        raise RuntimeError(
            f"{cls.__name__} declares attributes {declared}, but opcode {opcode.name} "
            f"has {opcode.attribute_names}"
        )
    if not opcode.is_source and len(cls.operand_names) != opcode.arity:
        raise RuntimeError(f"{cls.__name__} names {len(cls.operand_names)} operands for arity {opcode.arity}")
    cls.OPERATION_NAME = f"{DIALECT}.{opcode.name}"
    for position, name in enumerate(cls.operand_names):
        setattr(cls, name, _operand_property(position, name))
    for kind in cls.attribute_kinds:
        if kind.name not in cls.__dict__:
            setattr(cls, kind.name, _attribute_property(kind))
    _cext.register_operation(ToposDialect, replace=True)(cls)
    OP_CLASSES[opcode.name] = cls
    return cls


def _all_op_classes() -> list[type[ToposOp]]:
    found, pending = [], list(ToposOp.__subclasses__())
    while pending:
        cls = pending.pop(0)
        pending.extend(cls.__subclasses__())
        if "opcode" in cls.__dict__:
            found.append(cls)
    return found


_by_opcode = {cls.opcode.name: cls for cls in _all_op_classes()}
for _opcode in OPCODES:
    if _opcode.name in _by_opcode:
        _register(_by_opcode[_opcode.name])
del _by_opcode, _opcode


def op_class(name: str) -> type[ToposOp]:
    """The op class for an opcode name (``"narrow"``) or an op name (``"topos.narrow"``)."""
    short = name[len(DIALECT) + 1 :] if name.startswith(DIALECT + ".") else name
    try:
        return OP_CLASSES[short]
    except KeyError:
        raise KeyError(f"no topos op named {name!r}; the dialect has {sorted(OP_CLASSES)}") from None


# ---- verifying a whole module ------------------------------------------------------------


def verify_operation(operation: ir.Operation | ir.OpView) -> list[Diagnostic]:
    """The problems of one op: unknown topos op names, or what its class's verifier finds."""
    operation = operation.operation
    name = operation.name
    short = name[len(DIALECT) + 1 :]
    if short not in OP_CLASSES:
        return [
            Diagnostic.error(
                f"unknown op '{name}'; the topos dialect has "
                f"{', '.join(sorted(OP_CLASSES))}",
                operation,
            )
        ]
    view = operation.opview
    try:
        view.verify_op()
    except VerificationError as error:
        return list(error.diagnostics)
    return []


def topos_operations(root: ir.Operation | ir.Module) -> list[ir.Operation]:
    """Every ``topos.*`` op under ``root``, in walk (pre-)order."""
    found: list[ir.Operation] = []
    prefix = DIALECT + "."

    def visit(operation):
        if operation.name.startswith(prefix):
            found.append(operation.operation)
        return ir.WalkResult.ADVANCE

    _operation_of(root).walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


def verify_module(root: ir.Operation | ir.Module) -> list[Diagnostic]:
    """Every topos op's problems, plus node indices used twice; empty when the IR is sound."""
    problems: list[Diagnostic] = []
    seen: dict[int, ir.Operation] = {}
    for operation in topos_operations(root):
        found = verify_operation(operation)
        problems.extend(found)
        if found:
            continue
        node = operation.attributes[NODE].value
        if node in seen:
            problems.append(
                Diagnostic.error(
                    f"'{operation.name}' op node {node}: node index {node} is already used by "
                    f"{seen[node].name} at {seen[node].location}",
                    operation,
                )
            )
        else:
            seen[node] = operation
    return problems


def _operation_of(root) -> ir.Operation:
    return root.operation


__all__ = [
    "ANNOTATION_PREFIX", "DIALECT", "NODE", "OP_CLASSES", "AttributeKind", "Elements", "Integer",
    "Integers", "Text", "ToposDialect", "ToposOp", "element_type", "elements_array",
    "elements_attribute", "op_class", "selection_extent", "spec_of_type", "tensor_type",
    "topos_operations", "type_text", "verify_module", "verify_operation",
]
