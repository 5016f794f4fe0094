"""Reverse mode, opcode by opcode: recorded gradients are the backward scan, bit for bit.

One table (``CASES``) names a small recording per opcode, per map function
and per composite; one helper (``record_case``) turns a row into a network
whose loss is ``sum(out * probe)`` with a non-uniform probe (so a rule that
permutes or drops cotangents cannot hide behind an all-ones seed), followed
by ``tape.differentiate``. Each row is then checked three ways:

* the recorded gradient nodes, run by the oracle, equal ``run.backward``
  bit for bit in float32, float64 and bfloat16;
* in float64, both agree with finite differences (``check_gradients``);
* the table covers every opcode and every map function.

Operand values are multiples of 1/64 in [-3, 3], so they are exact in all
three element types, and inputs to kinks (relu, abs, maximum, step) are
odd or even multiples chosen so that no element sits on a kink.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

import topos
from topos import DifferentiationError, SymbolError, Tape, concat, stack
from topos.readings.gradcheck import check_gradients

DTYPES = (topos.float32, topos.float64, topos.bfloat16)
_GRID = 64  # operand values are multiples of 1/_GRID


# ---- operands: how each argument of a row is made ----------------------------------------


@dataclass(frozen=True)
class Operand:
    """One argument of a table row: a float tensor (parameter or input) or a selection leaf."""

    shape: tuple[int, ...] = ()
    low: float = -2.0
    high: float = 2.0
    parity: str = "any"  # "odd" or "even" multiples of 1/64: two parities never tie
    role: str = "parameter"  # "parameter", "input" or "selection"
    indices: tuple = ()
    extent: int = 0

    def make(self, rng: np.random.Generator, dtype) -> np.ndarray | topos.Selection:
        if self.role == "selection":
            return topos.selection(np.array(self.indices), self.extent)
        return grid(rng, self.shape, self.low, self.high, self.parity).astype(dtype)


def grid(rng, shape, low, high, parity="any") -> np.ndarray:
    """Uniform values on the 1/64 grid in [low, high] (exact in f64, f32 and bf16)."""
    ticks = np.floor(rng.uniform(low, high, shape) * _GRID)
    if parity == "odd":
        ticks = 2 * np.floor(ticks / 2) + 1
    elif parity == "even":
        ticks = 2 * np.floor(ticks / 2)
    return np.asarray(ticks / _GRID, dtype=np.float64)


def real(*shape, low=-2.0, high=2.0, parity="any", role="parameter") -> Operand:
    return Operand(tuple(shape), low, high, parity, role)


def positive(*shape, low=0.5, high=2.0, role="parameter") -> Operand:
    return Operand(tuple(shape), low, high, "any", role)


def chosen(indices, extent) -> Operand:
    return Operand(role="selection", indices=tuple(indices), extent=extent)


# ---- the table ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One row: ``build(*operand payloads)`` records the opcode or composite named ``name``."""

    name: str
    operands: tuple[Operand, ...]
    build: Callable
    smooth: bool = True  # False: the inputs sit on a kink on purpose (bitwise checks only)


def _map(function: str) -> Case:
    domains = {
        "log": positive(3, 4, low=0.25),
        "sqrt": positive(3, 4, low=0.25),
        "log1p": real(3, 4, low=-0.5),
        "sin": real(3, 4, low=-3.0, high=3.0),
        "cos": real(3, 4, low=-3.0, high=3.0),
    }
    return Case(f"map.{function}", (domains.get(function, real(3, 4)),), lambda x: x.map(function))


_REPEATED = chosen([0, 2, 2, 1, 0, 2], 4)

