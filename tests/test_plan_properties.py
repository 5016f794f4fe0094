"""Property: under Numerics.EXACT a plan run is bit-identical to the oracle, for any graph.

Hypothesis records random graphs: a few random-shaped sources
(parameters, inputs, leaves), then a random sequence of opcodes over
them (elementwise binaries, every map function, matmul, sums, reshape,
permute, narrow, pad, unfold, broadcasts, log_softmax, logsumexp), with
a bias towards extending the newest value so that elementwise chains
(the fused pattern) appear often. It then declares random roots and
observes. For every declared result, the plan's bits, the entry's
interpreter bits and the whole-spec oracle's bits must be the same
(NaN payloads and signed zeros included), in float32 and float64, and
in a smaller bfloat16 sample. A second generator records random conv
nets with ``topos.nn.functional`` (conv2d, max_pool, optional recorded
gradients), so the catalog's convolution and max-pool executors are held
to the same property.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import topos
from topos import MAP_FUNCTIONS, Numerics, Tape

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
BINARY = ("add", "sub", "mul", "div", "maximum", "pow", "step")
UNARY = ("map", "neg", "sum", "sum_along", "reshape", "permute", "narrow", "pad", "unfold",
         "broadcast_along", "log_softmax", "logsumexp", "matmul")


def _shape(draw) -> tuple[int, ...]:
    rank = draw(st.integers(1, 3))
    return tuple(draw(st.integers(1, 4)) for _ in range(rank))


def _payload(draw, shape, dtype) -> np.ndarray:
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(("normal", "positive", "wide")))
    if kind == "normal":
        values = rng.standard_normal(shape)
    elif kind == "positive":
        values = rng.uniform(0.25, 4.0, shape)
    else:
        values = rng.standard_normal(shape) * 50.0
    return values.astype(dtype)


def _source(tape, draw, shape, dtype):
    role = draw(st.sampled_from(("parameter", "input", "leaf")))
    return getattr(tape, role)(_payload(draw, shape, dtype))


def _partner(tape, draw, pool, value, dtype):
    """A second operand of value's shape: a same-shaped value, a broadcast one, a scalar, or a fresh source."""
    same = [v for v in pool if v.shape == value.shape]
    choice = draw(st.sampled_from(("same", "scalar", "broadcast", "fresh")))
    if choice == "same" and same:
        return draw(st.sampled_from(same))
    if choice == "scalar":
        return draw(st.sampled_from((0.5, 2.0, -1.0, 3.0)))
    if choice == "broadcast":
        smaller = [v for v in pool if v.ndim <= value.ndim and all(
            s in (1, t) for s, t in zip(reversed(v.shape), reversed(value.shape)))]
        if smaller:
            return draw(st.sampled_from(smaller)).broadcast_to(value.shape)
    return _source(tape, draw, value.shape, dtype)


def _step(tape, draw, pool, dtype):
    """Record one opcode over the pool and return the new Value."""
    newest = pool[-1]
    value = newest if draw(st.booleans()) else draw(st.sampled_from(pool))
    name = draw(st.sampled_from(BINARY + UNARY))
    rank, shape = value.ndim, value.shape
    if name in BINARY:
        other = _partner(tape, draw, pool, value, dtype)
        if draw(st.booleans()) and not isinstance(other, float):
            value, other = other, value
        return getattr(value, name)(other)
    if rank == 0 and name not in ("map", "neg", "sum", "reshape", "broadcast_along"):
        name = "map"
    if name == "map":
        return value.map(draw(st.sampled_from(sorted(MAP_FUNCTIONS))))
    if name == "neg":
        return -value
    if name == "sum":
        return value.sum()
    if name == "reshape":
        volume = int(np.prod(shape, dtype=np.int64))
        options = [(volume,), (1, volume), tuple(reversed(shape)) or (1,), shape + (1,)]
        return value.reshape(draw(st.sampled_from(options)))
    if name == "broadcast_along":
        return value.broadcast_along(draw(st.integers(0, rank)), draw(st.integers(1, 3)))
    axis = draw(st.integers(0, rank - 1))
    extent = shape[axis]
    if name == "sum_along":
        return value.sum_along(axis)
    if name == "permute":
        return value.permute(draw(st.permutations(range(rank))))
    if name == "narrow":
        start = draw(st.integers(0, extent - 1))
        return value.narrow(axis, start, draw(st.integers(1, extent - start)))
    if name == "pad":
        start = draw(st.integers(0, 2))
        return value.pad(axis, start, start + extent + draw(st.integers(0, 2)))
    if name == "unfold":
        size = draw(st.integers(1, extent))
        return value.unfold(axis, size, draw(st.integers(1, 2)))
    if name == "log_softmax":
        return value.log_softmax(axis)
    if name == "logsumexp":
        return value.logsumexp(axis)
    # matmul: make the value at least a matrix, then find or make a right-hand side.
    if rank == 1:
        value = value.reshape((1, extent))
    k = value.shape[-1]
    n = draw(st.integers(1, 4))
    batch = value.shape[:-2]
    fitting = [v for v in pool if v.ndim == value.ndim and v.shape[:-2] == batch and v.shape[-2] == k]
    if fitting and draw(st.booleans()):
        right = draw(st.sampled_from(fitting))
    else:
        right = _source(tape, draw, batch + (k, n), dtype)
    return value @ right


