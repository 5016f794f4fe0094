"""Every non-source opcode, recorded on a tape and run by the oracle, against independent float64 math.

One table drives it (tinygrad style): each row names an opcode, how to
record it, a float64 reference written here with NumPy or mpmath (never
the topos kernels), the operand shapes and attributes to try, the input
domain, and the tolerance in epsilons of each element type. One helper
records, feeds, runs and compares every row in float64, float32 and
bfloat16. The completeness test fails when an opcode or a map function
has no row.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import mpmath
import numpy as np
import pytest

import topos
from topos import Tape
from topos.base.errors import ShapeError, ToposError

from conftest import ELEMENT_IDS, ELEMENTS, assert_close, generator, line_here

F64, F32, BF16 = topos.float64, topos.float32, topos.bfloat16

# Tolerances in epsilons of the element type (see conftest.assert_close).
EXACT = {F64: 0, F32: 0, BF16: 0}  # moves, copies and comparisons never round
# IEEE basic operations (+ - * / sqrt) are correctly rounded: the result must equal the
# float64 reference rounded to the element, bit for bit. (Rounding a float64 result again to
# float32 or bfloat16 is innocuous: 53 >= 2p + 2 for both.)
ROUNDED = "correctly rounded"
CORRECTLY_ROUNDED = {F64: ROUNDED, F32: ROUNDED, BF16: ROUNDED}
# float64 reference transcendentals are fdlibm-class (<= 1 ulp); narrower
# types are evaluated in float64 and rounded once.
TRANSCENDENTAL = {F64: 2, F32: 1, BF16: 1}
# Up to 8 roundings in the compute type, measured against the sum of |terms|;
# bfloat16 accumulates in float32, whose roundings are far below one bf16 epsilon.
ACCUMULATED = {F64: 8, F32: 8, BF16: 1}


# ---- the table ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One try: operand shapes (a tuple) or index operands (a topos selection), and attributes."""

    operands: tuple
    attributes: dict = field(default_factory=dict)

    def label(self) -> str:
        def one(operand):
            if isinstance(operand, topos.Selection):
                return f"sel{_dims(operand.indices.shape)}<{operand.extent}>"
            return _dims(operand)

        attrs = ",".join(f"{k}={v}" for k, v in self.attributes.items())
        return "&".join(one(o) for o in self.operands) + (f"({attrs})" if attrs else "")


def _dims(shape) -> str:
    return "x".join(str(d) for d in shape) if shape else "scalar"


def v(*operands, **attributes) -> Variant:
    return Variant(tuple(operands), attributes)


@dataclass(frozen=True)
class Case:
    """One row: an opcode, how to record it, and an independent float64 reference."""

    opcode: str
    record: Callable  # (*operand Values, **attributes) -> Value
    expect: Callable  # (*float64 arrays, **attributes) -> float64 array
    variants: tuple
    epsilons: dict
    domain: tuple = ((-3.0, 3.0),)  # per operand (the last one repeats): (low, high) or fn(rng, shape)
    scale: Callable | None = None  # (*float64 arrays, **attributes) -> error yardstick
    function: str | None = None  # the map function, for map rows
    label: str = ""

    @property
    def name(self) -> str:
        return self.label or (f"map.{self.function}" if self.function else self.opcode)


def _mp(function, precision: int = 160):
    """Apply an mpmath function elementwise at high precision, rounding once to float64."""

    def apply(*arrays):
        arrays = np.broadcast_arrays(*arrays)
        out = np.empty(arrays[0].shape, dtype=np.float64)
        with mpmath.workprec(precision):
            for index in np.ndindex(out.shape):
                out[index] = float(function(*(mpmath.mpf(float(a[index])) for a in arrays)))
        return out

    return apply


def _integers(low, high):
    """A domain of small integers, so ties and exact zeros actually occur."""
    return lambda rng, shape: rng.integers(low, high + 1, shape).astype(np.float64)


def _unfold(x, axis, size, step, dilation):
    count = (x.shape[axis] - dilation * (size - 1) - 1) // step + 1
    windows = [
        np.stack([np.take(x, i * step + j * dilation, axis=axis) for j in range(size)], axis=axis)
        for i in range(count)
    ]
    return np.stack(windows, axis=axis)