CASES: tuple[Case, ...] = (
    # elementwise opcodes
    Case("add", (real(3, 4), real(3, 4, role="input")), lambda a, b: a + b),
    Case("sub", (real(3, 4), real(3, 4, role="input")), lambda a, b: a - b),
    Case("mul", (real(3, 4), real(3, 4)), lambda a, b: a * b),
    Case("div", (real(3, 4), positive(3, 4)), lambda a, b: a / b),
    Case("pow", (positive(3, 4), real(3, 4)), lambda a, b: a**b),
    Case("maximum", (real(3, 4, parity="odd"), real(3, 4, parity="even")), lambda a, b: a.maximum(b)),
    Case("step", (real(3, 4, parity="odd"), real(3, 4, parity="even")), lambda x, t: x.step(t) * x),
    Case("neg", (real(3, 4),), lambda x: -x),
    *(_map(function) for function in topos.MAP_FUNCTIONS),
    # linear algebra and reductions
    Case("matmul", (real(3, 4), real(4, 2)), lambda a, b: a @ b),
    Case("sum", (real(3, 4),), lambda x: x.sum()),
    Case("sum_along", (real(3, 4, 2),), lambda x: x.sum_along(1)),
    # shape
    Case("broadcast", (real(1, 1),), lambda x: x.broadcast((3, 4))),
    Case("broadcast_along", (real(3, 2),), lambda x: x.broadcast_along(1, 4)),
    Case("reshape", (real(3, 4),), lambda x: x.reshape((2, 6))),
    Case("permute", (real(2, 3, 4),), lambda x: x.permute((2, 0, 1))),
    Case("narrow", (real(5, 3),), lambda x: x.narrow(0, 1, 3)),
    Case("pad", (real(3, 2),), lambda x: x.pad(1, 1, 5)),
    Case("unfold", (real(6, 2),), lambda x: x.unfold(0, 3)),
    Case("fold", (real(3, 3, 2),), lambda x: x.fold(0, 3, 2, 1, 7)),
    # indexing (repeated indices accumulate)
    Case("gather", (real(4, 3), _REPEATED), lambda t, s: t.gather(s)),
    Case("scatter", (real(6, 3), _REPEATED), lambda v, s: v.scatter(s)),
    # stable log-domain
    Case("log_softmax", (real(3, 5, low=-3.0, high=3.0),), lambda x: x.log_softmax(1)),
    Case("logsumexp", (real(3, 5, low=-3.0, high=3.0),), lambda x: x.logsumexp(0)),
    # composites
    Case("relu", (real(3, 4, parity="odd"),), lambda x: x.relu()),
    Case("abs", (real(3, 4, parity="odd"),), lambda x: x.abs()),
    Case("softplus", (real(3, 4, low=-3.0, high=3.0, parity="odd"),), lambda x: x.softplus()),
    Case("gelu", (real(3, 4),), lambda x: x.gelu()),
    Case("softmax", (real(3, 5),), lambda x: x.softmax(1)),
    Case("mean", (real(3, 4),), lambda x: x.mean()),
    Case("mean_along", (real(3, 4),), lambda x: x.mean_along(0)),
    Case("transpose", (real(3, 4),), lambda x: x.T),
    Case("squeeze_unsqueeze", (real(3, 1),), lambda x: x.squeeze(1).unsqueeze(0)),
    Case("broadcast_to", (real(3, 1),), lambda x: x.broadcast_to((2, 3, 4))),
    Case("broadcast_to_scalar", (real(),), lambda x: x.broadcast_to((2, 3))),
    Case("concat", (real(3, 2), real(3, 1), real(3, 3)), lambda a, b, c: concat([a, b, c], 1)),
    Case("stack", (real(3, 2), real(3, 2)), lambda a, b: stack([a, b], 0)),
    Case("batched_matmul", (real(2, 3, 4), real(2, 4, 2)), lambda a, b: a @ b),
    Case("gather_scatter", (real(4, 3), _REPEATED), lambda t, s: t.gather(s).scatter(s)),
    Case("unfold_step_dilation", (real(9, 2),), lambda x: x.unfold(0, 3, step=2, dilation=2)),
    Case("fold_step_dilation", (real(2, 3, 2),), lambda x: x.fold(0, 3, 3, 2, 9)),
    Case("fan_out", (real(3, 4),), lambda x: x.tanh() * x + x.exp() - x),
    Case("same_operand_twice", (real(3, 4),), lambda x: x * x),
    Case(
        "composed_loss",  # tanh layer, bias, log_softmax cross-entropy picked by a selection
        (real(4, 5, role="input"), real(5, 3), real(1, 3), chosen([2, 3, 7, 11], 12)),
        lambda x, w, b, picks: -((x @ w).tanh() + b.broadcast_to((4, 3)))
        .log_softmax(1)
        .reshape((12, 1))
        .gather(picks)
        .mean(),
    ),
    # on a kink on purpose: the rule's choice (ties go left) must still be identical bitwise
    Case(
        "maximum_ties",
        (real(3, 4), real(3, 4)),
        lambda a, b: a.maximum(a * 1.0) + b.maximum(b),
        smooth=False,
    ),
    Case("relu_at_zero", (real(3, 4),), lambda x: (x - x).relu() + x, smooth=False),
)


