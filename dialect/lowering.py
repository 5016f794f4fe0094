"""The ``topos-lower-to-stablehlo`` pass: every topos op becomes StableHLO with the same meaning.

``LOWERINGS`` is the dialect's single place for each opcode's lowering:
one rule per opcode, keyed by the opcode's name. A rule reads one topos op
and returns the StableHLO value that replaces its result; the pass walks
each function in program order, so a rule always sees operands that are
already StableHLO.

Choices that keep the reference's meaning (each one is tested against the
oracle in ``tests/dialect/test_lowering_semantics.py``):

* ``maximum`` is ``select(a >= b or a != a, a, b)``, not
  ``stablehlo.maximum``: the reference sends ties to the left operand, so
  ``maximum(-0.0, +0.0)`` is ``-0.0``, where IEEE ``maximum`` gives
  ``+0.0``. (Both propagate a NaN from either side.)
* Sums start from ``-0.0``, the exact additive identity, so a sum of
  negative zeros stays ``-0.0`` as in the reference's halving tree. A sum
  to rank 0 first reshapes its operand to 1-D: GPU code generators reject
  a multi-axis reduction to a scalar.
* A narrow element (bfloat16, or a registered one such as float16 whose
  compute type is wider: ``topos.element.register``) computes in its
  compute type and rounds once, as the core does, wherever the result
  depends on more than one correctly rounded step: matmul, sums, fold,
  scatter, log_softmax, logsumexp, pow and every map function. Single
  IEEE operations (add, sub, mul, div) are spelled the same way: the
  compute type has more than twice the element's precision plus two bits
  (float32 against bfloat16's 8 and float16's 11), so one operation there
  rounded once gives the element's own bits. The element's accumulate
  type is its compute type (registration refuses another), so the same
  ``convert`` pair bounds every accumulation. Every rounding down to
  bfloat16 is a ``stablehlo.reduce_precision`` (e8m7) before the
  ``convert``: IREE computes bfloat16 chains in float32 and folds a
  convert down followed by a convert up, which would silently drop the
  rounding; reduce_precision survives that. It also flushes what is
  subnormal in the narrow format, harmless for bfloat16 (float32's
  exponent range) but not for float16 or the 8-bit floats, which take the
  ``convert`` alone (IREE keeps that rounding; measured). An 8-bit
  float's rounding first restores a carry IREE's software truncation
  drops (``_carry_into_smallest_normal``), and an 8-bit op over
  constants alone is folded with the reference kernel (``_folded``).
* ``fold`` adds the windows lane by lane onto zeros (each lane a strided
  ``pad``), the reference's order, so its bits match the reference
  exactly. A 0/1 ``dot_general`` would turn an infinity into NaN
  (``inf * 0``) and leave the order to the backend.
* ``gather`` is ``stablehlo.gather``: a copy, exact for every value.
* ``scatter`` is ``stablehlo.scatter`` with an add region. StableHLO
  leaves the order of colliding updates to the implementation; IREE on
  llvm-cpu applies them in position order, the reference's, so the bits
  agree there (the conformance tests hold it to that), and a parallel
  target's envelope allows another order. Compiled plans serve under the
  fast posture, so this is that posture's labeled freedom, not a silent
  one. A one-hot ``dot_general`` was rejected: it costs rows x extent x
  width and turns ``inf * 0`` into NaN.
* ``unfold`` is one strided ``slice`` per lane, concatenated: a copy.
* ``erf`` is ``chlo.erf``, which IREE's StableHLO input pipeline
  legalizes for float32 and float64; ``erf_derivative`` is decomposed as
  ``2/sqrt(pi) * exp(-(x * x))``. When x is ``y * c`` for a splat constant
  c (GELU's ``x / sqrt 2``), x is rebuilt from y as ``(y * 2c) * 0.5``:
  the same bits (``_scaled``), but not the forward's expression, so IREE
  computes it in the backward from y, which the forward keeps anyway,
  instead of storing the forward's x for it (measured in
  docs/performance.md, "GELU's backward").
* ``log_softmax`` and ``logsumexp`` shift by the maximum along the axis,
  with a non-finite maximum replaced by 0, exactly as the kernels do.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import ml_dtypes
import numpy as np
from iree.compiler import ir

from topos.element import element_of
from topos.opcodes import by_name

from .diagnostics import Diagnostic, DialectError
from .ops import elements_array, elements_attribute, registered_element
from .passes import register_pass

PASS_NAME = "topos-lower-to-stablehlo"
PASS_DESCRIPTION = "replace every topos op by StableHLO (and chlo.erf) with the same meaning"


class LoweringError(DialectError):
    """The lowering could not translate a topos op (unknown opcode or a malformed op)."""

    @classmethod
    def at(cls, message: str, location: ir.Location | None = None) -> LoweringError:
        return cls([Diagnostic.error(message, location)])

    @property
    def location(self) -> ir.Location | None:
        return self.diagnostics[0].location if self.diagnostics else None


# ---- building StableHLO ---------------------------------------------------------------


def _create(name: str, operands: Sequence[ir.Value], result: ir.Type | None,
            attributes: dict | None = None, regions: int = 0) -> ir.Operation:
    return ir.Operation.create(
        name,
        results=[] if result is None else [result],
        operands=list(operands),
        attributes=attributes or {},
        regions=regions,
    )


def _one(name: str, operands: Sequence[ir.Value], result: ir.Type, **attributes) -> ir.Value:
    return _create(name, operands, result, attributes).result


def _tensor(shape: Sequence[int], element: ir.Type) -> ir.RankedTensorType:
    return ir.RankedTensorType.get(list(shape), element)


def _shape(value: ir.Value) -> tuple[int, ...]:
    return tuple(ir.RankedTensorType(value.type).shape)


def _element(value: ir.Value) -> ir.Type:
    return ir.RankedTensorType(value.type).element_type


def _i64s(values: Sequence[int]) -> ir.Attribute:
    return ir.DenseI64ArrayAttr.get([int(v) for v in values])


def _constant(number: float, shape: Sequence[int], element: ir.Type) -> ir.Value:
    """A splat constant; ``number`` is a float for float elements, an int for integers."""
    type_ = _tensor(shape, element)
    if isinstance(element, ir.IntegerType):
        scalar = ir.IntegerAttr.get(element, int(number))
    else:
        scalar = ir.FloatAttr.get(element, float(number))
    return _one("stablehlo.constant", [], type_, value=ir.DenseElementsAttr.get_splat(type_, scalar))


def _like(number: float, value: ir.Value) -> ir.Value:
    return _constant(number, _shape(value), _element(value))


def _unary(name: str, x: ir.Value) -> ir.Value:
    return _one(name, [x], x.type)


def _binary(name: str, a: ir.Value, b: ir.Value) -> ir.Value:
    return _one(name, [a, b], a.type)


def _compute_type(element: ir.Type) -> ir.Type:
    """The MLIR type ``element`` computes in: float32 for bfloat16, itself for f32 and f64."""
    registered = registered_element(element)
    if registered is None or not registered.narrow:
        return element
    return ir.Type.parse(element_of(registered.compute).mlir)


@functools.cache
def _precision_bits(dtype, compute) -> tuple[int, int] | None:
    """(exponent bits, mantissa bits) for the reduce_precision before a rounding convert, or None for none.

    reduce_precision rounds to an IEEE format of those widths, and, as in
    XLA, flushes what would be subnormal there to zero. That is harmless
    only where the compute type flushes the same values anyway: bfloat16,
    whose exponent range is float32's (IREE's CPU runtime flushes float32
    subnormals). A narrower range (float16, the 8-bit floats) keeps its
    subnormals in the compute type, and a format without infinities
    (float8_e4m3fn) is not what reduce_precision rounds to: both take the
    convert alone.
    """
    info, wide = ml_dtypes.finfo(dtype), ml_dtypes.finfo(compute)
    with np.errstate(invalid="ignore"):
        has_infinity = bool(np.isinf(np.array([np.inf]).astype(dtype).astype(np.float64))[0])
    if not has_infinity or info.maxexp != 2 ** (info.nexp - 1) or info.minexp != wide.minexp:
        return None
    return int(info.nexp), int(info.nmant)


def _convert(x: ir.Value, element: ir.Type) -> ir.Value:
    if _element(x) == element:
        return x
    registered = registered_element(element)
    if registered is not None and registered.narrow and _compute_type(element) == _element(x):
        # Round to the element's precision while still in the compute type. IREE
        # computes bfloat16 chains in float32 and folds a convert down followed by a
        # convert up, dropping the rounding; reduce_precision survives that.
        bits = _precision_bits(registered.dtype, registered.compute)
        if bits is not None:
            i32 = ir.IntegerType.get_signless(32)
            x = _one("stablehlo.reduce_precision", [x], x.type,
                     exponent_bits=ir.IntegerAttr.get(i32, bits[0]),
                     mantissa_bits=ir.IntegerAttr.get(i32, bits[1]))
        if registered.dtype.itemsize == 1:
            x = _carry_into_smallest_normal(x, registered.dtype)
    return _one("stablehlo.convert", [x], _tensor(_shape(x), element))


def _carry_into_smallest_normal(x: ir.Value, dtype) -> ir.Value:
    """``x`` with the values that round up from the subnormals to the smallest normal set to it.

    IREE 3.13 truncates to an 8-bit float in software (MLIR's arith
    expansion), and that expansion drops exactly this carry: values in
    ``[tiny - s/2, tiny)``, ``s`` the subnormal spacing, come out as zeros
    of their sign instead of ``tiny`` (measured against ``refmath.nearest_even``
    at every value of f8E5M2 and f8E4M3FN, every midpoint and their float32
    neighbours; nothing else differs). Setting them to ``+-tiny`` first,
    which the truncation keeps, gives the rounding's own bits.
    """
    info = ml_dtypes.finfo(dtype)
    tiny, spacing = float(info.tiny), float(info.smallest_subnormal)
    size = _unary("stablehlo.abs", x)
    gap = _binary("stablehlo.and", _compare(size, _like(tiny - spacing / 2, x), "GE"),
                  _compare(size, _like(tiny, x), "LT"))
    signed = _select(_compare(x, _like(0.0, x), "LT"), _like(-tiny, x), _like(tiny, x))
    return _select(gap, signed, x)


def _widened(x: ir.Value) -> ir.Value:
    """``x`` in its compute type: float32 for bfloat16 (and any narrow registered element), itself otherwise."""
    wide = _compute_type(_element(x))
    return x if wide == _element(x) else _convert(x, wide)


def _is_narrow(element: ir.Type) -> bool:
    """Whether ``element`` computes in a wider type (bfloat16, a narrow registered element)."""
    registered = registered_element(element)
    return registered is not None and registered.narrow


def _reshape(x: ir.Value, shape: Sequence[int]) -> ir.Value:
    source, shape = _shape(x), tuple(shape)
    if source == shape:
        return x
    if math.prod(shape) == 1 and len(shape) > len(source):
        # IREE 3.13 refuses a one-element slice taken to more axes, by reshape or broadcast, when
        # the value is also returned or read twice ('expected rank to be smaller or equal to the
        # other rank'): the slice is taken again from its operand widened by unit axes, which
        # compiles (docs/reliability.md, iree-unit-slice-reshape).
        offset = len(shape) - len(source)
        sliced = _producer(x, "stablehlo.slice")
        if sliced is None:
            return _broadcast_in_dim(x, shape, list(range(offset, len(shape))))
        operand = sliced.operands[0]
        widened = _reshape(operand, _shape(operand) + (1,) * offset)
        starts = list(ir.DenseI64ArrayAttr(sliced.attributes["start_indices"])) + [0] * offset
        return _one("stablehlo.slice", [widened], _tensor(shape, _element(x)), start_indices=_i64s(starts),
                    limit_indices=_i64s([i + 1 for i in starts]), strides=_i64s([1] * len(starts)))
    return _one("stablehlo.reshape", [x], _tensor(shape, _element(x)))


def _producer(x: ir.Value, name: str) -> ir.Operation | None:
    """The op that defines ``x`` when it is a ``name`` op (not a block argument), else None."""
    owner = x.owner
    if not isinstance(owner, ir.Operation):
        owner = getattr(owner, "operation", None)
    return owner if owner is not None and owner.name == name else None


def _broadcast_in_dim(x: ir.Value, shape: Sequence[int], dimensions: Sequence[int]) -> ir.Value:
    if math.prod(shape) == 1 and len(shape) > len(_shape(x)) and _producer(x, "stablehlo.slice") is not None:
        return _reshape(x, shape)  # one element to more axes is a reshape, and _reshape re-slices a slice
    return _one("stablehlo.broadcast_in_dim", [x], _tensor(shape, _element(x)),
                broadcast_dimensions=_i64s(dimensions))


def _compare(a: ir.Value, b: ir.Value, direction: str) -> ir.Value:
    predicate = _tensor(_shape(a), ir.IntegerType.get_signless(1))
    return _one("stablehlo.compare", [a, b], predicate,
                comparison_direction=ir.Attribute.parse(f"#stablehlo<comparison_direction {direction}>"))


def _select(predicate: ir.Value, on_true: ir.Value, on_false: ir.Value) -> ir.Value:
    return _one("stablehlo.select", [predicate, on_true, on_false], on_true.type)


def _slice(x: ir.Value, axis: int, start: int, limit: int, stride: int = 1) -> ir.Value:
    shape = _shape(x)
    starts, limits, strides = [0] * len(shape), list(shape), [1] * len(shape)
    starts[axis], limits[axis], strides[axis] = start, limit, stride
    out = list(shape)
    out[axis] = (limit - start + stride - 1) // stride
    if out[axis] == 1:  # one element: the same slice with stride 1 ([0:1:2] of a [1] tensor, then
        limits[axis], strides[axis] = start + 1, 1  # broadcast, was refused: reliability.md, iree-unit-slice-reshape)
    return _one("stablehlo.slice", [x], _tensor(out, _element(x)), start_indices=_i64s(starts),
                limit_indices=_i64s(limits), strides=_i64s(strides))


def _pad(x: ir.Value, axis: int, low: int, high: int, interior: int, filler: float) -> ir.Value:
    if low == high == interior == 0:
        return x
    shape = _shape(x)
    lows, highs, interiors = [0] * len(shape), [0] * len(shape), [0] * len(shape)
    lows[axis], highs[axis], interiors[axis] = low, high, interior
    out = list(shape)
    out[axis] = low + high + shape[axis] + interior * (shape[axis] - 1)
    return _one("stablehlo.pad", [x, _constant(filler, (), _element(x))], _tensor(out, _element(x)),
                edge_padding_low=_i64s(lows), edge_padding_high=_i64s(highs),
                interior_padding=_i64s(interiors))


def _reduce(x: ir.Value, dimensions: Sequence[int], combiner: str, initial: float) -> ir.Value:
    """Reduce ``dimensions`` of ``x`` with the binary op ``combiner`` starting from ``initial``."""
    element = _element(x)
    kept = [d for i, d in enumerate(_shape(x)) if i not in dimensions]
    scalar = _tensor((), element)
    reduce = _create("stablehlo.reduce", [x, _constant(initial, (), element)], _tensor(kept, element),
                     {"dimensions": _i64s(dimensions)}, regions=1)
    body = reduce.regions[0].blocks.append(scalar, scalar)
    with ir.InsertionPoint(body):
        _create("stablehlo.return", [_binary(combiner, *body.arguments)], None)
    return reduce.result


def _sum(x: ir.Value, axis: int) -> ir.Value:
    # -0.0 is the exact additive identity: x + -0.0 == x for every x, -0.0 included.
    return _reduce(x, [axis], "stablehlo.add", -0.0)


def _peak(x: ir.Value, axis: int) -> ir.Value:
    """The maximum along ``axis`` with a non-finite maximum replaced by 0 (the kernels' shift)."""
    peak = _reduce(x, [axis], "stablehlo.maximum", -math.inf)
    finite = _one("stablehlo.is_finite", [peak], _tensor(_shape(peak), ir.IntegerType.get_signless(1)))
    return _select(finite, peak, _like(0.0, peak))


def _restore_axis(x: ir.Value, axis: int, shape: Sequence[int]) -> ir.Value:
    """Broadcast a value with ``axis`` removed back to ``shape``."""
    return _broadcast_in_dim(x, shape, [i for i in range(len(shape)) if i != axis])


# ---- the rules: one per opcode ----------------------------------------------------------


@dataclass(frozen=True)
class _Node:
    """One topos op as a lowering rule reads it."""

    op: ir.Operation

    @property
    def operands(self) -> list[ir.Value]:
        return list(self.op.operands)

    @property
    def type(self) -> ir.RankedTensorType:
        return ir.RankedTensorType(self.op.results[0].type)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.type.shape)

    @property
    def element(self) -> ir.Type:
        return self.type.element_type

    def attribute(self, name: str) -> ir.Attribute:
        try:
            return self.op.attributes[name]
        except KeyError:
            raise LoweringError.at(
                f"{self.op.name} has no '{name}' attribute; emit it with the core's attribute names",
                self.op.location,
            ) from None

    def integer(self, name: str) -> int:
        return ir.IntegerAttr(self.attribute(name)).value

    def ints(self, name: str) -> tuple[int, ...]:
        return tuple(ir.DenseI64ArrayAttr(self.attribute(name)))

    def text(self, name: str) -> str:
        return ir.StringAttr(self.attribute(name)).value


