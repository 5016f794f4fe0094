"""check_gradients: backward-scan gradients graded against float64 finite differences."""

from __future__ import annotations

import numpy as np
import pytest

import topos
from topos import DifferentiationError, SymbolError, Tape, ToposError
from topos.readings.gradcheck import (
    DEFAULT_STEP,
    TOLERANCES,
    GradientCheckError,
    GradientReport,
    check_gradients,
)
from topos.spec.opcodes.elementwise import MAP_FUNCTIONS, MapFunction

X0 = np.array([[0.5, -1.25, 0.75], [1.5, 0.25, -0.5]])
W0 = np.array([[0.25, -0.5], [1.0, 0.75], [-1.5, 0.5]])
B0 = np.array([[0.125, -0.25]])


def mlp(dtype):
    """A tanh layer and a log_softmax loss with fed features: (network, symbols)."""

    def model(tape):
        x = tape.input(X0.astype(dtype))
        w = tape.parameter(W0.astype(dtype))
        b = tape.parameter(B0.astype(dtype))
        unused = tape.parameter(np.ones(3, dtype))
        hidden = (x @ w).tanh() + b.broadcast_to((2, 2))
        loss = -(hidden.log_softmax(1) * tape.leaf(np.array([[1.0, 0.0], [0.0, 1.0]], dtype))).sum()
        return x, w, b, unused, loss

    return Tape.record(model)


@pytest.mark.parametrize("dtype", [topos.float64, topos.float32, topos.bfloat16], ids=str)
def test_a_correct_network_passes_under_its_element_types_default_tolerance(dtype):
    network, (x, w, b, unused, loss) = mlp(dtype)
    report = check_gradients(network, network.parameters(), None, loss)
    assert isinstance(report, GradientReport)
    assert report.ok, str(report)
    assert report.tolerance == TOLERANCES[dtype]
    assert [e.symbol for e in report.entries] == [w, b, unused]
    assert report.assert_ok() is report


def test_the_float64_rule_check_stays_tight_while_bfloat16_gradients_carry_rounding():
    network, (x, w, b, unused, loss) = mlp(topos.bfloat16)
    report = check_gradients(network, network.parameters(), None, loss)
    assert report.worst_rule_error < 1e-9
    assert report.worst_error > 1e-4  # eight significant bits cannot do better
    assert report.ok


def test_a_wrong_derivative_rule_is_caught_and_named(monkeypatch):
    tanh = MAP_FUNCTIONS["tanh"]
    wrong = MapFunction(tanh.forward, lambda x, out, g: g * (1 - out), tanh.reads)
    monkeypatch.setitem(MAP_FUNCTIONS, "tanh", wrong)
    network, (x, w, b, unused, loss) = mlp(topos.float32)
    report = check_gradients(network, network.parameters(), None, loss)
    assert not report.ok
    assert report.worst.symbol == w
    assert report.worst.rule_error > 1e-2  # the float64 twin runs the same wrong rule
    with pytest.raises(GradientCheckError, match=rf"parameter {w!r} \[3, 2\].*recorded at"):
        report.assert_ok()
    assert issubclass(GradientCheckError, ToposError)
    assert "FAIL" in str(report)


def test_the_report_reads_as_a_table_with_one_row_per_wrt():
    network, (x, w, b, unused, loss) = mlp(topos.float32)
    text = str(check_gradients(network, network.parameters(), None, loss, wrt=[w, x]))
    lines = text.splitlines()
    assert "f32 backward scan vs float64 finite differences" in lines[0]
    assert lines[1].split()[:3] == ["wrt", "kind", "shape"]
    assert lines[2].split()[:4] == [repr(w), "parameter", "[3,", "2]"]
    assert lines[3].split()[:4] == [repr(x), "input", "[2,", "3]"]
    assert lines[2].split()[-1] == lines[3].split()[-1] == "ok"
    assert lines[-1].endswith("ok")


def test_inputs_are_checked_at_the_fed_values():
    def model(tape):
        x = tape.input(np.zeros(3))
        w = tape.parameter(np.array([0.5, -1.0, 2.0]))
        return x, w, (w * x).exp().sum()

    network, (x, w, loss) = Tape.record(model)
    fed = np.array([1.0, -0.5, 0.25])
    report = check_gradients(network, network.parameters(), {x: fed}, loss, wrt=[w, x])
    assert report.ok, str(report)
    # d/dw sum(exp(w * x)) = x * exp(w * x): at the default x = 0 it would vanish
    w0 = np.array([0.5, -1.0, 2.0])
    assert report.entries[0].largest == pytest.approx(np.max(np.abs(fed * np.exp(w0 * fed))), rel=1e-9)
    assert [e.kind for e in report.entries] == ["parameter", "input"]


def test_a_parameter_the_target_ignores_has_zero_error_and_zero_gradient():
    network, (x, w, b, unused, loss) = mlp(topos.float64)
    (entry,) = check_gradients(network, network.parameters(), None, loss, wrt=[unused]).entries
    assert entry.error == entry.rule_error == entry.largest == 0.0


def test_second_order_targets_built_from_recorded_gradients_are_checked():
    v0 = np.array([[0.5, -0.25], [1.0, 0.75], [-0.5, 0.125]])

    def model(tape):
        x = tape.input(X0)
        w = tape.parameter(W0)
        loss = ((x @ w).tanh() ** 2.0).sum()
        (gradient,) = tape.differentiate(loss, [w]).gradients
        return w, (gradient * tape.leaf(v0)).sum()

    network, (w, hvp_target) = Tape.record(model)
    report = check_gradients(network, network.parameters(), None, hvp_target)
    assert report.ok, str(report)
    assert report.entries[0].largest > 0.1  # a genuine, non-zero Hessian-vector product


