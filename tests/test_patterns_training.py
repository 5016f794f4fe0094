"""Training plans: a convolution's and a max-pool's recorded gradients are fused, and the forward groups stay.

``tape.differentiate`` through ``conv2d`` records the weight gradient
(im2col^T @ dY) and the input gradient (dY @ kernel, then the unfolds'
adjoints: permute, two folds, the pads' narrows); through ``max_pool`` it
records the maximum rule at every fold step and the lanes' adjoints. The
gradient groups read the forward groups' interiors (the im2col matrix, the
lanes and the running maxima) by recomputing them from the forward
input, so the forward groups lend that interior (``Candidate.lends``)
and election keeps them only beside the groups that recompute it.

Every executor walks the composition's IEEE operations in its order, so
EXACT plans are compared bit for bit with ``network.forward``; FAST plans
with the matmul envelope. The kernel-count tests pin how the benchmark's
conv net and a LeNet-like net fuse once gradients are recorded.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from topos import Numerics, Tape
from topos.nn import conv2d, max_pool
from topos.readings.plan.patterns import elect, pattern
from topos.readings.plan.plan import Kernels

from conftest import ELEMENT_IDS, ELEMENTS, EPSILON, generator
from test_patterns import assert_bitwise, hand_conv, of_kind

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import _models  # noqa: E402  (the benchmark's conv net, at its benchmark size)

# ---- models -------------------------------------------------------------------------------------


def conv_training(dtype=np.float64, shape=(2, 3, 7, 6), weight_shape=(4, 3, 3, 3), stride=1, padding=1,
                  dilation=1, pool=None, recording="facade", wrt=("w", "x"), seed="conv training"):
    """A convolution (then tanh, optionally a max-pool), its squared sum, and the recorded gradients."""
    rng = generator(seed, shape, weight_shape)
    x0 = rng.standard_normal(shape).astype(dtype)
    w0 = (rng.standard_normal(weight_shape) * 0.5).astype(dtype)

    def model(tape):
        x, w = tape.input(x0), tape.parameter(w0)
        if recording == "facade":
            y = conv2d(x, w, stride=stride, padding=padding)
        else:
            pair = lambda v: (v, v) if isinstance(v, int) else v  # noqa: E731
            steps = hand_conv(x, w, pair(stride), pair(padding), pair(dilation))
            _, _, oh, _, ow, _ = steps["windows"].shape
            y = steps["product"].reshape((shape[0], oh, ow, weight_shape[0])).permute((0, 3, 1, 2))
        y = y.tanh()
        if pool is not None:
            y = max_pool(y, *pool)
        loss = (y * y).sum()
        return tape.differentiate(loss, [{"w": w, "x": x}[k] for k in wrt]).roots()

    return Tape.record(model)


def lenet(dtype=np.float32, batch=2, side=16, seed="lenet"):
    """conv 5x5 pad 2 -> relu -> pool 2 -> conv 3x3 -> relu -> pool 2 -> linear -> cross-entropy, trained."""
    rng = generator(seed, batch, side)
    flat = 6 * ((side // 2 - 2) // 2) ** 2

    def model(tape):
        x = tape.input(rng.standard_normal((batch, 1, side, side)).astype(dtype))
        onehot = tape.input(np.eye(10, dtype=dtype)[rng.integers(0, 10, batch)])
        w1 = tape.parameter((rng.standard_normal((4, 1, 5, 5)) * 0.2).astype(dtype))
        w2 = tape.parameter((rng.standard_normal((6, 4, 3, 3)) * 0.2).astype(dtype))
        w3 = tape.parameter((rng.standard_normal((flat, 10)) * 0.1).astype(dtype))
        h = max_pool(conv2d(x, w1, padding=2).relu(), 2)
        h = max_pool(conv2d(h, w2).relu(), 2).reshape((batch, flat))
        loss = -((h @ w3).log_softmax(1) * onehot).sum() / float(batch)
        return tape.differentiate(loss, [w1, w2, w3]).roots()

    return Tape.record(model)


def lower(network, roots, numerics=Numerics.EXACT, observe=()):
    return network.entry(roots, observe=observe, numerics=numerics).lower()


# ---- discovery, lending and election --------------------------------------------------------------


def test_a_training_convolution_offers_the_forward_group_and_both_gradients():
    network, roots = conv_training()
    plan = lower(network, roots)
    (forward,) = of_kind(plan.candidates(), "convolution")
    (weights,) = of_kind(plan.candidates(), "convolution_weight_gradient")
    (inputs,) = of_kind(plan.candidates(), "convolution_input_gradient")
    columns = max(n for n in forward.interior if network.node(network.symbol(n)).opcode.name == "reshape")
    # The im2col matrix is read by the weight gradient's permute, which recomputes it.
    transposed = next(n for n in weights.interior)
    assert dict(forward.lends) == {columns: (transposed,)}
    assert set(weights.recomputes) == set(forward.interior)
    assert weights.details["input"] == forward.details["input"] and weights.details["padding"] == ((1, 1), (1, 1))
    # The input gradient ends at the second narrow (the height pad's adjoint) and crops the fold.
    assert network.node(network.symbol(inputs.root)).opcode.name == "narrow"
    assert inputs.details["crop"] == ((1, 7), (1, 6)) and inputs.details["out_shape"] == (2, 3, 7, 6)
    assert {g.kind for g in plan.fusions()} >= {"convolution", "convolution_weight_gradient",
                                                  "convolution_input_gradient"}


def test_hand_recorded_chains_are_found_like_the_facades():
    kinds = []
    for recording in ("facade", "hand"):
        network, roots = conv_training(recording=recording, padding=(1, 0))
        kinds.append(sorted(c.kind for c in lower(network, roots).candidates() if c.kind != "elementwise"))
    assert kinds[0] == kinds[1] == ["convolution", "convolution_input_gradient", "convolution_weight_gradient"]


def test_a_lent_interior_needs_its_recomputing_group_elected():
    network, roots = conv_training(wrt=("w",))
    plan = lower(network, roots)
    assert [g.kind for g in plan.fusions() if g.kind != "elementwise"] == [
        "convolution", "convolution_weight_gradient"]
    # A consumer that cannot serve the weight gradient cannot take the forward group either:
    # its im2col matrix would have to exist for the matmul that reads it.
    without = elect(plan.candidates(), lambda c: c.kind != "convolution_weight_gradient")
    assert not of_kind(without, "convolution")


def test_observing_the_transposed_columns_removes_both_offers():
    network, roots = conv_training(wrt=("w",))
    (weights,) = of_kind(lower(network, roots).candidates(), "convolution_weight_gradient")
    transposed = network.symbol(weights.interior[0])  # im2col^T, the weight gradient's permute
    plan = lower(network, roots, observe=[transposed])
    assert not of_kind(plan.candidates(), "convolution_weight_gradient")
    assert not of_kind(plan.candidates(), "convolution"), plan.describe()  # its columns have a plain reader now
    parameters = network.parameters()
    for symbol in plan.results:
        assert_bitwise(plan.forward(parameters)[symbol], network.forward(parameters)[symbol])


def test_a_gradient_group_keeps_what_it_recomputes_from_alive_until_it_runs():
    network, roots = conv_training(wrt=("w",), pool=(2,))
    plan = lower(network, roots)
    (weights,) = of_kind(plan.fusions(), "convolution_weight_gradient")
    (pool,) = of_kind(plan.fusions(), "max_pool_gradient")
    assert plan._last_reader[weights.details["input"]] >= weights.root
    assert plan._last_reader[pool.details["input"]] >= pool.root
    # Nothing a lending group claims is materialized: every node of it is fused.
    labels = plan.liveness()
    for group in plan.fusions():
        assert all(labels[n].startswith("fused into") for n in group.interior), plan.describe()


def test_the_pool_gradient_claims_the_maximum_rules_and_the_lane_sums():
    network, roots = conv_training(pool=(2,), wrt=("w",))
    plan = lower(network, roots)
    (forward,) = of_kind(plan.candidates(), "max_pool")
    (gradient,) = of_kind(plan.candidates(), "max_pool_gradient")
    opcodes = Counter(network.node(network.symbol(n)).opcode.name for n in gradient.nodes)
    assert opcodes == {"step": 3, "mul": 6, "sub": 3, "pad": 4, "add": 3, "reshape": 1, "permute": 1, "fold": 2}
    assert set(forward.lends) == set(forward.details["maxima"][:-1]) | {lane for lane, _ in gradient.details["lanes"]}
    assert set(gradient.recomputes) == set(forward.interior)
    assert forward in plan.fusions() and gradient in plan.fusions()


# ---- bits: EXACT against the oracle ---------------------------------------------------------------

CASES = [
    # (input shape, weight shape, stride, padding, dilation, pool)
    ((2, 3, 7, 6), (4, 3, 3, 3), 1, 1, 1, None),
    ((1, 2, 9, 8), (3, 2, 3, 2), (2, 1), (1, 0), 1, None),
    ((2, 1, 10, 9), (2, 1, 3, 3), 2, 2, (2, 1), None),
    ((1, 2, 8, 8), (3, 2, 2, 2), 1, 0, 1, (2,)),
    ((1, 2, 9, 9), (2, 2, 2, 2), 1, 0, 1, (3, 2)),  # overlapping pool windows
]
SWEEP = [
    ((2, 3, 9, 8), (4, 3, 3, 2), 3, 4, 1, None),  # padding wider than the kernel: the crop starts inside the pad
    ((1, 5, 4, 4), (3, 5, 1, 1), 1, 0, 1, None),
    ((2, 3, 6, 5), (8, 3, 3, 3), 1, 1, 1, (2, 1)),
    ((1, 2, 11, 9), (6, 2, 2, 3), 2, 1, (1, 2), None),
    ((2, 2, 10, 10), (3, 2, 3, 3), 1, 1, 2, (3, 3)),
]


def _check_exact(case, dtype, recording):
    shape, weight_shape, stride, padding, dilation, pool = case
    network, roots = conv_training(dtype, shape, weight_shape, stride, padding, dilation, pool, recording)
    plan = lower(network, roots)
    kinds = {g.kind for g in plan.fusions()}
    assert {"convolution", "convolution_weight_gradient", "convolution_input_gradient"} <= kinds, plan.describe()
    if pool is not None:
        assert {"max_pool", "max_pool_gradient"} <= kinds, plan.describe()
    parameters = network.parameters()
    run, oracle = plan.forward(parameters), network.forward(parameters)
    for symbol in plan.results:
        assert_bitwise(run[symbol], oracle[symbol], repr(symbol))


@pytest.mark.parametrize("dtype", ELEMENTS, ids=ELEMENT_IDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}*{c[1]}-s{c[2]}-p{c[3]}-d{c[4]}-pool{c[5]}")
def test_exact_training_plan_matches_oracle_bitwise(case, dtype):
    recording = "hand" if case[4] != 1 else "facade"  # conv2d has no dilation; the hand recording does
    _check_exact(case, dtype, recording)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ELEMENTS, ids=ELEMENT_IDS)
@pytest.mark.parametrize("case", SWEEP, ids=lambda c: f"{c[0]}*{c[1]}-s{c[2]}-p{c[3]}-d{c[4]}-pool{c[5]}")
def test_exact_training_plan_matches_oracle_bitwise_sweep(case, dtype):
    _check_exact(case, dtype, "hand")


def test_pool_gradient_keeps_the_rules_ieee_corners():
    """Signed zeros, NaN and infinite seeds, ties: g * 0 is NaN for an infinite g, as in the composition."""
    values = np.array([
        [[-0.0, 0.0], [0.0, 0.0]], [[0.0, -0.0], [-0.0, -0.0]], [[np.nan, 1.0], [2.0, 3.0]],
        [[1.0, np.nan], [5.0, 0.0]], [[-np.inf, -np.inf], [-np.inf, -0.0]], [[2.0, 2.0], [2.0, 2.0]],
    ]).transpose(1, 0, 2).reshape(1, 1, 2, 12)
    seed = np.array([[[[1.0, -1.0, np.inf, -np.inf, np.nan, -0.0]]]])

    def model(tape):
        x = tape.input(values)
        g = tape.input(seed)
        return tape.vjp(max_pool(x, 2), g, [x]).roots()

    network, roots = Tape.record(model)
    plan = lower(network, roots)
    assert of_kind(plan.fusions(), "max_pool_gradient"), plan.describe()
    with np.errstate(invalid="ignore"):
        want = network.forward(network.parameters())
        got = plan.forward(network.parameters())
    for symbol in plan.results:
        assert_bitwise(got[symbol], want[symbol], repr(symbol))
    gradient = want[plan.results[-1]]
    assert np.isnan(gradient).any() and np.signbit(gradient).any()


# ---- FAST: BLAS per kernel tap, within the matmul envelope -----------------------------------------


@pytest.mark.parametrize("dtype", ELEMENTS, ids=ELEMENT_IDS)
def test_fast_gradient_groups_stay_in_the_matmul_envelope(dtype):
    """Each FAST gradient group against its EXACT walk on the same operand values (the oracle's).

    The bound is the reordered-sum one the FAST matmul declares: 2 ulps of
    the term count times the sum of |terms|, and that sum is the group's own
    EXACT walk over the absolute values of its operands.
    """
    network, roots = conv_training(dtype, (2, 3, 8, 8), (5, 3, 3, 3), 2, 1)
    plan = lower(network, roots, Numerics.FAST)
    oracle = network.forward(network.parameters())
    values = {n: oracle[network.symbol(n)] for n in range(len(network))}
    absolute = {n: np.abs(v) for n, v in values.items()}
    fast, exact = Kernels(network, Numerics.FAST), Kernels(network, Numerics.EXACT)
    checked = set()
    for group in plan.fusions():
        if group.kind not in ("convolution_weight_gradient", "convolution_input_gradient"):
            continue
        d, run = group.details, pattern(group.kind).execute
        kh, kw = d["kernel_size"]
        terms = (d["batch"] * d["count"][0] * d["count"][1] if group.kind == "convolution_weight_gradient"
                 else d["filters"] * kh * kw)
        want = run(group, values.__getitem__, network, exact)
        assert_bitwise(want, values[group.root], group.kind)  # the EXACT walk is the oracle's root
        got = run(group, values.__getitem__, network, fast).astype(np.float64)
        scale = terms * run(group, absolute.__getitem__, network, exact).astype(np.float64)
        error = np.abs(got - want.astype(np.float64))
        assert (error <= 2 * EPSILON[np.dtype(dtype)] * scale).all(), group.kind
        checked.add(group.kind)
    assert checked == {"convolution_weight_gradient", "convolution_input_gradient"}


# ---- kernel counts: how the benchmark's conv net and a LeNet-like net fuse when trained -----------


def _groups(plan):
    return Counter(g.kind for g in plan.fusions())


def test_benchmark_conv_net_training_fuses_into_the_pinned_groups():
    model = _models.conv_net()
    plan = lower(model.trained, model.adjoints.roots())
    # One conv (its input is fed, so no input gradient), one pool, their gradients;
    # the tanh derivative, the bias-add and the loss's links are elementwise chains.
    assert _groups(plan) == {"convolution": 1, "convolution_weight_gradient": 1, "max_pool": 1,
                             "max_pool_gradient": 1, "elementwise": 5}, plan.describe()
    parameters = model.parameters
    run, oracle = plan.forward(parameters, model.feeds), model.trained.forward(parameters, model.feeds)
    for symbol in plan.results:
        assert_bitwise(run[symbol], oracle[symbol], repr(symbol))


def test_lenet_training_fuses_into_the_pinned_groups():
    network, roots = lenet()
    plan = lower(network, roots)
    assert _groups(plan) == {"convolution": 2, "convolution_weight_gradient": 2, "convolution_input_gradient": 1,
                             "max_pool": 2, "max_pool_gradient": 2, "elementwise": 5}, plan.describe()
    parameters = network.parameters()
    run, oracle = plan.forward(parameters), network.forward(parameters)
    for symbol in plan.results:
        assert_bitwise(run[symbol], oracle[symbol], repr(symbol))
    fast = lower(network, roots, Numerics.FAST)
    assert _groups(fast) == _groups(plan)