def _source(node: _Node) -> ir.Value:
    # parameter and input wrap their function argument; the argument itself replaces them.
    return node.operands[0]


def _leaf(node: _Node) -> ir.Value:
    value = node.attribute("value")
    constant = _one("stablehlo.constant", [], node.type, value=value)
    return _one("stablehlo.optimization_barrier", [constant], node.type) if _fenced(value) else constant


def _fenced(value: ir.DenseElementsAttr) -> bool:
    """Whether a recorded constant reaches IREE behind an ``optimization_barrier``, as data it cannot fold.

    IREE 3.13 inlines a constant into the dispatches that read it, where LLVM
    evaluates a math function of it at compile time under the no-NaN,
    no-infinity assumptions of IREE's approximations: exp, logistic and expm1
    of a NaN came out 0, and sin, cos and tan of a NaN or an infinity 0, where
    the same dispatch run on the same values as an input gives NaN
    (docs/reliability.md, iree-folded-nonfinite). Behind the barrier the
    constant is a buffer, and the dispatch computes on it as on any input. So
    a float constant holding a NaN or an infinity is fenced. Finite ones are
    not: folded, they gave the run-time bits (subnormals aside, which the
    folding keeps and the run flushes), and fencing one cost a step (the
    MNIST LeNet's one-hot table: 22% slower). Nor are 8-bit floats, whose
    constant subgraphs ``_folded`` computes with the oracle's kernels.
    """
    registered = registered_element(ir.ShapedType(value.type).element_type)
    if registered is None or registered.dtype.itemsize == 1:
        return False
    dense = ir.DenseElementsAttr(value)
    if dense.is_splat:
        return not math.isfinite(ir.FloatAttr(dense.get_splat_value()).value)
    with np.errstate(invalid="ignore"):
        return not bool(np.isfinite(elements_array(value).astype(np.float64, copy=False)).all())