def test_finite_differences_across_a_kink_are_reported_not_hidden():
    def model(tape):
        x = tape.parameter(np.array([0.0, 1.0]))  # relu's kink sits at the first element
        return x.relu().sum()

    network, loss = Tape.record(model)
    report = check_gradients(network, network.parameters(), None, loss)
    assert not report.ok
    entry = report.entries[0]
    assert entry.worst_element == (0,)
    # ties go left, so relu'(0) = 1, while the central difference sees the average 1/2
    assert (entry.backward_at_worst, entry.finite_difference_at_worst) == (1.0, 0.5)


def test_the_step_can_be_chosen():
    network, (x, w, b, unused, loss) = mlp(topos.float64)
    assert check_gradients(network, network.parameters(), None, loss).step == DEFAULT_STEP
    coarse = check_gradients(network, network.parameters(), None, loss, step=0.25)
    assert coarse.step == 0.25
    assert coarse.worst_error > check_gradients(network, network.parameters(), None, loss).worst_error


def test_wrt_must_be_a_parameter_or_float_input():
    def model(tape):
        table = tape.parameter(np.ones((3, 2)))
        picks = tape.input(topos.selection([0, 2], 3))
        constant = tape.leaf(np.ones((2, 2)))
        return picks, constant, (table.gather(picks) * constant).sum()

    network, (picks, constant, loss) = Tape.record(model)
    with pytest.raises(DifferentiationError, match="leaf node"):
        check_gradients(network, network.parameters(), None, loss, wrt=[constant])
    with pytest.raises(DifferentiationError, match="selection"):
        check_gradients(network, network.parameters(), None, loss, wrt=[picks])


def test_the_target_must_be_a_rank_0_symbol_of_this_network():
    network, (x, w, b, unused, loss) = mlp(topos.float64)
    other, other_loss = Tape.record(lambda tape: tape.parameter(np.ones(())) * 2.0)
    with pytest.raises(SymbolError, match="another tape"):
        check_gradients(network, network.parameters(), None, other_loss)
    with pytest.raises(DifferentiationError, match="rank-0"):
        check_gradients(network, network.parameters(), None, w)


def test_a_selection_target_is_refused_as_having_no_gradient_with_or_without_a_tolerance():
    def model(tape):
        table = tape.parameter(np.ones((3, 2)))
        picks = tape.input(shape=(), extent=3, name="picks")
        return picks, table.sum()

    network, (picks, _) = Tape.record(model)
    fed = {"picks": np.array(1)}
    for options in ({}, {"tolerance": 1e-3}):
        with pytest.raises(DifferentiationError, match=r"target %\d+ is a selection .*must be a float scalar"):
            check_gradients(network, network.parameters(), fed, picks, **options)


def test_a_registered_element_without_a_default_tolerance_asks_for_one():
    from topos.base import refmath
    from topos.base.element import ELEMENTS, Element, register, unregister

    ours = np.dtype(np.float16) not in ELEMENTS  # tests/test_element_seam.py may hold it registered
    if ours:
        register(Element(dtype=np.float16, name="f16", mlir="f16", compute=np.float32, accumulate=np.float32,
                         rounding=refmath.nearest_even(np.float16), reference_math=refmath.FLOAT64_KERNELS))
    try:
        network, loss = Tape.record(lambda tape: (tape.parameter(np.ones(2, np.float16)) * 2.0).sum())
        with pytest.raises(topos.ArgumentError, match="no default tolerance for f16.*pass tolerance="):
            check_gradients(network, network.parameters(), {}, loss)
        assert check_gradients(network, network.parameters(), {}, loss, tolerance=1e-2).ok
    finally:
        if ours:
            unregister("f16")


def test_argument_slips_are_refused_rather_than_reported_as_a_pass_or_fail():
    def record(tape):
        w = tape.parameter(np.array([0.5, -0.25], np.float32), name="w")
        return w, (w * w).sum()

    network, (w, loss) = Tape.record(record)
    table = network.parameters()
    one = check_gradients(network, table, {}, loss, wrt=w)  # a bare symbol is one to check
    assert len(one.entries) == 1 and one.ok
    with pytest.raises(DifferentiationError, match=r"wrt=\[\] names nothing to check"):
        check_gradients(network, table, {}, loss, wrt=[])
    with pytest.raises(DifferentiationError, match="more than once"):
        check_gradients(network, table, {}, loss, wrt=[w, w])
    with pytest.raises(DifferentiationError, match="wrt takes a parameter or input .* got int 0; leave wrt out"):
        check_gradients(network, table, {}, loss, wrt=0)
    with pytest.raises(DifferentiationError, match=r"got str 'w'; for the slot named 'w' pass network.named\('w'\)"):
        check_gradients(network, table, {}, loss, wrt="w")
    for option, value in (("tolerance", "tight"), ("tolerance", -1.0), ("step", 0.0), ("rule_tolerance", float("nan"))):
        with pytest.raises(topos.ArgumentError, match=f"{option} must be a finite number > 0"):
            check_gradients(network, table, {}, loss, **{option: value})