def _fold(x, axis, size, step, dilation, extent):
    out = np.zeros(x.shape[:axis] + (extent,) + x.shape[axis + 2 :])
    for i in range(x.shape[axis]):
        for j in range(size):
            target = [slice(None)] * out.ndim
            target[axis] = i * step + j * dilation
            source = [slice(None)] * x.ndim
            source[axis], source[axis + 1] = i, j
            out[tuple(target)] += x[tuple(source)]
    return out


def _scatter(values, indices, extent):
    out = np.zeros((extent,) + values.shape[indices.ndim :])
    np.add.at(out, indices, values)
    return out


def _logsumexp(x, axis):
    peak = np.max(x, axis=axis, keepdims=True)
    return np.squeeze(peak, axis) + np.log(np.sum(np.exp(x - peak), axis=axis))


def _log_softmax(x, axis):
    # Shift first: x - max is exact here, and subtracting the large max late would
    # cost the reference itself an ulp of the max.
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def _pad(x, axis, start, extent):
    widths = [(0, 0)] * x.ndim
    widths[axis] = (start, extent - start - x.shape[axis])
    return np.pad(x, widths)


ELEMENTWISE_SHAPES = ((), (1,), (5,), (2, 3), (1, 4, 1), (2, 1, 3))


def _binary_variants():
    return tuple(v(s, s) for s in ELEMENTWISE_SHAPES)


def _unary_variants():
    return tuple(v(s) for s in ELEMENTWISE_SHAPES)


MAP_REFERENCES = {
    # function: (mpmath reference, input domain)
    "exp": (mpmath.exp, (-5.0, 5.0)),
    "log": (mpmath.log, (0.01, 20.0)),
    "sqrt": (mpmath.sqrt, (0.0, 20.0)),
    "tanh": (mpmath.tanh, (-4.0, 4.0)),
    "sin": (mpmath.sin, (-10.0, 10.0)),
    "cos": (mpmath.cos, (-10.0, 10.0)),
    "log1p": (mpmath.log1p, (-0.9, 5.0)),
    "expm1": (mpmath.expm1, (-3.0, 3.0)),
    "erf": (mpmath.erf, (-3.0, 3.0)),
    "erf_derivative": (lambda x: 2 / mpmath.sqrt(mpmath.pi) * mpmath.exp(-x * x), (-3.0, 3.0)),
}

_SUM_SCALE = dict(scale=lambda x, **a: np.full(np.shape(np.sum(x, **a)), np.sum(np.abs(x))))