# ---- the one helper --------------------------------------------------------------------------


@dataclass(frozen=True)
class Recorded:
    """A table row recorded in one element type: its loss, wrt and recorded gradients."""

    network: topos.Network
    loss: topos.Symbol
    wrt: tuple[topos.Symbol, ...]
    adjoints: topos.Adjoints
    second: topos.Symbol | None = None  # sum over wrt of sum(gradient * direction)
    second_adjoints: topos.Adjoints | None = None


def record_case(case: Case, dtype, *, second_order: bool = False) -> Recorded:
    """Record ``case`` in ``dtype``: loss = sum(out * probe), then differentiate it.

    With ``second_order`` the gradients are contracted with fixed
    directions into a second rank-0 target, which is differentiated again
    (reverse over reverse: its gradients are Hessian-vector products).
    """
    rng = np.random.default_rng(zlib.crc32(case.name.encode()))

    def model(tape):
        arguments, wrt = [], []
        for operand in case.operands:
            payload = operand.make(rng, dtype)
            if operand.role == "selection":
                arguments.append(tape.leaf(payload))
                continue
            value = tape.parameter(payload) if operand.role == "parameter" else tape.input(payload)
            arguments.append(value)
            wrt.append(value)
        out = case.build(*arguments)
        loss = (out * tape.leaf(grid(rng, out.shape, 0.5, 1.5).astype(dtype))).sum()
        adjoints = tape.differentiate(loss, wrt)
        if not second_order:
            return loss, tuple(wrt), adjoints, None, None
        contractions = [
            (g * tape.leaf(grid(rng, g.shape, -1.0, 1.0).astype(dtype))).sum()
            for g in adjoints.gradients
        ]
        second = contractions[0]
        for c in contractions[1:]:
            second = second + c
        return loss, tuple(wrt), adjoints, second, tape.differentiate(second, wrt)

    network, recorded = Tape.record(model)
    return Recorded(network, *recorded)


def bits(array: np.ndarray) -> np.ndarray:
    """The raw bit patterns of a float array (so -0.0 and NaN payloads count too)."""
    array = np.asarray(array)
    return array.view(f"uint{8 * array.dtype.itemsize}")


def assert_bitwise(recorded: np.ndarray, scanned: np.ndarray, what: str) -> None:
    assert recorded.dtype == scanned.dtype, f"{what}: {recorded.dtype} vs {scanned.dtype}"
    assert recorded.shape == scanned.shape, f"{what}: {recorded.shape} vs {scanned.shape}"
    np.testing.assert_array_equal(bits(recorded), bits(scanned), err_msg=what)


def assert_recorded_is_scanned(network, target, adjoints, wrt) -> None:
    """Running the recorded gradient nodes gives the backward scan's bits for every wrt."""
    run = network.forward(network.parameters())
    gradients = run.backward(target)
    for w in wrt:
        assert_bitwise(run[adjoints[w]], gradients[w], f"d {target!r} / d {w!r}")


def short(dtype) -> str:
    return topos.base.element.short_name(dtype)


# ---- per opcode: recorded == scanned, bit for bit; both == finite differences ---------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=short)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_recorded_gradients_equal_backward_scan_bitwise(case, dtype):
    r = record_case(case, dtype)
    assert_recorded_is_scanned(r.network, r.loss, r.adjoints, r.wrt)
    gradients = r.network.forward(r.network.parameters()).backward(r.loss)
    assert any(np.any(gradients[w] != 0) for w in r.wrt), "a vacuous row: every gradient is zero"


FLOAT64_TOLERANCE = 1e-8  # norm-wise relative error of the float64 backward scan vs finite differences


@pytest.mark.parametrize("case", [c for c in CASES if c.smooth], ids=lambda c: c.name)
def test_backward_scan_matches_float64_finite_differences(case):
    r = record_case(case, topos.float64)
    report = check_gradients(
        r.network, r.network.parameters(), None, r.loss, wrt=r.wrt, tolerance=FLOAT64_TOLERANCE
    )
    report.assert_ok()
    assert report.worst_error <= FLOAT64_TOLERANCE