def _exact(name: str) -> Callable[[_Node], ir.Value]:
    """A single IEEE operation in the element type.

    A narrow element's arithmetic (bfloat16's, float16's) is spelled as
    compute-type arithmetic rounded once (the same bits, see the module
    doc), so the rounding is explicit and survives IREE's conversions.
    """

    def rule(node: _Node) -> ir.Value:
        if name != "stablehlo.negate" and _is_narrow(node.element):
            wide = [_widened(x) for x in node.operands]
            return _convert(_one(name, wide, wide[0].type), node.element)
        return _one(name, node.operands, node.type)

    return rule


def _pow(node: _Node) -> ir.Value:
    """C99 pow, which the reference follows: IREE's power gives NaN for a negative base and for 0**0.

    Compute |a|**b, give it a's sign when b is an odd integer, NaN when a < 0
    and b is not an integer, and 1 when b == 0, a == 1, or |a| == 1 and b is infinite.
    """
    base, exponent = (_widened(x) for x in node.operands)
    size = _unary("stablehlo.abs", base)
    magnitude = _binary("stablehlo.power", size, exponent)
    integer = _compare(_unary("stablehlo.floor", exponent), exponent, "EQ")
    half = _binary("stablehlo.multiply", exponent, _like(0.5, exponent))
    odd = _binary("stablehlo.and", integer, _compare(_unary("stablehlo.floor", half), half, "NE"))
    negative = _compare(base, _like(0.0, base), "LT")
    signed = _select(_binary("stablehlo.and", odd, _unary_sign_bit(base)),
                     _unary("stablehlo.negate", magnitude), magnitude)
    invalid = _binary("stablehlo.and", negative, _unary("stablehlo.not", integer))
    signed = _select(invalid, _like(float("nan"), base), signed)
    one = _binary("stablehlo.or", _compare(exponent, _like(0.0, exponent), "EQ"),
                  _compare(base, _like(1.0, base), "EQ"))
    unit_to_infinity = _binary(
        "stablehlo.and", _compare(size, _like(1.0, base), "EQ"),
        _compare(_unary("stablehlo.abs", exponent), _like(float("inf"), exponent), "EQ"))
    one = _binary("stablehlo.or", one, unit_to_infinity)
    return _convert(_select(one, _like(1.0, base), signed), node.element)


