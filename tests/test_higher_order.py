"""Higher order: a recorded gradient is ordinary spec, so it can be differentiated again.

Every row of the opcode table (tests/test_differentiate.py) is recorded,
differentiated, contracted with fixed directions into
``second = sum_w sum(gradient_w * v_w)`` and differentiated again. The
second gradients are Hessian-vector products; they must equal the
backward scan of ``second`` bit for bit and agree with float64 finite
differences of the recorded gradient. Hessian-vector products through
``tape.vjp(gradient, direction, wrt)`` with a computed direction are
compared with closed forms.
"""

from __future__ import annotations

import numpy as np
import pytest

import topos
from topos import Tape
from topos.readings.gradcheck import check_gradients

from test_differentiate import (
    CASES,
    DTYPES,
    assert_bitwise,
    assert_recorded_is_scanned,
    record_case,
    short,
)

SECOND_ORDER_TOLERANCE = 1e-9  # measured worst over the table: about 1e-11


@pytest.mark.parametrize("dtype", DTYPES, ids=short)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_recorded_second_order_equals_its_backward_scan_bitwise(case, dtype):
    r = record_case(case, dtype, second_order=True)
    assert_recorded_is_scanned(r.network, r.second, r.second_adjoints, r.wrt)


@pytest.mark.parametrize("case", [c for c in CASES if c.smooth], ids=lambda c: c.name)
def test_second_order_matches_finite_differences_of_the_gradient(case):
    r = record_case(case, topos.float64, second_order=True)
    report = check_gradients(
        r.network, r.network.parameters(), None, r.second, wrt=r.wrt,
        tolerance=SECOND_ORDER_TOLERANCE,
    )
    report.assert_ok()


# ---- Hessian-vector products through vjp with a computed seed ----------------------------------------

X0 = np.array([[0.75, -1.25, 0.5, 1.5], [-0.5, 0.25, -1.75, 1.0]])
V0 = np.array([[0.5, 1.0, -0.25, 0.75], [1.5, -1.0, 0.125, -0.5]])


def hvp(f, x0=X0, v0=V0):
    """Record f(x), its gradient, and vjp(gradient, v + v, [x]); return (H (2v), via contraction)."""

    def model(tape):
        x = tape.parameter(x0)
        v = tape.input(v0)
        (gradient,) = tape.differentiate(f(x), [x]).gradients
        direction = v + v  # a computed seed, not a leaf
        (by_vjp,) = tape.vjp(gradient, direction, [x]).gradients
        (by_contraction,) = tape.differentiate((gradient * direction).sum(), [x]).gradients
        return by_vjp, by_contraction

    network, (by_vjp, by_contraction) = Tape.record(model)
    run = network.forward(network.parameters())
    return run[by_vjp], run[by_contraction]


def softmax_rows(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


TARGETS = np.array([[0.25, 0.25, 0.5, 0.0], [0.0, 1.0, 0.0, 0.0]])  # rows sum to 1

CLOSED_FORMS = {
    # f(x) -> H u for u = 2 V0, written with NumPy alone
    "cubic": (lambda x: (x**3.0).sum(), lambda x, u: 6 * x * u),
    "exp": (lambda x: x.exp().sum(), lambda x, u: np.exp(x) * u),
    "tanh": (lambda x: x.tanh().sum(), lambda x, u: -2 * np.tanh(x) * (1 - np.tanh(x) ** 2) * u),
    "log": (lambda x: (x * x + 1.0).log().sum(), lambda x, u: 2 * (1 - x * x) / (1 + x * x) ** 2 * u),
    "log_softmax": (
        # -sum(t * log_softmax(x)) with rows of t summing to 1 has H = diag(p) - p p^T per row
        lambda x: -(x.log_softmax(1) * TARGETS).sum(),
        lambda x, u: softmax_rows(x) * u
        - softmax_rows(x) * (softmax_rows(x) * u).sum(axis=1, keepdims=True),
    ),
}


@pytest.mark.parametrize("name", CLOSED_FORMS)
def test_hessian_vector_product_matches_closed_form(name):
    f, closed = CLOSED_FORMS[name]
    by_vjp, by_contraction = hvp(f)
    np.testing.assert_allclose(by_vjp, closed(X0, 2 * V0), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("name", CLOSED_FORMS)
def test_hvp_by_vjp_equals_hvp_by_differentiating_the_contraction_bitwise(name):
    f, _ = CLOSED_FORMS[name]
    by_vjp, by_contraction = hvp(f)
    assert_bitwise(by_vjp, by_contraction, name)


def test_hvp_matches_independent_finite_differences_of_the_closed_form_gradient():
    # The gradient of sum(x * tanh(x)) is tanh(x) + x (1 - tanh(x)^2), written in NumPy;
    # its central difference along u in float64 approximates H u to O(h^2).
    def gradient(x):
        t = np.tanh(x)
        return (1 - t * t) * x + t

    h = 2.0**-18
    u = 2 * V0
    expected = (gradient(X0 + h * u) - gradient(X0 - h * u)) / (2 * h)
    by_vjp, _ = hvp(lambda x: (x.tanh() * x).sum())
    np.testing.assert_allclose(by_vjp, expected, rtol=1e-8, atol=1e-9)


# ---- kinks: second derivatives that are exactly zero ----------------------------------------------------


def test_relu_second_derivative_is_exactly_zero():
    w0 = np.array([[0.5, -1.5, 2.0, 0.25], [1.0, 0.75, -0.5, 1.25]])

    def model(tape):
        x = tape.parameter(X0)
        w = tape.parameter(w0)
        gradient_x = tape.differentiate((x.relu() * w).sum(), [x]).gradients[0]
        direction = tape.input(V0)
        return tape.vjp(gradient_x, direction, [x, w]).gradients

    network, (xx, wx) = Tape.record(model)
    run = network.forward(network.parameters())
    assert_bitwise(run[xx], np.zeros_like(X0), "d2/dx2 of relu")
    # the mixed partial is not zero: d/dw of (step(x) * w) in direction v is step(x) * v
    assert_bitwise(run[wx], (X0 >= 0) * V0, "d2/dw dx")


@pytest.mark.parametrize(
    "f",
    [
        lambda x: (x.step(x * 0.0 + 0.125) * x).sum(),
        lambda x: x.abs().sum(),
        lambda x: x.maximum(-x * 0.5).sum(),
    ],
    ids=["step", "abs", "maximum"],
)
def test_piecewise_linear_second_derivatives_are_exactly_zero(f):
    by_vjp, by_contraction = hvp(f)
    assert_bitwise(by_vjp, np.zeros_like(X0), "H v")
    assert_bitwise(by_contraction, np.zeros_like(X0), "H v by contraction")


def test_third_order_of_a_cubic_is_the_constant_six():
    def model(tape):
        x = tape.parameter(X0)
        (first,) = tape.differentiate((x**3.0).sum(), [x]).gradients  # 3 x^2
        (second,) = tape.differentiate(first.sum(), [x]).gradients  # 6 x
        total = second.sum()
        (third,) = tape.differentiate(total, [x]).gradients  # 6
        return first, second, total, third

    network, (first, second, total, third) = Tape.record(model)
    run = network.forward(network.parameters())
    np.testing.assert_allclose(run[first], 3 * X0**2, rtol=1e-15)
    np.testing.assert_allclose(run[second], 6 * X0, rtol=1e-15)
    np.testing.assert_allclose(run[third], np.full_like(X0, 6.0), rtol=1e-15)
    check_gradients(network, network.parameters(), None, total).assert_ok()
