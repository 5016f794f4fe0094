"""The ``topos-lower-to-stablehlo`` pass: every topos op becomes StableHLO with the same meaning.

``LOWERINGS`` is the dialect's single place for each opcode's lowering:
one rule per opcode, keyed by the opcode's name. A rule reads one topos op
and returns the StableHLO value that replaces its result; the pass walks
each function in program order, so a rule always sees operands that are
already StableHLO. The rules spell their ops with the shared builders of
``topos.dialect.passes.builders``.

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
  compute type is wider: ``topos.base.element.register``) computes in its
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
  drops (``builders.convert``), and an 8-bit op over
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

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import ml_dtypes
import numpy as np
from iree.compiler import ir

from topos.dialect.ir.diagnostics import Diagnostic, DialectError
from topos.dialect.ir.ops import elements_array, elements_attribute, registered_element
from topos.dialect.passes.builders import (
    binary,
    broadcast_in_dim,
    compare,
    concatenate,
    constant,
    convert,
    create,
    dot,
    element_type,
    i64_array,
    like,
    maximum_of,
    one_result,
    pad,
    placed,
    producer,
    reduce,
    reshape,
    select,
    shape_of,
    slice_along,
    tensor_type,
    transpose,
    unary,
    widened,
)
from topos.dialect.passes.registry import register_pass
from topos.spec.opcodes import by_name

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


# ---- what several rules build --------------------------------------------------------


def _is_narrow(element: ir.Type) -> bool:
    """Whether ``element`` computes in a wider type (bfloat16, a narrow registered element)."""
    registered = registered_element(element)
    return registered is not None and registered.narrow


def _sum(x: ir.Value, axis: int) -> ir.Value:
    # -0.0 is the exact additive identity: x + -0.0 == x for every x, -0.0 included.
    return reduce(x, [axis], "stablehlo.add", -0.0)


def _peak(x: ir.Value, axis: int) -> ir.Value:
    """The maximum along ``axis`` with a non-finite maximum replaced by 0 (the kernels' shift)."""
    peak = reduce(x, [axis], "stablehlo.maximum", -math.inf)
    finite = one_result("stablehlo.is_finite", [peak], tensor_type(shape_of(peak), ir.IntegerType.get_signless(1)))
    return select(finite, peak, like(0.0, peak))


def _restore_axis(x: ir.Value, axis: int, shape: Sequence[int]) -> ir.Value:
    """Broadcast a value with ``axis`` removed back to ``shape``."""
    return broadcast_in_dim(x, shape, [i for i in range(len(shape)) if i != axis])


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
    recorded = one_result("stablehlo.constant", [], node.type, value=value)
    return one_result("stablehlo.optimization_barrier", [recorded], node.type) if _fenced(value) else recorded


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
            wide = [widened(x) for x in node.operands]
            return convert(one_result(name, wide, wide[0].type), node.element)
        return one_result(name, node.operands, node.type)

    return rule


def _pow(node: _Node) -> ir.Value:
    """C99 pow, which the reference follows: IREE's power gives NaN for a negative base and for 0**0.

    Compute |a|**b, give it a's sign when b is an odd integer, NaN when a < 0
    and b is not an integer, and 1 when b == 0, a == 1, or |a| == 1 and b is infinite.
    """
    base, exponent = (widened(x) for x in node.operands)
    size = unary("stablehlo.abs", base)
    magnitude = binary("stablehlo.power", size, exponent)
    integer = compare(unary("stablehlo.floor", exponent), exponent, "EQ")
    half = binary("stablehlo.multiply", exponent, like(0.5, exponent))
    odd = binary("stablehlo.and", integer, compare(unary("stablehlo.floor", half), half, "NE"))
    negative = compare(base, like(0.0, base), "LT")
    signed = select(binary("stablehlo.and", odd, _unary_sign_bit(base)),
                    unary("stablehlo.negate", magnitude), magnitude)
    invalid = binary("stablehlo.and", negative, unary("stablehlo.not", integer))
    signed = select(invalid, like(float("nan"), base), signed)
    one = binary("stablehlo.or", compare(exponent, like(0.0, exponent), "EQ"),
                 compare(base, like(1.0, base), "EQ"))
    unit_to_infinity = binary(
        "stablehlo.and", compare(size, like(1.0, base), "EQ"),
        compare(unary("stablehlo.abs", exponent), like(float("inf"), exponent), "EQ"))
    one = binary("stablehlo.or", one, unit_to_infinity)
    return convert(select(one, like(1.0, base), signed), node.element)


def _unary_sign_bit(x: ir.Value) -> ir.Value:
    """True where x's sign bit is set, -0.0 included (1 / -0.0 is -inf), as C99 pow needs."""
    zero = like(0.0, x)
    reciprocal = binary("stablehlo.divide", like(1.0, x), x)
    return binary("stablehlo.or", compare(x, zero, "LT"), compare(reciprocal, zero, "LT"))


def _maximum(node: _Node) -> ir.Value:
    return maximum_of(*node.operands)


def _step(node: _Node) -> ir.Value:
    x, threshold = node.operands
    return select(compare(x, threshold, "GE"), like(1.0, x), like(0.0, x))


def _erf_derivative(x: ir.Value) -> ir.Value:
    scaled = _scaled(x)
    if scaled is not None:
        # x = y * c (GELU's x / sqrt 2): rebuild it here from y as (y * 2c) * 0.5, which rounds as
        # y * c does (see _scaled) but is another expression, so IREE recomputes it in the
        # backward instead of keeping the forward's copy alive between the two.
        y, c = scaled
        x = binary("stablehlo.multiply", binary("stablehlo.multiply", y, like(2.0 * c, y)), like(0.5, y))
    bell = unary("stablehlo.exponential", unary("stablehlo.negate", binary("stablehlo.multiply", x, x)))
    return binary("stablehlo.multiply", like(2.0 / math.sqrt(math.pi), x), bell)


def _scaled(x: ir.Value) -> tuple[ir.Value, float] | None:
    """(y, c) when ``x`` is ``y * c`` for a float32/float64 splat constant c whose double is finite.

    Doubling and halving are exact, so (y * 2c) * 0.5 equals y * c but where
    y * c is subnormal (the two may differ in the last place; the square
    rounds both to 0) or beyond half the largest float (y * 2c overflows;
    both squares overflow): erf_derivative's bits are the same everywhere.
    """
    owner = producer(x, "stablehlo.multiply")
    element = element_type(x)
    if owner is None or not isinstance(element, (ir.F32Type, ir.F64Type)):
        return None
    largest = float(ml_dtypes.finfo(registered_element(element).dtype).max)
    for k in (0, 1):
        factor = producer(owner.operands[k], "stablehlo.constant")
        value = None if factor is None else ir.DenseElementsAttr(factor.attributes["value"])
        if value is not None and value.is_splat:
            c = ir.FloatAttr(value.get_splat_value()).value
            return (owner.operands[1 - k], c) if math.isfinite(c) and abs(2.0 * c) <= largest else None
    return None


def _chlo_erf(x: ir.Value) -> ir.Value:
    return unary("chlo.erf", x)


def _is_f64(x: ir.Value) -> bool:
    return isinstance(element_type(x), ir.F64Type)


def _log1p(x: ir.Value) -> ir.Value:
    """log1p; in float64 IREE expands it as log(1 + x), so use Kahan's form log(u) * x / (u - 1)."""
    if not _is_f64(x):
        return unary("stablehlo.log_plus_one", x)
    u = binary("stablehlo.add", like(1.0, x), x)
    kahan = binary("stablehlo.multiply", unary("stablehlo.log", u),
                   binary("stablehlo.divide", x, binary("stablehlo.subtract", u, like(1.0, x))))
    exact = select(compare(u, like(1.0, x), "EQ"), x, kahan)  # |x| below half an ulp of 1
    return select(compare(x, like(float("inf"), x), "EQ"), x, exact)


def _expm1(x: ir.Value) -> ir.Value:
    """expm1; in float64 IREE expands it as exp(x) - 1, so use Kahan's form (u - 1) * x / log(u)."""
    if not _is_f64(x):
        return unary("stablehlo.exponential_minus_one", x)
    u = unary("stablehlo.exponential", x)
    less = binary("stablehlo.subtract", u, like(1.0, x))
    kahan = binary("stablehlo.multiply", less, binary("stablehlo.divide", x, unary("stablehlo.log", u)))
    result = select(compare(u, like(1.0, x), "EQ"), x, kahan)
    result = select(compare(less, like(-1.0, x), "EQ"), less, result)  # exp underflowed: -1
    return select(compare(u, like(float("inf"), x), "EQ"), u, result)  # overflow (and +inf)


def _sin(x: ir.Value) -> ir.Value:
    """sin; IREE's float32 approximation loses small negative arguments, so use sin(x) = -sin(-x), and
    gives +0 for -0 (docs/reliability.md, iree-sin-negative-zero), so sin(+-0) is its argument."""
    if _is_f64(x):
        return unary("stablehlo.sine", x)
    zero = like(0.0, x)
    negative = compare(x, zero, "LT")
    mirrored = unary("stablehlo.negate", unary("stablehlo.sine", unary("stablehlo.negate", x)))
    value = select(negative, mirrored, unary("stablehlo.sine", x))
    return select(compare(x, zero, "EQ"), x, value)


# One entry per map function; MAP_FUNCTIONS in the core names the same set.
MAP_LOWERINGS: dict[str, Callable[[ir.Value], ir.Value]] = {
    "exp": lambda x: unary("stablehlo.exponential", x),
    "log": lambda x: unary("stablehlo.log", x),
    "sqrt": lambda x: unary("stablehlo.sqrt", x),
    "tanh": lambda x: unary("stablehlo.tanh", x),
    "sin": _sin,
    "cos": lambda x: unary("stablehlo.cosine", x),
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
    return convert(MAP_LOWERINGS[function](widened(x)), node.element)


def _swapped_source(x: ir.Value, rank: int) -> ir.Value | None:
    """The input of ``x`` when ``x`` is a transpose swapping just the last two axes, else None."""
    owner = producer(x, "stablehlo.transpose")
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
    if rank == 2 and shape_of(a)[0] == 1 and (weight := _swapped_source(b, rank)) is not None:
        product = dot(widened(weight), widened(a), [], 1, 1, (shape_of(weight)[0], 1))
        return convert(reshape(product, node.shape), node.element)
    contract = [rank - 1, rank - 2]
    operands = []
    for side, x in enumerate(node.operands):
        source = _swapped_source(x, rank)
        if source is not None:
            x, contract[side] = source, rank - 2 if side == 0 else rank - 1
        operands.append(widened(x))
    a, b = operands
    batch = list(range(rank - 2))
    return convert(dot(a, b, batch, contract[0], contract[1], node.shape), node.element)


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
    negated = producer(x, "stablehlo.negate")
    if negated is not None:
        return unary("stablehlo.negate", _total(negated.operands[0], axis, element))
    if axis is None:
        # 1-D first: GPU targets fail on a multi-axis reduction to a scalar.
        x, axis = reshape(x, [math.prod(shape_of(x))]), 0
    return convert(_sum(widened(x), axis), element)


def _full_sum(node: _Node) -> ir.Value:
    (x,) = node.operands
    return _total(x, None, node.element) if shape_of(x) else x


def _sum_along(node: _Node) -> ir.Value:
    (x,) = node.operands
    return _total(x, node.integer("axis"), node.element)


def _broadcast(node: _Node) -> ir.Value:
    (x,) = node.operands
    return broadcast_in_dim(reshape(x, ()), node.shape, [])


def _broadcast_along(node: _Node) -> ir.Value:
    (x,) = node.operands
    return _restore_axis(x, node.integer("axis"), node.shape)


def _reshape_rule(node: _Node) -> ir.Value:
    (x,) = node.operands
    return reshape(x, node.shape)


def _permute(node: _Node) -> ir.Value:
    (x,) = node.operands
    return transpose(x, node.ints("order"))


def _narrow(node: _Node) -> ir.Value:
    (x,) = node.operands
    start = node.integer("start")
    return slice_along(x, node.integer("axis"), start, start + node.integer("length"))


def _pad_rule(node: _Node) -> ir.Value:
    (x,) = node.operands
    axis, start = node.integer("axis"), node.integer("start")
    high = node.integer("extent") - start - shape_of(x)[axis]
    return pad(x, axis, start, high, 0, 0.0)


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
        # window is the exception, which reshape slices again from the widened operand.
        first = lane * dilation
        strided = slice_along(x, axis, first, first + (count - 1) * step + 1, step)
        lanes.append(reshape(strided, lane_shape))
    return concatenate(lanes, axis + 1)


def _fold(node: _Node) -> ir.Value:
    (x,) = node.operands
    axis, size, step, dilation, extent = (
        node.integer(n) for n in ("axis", "size", "step", "dilation", "extent")
    )
    work = widened(x)
    total = constant(0.0, node.shape, element_type(work))
    for lane in range(size):
        # Lane j of window i lands on i*step + j*dilation. +0.0 fills the positions this lane
        # does not touch. The running total starts at +0.0 and so is never -0.0, and
        # x + 0.0 == x for every other x.
        lanes = slice_along(work, axis + 1, lane, lane + 1)  # [..., count, 1, ...]
        total = binary("stablehlo.add", total, placed(lanes, axis, lane * dilation, extent, step))
    return convert(total, node.element)


def _gather(node: _Node) -> ir.Value:
    table, selection = node.operands
    picks = len(shape_of(selection))
    rows = shape_of(table)[1:]
    start, step = _recorded_run(selection)
    if start is not None and step == 1:
        # Recorded rows in a run (one index; positions 0..T-1) are a slice: the same copy. IREE
        # folds a gather of one recorded index into a one-element slice it then refuses
        # (docs/reliability.md, iree-one-row-gather), and metal could not compile a recorded
        # index vector fused into a reduction's dispatch (docs/compiling.md); a slice compiles.
        return reshape(slice_along(table, 0, start, start + math.prod(shape_of(selection))), node.shape)
    if start is not None:
        # One recorded row picked again and again is that row broadcast. Gathered by the indices
        # [0, 0], IREE wrote a table it also returned at row 0 only (docs/reliability.md,
        # iree-gather-producer-fusion).
        row = reshape(slice_along(table, 0, start, start + 1), rows)
        return broadcast_in_dim(row, node.shape, [picks + i for i in range(len(rows))])
    # The index vector spelled as a trailing axis of one: left implicit (index_vector_dim equal to
    # the indices' rank), IREE 3.13 gathers in one loop over every element, dividing each position
    # back into its index and offset. makemore's MLP embedding, [27, 10] by [64, 3]: 4.6 us a call
    # implicit, 0.9 us explicit (iree-benchmark-module, one core; docs/performance.md, "One
    # compiler, two front ends").
    indices = reshape(selection, shape_of(selection) + (1,))
    numbers = ir.Attribute.parse(
        f"#stablehlo.gather<offset_dims = {[picks + i for i in range(len(rows))]}, "
        f"collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = {picks}>"
    )
    return one_result("stablehlo.gather", [table, indices], node.type, dimension_numbers=numbers,
                      slice_sizes=i64_array((1,) + rows))


def _recorded_run(selection: ir.Value) -> tuple[int | None, int]:
    """(first index, step) when ``selection`` is a recorded constant of rows k, k + step, ... (row-major)
    with a step of 1 or 0 (one row, repeated), else (None, 0)."""
    recorded = producer(selection, "stablehlo.constant")
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
    positions = math.prod(shape_of(selection))
    row = node.shape[1:]
    work = widened(values)
    element = element_type(work)
    rows = reshape(work, (positions,) + row)
    targets = reshape(selection, (positions, 1))
    numbers = ir.Attribute.parse(
        f"#stablehlo.scatter<update_window_dims = {[1 + i for i in range(len(row))]}, "
        "inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>"
    )
    scalar = tensor_type((), element)
    scatter = create("stablehlo.scatter", [constant(0.0, node.shape, element), targets, rows],
                     tensor_type(node.shape, element), {"scatter_dimension_numbers": numbers}, regions=1)
    body = scatter.regions[0].blocks.append(scalar, scalar)
    with ir.InsertionPoint(body):
        create("stablehlo.return", [binary("stablehlo.add", *body.arguments)], None)
    return convert(scatter.result, node.element)


def _log_softmax(node: _Node) -> ir.Value:
    (x,) = node.operands
    axis = node.integer("axis")
    work = widened(x)
    shape = shape_of(work)
    shifted = binary("stablehlo.subtract", work, _restore_axis(_peak(work, axis), axis, shape))
    total = unary("stablehlo.log", _sum(unary("stablehlo.exponential", shifted), axis))
    out = binary("stablehlo.subtract", shifted, _restore_axis(total, axis, shape))
    return convert(out, node.element)


def _logsumexp(node: _Node) -> ir.Value:
    (x,) = node.operands
    axis = node.integer("axis")
    work = widened(x)
    peak = _peak(work, axis)
    shifted = binary("stablehlo.subtract", work, _restore_axis(peak, axis, shape_of(work)))
    total = unary("stablehlo.log", _sum(unary("stablehlo.exponential", shifted), axis))
    return convert(binary("stablehlo.add", peak, total), node.element)


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
    ``builders.convert``). Such an op is computed here with the
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
        owner = producer(operand, "stablehlo.constant")
        if owner is None:
            return None
        array = elements_array(owner.attributes["value"])
        shape = tuple(ir.RankedTensorType(operand.type).shape)
        arrays.append(np.broadcast_to(array, shape) if array.shape != shape else array)
    with np.errstate(all="ignore"):
        value = np.asarray(opcode.kernel(*arrays, **op.opview.opcode_attributes()))
    return one_result("stablehlo.constant", [], op.results[0].type, value=elements_attribute(value))


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