def _unary_sign_bit(x: ir.Value) -> ir.Value:
    """True where x's sign bit is set, -0.0 included (1 / -0.0 is -inf), as C99 pow needs."""
    zero = _like(0.0, x)
    reciprocal = _binary("stablehlo.divide", _like(1.0, x), x)
    return _binary("stablehlo.or", _compare(x, zero, "LT"), _compare(reciprocal, zero, "LT"))


def _maximum(node: _Node) -> ir.Value:
    return _maximum_of(*node.operands)


def _maximum_of(a: ir.Value, b: ir.Value) -> ir.Value:
    """The reference's maximum: ties and a NaN on the left go left."""
    left = _binary("stablehlo.or", _compare(a, b, "GE"), _compare(a, a, "NE"))
    return _select(left, a, b)


def _step(node: _Node) -> ir.Value:
    x, threshold = node.operands
    return _select(_compare(x, threshold, "GE"), _like(1.0, x), _like(0.0, x))


def _erf_derivative(x: ir.Value) -> ir.Value:
    scaled = _scaled(x)
    if scaled is not None:
        # x = y * c (GELU's x / sqrt 2): rebuild it here from y as (y * 2c) * 0.5, which rounds as
        # y * c does (see _scaled) but is another expression, so IREE recomputes it in the
        # backward instead of keeping the forward's copy alive between the two.
        y, c = scaled
        x = _binary("stablehlo.multiply", _binary("stablehlo.multiply", y, _like(2.0 * c, y)), _like(0.5, y))
    bell = _unary("stablehlo.exponential", _unary("stablehlo.negate", _binary("stablehlo.multiply", x, x)))
    return _binary("stablehlo.multiply", _like(2.0 / math.sqrt(math.pi), x), bell)