CASES: tuple[Case, ...] = (
    Case("add", lambda a, b: a + b, lambda a, b: a + b, _binary_variants(), CORRECTLY_ROUNDED),
    Case("sub", lambda a, b: a - b, lambda a, b: a - b, _binary_variants(), CORRECTLY_ROUNDED),
    Case("mul", lambda a, b: a * b, lambda a, b: a * b, _binary_variants(), CORRECTLY_ROUNDED),
    Case(
        "div", lambda a, b: a / b, lambda a, b: a / b, _binary_variants(), CORRECTLY_ROUNDED,
        domain=((-3.0, 3.0), (0.25, 4.0)),
    ),
    Case(
        "pow", lambda a, b: a**b, _mp(mpmath.power), _binary_variants(), TRANSCENDENTAL,
        domain=((0.05, 4.0), (-2.5, 2.5)),
    ),
    Case(
        "pow", lambda a, b: a**b, _mp(mpmath.power), _binary_variants(), TRANSCENDENTAL,
        domain=((-3.0, -0.1), _integers(-3, 3)), label="pow.negative_base_integer_exponent",
    ),
    Case(
        "maximum", lambda a, b: a.maximum(b), np.maximum, _binary_variants(), EXACT,
        domain=(_integers(-2, 2),),
    ),
    Case(
        "step", lambda x, t: x.step(t), lambda x, t: (x >= t).astype(np.float64),
        _binary_variants(), EXACT, domain=(_integers(-2, 2),),
    ),
    Case("neg", lambda x: -x, np.negative, _unary_variants(), EXACT),
    *(
        Case(
            "map", lambda x, f=name: x.map(f), _mp(reference), _unary_variants(),
            CORRECTLY_ROUNDED if name == "sqrt" else TRANSCENDENTAL,
            domain=(domain,), function=name,
        )
        for name, (reference, domain) in MAP_REFERENCES.items()
    ),
    Case(
        "matmul", lambda a, b: a @ b, np.matmul,
        (
            v((1, 1), (1, 1)),
            v((2, 3), (3, 4)),
            v((1, 5), (5, 1)),
            v((3, 1), (1, 2)),
            v((2, 2, 3), (2, 3, 2)),
            v((2, 1, 3, 4), (2, 1, 4, 1)),
        ),
        ACCUMULATED, scale=lambda a, b: np.abs(a) @ np.abs(b),
    ),
    Case(
        "sum", lambda x: x.sum(), lambda x: np.asarray(math.fsum(x.reshape(-1))),
        (v(()), v((1,)), v((7,)), v((2, 3)), v((2, 1, 4)), v((3, 3, 3))),
        ACCUMULATED, **_SUM_SCALE,
    ),
    Case(
        "sum_along", lambda x, axis: x.sum_along(axis), lambda x, axis: np.sum(x, axis=axis),
        (
            v((1,), axis=0),
            v((6,), axis=0),
            v((2, 3), axis=0),
            v((2, 3), axis=1),
            v((2, 1, 4), axis=1),
            v((2, 1, 5), axis=2),
        ),
        ACCUMULATED,
        scale=lambda x, axis: np.sum(np.abs(x), axis=axis),
    ),
    Case(
        "broadcast", lambda x, shape: x.broadcast(shape),
        lambda x, shape: np.full(shape, x.reshape(-1)[0]),
        (v((), shape=(2, 3)), v((), shape=()), v((1,), shape=(4,)), v((1, 1), shape=(2, 1, 3)), v((1, 1), shape=(1,))),
        EXACT,
    ),
    Case(
        "broadcast_along", lambda x, axis, extent: x.broadcast_along(axis, extent),
        lambda x, axis, extent: np.stack([x] * extent, axis=axis),
        (
            v((), axis=0, extent=3),
            v((2,), axis=0, extent=3),
            v((2,), axis=1, extent=3),
            v((2, 3), axis=1, extent=1),
            v((2, 3), axis=2, extent=2),
        ),
        EXACT,
    ),
    Case(
        "reshape", lambda x, shape: x.reshape(shape), lambda x, shape: np.reshape(x, shape),
        (
            v((), shape=(1, 1)),
            v((1,), shape=()),
            v((6,), shape=(2, 3)),
            v((2, 3), shape=(3, 2)),
            v((2, 1, 3), shape=(6,)),
        ),
        EXACT,
    ),
    Case(
        "permute", lambda x, order: x.permute(order), lambda x, order: np.transpose(x, order),
        (v((), order=()), v((3,), order=(0,)), v((2, 3), order=(1, 0)), v((2, 1, 3), order=(2, 0, 1))),
        EXACT,
    ),
    Case(
        "narrow", lambda x, axis, start, length: x.narrow(axis, start, length),
        lambda x, axis, start, length: np.take(x, np.arange(start, start + length), axis=axis),
        (
            v((5,), axis=0, start=1, length=3),
            v((1,), axis=0, start=0, length=1),
            v((2, 3), axis=1, start=2, length=1),
            v((1, 4), axis=0, start=0, length=1),
            v((3, 4, 2), axis=1, start=2, length=2),
        ),
        EXACT,
    ),
    Case(
        "pad", lambda x, axis, start, extent: x.pad(axis, start, extent), _pad,
        (
            v((3,), axis=0, start=2, extent=6),
            v((1,), axis=0, start=0, extent=1),
            v((2, 3), axis=1, start=0, extent=4),
            v((2, 1, 3), axis=1, start=1, extent=2),
        ),
        EXACT,
    ),
    Case(
        "unfold", lambda x, axis, size, step, dilation: x.unfold(axis, size, step, dilation), _unfold,
        (
            v((7,), axis=0, size=3, step=1, dilation=1),
            v((7,), axis=0, size=2, step=2, dilation=1),
            v((9,), axis=0, size=3, step=2, dilation=2),
            v((2, 8, 3), axis=1, size=3, step=1, dilation=3),
            v((4,), axis=0, size=4, step=1, dilation=1),
            v((1, 1), axis=1, size=1, step=1, dilation=1),
            v((7, 2), axis=0, size=1, step=3, dilation=1),
        ),
        EXACT,
    ),
    Case(
        "fold", lambda x, **a: x.fold(a["axis"], a["size"], a["step"], a["dilation"], a["extent"]), _fold,
        (
            v((5, 3), axis=0, size=3, step=1, dilation=1, extent=7),
            v((3, 2), axis=0, size=2, step=2, dilation=1, extent=7),
            v((3, 3), axis=0, size=3, step=2, dilation=2, extent=9),
            v((2, 2, 3, 3), axis=1, size=3, step=1, dilation=3, extent=8),
            v((3, 1), axis=0, size=1, step=3, dilation=1, extent=7),
            v((1, 1, 1), axis=1, size=1, step=1, dilation=1, extent=1),
        ),
        ACCUMULATED,
        scale=lambda x, **a: _fold(np.abs(x), **a),
    ),
    Case(
        "gather", lambda table, selection: table.gather(selection), lambda table, indices: table[indices],
        (
            v((5,), topos.selection([4, 0, 4], 5)),
            v((4, 3), topos.selection([[0, 3], [3, 1]], 4)),
            v((4, 3), topos.selection(2, 4)),
            v((1,), topos.selection([0, 0], 1)),
            v((3, 1, 2), topos.selection([2], 3)),
        ),
        EXACT,
    ),
    Case(
        "scatter", lambda values, selection, extent: values.scatter(selection, extent), _scatter,
        (
            v((4,), topos.selection([1, 1, 3, 1], 5), extent=5),
            v((3, 2), topos.selection([0, 2, 0], 3), extent=3),
            v((2, 2, 3), topos.selection([[1, 0], [1, 1]], 2), extent=2),
            v((3,), topos.selection(2, 4), extent=4),
            v((1,), topos.selection([0], 1), extent=1),
        ),
        ACCUMULATED,
        scale=lambda values, indices, extent: _scatter(np.abs(values), indices, extent),
    ),
    Case(
        "log_softmax", lambda x, axis: x.log_softmax(axis),
        _log_softmax,
        (v((1,), axis=0), v((5,), axis=0), v((2, 3), axis=0), v((2, 3), axis=1), v((2, 1, 4), axis=1)),
        ACCUMULATED,
        scale=lambda x, axis: np.abs(_log_softmax(x, axis)) + np.abs(x - np.max(x, axis=axis, keepdims=True)) + 1,
        domain=((-4.0, 4.0),),
    ),
    Case(
        "log_softmax", lambda x, axis: x.log_softmax(axis),
        _log_softmax,
        (v((4,), axis=0), v((2, 3), axis=1)),
        ACCUMULATED,
        scale=lambda x, axis: np.abs(_log_softmax(x, axis)) + np.abs(x - np.max(x, axis=axis, keepdims=True)) + 1,
        domain=((500.0, 504.0),), label="log_softmax.large_logits",
    ),
    Case(
        "logsumexp", lambda x, axis: x.logsumexp(axis), _logsumexp,
        (v((1,), axis=0), v((5,), axis=0), v((2, 3), axis=0), v((2, 3), axis=1), v((2, 1, 4), axis=2)),
        ACCUMULATED,
        scale=lambda x, axis: np.abs(_logsumexp(x, axis)) + np.max(np.abs(x), axis=axis) + 1,
        domain=((-4.0, 4.0),),
    ),
    Case(
        "logsumexp", lambda x, axis: x.logsumexp(axis), _logsumexp,
        (v((4,), axis=0), v((2, 3), axis=1)),
        ACCUMULATED,
        scale=lambda x, axis: np.abs(_logsumexp(x, axis)) + np.max(np.abs(x), axis=axis) + 1,
        domain=((500.0, 504.0),), label="logsumexp.large_logits",
    ),
)


