"""The fidelity model: each kernel declares what it promises about its bits, and a posture says what it accepts."""

from __future__ import annotations

import numpy as np
import pytest

import topos
from topos import Fidelity, Numerics, Tape, ToposError, by_name
from topos.readings.plan.numerics import FAST_KERNELS, REGISTERED, Envelope, kernel_for
from topos.readings.plan.patterns import CATALOG

RNG = np.random.default_rng(11)
A = RNG.standard_normal((40, 300)).astype(np.float32)
B = RNG.standard_normal((300, 30)).astype(np.float32)


@pytest.fixture(autouse=True)
def clean_registry():
    yield
    REGISTERED.clear()


def test_exact_accepts_only_the_reference_bits_and_fast_accepts_every_fidelity():
    assert Numerics.EXACT.accepts(Fidelity.IDENTICAL) and Numerics.EXACT.accepts(Fidelity.COMPOSED)
    assert not Numerics.EXACT.accepts(Fidelity.ENVELOPE)
    assert all(Numerics.FAST.accepts(f) for f in Fidelity)


def test_every_built_in_kernel_declares_a_fidelity_the_posture_honours():
    matmul = by_name("matmul")
    assert "matmul" in FAST_KERNELS
    exact = kernel_for(matmul, {}, Numerics.EXACT)(A, B)
    assert np.array_equal(exact, matmul.kernel(A, B))
    fast = kernel_for(matmul, {}, Numerics.FAST)(A, B)
    assert not np.array_equal(fast, exact)  # BLAS sums in another order: ENVELOPE, so EXACT never runs it
    for pattern in CATALOG:
        assert pattern.fidelity is (Fidelity.COMPOSED if pattern.bit_identical else Fidelity.ENVELOPE)


def test_a_kernel_that_keeps_its_promise_serves_exact_plans_and_shows_in_the_tally():
    def add_directly(a, b):
        return np.add(a, b)  # float64 addition rounds once: the reference's bits

    x = RNG.standard_normal(64)
    topos.register_kernel("add", add_directly, Fidelity.IDENTICAL, examples=[((x, x[::-1]), {})])

    def record(tape):
        p = tape.parameter(np.linspace(-1, 1, 64))
        return (p + p).sum()

    network, out = Tape.record(record)
    plan = network.entry([out], numerics=Numerics.EXACT).lower()
    served = {d.opcode: d for d in plan.tally()}
    assert served["add"].backend == "registered" and "add_directly (bit-identical)" in served["add"].kernel
    assert np.array_equal(plan.forward(network.parameters())[out], network.forward(network.parameters())[out])
    topos.unregister_kernel("add")
    assert network.entry([out], numerics=Numerics.EXACT).lower().tally()[1].backend == "oracle"


def test_a_kernel_that_declares_bit_identical_but_differs_is_refused_naming_it():
    def blas(a, b):
        return np.matmul(a, b)

    with pytest.raises(ToposError, match=r"matmul kernel declares bit-identical fidelity, but on example 0 \d+ of "
                                         r"1200 elements differ"):
        topos.register_kernel("matmul", blas, Fidelity.IDENTICAL, examples=[((A, B), {})])
    assert "matmul" not in REGISTERED
    topos.register_kernel("matmul", blas, Fidelity.ENVELOPE, examples=[((A, B), {})],
                          envelope=Envelope(2.0, accumulates=True))
    assert kernel_for(by_name("matmul"), {}, Numerics.EXACT)(A, B).tobytes() == by_name("matmul").kernel(A, B).tobytes()


def test_an_envelope_kernel_needs_its_envelope_and_must_stay_inside_it():
    x = np.linspace(0.1, 3.0, 50)
    with pytest.raises(ToposError, match="declares ENVELOPE fidelity: give its envelope="):
        topos.register_kernel("map", np.exp, Fidelity.ENVELOPE, examples=[((x,), {})], function="exp")
    with pytest.raises(ToposError, match="leaves its envelope"):
        topos.register_kernel("map", lambda v: np.exp(v) * (1 + 1e-9), Fidelity.ENVELOPE,
                              examples=[((x,), {})], envelope=Envelope(4.0), function="exp")
    with pytest.raises(ToposError, match="needs examples"):
        topos.register_kernel("add", np.add, Fidelity.IDENTICAL, examples=[])


def test_the_posture_context_decides_what_direct_payload_calls_run():
    matmul = by_name("matmul")
    reference = matmul.kernel(A, B)
    assert np.array_equal(matmul.express((A, B)), reference)  # the default: the oracle's bits
    with topos.posture(Numerics.FAST):
        fast = matmul.express((A, B))
        with topos.exactly():
            assert np.array_equal(matmul.express((A, B)), reference)
        assert np.array_equal(matmul.express((A, B)), fast)
    assert not np.array_equal(fast, reference)
    assert np.array_equal(matmul.express((A, B)), reference)  # restored on the way out
    with pytest.raises(TypeError, match="posture takes Numerics"):
        with topos.posture("fast"):
            pass


def test_the_backward_scan_is_a_direct_payload_call_too():
    def record(tape):
        w = tape.parameter(B)
        return (tape.leaf(A) @ w).tanh().sum()

    network, out = Tape.record(record)
    run = network.forward(network.parameters())
    exact = run.backward(out)[network.symbol(0)]
    with topos.posture(Numerics.FAST):
        fast = run.backward(out)[network.symbol(0)]
    np.testing.assert_allclose(fast, exact, rtol=1e-4, atol=1e-5)
    assert np.array_equal(run.backward(out)[network.symbol(0)], exact)