def _scaled(x: ir.Value) -> tuple[ir.Value, float] | None:
    """(y, c) when ``x`` is ``y * c`` for a float32/float64 splat constant c whose double is finite.

    Doubling and halving are exact, so (y * 2c) * 0.5 equals y * c but where
    y * c is subnormal (the two may differ in the last place; the square
    rounds both to 0) or beyond half the largest float (y * 2c overflows;
    both squares overflow): erf_derivative's bits are the same everywhere.
    """
    owner = _producer(x, "stablehlo.multiply")
    element = _element(x)
    if owner is None or not isinstance(element, (ir.F32Type, ir.F64Type)):
        return None
    largest = float(ml_dtypes.finfo(registered_element(element).dtype).max)
    for k in (0, 1):
        constant = _producer(owner.operands[k], "stablehlo.constant")
        value = None if constant is None else ir.DenseElementsAttr(constant.attributes["value"])
        if value is not None and value.is_splat:
            c = ir.FloatAttr(value.get_splat_value()).value
            return (owner.operands[1 - k], c) if math.isfinite(c) and abs(2.0 * c) <= largest else None
    return None


def _chlo_erf(x: ir.Value) -> ir.Value:
    return _unary("chlo.erf", x)


def _is_f64(x: ir.Value) -> bool:
    return isinstance(_element(x), ir.F64Type)


def _log1p(x: ir.Value) -> ir.Value:
    """log1p; in float64 IREE expands it as log(1 + x), so use Kahan's form log(u) * x / (u - 1)."""
    if not _is_f64(x):
        return _unary("stablehlo.log_plus_one", x)
    u = _binary("stablehlo.add", _like(1.0, x), x)
    kahan = _binary("stablehlo.multiply", _unary("stablehlo.log", u),
                    _binary("stablehlo.divide", x, _binary("stablehlo.subtract", u, _like(1.0, x))))
    exact = _select(_compare(u, _like(1.0, x), "EQ"), x, kahan)  # |x| below half an ulp of 1
    return _select(_compare(x, _like(float("inf"), x), "EQ"), x, exact)


def _expm1(x: ir.Value) -> ir.Value:
    """expm1; in float64 IREE expands it as exp(x) - 1, so use Kahan's form (u - 1) * x / log(u)."""
    if not _is_f64(x):
        return _unary("stablehlo.exponential_minus_one", x)
    u = _unary("stablehlo.exponential", x)
    less = _binary("stablehlo.subtract", u, _like(1.0, x))
    kahan = _binary("stablehlo.multiply", less, _binary("stablehlo.divide", x, _unary("stablehlo.log", u)))
    result = _select(_compare(u, _like(1.0, x), "EQ"), x, kahan)
    result = _select(_compare(less, _like(-1.0, x), "EQ"), less, result)  # exp underflowed: -1
    return _select(_compare(u, _like(float("inf"), x), "EQ"), u, result)  # overflow (and +inf)


def _sin(x: ir.Value) -> ir.Value:
    """sin; IREE's float32 approximation loses small negative arguments, so use sin(x) = -sin(-x), and
    gives +0 for -0 (docs/reliability.md, iree-sin-negative-zero), so sin(+-0) is its argument."""
    if _is_f64(x):
        return _unary("stablehlo.sine", x)
    zero = _like(0.0, x)
    negative = _compare(x, zero, "LT")
    mirrored = _unary("stablehlo.negate", _unary("stablehlo.sine", _unary("stablehlo.negate", x)))
    value = _select(negative, mirrored, _unary("stablehlo.sine", x))
    return _select(_compare(x, zero, "EQ"), x, value)


# One entry per map function; MAP_FUNCTIONS in the core names the same set.
MAP_LOWERINGS: dict[str, Callable[[ir.Value], ir.Value]] = {
    "exp": lambda x: _unary("stablehlo.exponential", x),
    "log": lambda x: _unary("stablehlo.log", x),
    "sqrt": lambda x: _unary("stablehlo.sqrt", x),
    "tanh": lambda x: _unary("stablehlo.tanh", x),
    "sin": _sin,
    "cos": lambda x: _unary("stablehlo.cosine", x),
    "log1p": _log1p,
    "expm1": _expm1,
    "erf": _chlo_erf,
    "erf_derivative": _erf_derivative,
}


def _map(node: _Node) -> ir.Value:
    function = node.text("function")
    if function not in MAP_LOWERINGS:
        raise LoweringError.at(
            f"topos.map: unknown function {function!r}; known: {', '.join(MAP_LOWERINGS)}",
            node.op.location,
        )
    (x,) = node.operands
    return _convert(MAP_LOWERINGS[function](_widened(x)), node.element)


def _swapped_source(x: ir.Value, rank: int) -> ir.Value | None:
    """The input of ``x`` when ``x`` is a transpose swapping just the last two axes, else None."""
    owner = _producer(x, "stablehlo.transpose")
    if owner is None:
        return None
    order = list(ir.DenseI64ArrayAttr(owner.attributes["permutation"]))
    swap = list(range(rank - 2)) + [rank - 1, rank - 2]
    return owner.operands[0] if order == swap else None