def _params():
    for case in CASES:
        for variant in case.variants:
            for element, element_id in zip(ELEMENTS, ELEMENT_IDS):
                yield pytest.param(case, variant, element, id=f"{case.name}-{variant.label()}-{element_id}")


# ---- the one helper ---------------------------------------------------------------------------


def _draw(case: Case, index: int, operand, element, rng):
    """Operand data: element-typed data for a float operand, the indices for a selection."""
    if isinstance(operand, topos.Selection):
        return operand.indices
    domain = case.domain[min(index, len(case.domain) - 1)]
    data = domain(rng, operand) if callable(domain) else rng.uniform(*domain, size=operand)
    return np.asarray(data).astype(element)


def check_opcode(case: Case, variant: Variant, element) -> None:
    """Record the row's opcode over fed inputs, run the oracle, and compare with the reference."""
    rng = generator(case.name, variant.label(), str(element))
    feeds = [_draw(case, i, operand, element, rng) for i, operand in enumerate(variant.operands)]

    def model(tape):
        operands = [
            tape.input(topos.selection(np.zeros_like(o.indices), o.extent))
            if isinstance(o, topos.Selection)
            else tape.input(np.zeros(o, element))
            for o in variant.operands
        ]
        return operands, case.record(*operands, **variant.attributes)

    network, (inputs, out) = Tape.record(model)
    node = network.node(out)
    assert node.opcode.name == case.opcode, "the row records a different opcode than it claims"
    if case.function is not None:
        assert node.attributes["function"] == case.function

    run = network.forward(network.parameters(), dict(zip(inputs, feeds)))
    got = run[out]
    references = [f if f.dtype.kind in "iu" else f.astype(np.float64) for f in feeds]
    want = np.asarray(case.expect(*references, **variant.attributes), dtype=np.float64)

    assert got.shape == node.shape == want.shape
    assert got.dtype == node.dtype == element
    assert not got.flags.writeable
    tolerance = case.epsilons[element]
    if tolerance == ROUNDED:
        assert_close(got, want.astype(element), element, 0, what=f"{case.name} (correctly rounded)")
        return
    scale = None if case.scale is None else case.scale(*references, **variant.attributes)
    assert_close(got, want, element, tolerance, scale, what=case.name)


