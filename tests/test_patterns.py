"""Fusion patterns for convolution, max-pooling and batch norm: discovery, barriers, bits, kernel counts.

Every pattern is matched by structure alone, so each discovery test runs
twice: on the ``topos.nn`` facade's recording and on the same opcodes
recorded by hand in this file. The kernel-count tests pin how many groups
(and of which kinds) the reference models fuse into; their failure
message is the plan's ``describe()``, which says why.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from topos import Numerics, Tape
from topos.nn import batch_norm, batch_norm_inference, conv2d, max_pool
from topos.readings.plan.patterns import CATALOG

from conftest import ELEMENT_IDS, ELEMENTS, generator
from test_numerics_fast import check_node

# ---- helpers -------------------------------------------------------------------------------


def bits(array: np.ndarray) -> np.ndarray:
    """The raw bit patterns of an array, so NaN payloads and signed zeros compare exactly."""
    array = np.ascontiguousarray(array)
    return array.view(np.dtype(f"u{array.dtype.itemsize}"))


def assert_bitwise(got, want, what=""):
    assert got.dtype == want.dtype and got.shape == want.shape, what
    differ = bits(got) != bits(want)
    assert not differ.any(), f"{what}: {int(differ.sum())} of {differ.size} elements differ in their bits"


def of_kind(candidates, kind):
    return [c for c in candidates if c.kind == kind]


def lower(network, roots, observe=(), numerics=Numerics.EXACT):
    return network.entry(roots, observe=observe, numerics=numerics).lower()


def index(symbol) -> int:
    return symbol.index


def nbytes(network, *symbols) -> int:
    nodes = [network.node(s) for s in symbols]
    return sum(int(np.prod(n.shape)) * np.dtype(n.dtype).itemsize for n in nodes)


# ---- hand-recorded chains (the same opcodes as topos.nn, written out here) -----------------


def hand_conv(x, w, stride=(1, 1), padding=(0, 0), dilation=(1, 1), order=(0, 2, 4, 1, 3, 5)):
    """A convolution recorded opcode by opcode; returns the named steps."""
    steps = {}
    batch, channels, height, width = x.shape
    filters, _, kh, kw = w.shape
    if padding[0]:
        x = steps["pad_h"] = x.pad(2, padding[0], height + 2 * padding[0])
    if padding[1]:
        x = steps["pad_w"] = x.pad(3, padding[1], width + 2 * padding[1])
    rows = steps["rows"] = x.unfold(2, kh, stride[0], dilation[0])
    windows = steps["windows"] = rows.unfold(4, kw, stride[1], dilation[1])
    permuted = steps["permuted"] = windows.permute(order)
    oh, ow = windows.shape[2], windows.shape[4]
    columns = steps["columns"] = permuted.reshape((batch * oh * ow, channels * kh * kw))
    kernel = steps["kernel"] = w.reshape((filters, channels * kh * kw)).permute((1, 0))
    steps["product"] = columns @ kernel
    return steps


def hand_pool(x, size, stride, lane_order=None, balanced=False):
    """A max-pool recorded opcode by opcode: unfolds, permute, reshape, lane narrows, a fold of maximum."""
    steps = {}
    rows = steps["rows"] = x.unfold(2, size, stride)
    windows = steps["windows"] = rows.unfold(4, size, stride)
    b, c, oh, _, ow, _ = windows.shape
    permuted = steps["permuted"] = windows.permute((0, 1, 2, 4, 3, 5))
    stacked = steps["stacked"] = permuted.reshape((b, c, oh, ow, size * size))
    order = list(range(size * size) if lane_order is None else lane_order)
    lanes, maxima = steps["lanes"], steps["maxima"] = [stacked.narrow(4, order[0], 1)], []
    if balanced:
        lanes.extend(stacked.narrow(4, lane, 1) for lane in order[1:])
        best = lanes[0].maximum(lanes[1]).maximum(lanes[2].maximum(lanes[3]))
    else:
        best = lanes[0]
        for lane in order[1:]:
            lanes.append(stacked.narrow(4, lane, 1))
            best = best.maximum(lanes[-1])
            maxima.append(best)
    steps["out"] = best.reshape((b, c, oh, ow))
    return steps


def hand_batch_norm(x, scale, shift, eps, divisor=None):
    """The training formula opcode by opcode; ``divisor`` other than the batch spells another statistic."""
    n = x.shape[0]
    divisor = n if divisor is None else divisor
    steps = {}
    steps["mean"] = x.sum_along(0) / float(n)
    steps["centered"] = x - steps["mean"].broadcast_along(0, n)
    steps["variance"] = (steps["centered"] * steps["centered"]).sum_along(0) / float(divisor)
    steps["normalized"] = steps["centered"] / (steps["variance"] + eps).sqrt().broadcast_along(0, n)
    steps["out"] = steps["normalized"] * scale.broadcast_along(0, n) + shift.broadcast_along(0, n)
    return steps


def test_catalog_puts_the_big_patterns_before_elementwise_chains():
    kinds = [p.kind for p in CATALOG]
    assert kinds == ["convolution", "convolution_weight_gradient", "convolution_input_gradient", "max_pool",
                     "max_pool_gradient", "batch_norm_training", "batch_norm_inference", "elementwise"]


# ---- convolution ---------------------------------------------------------------------------


def _conv_network(recording, dtype=np.float64, shape=(2, 3, 7, 6), weight_shape=(4, 3, 3, 3),
                  stride=1, padding=1, dilation=1, seed="conv"):
    rng = generator(seed, shape, weight_shape)
    x0 = rng.standard_normal(shape).astype(dtype)
    w0 = rng.standard_normal(weight_shape).astype(dtype)

    def model(tape):
        x, w = tape.input(x0), tape.parameter(w0)
        if recording == "facade":
            out = conv2d(x, w, stride=stride, padding=padding)
            return {"out": out, "x": x}
        pair = lambda v: (v, v) if isinstance(v, int) else v  # noqa: E731
        steps = hand_conv(x, w, pair(stride), pair(padding), pair(dilation))
        return {**steps, "x": x, "out": steps["product"]}

    return Tape.record(model)


def _matmul_of(network):
    (node,) = [n for n in network.nodes() if n.opcode.name == "matmul"]
    return node.symbol


@pytest.mark.parametrize("recording", ["facade", "hand"])
def test_convolution_is_discovered_on_any_recording_of_the_chain(recording):
    network, named = _conv_network(recording)
    plan = lower(network, [named["out"]])
    (candidate,) = of_kind(plan.candidates(), "convolution")
    assert candidate.root == index(_matmul_of(network))
    assert candidate in plan.fusions()
    assert candidate.details["out_shape"] == (2, 4, 7, 6)


def test_convolution_candidate_names_its_root_nodes_details_and_savings():
    network, s = _conv_network("hand", stride=(2, 1), padding=(1, 2), shape=(2, 3, 9, 8))
    (candidate,) = of_kind(lower(network, [s["product"]]).candidates(), "convolution")
    chain = [s[k] for k in ("pad_h", "pad_w", "rows", "windows", "permuted", "columns", "product")]
    assert candidate.kind == "convolution"
    assert candidate.root == index(s["product"])
    assert candidate.nodes == tuple(sorted(index(v) for v in chain))
    assert candidate.bytes_saved == nbytes(network, s["rows"], s["windows"], s["permuted"], s["columns"])
    assert "3x3 convolution" in candidate.reason and "stride (2, 1)" in candidate.reason
    assert candidate.details == {
        "input": index(s["x"]), "kernel": index(s["kernel"]), "batch": 2, "channels": 3, "filters": 4,
        "kernel_size": (3, 3), "stride": (2, 1), "dilation": (1, 1),
        "padding": ((1, 1), (2, 2)), "out_shape": (2, 4, 5, 10),
    }


@pytest.mark.parametrize("observed", ["rows", "windows", "permuted", "columns"])
def test_an_observed_interior_blocks_the_convolution(observed):
    network, s = _conv_network("hand")
    plan = lower(network, [s["product"]], observe=[s[observed]])
    assert not of_kind(plan.candidates(), "convolution"), plan.describe()


def test_an_observed_pad_stays_outside_and_becomes_the_convolutions_input():
    network, s = _conv_network("hand", padding=(1, 1))
    (candidate,) = of_kind(lower(network, [s["product"]], observe=[s["pad_h"]]).candidates(), "convolution")
    assert candidate.details["input"] == index(s["pad_h"])
    assert candidate.details["padding"] == ((0, 0), (1, 1))
    assert index(s["pad_h"]) not in candidate.nodes


def test_a_different_column_order_is_not_a_convolution():
    # (c, j, i) columns: a valid computation, but not the one a conv kernel performs.
    def model(tape):
        x = tape.input(np.zeros((1, 2, 5, 5)))
        w = tape.parameter(np.zeros((3, 2, 3, 3)))
        return hand_conv(x, w, order=(0, 2, 4, 1, 5, 3))["product"]

    network, out = Tape.record(model)
    assert not of_kind(lower(network, [out]).candidates(), "convolution")


def test_a_shared_im2col_matrix_is_not_fused():
    # Another reader of the columns (here a second product) needs them materialized.
    def model(tape):
        x = tape.input(np.zeros((1, 2, 5, 5)))
        steps = hand_conv(x, tape.parameter(np.zeros((3, 2, 3, 3))))
        return steps["product"], steps["columns"].sum()

    network, (out, other) = Tape.record(model)
    assert not of_kind(lower(network, [out, other]).candidates(), "convolution")


CONV_PLAN_CASES = [
    # (input shape, weight shape, stride, padding, dilation)
    ((2, 3, 7, 6), (4, 3, 3, 3), 1, 1, 1),
    ((1, 2, 9, 11), (3, 2, 3, 2), (2, 3), (1, 0), 1),
    ((2, 1, 10, 9), (2, 1, 3, 3), 2, 2, (2, 1)),
    ((1, 5, 4, 4), (3, 5, 1, 1), 1, 0, 1),
    # More filters than output columns: the executor accumulates filters-last.
    ((2, 3, 6, 5), (8, 3, 3, 3), 1, 1, 1),
    ((1, 2, 9, 7), (6, 2, 2, 3), 2, 0, (1, 2)),
]


@pytest.mark.parametrize("dtype", ELEMENTS, ids=ELEMENT_IDS)
@pytest.mark.parametrize("case", CONV_PLAN_CASES, ids=lambda c: f"{c[0]}*{c[1]}-s{c[2]}-p{c[3]}-d{c[4]}")
def test_exact_plan_with_convolution_matches_oracle_bitwise(case, dtype):
    shape, weight_shape, stride, padding, dilation = case
    network, s = _conv_network("hand", dtype, shape, weight_shape, stride, padding, dilation)
    plan = lower(network, [s["product"]])
    assert [g.kind for g in plan.fusions()] == ["convolution"], plan.describe()
    parameters = network.parameters()
    assert_bitwise(plan.forward(parameters)[s["product"]], network.forward(parameters)[s["product"]])


def test_convolution_keeps_zero_times_infinity_from_the_padding():
    # The composition multiplies padded zeros by every weight: 0 * inf = NaN
    # where the infinite weight meets the border, inf elsewhere.
    def model(tape):
        x = tape.input(np.ones((1, 1, 3, 3), np.float32))
        w = tape.parameter(np.array([[[[np.inf, 1, 1], [1, 1, 1], [1, 1, -1]]]], np.float32))
        return conv2d(x, w, padding=1)

    network, out = Tape.record(model)
    plan = lower(network, [out])
    assert of_kind(plan.fusions(), "convolution")
    with np.errstate(invalid="ignore"):
        want = network.forward(network.parameters())[out]
        got = plan.forward(network.parameters())[out]
    assert np.isnan(want).any() and not np.isnan(want).all()
    assert_bitwise(got, want)


@pytest.mark.parametrize("dtype", ELEMENTS, ids=ELEMENT_IDS)
def test_fast_plan_with_convolution_stays_in_the_matmul_envelope(dtype):
    network, s = _conv_network("hand", dtype, (2, 3, 8, 8), (5, 3, 3, 3), 1, 1)
    plan = lower(network, [s["product"]], numerics=Numerics.FAST)
    assert of_kind(plan.fusions(), "convolution"), plan.describe()
    parameters = network.parameters()
    operands = network.entry([s["columns"], s["kernel"]], numerics=Numerics.EXACT).interpret(parameters)
    fast = plan.forward(parameters)[s["product"]]
    # The same envelope checker the FAST kernels answer to, applied to the group's root.
    check_node(network.node(s["product"]), [operands[s["columns"]], operands[s["kernel"]]], fast)
    # In fact the executor has one (exact) order under both postures.
    assert_bitwise(fast, network.forward(parameters)[s["product"]])


# ---- max_pool ------------------------------------------------------------------------------


def _pool_network(recording, dtype=np.float64, shape=(2, 3, 6, 7), size=2, stride=2, values=None, **options):
    x0 = generator("pool", shape).standard_normal(shape).astype(dtype) if values is None else values

    def model(tape):
        x = tape.input(x0)
        if recording == "facade":
            return {"out": max_pool(x, size, stride), "x": x}
        return {**hand_pool(x, size, stride, **options), "x": x}

    return Tape.record(model)


@pytest.mark.parametrize("recording", ["facade", "hand"])
def test_max_pool_is_discovered_on_any_recording_of_the_fold(recording):
    network, s = _pool_network(recording)
    plan = lower(network, [s["out"]])
    (candidate,) = of_kind(plan.candidates(), "max_pool")
    assert candidate.root == index(s["out"])
    assert candidate in plan.fusions()
    # The fold's maxima are an elementwise chain too; the pool claims them first.
    assert not of_kind(plan.fusions(), "elementwise")


def test_max_pool_candidate_names_its_root_nodes_details_and_savings():
    network, s = _pool_network("hand", shape=(2, 3, 7, 7), size=3, stride=2)
    (candidate,) = of_kind(lower(network, [s["out"]]).candidates(), "max_pool")
    fixed = [s["rows"], s["windows"], s["permuted"], s["stacked"]]
    assert candidate.kind == "max_pool"
    assert candidate.root == index(s["out"])
    assert candidate.nodes == tuple(sorted(index(v) for v in (*fixed, *s["lanes"], *s["maxima"], s["out"])))
    assert len(candidate.nodes) == 4 + 9 + 8 + 1
    assert candidate.bytes_saved == nbytes(network, *fixed, *s["lanes"])
    assert "9 lanes of 3x3 windows" in candidate.reason
    assert candidate.details == {
        "input": index(s["x"]), "batch": 2, "channels": 3, "window": (3, 3), "stride": (2, 2),
        "dilation": (1, 1), "out_shape": (2, 3, 3, 3), "maxima": tuple(index(m) for m in s["maxima"]),
    }


@pytest.mark.parametrize("observed", ["windows", "stacked", "lane 2", "maximum 1"])
def test_an_observed_interior_blocks_the_max_pool(observed):
    network, s = _pool_network("hand")
    node = {"lane 2": s["lanes"][2], "maximum 1": s["maxima"][1]}.get(observed) or s[observed]
    assert not of_kind(lower(network, [s["out"]], observe=[node]).candidates(), "max_pool")


@pytest.mark.parametrize("variant", ["balanced tree", "lanes out of order"])
def test_another_fold_of_the_lanes_is_not_matched(variant):
    # Same values in the end, but another order of comparisons: ties may resolve differently.
    options = {"balanced": True} if variant == "balanced tree" else {"lane_order": (1, 0, 2, 3)}
    network, s = _pool_network("hand", **options)
    assert not of_kind(lower(network, [s["out"]]).candidates(), "max_pool")


POOL_PLAN_CASES = [((2, 3, 6, 7), 2, 2), ((1, 2, 7, 7), 3, 2), ((2, 1, 5, 8), 2, 1), ((1, 1, 9, 6), 3, 3)]


@pytest.mark.parametrize("numerics", [Numerics.EXACT, Numerics.FAST], ids=["exact", "fast"])
@pytest.mark.parametrize("dtype", ELEMENTS, ids=ELEMENT_IDS)
@pytest.mark.parametrize("case", POOL_PLAN_CASES, ids=lambda c: f"{c[0]}-k{c[1]}-s{c[2]}")
def test_plan_with_max_pool_matches_oracle_bitwise(case, dtype, numerics):
    shape, size, stride = case
    network, s = _pool_network("facade", dtype, shape, size, stride)
    plan = lower(network, [s["out"]], numerics=numerics)
    assert [g.kind for g in plan.fusions()] == ["max_pool"], plan.describe()
    parameters = network.parameters()
    assert_bitwise(plan.forward(parameters)[s["out"]], network.forward(parameters)[s["out"]])


def test_max_pool_executor_resolves_signed_zeros_and_nans_like_the_fold():
    # Window by window: all-tied windows whose first lane differs in sign from
    # the rest (the first must win), NaN first and later, -inf ties.
    values = np.array([
        [[-0.0, 0.0], [0.0, 0.0]], [[0.0, -0.0], [-0.0, -0.0]], [[np.nan, 1.0], [2.0, 3.0]],
        [[1.0, np.nan], [5.0, 0.0]], [[-np.inf, -np.inf], [-np.inf, -0.0]], [[2.0, 2.0], [2.0, 2.0]],
    ]).transpose(1, 0, 2).reshape(1, 1, 2, 12)
    network, s = _pool_network("facade", shape=values.shape, values=values)
    plan = lower(network, [s["out"]])
    assert of_kind(plan.fusions(), "max_pool")
    want = network.forward(network.parameters())[s["out"]]
    assert np.signbit(want[0, 0, 0, 0]) and not np.signbit(want[0, 0, 0, 1])
    assert np.isnan(want[0, 0, 0, 2]) and np.isnan(want[0, 0, 0, 3])
    assert_bitwise(plan.forward(network.parameters())[s["out"]], want)


# ---- batch norm ----------------------------------------------------------------------------


def _bn_network(recording, dtype=np.float64, shape=(8, 5), eps=1e-5, extra=None, divisor=None):
    rng = generator("bn", shape)
    x0 = (rng.standard_normal(shape) * 2 + 1).astype(dtype)

    def model(tape):
        x = tape.input(x0)
        scale = tape.parameter(rng.standard_normal(shape[1]).astype(dtype))
        shift = tape.parameter(rng.standard_normal(shape[1]).astype(dtype))
        if recording == "facade":
            out, mean, variance = batch_norm(x, scale, shift, eps)
            steps = {"out": out, "mean": mean, "variance": variance}
        else:
            steps = hand_batch_norm(x, scale, shift, eps, divisor)
        if extra is not None:
            steps["extra"] = extra(steps)
        return {**steps, "x": x, "scale": scale, "shift": shift}

    return Tape.record(model)


@pytest.mark.parametrize("recording", ["facade", "hand"])
def test_batch_norm_training_is_discovered_on_any_recording(recording):
    network, s = _bn_network(recording)
    plan = lower(network, [s["out"]])
    (candidate,) = of_kind(plan.candidates(), "batch_norm_training")
    assert candidate.root == index(s["out"])
    assert candidate.details["results"] == (index(s["mean"]), index(s["variance"]))


def test_batch_norm_training_candidate_claims_the_statistics_and_the_formula():
    network, s = _bn_network("hand", eps=1e-3)
    (candidate,) = of_kind(lower(network, [s["out"]]).candidates(), "batch_norm_training")
    # Every computed node of the recording (sources are operands, not claimed).
    computed = [n.index for n in network.nodes() if not n.is_source]
    assert candidate.kind == "batch_norm_training"
    assert candidate.nodes == tuple(computed)
    claimed = [network.symbol(n) for n in candidate.nodes
               if n not in (index(s["out"]), index(s["mean"]), index(s["variance"]))]
    assert candidate.bytes_saved == nbytes(network, *claimed)
    assert "eps 0.001" in candidate.reason
    assert candidate.details["epsilon"] == 1e-3
    assert (candidate.details["batch"], candidate.details["features"]) == (8, 5)
    assert candidate.details["input"] == index(s["x"])
    assert (candidate.details["scale"], candidate.details["shift"]) == (index(s["scale"]), index(s["shift"]))


def test_declared_statistics_are_named_results_not_barriers():
    network, s = _bn_network("facade")
    plan = lower(network, [s["out"]], observe=[s["mean"], s["variance"]])
    assert of_kind(plan.candidates(), "batch_norm_training"), plan.describe()


def test_statistics_read_outside_the_group_are_named_results_too():
    # A running average reads the batch mean after normalization.
    network, s = _bn_network("facade", extra=lambda steps: steps["mean"] * 0.1)
    plan = lower(network, [s["out"], s["extra"]])
    assert of_kind(plan.candidates(), "batch_norm_training"), plan.describe()


@pytest.mark.parametrize("observed", ["centered", "normalized"])
def test_an_observed_interior_blocks_batch_norm(observed):
    network, s = _bn_network("hand")
    plan = lower(network, [s["out"]], observe=[s[observed]])
    assert not of_kind(plan.candidates(), "batch_norm_training")
    assert not of_kind(plan.candidates(), "batch_norm_inference")


def test_an_unbiased_variance_is_not_batch_norm():
    network, s = _bn_network("hand", divisor=7)
    plan = lower(network, [s["out"]])
    assert not of_kind(plan.candidates(), "batch_norm_training")
    # Its tail reads computed statistics, but `centered` also feeds the variance: not closed.
    assert not of_kind(plan.candidates(), "batch_norm_inference")


@pytest.mark.parametrize("dtype", ELEMENTS, ids=ELEMENT_IDS)
def test_batch_norm_training_is_offered_but_never_run_at_home(dtype):
    network, s = _bn_network("facade", dtype)
    for numerics in (Numerics.EXACT, Numerics.FAST):
        plan = lower(network, [s["out"]], observe=[s["mean"], s["variance"]], numerics=numerics)
        assert of_kind(plan.candidates(), "batch_norm_training")
        assert not of_kind(plan.fusions(), "batch_norm_training"), plan.describe()
    parameters = network.parameters()
    exact = lower(network, [s["out"]], observe=[s["mean"], s["variance"]]).forward(parameters)
    oracle = network.forward(parameters)
    for name in ("out", "mean", "variance"):
        assert_bitwise(exact[s[name]], oracle[s[name]], name)


def _bn_inference_network(recording, dtype=np.float64):
    rng = generator("bn inference")
    vectors = [rng.standard_normal(4).astype(dtype) for _ in range(4)]
    vectors[1] = np.abs(vectors[1]) + np.array(0.5, dtype)

    def model(tape):
        x = tape.input(rng.standard_normal((6, 4)).astype(dtype))
        mean, variance = tape.input(vectors[0]), tape.input(vectors[1])
        scale, shift = tape.parameter(vectors[2]), tape.parameter(vectors[3])
        if recording == "facade":
            return {"out": batch_norm_inference(x, mean, variance, scale, shift, 1e-3)}
        steps = {"centered": x - mean.broadcast_along(0, 6)}
        deviation = (variance + 1e-3).sqrt()
        steps["normalized"] = steps["centered"] / deviation.broadcast_along(0, 6)
        # The affine step spelled the other way round: multiplication and addition commute exactly.
        steps["out"] = shift.broadcast_along(0, 6) + scale.broadcast_along(0, 6) * steps["normalized"]
        return steps

    return Tape.record(model)


@pytest.mark.parametrize("recording", ["facade", "hand"])
def test_batch_norm_inference_is_discovered_on_any_recording(recording):
    network, s = _bn_inference_network(recording)
    plan = lower(network, [s["out"]])
    (candidate,) = of_kind(plan.candidates(), "batch_norm_inference")
    computed = [n.index for n in network.nodes() if not n.is_source]
    assert candidate.root == index(s["out"]) and candidate.nodes == tuple(computed)
    assert candidate.details["epsilon"] == 1e-3 and candidate.details["feature_index"] == 1
    claimed = [network.symbol(n) for n in candidate.interior]
    assert candidate.bytes_saved == nbytes(network, *claimed)
    assert "supplied statistics" in candidate.reason
    assert not of_kind(plan.fusions(), "batch_norm_inference")  # raise-only


def test_batch_norm_inference_is_blocked_by_an_observed_interior():
    network, s = _bn_inference_network("hand")
    plan = lower(network, [s["out"]], observe=[s["normalized"]])
    assert not of_kind(plan.candidates(), "batch_norm_inference")


def test_the_training_formula_is_not_offered_as_inference():
    network, s = _bn_network("facade")
    kinds = [c.kind for c in lower(network, [s["out"]]).candidates()]
    assert "batch_norm_inference" not in kinds and "batch_norm_training" in kinds


def test_raise_only_patterns_refuse_to_execute_at_home():
    network, s = _bn_network("facade")
    (candidate,) = of_kind(lower(network, [s["out"]]).candidates(), "batch_norm_training")
    pattern = next(p for p in CATALOG if p.kind == "batch_norm_training")
    assert pattern.executes is False
    with pytest.raises(NotImplementedError, match="raise-only"):
        pattern.execute(candidate, None, network, None)


@pytest.mark.parametrize("kind", ["convolution", "max_pool", "batch_norm_training", "batch_norm_inference"])
def test_facade_and_hand_recordings_get_identical_candidates(kind):
    # The hand recordings append the same opcodes in the same order as topos.nn,
    # so provenance (file, line) is the only difference: the offers must be equal.
    build, root = {
        "convolution": (_conv_network, "out"),
        "max_pool": (_pool_network, "out"),
        "batch_norm_training": (_bn_network, "out"),
        "batch_norm_inference": (_bn_inference_network, "out"),
    }[kind]
    offers = []
    for recording in ("facade", "hand"):
        network, s = build(recording)
        offers.append(of_kind(lower(network, [s[root]]).candidates(), kind))
    assert len(offers[0]) == 1 and offers[0] == offers[1]


# ---- kernel counts: how the reference models fuse -------------------------------------------


def _linear(x, w, b):
    return x @ w + b.broadcast_along(0, x.shape[0])


def _cross_entropy(logits, onehot):
    return -(logits.log_softmax(1) * onehot).sum() / float(logits.shape[0])


def conv_net(tape, with_gradients=False):
    """conv -> relu -> pool -> conv -> relu -> pool -> flatten -> linear -> cross-entropy."""
    rng = generator("conv net")
    x = tape.input(rng.standard_normal((2, 1, 12, 12)))
    onehot = tape.input(np.eye(10)[[3, 7]])
    w1, b1 = tape.parameter(rng.standard_normal((4, 1, 3, 3)) * 0.3), tape.parameter(np.zeros(4))
    w2, b2 = tape.parameter(rng.standard_normal((8, 4, 3, 3)) * 0.3), tape.parameter(np.zeros(8))
    w3, b3 = tape.parameter(rng.standard_normal((72, 10)) * 0.1), tape.parameter(np.zeros(10))
    h = max_pool(conv2d(x, w1, b1, padding=1).relu(), 2)
    h = max_pool(conv2d(h, w2, b2, padding=1).relu(), 2)
    loss = _cross_entropy(_linear(h.reshape((2, 72)), w3, b3), onehot)
    if with_gradients:
        return tape.differentiate(loss, [w1, b1, w2, b2, w3, b3]).roots()
    return [loss]


def mlp(tape, normalize=False):
    """784 -> 128 (tanh) -> 10 -> cross-entropy; with ``normalize``, batch norm replaces the first bias."""
    rng = generator("mlp")
    x = tape.input(rng.standard_normal((4, 784)))
    onehot = tape.input(np.eye(10)[[3, 7, 1, 0]])
    w1 = tape.parameter(rng.standard_normal((784, 128)) * 0.03)
    if normalize:
        hidden = batch_norm(x @ w1, tape.parameter(np.ones(128)), tape.parameter(np.zeros(128)))[0]
    else:
        hidden = _linear(x, w1, tape.parameter(np.zeros(128)))
    w2, b2 = tape.parameter(rng.standard_normal((128, 10)) * 0.1), tape.parameter(np.zeros(10))
    return [_cross_entropy(_linear(hidden.tanh(), w2, b2), onehot)]


def _groups(plan):
    return sorted((g.kind, len(g.nodes)) for g in plan.fusions())


KERNEL_COUNTS = {
    # Forward only: each conv (pads through matmul) and each pool is one group;
    # the bias-add + relu pairs and the loss's neg + div are elementwise chains.
    "conv net": (conv_net, {}, [
        ("convolution", 7), ("convolution", 7), ("elementwise", 2), ("elementwise", 2),
        ("elementwise", 2), ("max_pool", 12), ("max_pool", 12),
    ]),
    # With recorded gradients the weight gradients read each im2col matrix and
    # the pool gradients' step masks read every lane and maximum; both
    # recompute what they read, so the forward groups lend it and still
    # fuse. The first convolution's input is not differentiated: one input
    # gradient. The pool gradients claim four of the elementwise chains.
    "conv net training": (
        conv_net, {"with_gradients": True}, [
            ("convolution", 7), ("convolution", 7), ("convolution_weight_gradient", 2),
            ("convolution_weight_gradient", 2), ("convolution_input_gradient", 7),
            ("max_pool", 12), ("max_pool", 12), ("max_pool_gradient", 23), ("max_pool_gradient", 23),
            ("elementwise", 2), ("elementwise", 2), ("elementwise", 2), ("elementwise", 2), ("elementwise", 3),
        ],
    ),
    "mlp": (mlp, {}, [("elementwise", 2), ("elementwise", 2)]),
    # Batch norm is offered (raise-only); at home its variance -> +eps -> sqrt and
    # normalize -> scale -> shift -> tanh run as elementwise chains.
    "mlp with batch norm": (
        mlp, {"normalize": True}, [("elementwise", 2), ("elementwise", 3), ("elementwise", 4)],
    ),
}

OFFERED = {
    "conv net": {"convolution": 2, "max_pool": 2, "elementwise": 5},
    "conv net training": {"convolution": 2, "convolution_weight_gradient": 2, "convolution_input_gradient": 1,
                          "max_pool": 2, "max_pool_gradient": 2, "elementwise": 13},
    "mlp": {"elementwise": 2},
    "mlp with batch norm": {"batch_norm_training": 1, "elementwise": 3},
}


@pytest.mark.parametrize("model", list(KERNEL_COUNTS))
def test_reference_models_fuse_into_the_pinned_groups(model):
    build, options, expected = KERNEL_COUNTS[model]
    network, roots = Tape.record(lambda tape: build(tape, **options))
    plan = lower(network, roots)
    assert _groups(plan) == sorted(expected), plan.describe()
    assert dict(Counter(c.kind for c in plan.candidates())) == OFFERED[model], plan.describe()
    parameters = network.parameters()
    oracle, run = network.forward(parameters), plan.forward(parameters)
    for root in roots:
        assert_bitwise(run[root], oracle[root], f"{model}: {root}")