def _matmul(node: _Node) -> ir.Value:
    # x @ w.T (a Linear layer's [out, in] weight) contracts w's last axis directly: the
    # transpose is folded into dot_general, so a resident weight is not copied per call.
    # Same products, same k order: the bits do not change. One case is spelled the other way
    # round: a single row times w.T (decoding one token) is w @ x.T, reshaped, because
    # llvm-cpu runs that vector-matrix product 17x faster (14.7 ms against 258 ms for a
    # [1, 768] row and a [50257, 768] weight; benchmarks in docs/performance.md).
    rank = len(node.shape)
    a, b = node.operands
    if rank == 2 and _shape(a)[0] == 1 and (weight := _swapped_source(b, rank)) is not None:
        product = _dot(_widened(weight), _widened(a), [], 1, 1, (_shape(weight)[0], 1))
        return _convert(_reshape(product, node.shape), node.element)
    contract = [rank - 1, rank - 2]
    operands = []
    for side, x in enumerate(node.operands):
        source = _swapped_source(x, rank)
        if source is not None:
            x, contract[side] = source, rank - 2 if side == 0 else rank - 1
        operands.append(_widened(x))
    a, b = operands
    batch = list(range(rank - 2))
    return _convert(_dot(a, b, batch, contract[0], contract[1], node.shape), node.element)


def _dot(a: ir.Value, b: ir.Value, batch: list[int], lhs: int, rhs: int, shape) -> ir.Value:
    """``stablehlo.dot_general`` contracting ``a``'s axis ``lhs`` with ``b``'s axis ``rhs``."""
    numbers = ir.Attribute.parse(
        f"#stablehlo.dot<lhs_batching_dimensions = {batch}, rhs_batching_dimensions = {batch}, "
        f"lhs_contracting_dimensions = [{lhs}], rhs_contracting_dimensions = [{rhs}]>"
    )
    return _one("stablehlo.dot_general", [a, b], _tensor(tuple(shape), _element(a)), dot_dimension_numbers=numbers)


def _total(x: ir.Value, axis: int | None, element: ir.Type) -> ir.Value:
    """The sum of ``x`` along ``axis`` (None: of every element) as ``element``.

    A negation is summed as the negation of the sum: the same bits
    (negating is exact and rounding is symmetric, so every partial sum is
    mirrored), one negation per sum instead of per element, and IREE 3.13
    compiles it for the GPU targets. Given ``sum(-x)`` IREE folds the
    negation into the reduction (``out - in``), for which its GPU reduction
    pipelines find no identity value ("failed to get neutral element for
    reduction"): LayerNorm's gradient holds one, so the small GPT's and
    makemore transformer's training steps did not compile for cuda, rocm
    or metal (docs/compiling.md, "float64 and target caveats").
    """
    negated = _producer(x, "stablehlo.negate")
    if negated is not None:
        return _unary("stablehlo.negate", _total(negated.operands[0], axis, element))
    if axis is None:
        # 1-D first: GPU targets fail on a multi-axis reduction to a scalar.
        x, axis = _reshape(x, [math.prod(_shape(x))]), 0
    return _convert(_sum(_widened(x), axis), element)


def _full_sum(node: _Node) -> ir.Value:
    (x,) = node.operands
    return _total(x, None, node.element) if _shape(x) else x


def _sum_along(node: _Node) -> ir.Value:
    (x,) = node.operands
    return _total(x, node.integer("axis"), node.element)


def _broadcast(node: _Node) -> ir.Value:
    (x,) = node.operands
    return _broadcast_in_dim(_reshape(x, ()), node.shape, [])


def _broadcast_along(node: _Node) -> ir.Value:
    (x,) = node.operands
    return _restore_axis(x, node.integer("axis"), node.shape)


def _reshape_rule(node: _Node) -> ir.Value:
    (x,) = node.operands
    return _reshape(x, node.shape)


def _permute(node: _Node) -> ir.Value:
    (x,) = node.operands
    return _transpose(x, node.ints("order"))


def _transpose(x: ir.Value, permutation: Sequence[int]) -> ir.Value:
    shape = _shape(x)
    return _one("stablehlo.transpose", [x], _tensor([shape[p] for p in permutation], _element(x)),
                permutation=_i64s(permutation))


def _narrow(node: _Node) -> ir.Value:
    (x,) = node.operands
    start = node.integer("start")
    return _slice(x, node.integer("axis"), start, start + node.integer("length"))


def _pad_rule(node: _Node) -> ir.Value:
    (x,) = node.operands
    axis, start = node.integer("axis"), node.integer("start")
    high = node.integer("extent") - start - _shape(x)[axis]
    return _pad(x, axis, start, high, 0, 0.0)


def _unfold(node: _Node) -> ir.Value:
    (x,) = node.operands
    axis, size, step, dilation = (node.integer(n) for n in ("axis", "size", "step", "dilation"))
    count = node.shape[axis]
    lane_shape = node.shape[: axis + 1] + (1,) + node.shape[axis + 2 :]
    lanes = []
    for lane in range(size):
        # lane j of window i reads element i*step + j*dilation: a strided slice. Sliced, then
        # given its lane axis: IREE 3.13 cannot translate a gather of the other order's slice
        # (reshape, then slice; docs/reliability.md, iree-gather-of-widened-slice). A one-element
        # window is the exception, which _reshape slices again from the widened operand.
        first = lane * dilation
        strided = _slice(x, axis, first, first + (count - 1) * step + 1, step)
        lanes.append(_reshape(strided, lane_shape))
    return _concatenate(lanes, axis + 1)