@pytest.mark.parametrize("case, variant, element", list(_params()))
def test_opcode_matches_independent_float64_reference(case, variant, element):
    check_opcode(case, variant, element)


# ---- completeness -----------------------------------------------------------------------------


def test_table_covers_every_non_source_opcode():
    covered = {case.opcode for case in CASES}
    vocabulary = {opcode.name for opcode in topos.OPCODES if not opcode.is_source}
    assert covered == vocabulary, (
        f"opcodes without a row: {sorted(vocabulary - covered)}; rows for unknown opcodes: "
        f"{sorted(covered - vocabulary)}"
    )


def test_table_covers_every_map_function():
    covered = {case.function for case in CASES if case.opcode == "map"}
    assert covered == set(topos.MAP_FUNCTIONS)


def test_table_tries_a_rank_zero_or_size_one_operand_for_every_opcode():
    def small(operand):
        shape = operand.indices.shape if isinstance(operand, topos.Selection) else operand
        return shape == () or 1 in shape

    tried: dict[tuple, bool] = {}
    for case in CASES:
        key = (case.opcode, case.function)
        tried[key] = tried.get(key, False) or any(
            small(o) for variant in case.variants for o in variant.operands
        )
    assert [key for key, ok in tried.items() if not ok] == []


def test_source_opcodes_are_exactly_leaf_parameter_input():
    assert {op.name for op in topos.OPCODES if op.is_source} == {"leaf", "parameter", "input"}
    assert len(topos.OPCODES) == 27


# ---- semantics the table cannot see -------------------------------------------------------------


def _run_binary(method: str, left, right, element):
    def model(tape):
        return getattr(tape.leaf(np.asarray(left, element)), method)(tape.leaf(np.asarray(right, element)))

    network, out = Tape.record(model)
    return network.forward(network.parameters())[out]