def test_table_covers_every_opcode_and_map_function():
    rows = {c.name for c in CASES}
    opcodes = {op.name for op in topos.OPCODES if not op.is_source and op.name != "map"}
    functions = {f"map.{f}" for f in topos.MAP_FUNCTIONS}
    assert len(opcodes) + 1 == 24  # the 24 non-source opcodes, map counted once
    assert not (opcodes | functions) - rows, f"rows missing: {sorted((opcodes | functions) - rows)}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_opcode_rows_record_the_opcode_they_name(case):
    r = record_case(case, topos.float64)
    forward = r.network.nodes()[: r.loss.index + 1]
    recorded = {n.opcode.name for n in forward} | {
        f"map.{n.attributes['function']}" for n in forward if n.opcode.name == "map"
    }
    if case.name in {op.name for op in topos.OPCODES} or case.name.startswith("map."):
        assert case.name in recorded


# ---- fan-out and the accumulation order --------------------------------------------------------------


def test_same_operand_twice_accumulates_both_contributions():
    x0 = np.array([0.75, -1.5, 3.0], np.float32)
    c0 = np.array([0.5, 1.25, -2.0], np.float32)

    def model(tape):
        x = tape.parameter(x0)
        loss = (x * x * tape.leaf(c0)).sum()
        return x, loss, tape.differentiate(loss, [x])

    network, (x, loss, adjoints) = Tape.record(model)
    run = network.forward(network.parameters())
    # d/dx sum(x*x*c): the mul (x, x) gets g = c, and both positions contribute c*x.
    expected = c0 * x0 + c0 * x0
    assert_bitwise(run.backward(loss)[x], expected, "x * x")
    assert_bitwise(run[adjoints[x]], expected, "x * x recorded")


def test_cotangents_accumulate_in_reverse_consumer_order():
    # Three consumers of x, recorded in the order a, b, c. The contract says
    # x's cotangent is c's contribution, then + b's, then + a's. In float32,
    # (c + b) + a = (-1e8 + 1e8) + 1 = 1, while (a + b) + c = 0: 1e8 + 1 rounds to 1e8.
    a, b, c = (np.full(2, v, np.float32) for v in (1.0, 1e8, -1e8))

    def model(tape):
        x = tape.parameter(np.ones(2, np.float32))
        loss = (x * tape.leaf(a)).sum() + (x * tape.leaf(b)).sum() + (x * tape.leaf(c)).sum()
        return x, loss, tape.differentiate(loss, [x])

    network, (x, loss, adjoints) = Tape.record(model)
    run = network.forward(network.parameters())
    assert_bitwise(run.backward(loss)[x], np.ones(2, np.float32), "reverse consumer order")
    assert_bitwise(run[adjoints[x]], np.ones(2, np.float32), "reverse consumer order, recorded")


def test_fan_out_gradient_matches_closed_form():
    x0 = np.array([[0.5, -1.0], [1.5, 0.25]])

    def model(tape):
        x = tape.parameter(x0)
        y = x.tanh()  # three consumers of y, and x itself read twice more
        loss = (y * x + y * y + y.exp() * x).sum()
        return x, loss, tape.differentiate(loss, [x])

    network, (x, loss, adjoints) = Tape.record(model)
    run = network.forward(network.parameters())
    t = np.tanh(x0)
    dt = 1 - t * t
    closed = dt * x0 + t + 2 * t * dt + np.exp(t) * dt * x0 + np.exp(t)
    np.testing.assert_allclose(run.backward(loss)[x], closed, rtol=1e-14)
    assert_bitwise(run[adjoints[x]], run.backward(loss)[x], "fan-out")


# ---- what reaches and what does not ------------------------------------------------------------------


def test_non_ancestor_wrt_gets_a_recorded_zero():
    def model(tape):
        x = tape.parameter(np.array([1.0, 2.0], np.float32))
        unused = tape.parameter(np.ones((2, 3), np.float32))
        fed = tape.input(np.ones(4, np.float32))
        loss = (x * x).sum()
        return x, unused, fed, loss, tape.differentiate(loss, [x, unused, fed])

    network, (x, unused, fed, loss, adjoints) = Tape.record(model)
    run = network.forward(network.parameters())
    for w, shape in ((unused, (2, 3)), (fed, (4,))):
        assert network.node(adjoints[w]).opcode.name == "leaf"
        assert_bitwise(run[adjoints[w]], np.zeros(shape, np.float32), f"recorded zero for {w!r}")
        assert not run.backward(loss).reached(w)
        assert_bitwise(run.backward(loss)[w], np.zeros(shape, np.float32), f"scanned zero for {w!r}")