def _concatenate(values: list[ir.Value], axis: int) -> ir.Value:
    """``values`` joined along ``axis``; one value is itself (IREE need not see a one-operand concatenate)."""
    if len(values) == 1:
        return values[0]
    shape = list(_shape(values[0]))
    shape[axis] = sum(_shape(v)[axis] for v in values)
    return _one("stablehlo.concatenate", values, _tensor(tuple(shape), _element(values[0])),
                dimension=ir.IntegerAttr.get(ir.IntegerType.get_signless(64), axis))


def _fold(node: _Node) -> ir.Value:
    (x,) = node.operands
    axis, size, step, dilation, extent = (
        node.integer(n) for n in ("axis", "size", "step", "dilation", "extent")
    )
    work = _widened(x)
    total = _constant(0.0, node.shape, _element(work))
    for lane in range(size):
        # Lane j of window i lands on i*step + j*dilation. +0.0 fills the positions this lane
        # does not touch. The running total starts at +0.0 and so is never -0.0, and
        # x + 0.0 == x for every other x.
        lanes = _slice(work, axis + 1, lane, lane + 1)  # [..., count, 1, ...]
        total = _binary("stablehlo.add", total, _placed(lanes, axis, lane * dilation, extent, step))
    return _convert(total, node.element)


def _placed(lanes: ir.Value, axis: int, first: int, extent: int, step: int) -> ir.Value:
    """Values ``[..., count, 1, ...]`` (a unit axis after ``axis``) placed along ``axis`` at
    first, first + step, ...: ``[..., extent, ...]``, +0.0 everywhere else.

    The step - 1 zeros between values are the unit axis padded at its high
    edge, then merged into ``axis``: edge padding only. IREE 3.13
    miscompiles interior padding of a value that was itself padded: it
    composes the two pads as if the inner low edge were not stretched too
    (``pad(pad(x, low=1), interior=1)`` put x one place early;
    docs/reliability.md, iree-pad-of-pad).
    """
    shape = _shape(lanes)
    count = shape[axis]
    if step > 1:
        lanes = _pad(lanes, axis + 1, 0, step - 1, 0, 0.0)  # [..., count, step, ...]
    spread = _reshape(lanes, shape[:axis] + (count * step,) + shape[axis + 2 :])
    high = extent - first - count * step
    if high < 0:  # the zeros after the last value run past the extent
        spread, high = _slice(spread, axis, 0, count * step + high), 0
    return _pad(spread, axis, first, high, 0, 0.0)


def _gather(node: _Node) -> ir.Value:
    table, selection = node.operands
    picks = len(_shape(selection))
    rows = _shape(table)[1:]
    start, step = _recorded_run(selection)
    if start is not None and step == 1:
        # Recorded rows in a run (one index; positions 0..T-1) are a slice: the same copy. IREE
        # folds a gather of one recorded index into a one-element slice it then refuses
        # (docs/reliability.md, iree-one-row-gather), and metal could not compile a recorded
        # index vector fused into a reduction's dispatch (docs/compiling.md); a slice compiles.
        return _reshape(_slice(table, 0, start, start + math.prod(_shape(selection))), node.shape)
    if start is not None:
        # One recorded row picked again and again is that row broadcast. Gathered by the indices
        # [0, 0], IREE wrote a table it also returned at row 0 only (docs/reliability.md,
        # iree-gather-producer-fusion).
        row = _reshape(_slice(table, 0, start, start + 1), rows)
        return _broadcast_in_dim(row, node.shape, [picks + i for i in range(len(rows))])
    # The index vector spelled as a trailing axis of one: left implicit (index_vector_dim equal to
    # the indices' rank), IREE 3.13 gathers in one loop over every element, dividing each position
    # back into its index and offset. makemore's MLP embedding, [27, 10] by [64, 3]: 4.6 us a call
    # implicit, 0.9 us explicit (iree-benchmark-module, one core; docs/performance.md, "One
    # compiler, two front ends").
    indices = _reshape(selection, _shape(selection) + (1,))
    numbers = ir.Attribute.parse(
        f"#stablehlo.gather<offset_dims = {[picks + i for i in range(len(rows))]}, "
        f"collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = {picks}>"
    )
    return _one("stablehlo.gather", [table, indices], node.type, dimension_numbers=numbers,
                slice_sizes=_i64s((1,) + rows))


def _recorded_run(selection: ir.Value) -> tuple[int | None, int]:
    """(first index, step) when ``selection`` is a recorded constant of rows k, k + step, ... (row-major)
    with a step of 1 or 0 (one row, repeated), else (None, 0)."""
    recorded = _producer(selection, "stablehlo.constant")
    if recorded is None:
        return None, 0
    rows = np.asarray(ir.DenseIntElementsAttr(recorded.attributes["value"])).reshape(-1)
    for step in (1, 0):
        if rows.size > 0 and np.array_equal(rows, rows[0] + step * np.arange(rows.size)):
            return int(rows[0]), step
    return None, 0


def _scatter(node: _Node) -> ir.Value:
    """stablehlo.scatter with an add region, starting from zeros.

    StableHLO leaves the order of colliding updates to the implementation.
    IREE on llvm-cpu applies them in position order — the reference's
    order, so the bits agree (tests/iree/test_conformance.py holds it to
    that); a parallel target may add them in another order, which its
    accumulation envelope allows. (An earlier lowering spelled the order
    out with a stablehlo.while, one trip per row: 50x slower on a 512-row
    embedding gradient.)
    """
    values, selection = node.operands
    positions = math.prod(_shape(selection))
    row = node.shape[1:]
    work = _widened(values)
    element = _element(work)
    rows = _reshape(work, (positions,) + row)
    targets = _reshape(selection, (positions, 1))
    numbers = ir.Attribute.parse(
        f"#stablehlo.scatter<update_window_dims = {[1 + i for i in range(len(row))]}, "
        "inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>"
    )
    scalar = _tensor((), element)
    scatter = _create("stablehlo.scatter", [_constant(0.0, node.shape, element), targets, rows],
                      _tensor(node.shape, element), {"scatter_dimension_numbers": numbers}, regions=1)
    body = scatter.regions[0].blocks.append(scalar, scalar)
    with ir.InsertionPoint(body):
        _create("stablehlo.return", [_binary("stablehlo.add", *body.arguments)], None)
    return _convert(scatter.result, node.element)