@pytest.mark.parametrize("element", ELEMENTS, ids=ELEMENT_IDS)
def test_maximum_ties_go_left(element):
    # Signed zeros compare equal, so the sign of the result shows which side won.
    assert np.signbit(_run_binary("maximum", [-0.0, 0.0], [0.0, -0.0], element)).tolist() == [True, False]


@pytest.mark.parametrize("element", ELEMENTS, ids=ELEMENT_IDS)
def test_maximum_propagates_nan_from_either_side(element):
    got = _run_binary("maximum", [np.nan, 1.0, np.nan], [1.0, np.nan, np.nan], element)
    assert np.isnan(got.astype(np.float64)).all()


@pytest.mark.parametrize("element", ELEMENTS, ids=ELEMENT_IDS)
def test_step_at_ties_gives_one(element):
    values = [-2.5, -0.0, 0.0, 0.0, 1.0, 3.0]
    thresholds = [-2.5, 0.0, -0.0, 0.0, 1.0, 3.0]
    assert _run_binary("step", values, thresholds, element).tolist() == [1.0] * 6


@pytest.mark.parametrize("element", ELEMENTS, ids=ELEMENT_IDS)
def test_step_is_zero_below_and_one_above_the_threshold(element):
    got = _run_binary("step", [-1.0, 0.5, 2.0], [0.0, 1.0, 1.0], element)
    assert got.tolist() == [0.0, 0.0, 1.0]


def test_run_payloads_are_read_only():
    def model(tape):
        x = tape.input(np.ones((2, 2), np.float32))
        return x, (x * 2.0).tanh().sum_along(0)

    network, (x, y) = Tape.record(model)
    run = network.forward(network.parameters(), {x: np.ones((2, 2), np.float32)})
    for symbol in (x, y):
        with pytest.raises(ValueError):
            run[symbol][...] = 0


def test_scatter_adds_repeated_indices_in_ascending_position_order():
    # 1 + 2**-24 + 2**-24 in float32: adding the tiny terms first keeps them,
    # adding the large one first rounds both away. Positions run 0, 1, 2.
    tiny = 2.0**-24
    values = np.array([1.0, tiny, tiny], np.float32)

    def model(tape):
        return tape.leaf(values).scatter(tape.leaf(topos.selection([0, 0, 0], 1)), 1)

    network, out = Tape.record(model)
    expected = np.float32(np.float32(1.0) + np.float32(tiny)) + np.float32(tiny)
    assert network.forward(network.parameters())[out].tolist() == [float(expected)]


# bfloat16 data on a coarse grid (multiples of 2**-6, |x| <= 8): every float32 partial
# sum and product is then exact, so "accumulate in float32, round once" must give exactly
# the exact result rounded to bfloat16, while accumulating in bfloat16 would drift.
ACCUMULATIONS = {
    "sum": (((8, 8),), lambda x: x.sum(), lambda x: np.sum(x)),
    "sum_along": (((3, 64),), lambda x: x.sum_along(1), lambda x: np.sum(x, axis=1)),
    "matmul": (((3, 48), (48, 2)), lambda a, b: a @ b, lambda a, b: a @ b),
    "fold": (((61, 4),), lambda x: x.fold(0, 4, 1, 1, 64), lambda x: _fold(x, 0, 4, 1, 1, 64)),
    "scatter": (
        ((64, 2), topos.selection([0] * 40 + [1] * 24, 2)),
        lambda v, s: v.scatter(s, 2),
        lambda v, s: _scatter(v, s, 2),
    ),
}


@pytest.mark.parametrize("opcode", list(ACCUMULATIONS))
def test_bfloat16_accumulates_in_float32_and_rounds_once(opcode):
    operands, record, exact = ACCUMULATIONS[opcode]
    rng = generator("accumulate", opcode)
    data = [
        o.indices if isinstance(o, topos.Selection)
        else (rng.integers(-512, 513, o) * 2.0**-6).astype(topos.bfloat16)
        for o in operands
    ]

    def model(tape):
        return record(*(tape.leaf(o if isinstance(o, topos.Selection) else d) for o, d in zip(operands, data)))

    network, out = Tape.record(model)
    assert network.node(out).opcode.name == opcode
    references = [d if d.dtype.kind in "iu" else d.astype(np.float64) for d in data]
    want = np.asarray(exact(*references)).astype(topos.bfloat16)
    got = network.forward(network.parameters())[out]
    assert got.dtype == topos.bfloat16
    assert_close(got, want, topos.bfloat16, 0, what=opcode)