@st.composite
def graphs(draw, dtype):
    """(network, roots, observes) for a random recording in ``dtype``."""
    declared: dict[str, list] = {}

    def model(tape):
        pool = [_source(tape, draw, _shape(draw), dtype) for _ in range(draw(st.integers(1, 3)))]
        for _ in range(draw(st.integers(1, 16))):
            pool.append(_step(tape, draw, pool, dtype))
        computed = [v for v in pool if not tape.columns.opcodes[v._index].is_source] or pool
        declared["roots"] = [v.symbol for v in draw(st.lists(st.sampled_from(computed), min_size=1, max_size=3))]
        declared["observes"] = [v.symbol for v in draw(st.lists(st.sampled_from(pool), max_size=3))]
        return None

    network, _ = Tape.record(model)
    return network, declared["roots"], declared["observes"]


def _bits(array) -> bytes:
    array = np.ascontiguousarray(array)
    return repr((array.shape, array.dtype.str)).encode() + array.tobytes()


def _check_exact(network, roots, observes):
    parameters = network.parameters()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NaN and inf are fine; their bits must agree
        oracle = network.forward(parameters)
        entry = network.entry(roots, observe=observes, numerics=Numerics.EXACT)
        plan = entry.lower()
        planned = plan.forward(parameters)
        interpreted = entry.interpret(parameters)
    for symbol in plan.results:
        want = _bits(oracle[symbol])
        assert _bits(planned[symbol]) == want, f"plan differs from the oracle at {symbol!r}\n{plan.describe()}"
        assert _bits(interpreted[symbol]) == want, f"entry.interpret differs at {symbol!r}"


@settings(max_examples=60, **SETTINGS)
@given(st.data())
def test_exact_plan_matches_oracle_bitwise_float32_and_float64(data):
    dtype = data.draw(st.sampled_from((topos.float32, topos.float64)))
    _check_exact(*data.draw(graphs(dtype)))


@settings(max_examples=20, **SETTINGS)
@given(st.data())
def test_exact_plan_matches_oracle_bitwise_bfloat16(data):
    _check_exact(*data.draw(graphs(topos.bfloat16)))


def test_random_graphs_exercise_fusion():
    """The generator is not vacuous: chains long enough to fuse do occur."""
    fused = 0

    @settings(max_examples=40, database=None, derandomize=True, **SETTINGS)
    @given(graphs(topos.float64))
    def count(graph):
        nonlocal fused
        network, roots, observes = graph
        fused += bool(network.entry(roots, observe=observes, numerics=Numerics.EXACT).lower().fusions())

    count()
    assert fused > 0


# ---- convolution and pooling compositions (the catalog's structural patterns) -----------------------


@st.composite
def conv_nets(draw, dtype):
    """A random conv2d (+ optional tanh, max_pool, recorded gradients) from topos.nn.functional."""
    functional = pytest.importorskip("topos.nn.functional")
    batch, channels, filters = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    height, width = draw(st.integers(3, 7)), draw(st.integers(3, 7))
    padding = draw(st.integers(0, 1))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride = draw(st.integers(1, 2))
    declared: dict[str, list] = {}

    def model(tape):
        x = _source(tape, draw, (batch, channels, height, width), dtype)
        kernel = tape.parameter(_payload(draw, (filters, channels, kh, kw), dtype))
        bias = tape.parameter(_payload(draw, (filters,), dtype)) if draw(st.booleans()) else None
        out = functional.conv2d(x, kernel, bias, stride=stride, padding=padding)
        if draw(st.booleans()):
            out = out.tanh()
        if draw(st.booleans()) and min(out.shape[2:]) >= 2:
            out = functional.max_pool(out, 2, draw(st.integers(1, 2)))
        roots = [out]
        if draw(st.booleans()):
            loss = (out * out).sum()
            roots = tape.differentiate(loss, [kernel]).roots()
        declared["roots"] = [v.symbol for v in roots]
        declared["observes"] = [x.symbol] if draw(st.booleans()) else []

    network, _ = Tape.record(model)
    return network, declared["roots"], declared["observes"]


@settings(max_examples=30, **SETTINGS)
@given(st.data())
def test_exact_plan_with_convolution_and_pooling_matches_oracle_bitwise(data):
    dtype = data.draw(st.sampled_from((topos.float32, topos.float64, topos.bfloat16)))
    _check_exact(*data.draw(conv_nets(dtype)))


def test_random_conv_nets_exercise_the_structural_patterns():
    kinds: set[str] = set()

    @settings(max_examples=40, database=None, derandomize=True, **SETTINGS)
    @given(conv_nets(topos.float32))
    def collect(graph):
        network, roots, observes = graph
        plan = network.entry(roots, observe=observes, numerics=Numerics.EXACT).lower()
        kinds.update(g.kind for g in plan.fusions())

    collect()
    assert {"convolution", "max_pool"} <= kinds