def _log_softmax(node: _Node) -> ir.Value:
    (x,) = node.operands
    axis = node.integer("axis")
    work = _widened(x)
    shape = _shape(work)
    shifted = _binary("stablehlo.subtract", work, _restore_axis(_peak(work, axis), axis, shape))
    total = _unary("stablehlo.log", _sum(_unary("stablehlo.exponential", shifted), axis))
    out = _binary("stablehlo.subtract", shifted, _restore_axis(total, axis, shape))
    return _convert(out, node.element)


def _logsumexp(node: _Node) -> ir.Value:
    (x,) = node.operands
    axis = node.integer("axis")
    work = _widened(x)
    peak = _peak(work, axis)
    shifted = _binary("stablehlo.subtract", work, _restore_axis(peak, axis, _shape(work)))
    total = _unary("stablehlo.log", _sum(_unary("stablehlo.exponential", shifted), axis))
    return _convert(_binary("stablehlo.add", peak, total), node.element)


# The table: one rule per opcode of topos.OPCODES (a completeness test enforces it).
LOWERINGS: dict[str, Callable[[_Node], ir.Value]] = {
    "leaf": _leaf,
    "parameter": _source,
    "input": _source,
    "add": _exact("stablehlo.add"),
    "sub": _exact("stablehlo.subtract"),
    "mul": _exact("stablehlo.multiply"),
    "div": _exact("stablehlo.divide"),
    "neg": _exact("stablehlo.negate"),
    "pow": _pow,
    "maximum": _maximum,
    "step": _step,
    "map": _map,
    "matmul": _matmul,
    "sum": _full_sum,
    "sum_along": _sum_along,
    "broadcast": _broadcast,
    "broadcast_along": _broadcast_along,
    "reshape": _reshape_rule,
    "permute": _permute,
    "narrow": _narrow,
    "pad": _pad_rule,
    "unfold": _unfold,
    "fold": _fold,
    "gather": _gather,
    "scatter": _scatter,
    "log_softmax": _log_softmax,
    "logsumexp": _logsumexp,
}


# ---- the pass ---------------------------------------------------------------------------


def _topos_ops(root: ir.Operation) -> list[ir.Operation]:
    found: list[ir.Operation] = []

    def visit(op):
        if op.operation.name.startswith("topos."):
            found.append(op.operation)
        return ir.WalkResult.ADVANCE

    root.walk(visit)
    return found


def lower_operation(op: ir.Operation) -> None:
    """Replace one topos op by its StableHLO, inserted just before it."""
    opcode = op.name[len("topos."):]
    rule = LOWERINGS.get(opcode)
    if rule is None:
        raise LoweringError.at(
            f"{op.name} has no StableHLO lowering; the vocabulary is {', '.join(sorted(LOWERINGS))}",
            op.location,
        )
    with op.location, ir.InsertionPoint(op):
        value = _folded(op)
        if value is None:
            value = rule(_Node(op))
    if value.type != op.results[0].type:
        raise LoweringError.at(
            f"lowering {op.name} produced {value.type}, but the op declares {op.results[0].type}",
            op.location,
        )
    op.results[0].replace_all_uses_with(value)
    op.erase()


def _folded(op: ir.Operation) -> ir.Value | None:
    """The oracle's value of ``op`` as a constant, when its element is an 8-bit float and its operands are constants.

    IREE 3.13 evaluates constant subgraphs ahead of time (const-eval), and
    with an 8-bit float in them its JIT fails ('jit global source
    initialization order invalid') or would round in software (see
    ``_carry_into_smallest_normal``). Such an op is computed here with the
    core's reference kernel instead: the oracle's bits, as a
    ``stablehlo.constant``. Chains fold one op at a time, in program order.
    """
    registered = registered_element(ir.RankedTensorType(op.results[0].type).element_type)
    if registered is None or not registered.narrow or registered.dtype.itemsize != 1:
        return None
    opcode = by_name(op.name[len("topos."):])
    if opcode.is_source:
        return None
    arrays = []
    for operand in op.operands:
        owner = _producer(operand, "stablehlo.constant")
        if owner is None:
            return None
        array = elements_array(owner.attributes["value"])
        shape = tuple(ir.RankedTensorType(operand.type).shape)
        arrays.append(np.broadcast_to(array, shape) if array.shape != shape else array)
    with np.errstate(all="ignore"):
        value = np.asarray(opcode.kernel(*arrays, **op.opview.opcode_attributes()))
    return _one("stablehlo.constant", [], op.results[0].type, value=elements_attribute(value))


def lower_to_stablehlo(root: ir.Operation) -> None:
    """Lower every topos op under ``root`` (a module or a function), in program order."""
    for op in _topos_ops(root):
        lower_operation(op)


@register_pass(PASS_NAME, PASS_DESCRIPTION)
def lowering_pass(module) -> None:
    """The registered pass: lower ``module`` in place; LoweringError at the failing op's location."""
    lower_to_stablehlo(module.operation)


__all__ = [
    "LOWERINGS", "MAP_LOWERINGS", "PASS_DESCRIPTION", "PASS_NAME", "LoweringError",
    "lower_operation", "lower_to_stablehlo", "lowering_pass",
]