# ---- refusals: one bad recording per opcode ------------------------------------------------------

REFUSALS = (
    # (opcode, make operand shapes, record, words the message must contain)
    ("add", ((2, 3), (3, 2)), lambda a, b: a + b, ["[2, 3]", "[3, 2]", "hint"]),
    ("matmul", ((2, 3), (2, 3)), lambda a, b: a @ b, ["k=3", "k=2", "hint"]),
    ("matmul", ((3,), (3, 1)), lambda a, b: a @ b, ["rank >= 2", "hint"]),
    ("matmul", ((2, 2, 3), (3, 3, 1)), lambda a, b: a @ b, ["batch axes", "hint"]),
    ("sum_along", ((2, 3),), lambda x: x.sum_along(2), ["axis 2", "rank 2", "hint"]),
    ("sum_along", ((2, 3),), lambda x: x.sum_along(-1), ["axis -1"]),
    ("broadcast", ((2,),), lambda x: x.broadcast((2, 2)), ["single-element", "hint"]),
    ("broadcast_along", ((2,),), lambda x: x.broadcast_along(0, 0), ["extent", ">= 1"]),
    ("reshape", ((2, 3),), lambda x: x.reshape((4, 2)), ["6 elements", "8 elements", "hint"]),
    ("permute", ((2, 3),), lambda x: x.permute((0, 0)), ["not a permutation", "hint"]),
    ("narrow", ((5,),), lambda x: x.narrow(0, 3, 3), ["[3, 6)", "extent 5", "hint"]),
    ("pad", ((5,),), lambda x: x.pad(0, 2, 6), ["does not fit", "hint"]),
    ("unfold", ((5,),), lambda x: x.unfold(0, 3, 1, 3), ["spans 7", "hint"]),
    ("fold", ((4, 3),), lambda x: x.fold(0, 3, 1, 1, 7), ["count=5", "hint"]),
    ("map", ((2,),), lambda x: x.map("sigmoid"), ["sigmoid", "hint"]),
    ("maximum", ((2,), (2,)), lambda a, b: a.maximum(b.reshape((1, 2))), ["[2]", "[1, 2]"]),
)


@pytest.mark.parametrize(
    "opcode, shapes, record, words", REFUSALS, ids=[f"{r[0]}-{i}" for i, r in enumerate(REFUSALS)]
)
def test_bad_recording_raises_shape_error_naming_opcode_and_line(opcode, shapes, record, words):
    def model(tape):
        operands = [tape.input(np.zeros(s, np.float32)) for s in shapes]
        line = line_here() + 2
        with pytest.raises(ShapeError) as caught:
            record(*operands)
        return line, caught.value

    _, (_, error) = Tape.record(model)
    message = str(error)
    assert isinstance(error, ToposError)
    assert f"{opcode}:" in message
    # The record lambda sits in the REFUSALS table, so the innermost user frame is there.
    assert f"{__file__}:" in message
    for word in words:
        assert word in message, f"{word!r} missing from: {message}"


def test_element_type_mismatch_and_index_misuse_are_refused():
    def model(tape):
        a = tape.input(np.zeros(3, np.float32))
        b = tape.input(np.zeros(3, np.float64))
        table = tape.input(np.zeros((4, 2), np.float32))
        indices = tape.leaf(topos.selection([0, 1, 2], 3))
        errors = []
        for make in (lambda: a + b, lambda: table.gather(indices), lambda: indices + indices,
                     lambda: a.gather(a), lambda: a.scatter(indices, 4)):
            with pytest.raises(ShapeError) as caught:
                make()
            errors.append(str(caught.value))
        return errors

    _, errors = Tape.record(model)
    assert "f32" in errors[0] and "f64" in errors[0]
    assert "3" in errors[1] and "4" in errors[1] and "hint" in errors[1]
    assert "index<3>" in errors[2]
    assert "selection" in errors[3]
    assert "extent 4" in errors[4]