def test_disconnected_zero_over_zero_injects_no_nan():
    def model(tape):
        x = tape.parameter(np.array([1.0, -2.0, 0.5]))
        nan = (x - x) / (x - x)  # consumes x, but the loss never reads it
        loss = (x * 3.0).sum()
        return x, nan, loss, tape.differentiate(loss, [x])

    network, (x, nan, loss, adjoints) = Tape.record(model)
    with np.errstate(invalid="ignore"):
        run = network.forward(network.parameters())
    assert np.isnan(run[nan]).all()
    assert_bitwise(run.backward(loss)[x], np.full(3, 3.0), "d loss / d x beside a NaN")
    assert_bitwise(run[adjoints[x]], np.full(3, 3.0), "recorded, beside a NaN")


def test_pow_exponent_gradient_at_a_zero_base_is_zero_not_nan():
    """d/db a**b = a**b log a is 0 * -inf at a = 0; its limit (and PyTorch's and JAX's answer) is 0.
    The fuzz's first seeded host run drew it (docs/reliability.md, pow-exponent-at-zero-base)."""
    from topos.readings.forward_mode import jvp

    def model(tape):
        a = tape.parameter(np.array([0.0, -0.0, 2.0, 0.5]), name="a")
        b = tape.parameter(np.array([1.5, 2.0, 0.5, 3.0]), name="b")
        loss = (a**b).sum()
        return a, b, loss, tape.differentiate(loss, [a, b])

    network, (a, b, loss, adjoints) = Tape.record(model)
    run = network.forward(network.parameters())
    want = np.array([0.0, 0.0, 2.0**0.5 * np.log(2.0), 0.125 * np.log(0.5)])  # torch.autograd agrees
    np.testing.assert_allclose(run[adjoints[b]], want, rtol=1e-15)
    assert_bitwise(run.backward(loss)[b], run[adjoints[b]], "scan and recorded")
    _, tangents = jvp(network, network.parameters(), None, {"b": np.ones(4)})
    np.testing.assert_allclose(tangents[loss], want.sum(), rtol=1e-15)  # forward mode shares the rule


def test_describe_shows_the_appended_gradient_nodes():
    def model(tape):
        x = tape.parameter(np.ones(2, np.float32))
        y = tape.parameter(np.ones(2, np.float32))
        loss = (x * y).sum()
        return tape.differentiate(loss, [x])

    network, adjoints = Tape.record(model)
    # By hand: the ones seed, sum's rule (broadcast), mul's rule for x (g * y);
    # mul's rule also computed g * x for y, which nobody asked for, so it is gone.
    expected = """
        0 parameter () [2] f32
        1 parameter () [2] f32
        2 mul (0, 1) [2] f32
        3 sum (2) [] f32
        4 leaf () value=1 [] f32
        5 broadcast (4) shape=[2] [2] f32
        6 mul (5, 1) [2] f32
        network: 7 nodes (2 parameters, 0 inputs, 1 leaf)
    """
    lines = [" ".join(line.split()) for line in network.describe().splitlines()]
    assert lines == [line.strip() for line in expected.strip().splitlines()]
    assert adjoints.gradients[0].index == 6


# ---- errors name the problem -------------------------------------------------------------------------


def test_differentiating_a_non_scalar_target_names_its_shape():
    tape = Tape()
    x = tape.parameter(np.ones((2, 3)))
    with pytest.raises(DifferentiationError, match=r"rank-0 loss.*\[2, 3\].*vjp"):
        tape.differentiate(x * 2.0, [x])


def test_backward_of_a_non_scalar_target_names_its_shape():
    def model(tape):
        x = tape.parameter(np.ones((2, 3)))
        return x * 2.0

    network, y = Tape.record(model)
    with pytest.raises(DifferentiationError, match=r"rank-0 target.*\[2, 3\]"):
        network.forward(network.parameters()).backward(y)


def test_backward_of_a_selection_says_a_selection_has_no_gradient():
    network, picks = Tape.record(lambda tape: tape.input(shape=(), extent=3, name="picks"))
    run = network.forward(network.parameters(), {"picks": np.array(2)})
    with pytest.raises(DifferentiationError, match=r"target %0 is a selection \(\[\] index<3>.*no gradient: the "
                                                   "target must be a float scalar"):
        run.backward(picks)


def test_wrt_from_another_tape_is_a_symbol_error():
    other, x_elsewhere = Tape.record(lambda tape: tape.parameter(np.ones(2)))
    tape = Tape()
    x = tape.parameter(np.ones(2))
    with pytest.raises(SymbolError, match="wrt"):
        tape.differentiate((x * x).sum(), [x_elsewhere])
    open_tape = Tape()
    foreign = open_tape.parameter(np.ones(2))
    with pytest.raises(SymbolError, match="another tape"):
        tape.differentiate((x * x).sum(), [foreign])


def test_target_from_another_tape_is_a_symbol_error():
    other = Tape()
    z = other.parameter(np.ones(()))
    tape = Tape()
    x = tape.parameter(np.ones(()))
    with pytest.raises(SymbolError, match="target"):
        tape.differentiate(z * 2.0, [x])


def test_wrt_that_is_not_a_parameter_or_input_is_named():
    tape = Tape()
    x = tape.parameter(np.ones(2))
    hidden = x * 2.0
    with pytest.raises(DifferentiationError, match=r"mul node.*parameters or inputs"):
        tape.differentiate(hidden.sum(), [hidden])
    constant = tape.leaf(np.ones(2))
    with pytest.raises(DifferentiationError, match=r"leaf node"):
        tape.differentiate((x * constant).sum(), [constant])


def test_wrt_a_selection_is_a_differentiation_error():
    tape = Tape()
    table = tape.parameter(np.ones((3, 2)))
    picks = tape.input(topos.selection([0, 2], 3))
    with pytest.raises(DifferentiationError, match="selection"):
        tape.differentiate(table.gather(picks).sum(), [table, picks])


def test_vjp_seed_of_the_wrong_shape_is_named():
    tape = Tape()
    x = tape.parameter(np.ones((2, 3)))
    with pytest.raises(DifferentiationError, match=r"seed has shape \[3\].*\[2, 3\]"):
        tape.vjp(x * 2.0, np.ones(3), [x])


def test_a_refused_vjp_seed_leaves_the_tape_as_it_was():
    tape = Tape()
    x = tape.parameter(np.ones((2, 3)))
    y = x * 2.0
    length, before = len(tape), tape.describe()
    for seed in (np.ones(3), np.ones((2, 3), np.float32)):  # the wrong shape, then the wrong element type
        with pytest.raises(DifferentiationError, match="seed"):
            tape.vjp(y, seed, [x])
    assert len(tape) == length and tape.describe() == before


def test_a_vjp_of_a_selection_says_selections_have_no_derivative():
    tape = Tape()
    picks = tape.input(topos.selection([0, 1], 2))
    w = tape.parameter(np.ones(2))
    for seed in ([1, 1], np.ones(2), None):
        with pytest.raises(DifferentiationError, match=r"target %0 is a selection .*no derivative"):
            tape.vjp(picks, seed, [w])
    assert len(tape) == 2


def test_vjp_seed_of_another_element_type_or_out_of_range_is_refused_not_narrowed():
    def seeded(seed):
        def model(tape):
            w = tape.parameter(np.ones(3, np.float32))
            return tape.vjp(w * w, seed, [w]).gradients[0]

        network, gradient = Tape.record(model)
        return network.forward(network.parameters())[gradient]

    with pytest.raises(DifferentiationError, match=r"seed is float64 and the target %1 is f32; convert .*\.astype"):
        seeded(np.full(3, 1e300))
    with pytest.raises(DifferentiationError, match=r"seed is float64 .* f32"):
        seeded(np.ones(3))  # in range too: an array keeps its type, as a feed's must
    with pytest.raises(DifferentiationError, match=r"seed holds 1e\+300 at position \(1,\).*f32.*become inf"):
        seeded([1.0, 1e300, 2.0])
    with pytest.raises(DifferentiationError, match="seed .list. does not convert.*not numbers"):
        seeded(["a", "b", "c"])
    assert seeded(np.array([1.0, 2.0, 3.0], np.float32)).tolist() == [2.0, 4.0, 6.0]
    assert seeded([1.0, 2.0, 3.0]).tolist() == [2.0, 4.0, 6.0]  # Python numbers convert


def test_gradients_name_their_network_and_target():
    def model(tape):
        w = tape.parameter(np.float64(3.0))
        return w, (w * w).sum()

    network, (w, loss) = Tape.record(model)
    gradients = network.forward(network.parameters()).backward(loss)
    assert gradients.network is network and gradients.target == loss
    assert gradients.map(lambda g: g * 2).target == loss
