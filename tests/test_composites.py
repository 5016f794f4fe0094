"""Composites (relu, softmax, broadcast_to, concat, ...): right values, and only primitive opcodes recorded."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

import topos
from topos import Tape, concat, stack
from topos.base.errors import ShapeError, ToposError

from conftest import ELEMENT_IDS, ELEMENTS, assert_close, described_opcodes, generator, line_here

F64, F32, BF16 = topos.float64, topos.float32, topos.bfloat16

EXACT = {F64: 0, F32: 0, BF16: 0}
# A short chain of roundings, each one relative to the magnitude stated by the row's scale.
CHAIN = {F64: 4, F32: 4, BF16: 3}
ACCUMULATED = {F64: 8, F32: 8, BF16: 2}

_erf = np.vectorize(math.erf)


def _log_softmax(x, axis):
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


@dataclass(frozen=True)
class Composite:
    """One row: a composite spelling, its float64 reference, and the opcodes it must record."""

    label: str
    shapes: tuple  # operand shapes
    record: Callable  # (*Values) -> Value
    expect: Callable  # (*float64 arrays) -> float64 array
    opcodes: tuple  # describe's opcode column after the inputs
    epsilons: dict = None
    scale: Callable | None = None
    domain: tuple = (-3.0, 3.0)


COMPOSITES = (
    Composite("relu", ((2, 5),), lambda x: x.relu(), lambda x: np.maximum(x, 0.0), ("leaf value=0", "maximum"), EXACT),
    Composite(
        "relu-scalar", ((),), lambda x: x.relu(), lambda x: np.maximum(x, 0.0), ("leaf value=0", "maximum"), EXACT,
    ),
    Composite("abs", ((3, 1, 2),), lambda x: x.abs(), np.abs, ("neg", "maximum"), EXACT),
    Composite(
        "softplus", ((2, 6),), lambda x: x.softplus(), lambda x: np.logaddexp(0.0, x),
        ("leaf value=0", "maximum", "neg", "maximum", "neg", "map function=exp", "map function=log1p", "add"),
        CHAIN, domain=(-30.0, 30.0),
    ),
    Composite(
        "gelu", ((3, 4),), lambda x: x.gelu(), lambda x: x * (1 + _erf(x / math.sqrt(2))) / 2,
        # The structure test records in float32, so the constant is rounded to it.
        (f"leaf value={float(np.float32(math.sqrt(0.5)))!r}", "mul", "map function=erf", "leaf value=1", "add", "mul",
         "leaf value=0.5", "mul"),
        # 1 + erf cancels for negative x: errors scale with the terms, not the result.
        CHAIN, scale=lambda x: np.abs(x) * (1 + np.abs(_erf(x / math.sqrt(2)))) / 2,
    ),
    Composite(
        "softmax", ((3, 4),), lambda x: x.softmax(1), lambda x: np.exp(_log_softmax(x, 1)),
        ("log_softmax axis=1", "map function=exp"),
        # exp turns log_softmax's absolute error into a relative one.
        {F64: 8, F32: 8, BF16: 1},
        scale=lambda x: np.exp(_log_softmax(x, 1))
        * (np.abs(x - x.max(1, keepdims=True)) + np.abs(_log_softmax(x, 1)) + 2),
    ),
    Composite(
        "mean", ((3, 5),), lambda x: x.mean(), lambda x: np.asarray(math.fsum(x.reshape(-1)) / x.size),
        ("sum", "leaf value=15", "div"), ACCUMULATED, scale=lambda x: np.asarray(np.abs(x).mean()),
    ),
    Composite(
        "mean_along", ((3, 5),), lambda x: x.mean_along(1), lambda x: x.mean(axis=1),
        ("sum_along axis=1", "leaf value=5", "div"), ACCUMULATED, scale=lambda x: np.abs(x).mean(axis=1),
    ),
    Composite("transpose", ((2, 3, 4),), lambda x: x.transpose(), lambda x: x.T, ("permute order=[2, 1, 0]",), EXACT),
    Composite(
        "transpose-order", ((2, 3, 4),), lambda x: x.transpose((1, 2, 0)), lambda x: np.transpose(x, (1, 2, 0)),
        ("permute order=[1, 2, 0]",), EXACT,
    ),
    Composite(".T", ((2, 3),), lambda x: x.T, lambda x: x.T, ("permute order=[1, 0]",), EXACT),
    Composite(".T-scalar", ((),), lambda x: x.T, lambda x: x, ("permute order=[]",), EXACT),
    Composite(
        "squeeze", ((2, 1, 3),), lambda x: x.squeeze(1), lambda x: np.squeeze(x, 1), ("reshape shape=[2, 3]",), EXACT,
    ),
    Composite(
        "squeeze-to-scalar", ((1,),), lambda x: x.squeeze(0), lambda x: np.squeeze(x, 0), ("reshape shape=[]",), EXACT,
    ),
    Composite(
        "unsqueeze", ((2, 3),), lambda x: x.unsqueeze(2), lambda x: np.expand_dims(x, 2),
        ("reshape shape=[2, 3, 1]",), EXACT,
    ),
    Composite(
        "unsqueeze-scalar", ((),), lambda x: x.unsqueeze(0), lambda x: np.expand_dims(x, 0),
        ("reshape shape=[1]",), EXACT,
    ),
    Composite(
        "broadcast_to-leading", ((3,),), lambda x: x.broadcast_to((2, 3)), lambda x: np.broadcast_to(x, (2, 3)),
        ("broadcast_along axis=0 extent=2",), EXACT,
    ),
    Composite(
        "broadcast_to-size-one", ((2, 1),), lambda x: x.broadcast_to((2, 3)), lambda x: np.broadcast_to(x, (2, 3)),
        ("reshape shape=[2]", "broadcast_along axis=1 extent=3"), EXACT,
    ),
    Composite(
        "broadcast_to-mixed", ((2, 1, 3),), lambda x: x.broadcast_to((4, 2, 5, 3)),
        lambda x: np.broadcast_to(x, (4, 2, 5, 3)),
        ("reshape shape=[2, 3]", "broadcast_along axis=0 extent=4", "broadcast_along axis=2 extent=5"), EXACT,
    ),
    Composite(
        "broadcast_to-scalar", ((),), lambda x: x.broadcast_to((2, 2)), lambda x: np.broadcast_to(x, (2, 2)),
        ("broadcast shape=[2, 2]",), EXACT,
    ),
    Composite(
        "broadcast_to-volume-one", ((1, 1),), lambda x: x.broadcast_to((3, 1, 2)),
        lambda x: np.broadcast_to(x, (3, 1, 2)),
        ("broadcast shape=[3, 1, 2]",), EXACT,
    ),
    Composite(
        "broadcast_like", ((1, 3), (2, 3)), lambda x, y: x.broadcast_like(y), lambda x, y: np.broadcast_to(x, y.shape),
        ("reshape shape=[3]", "broadcast_along axis=0 extent=2"), EXACT,
    ),
    Composite(
        "concat", ((2, 3), (2, 1), (2, 2)), lambda *v: concat(v, 1), lambda *v: np.concatenate(v, 1),
        ("pad axis=1 start=0 extent=6", "pad axis=1 start=3 extent=6", "add", "pad axis=1 start=4 extent=6", "add"),
        EXACT,
    ),
    Composite(
        "concat-axis0", ((1,), (3,)), lambda *v: concat(v, 0), lambda *v: np.concatenate(v, 0),
        ("pad axis=0 start=0 extent=4", "pad axis=0 start=1 extent=4", "add"), EXACT,
    ),
    Composite(
        "stack", ((2, 3), (2, 3)), lambda *v: stack(v, 2), lambda *v: np.stack(v, 2),
        ("reshape shape=[2, 3, 1]", "reshape shape=[2, 3, 1]", "pad axis=2 start=0 extent=2",
         "pad axis=2 start=1 extent=2", "add"),
        EXACT,
    ),
    Composite(
        "stack-scalars", ((), (), ()), lambda *v: stack(v, 0), lambda *v: np.stack(v, 0),
        ("reshape shape=[1]",) * 3 + ("pad axis=0 start=0 extent=3", "pad axis=0 start=1 extent=3", "add",
                                      "pad axis=0 start=2 extent=3", "add"),
        EXACT,
    ),
)


def _params():
    for row in COMPOSITES:
        for element, element_id in zip(ELEMENTS, ELEMENT_IDS):
            yield pytest.param(row, element, id=f"{row.label}-{element_id}")


def _record(row: Composite, element):
    def model(tape):
        values = [tape.input(np.zeros(shape, element)) for shape in row.shapes]
        return values, row.record(*values)

    return Tape.record(model)


@pytest.mark.parametrize("row, element", list(_params()))
def test_composite_matches_independent_float64_reference(row, element):
    rng = generator(row.label, str(element))
    data = [np.asarray(rng.uniform(*row.domain, size=shape)).astype(element) for shape in row.shapes]
    network, (inputs, out) = _record(row, element)
    got = network.forward(network.parameters(), dict(zip(inputs, data)))[out]
    references = [d.astype(np.float64) for d in data]
    want = np.asarray(row.expect(*references), dtype=np.float64)
    assert got.dtype == element and got.shape == want.shape == network.node(out).shape
    scale = None if row.scale is None else row.scale(*references)
    assert_close(got, want, element, row.epsilons[element], scale, what=row.label)


@pytest.mark.parametrize("row", COMPOSITES, ids=[row.label for row in COMPOSITES])
def test_composite_records_only_the_stated_primitive_opcodes(row):
    network, _ = _record(row, F32)
    assert described_opcodes(network, start=len(row.shapes)) == list(row.opcodes)
    vocabulary = {opcode.name for opcode in topos.OPCODES}
    assert {node.opcode.name for node in network.nodes()} <= vocabulary


def test_softmax_sums_to_one_and_softplus_is_stable_for_large_inputs():
    def model(tape):
        x = tape.leaf(np.array([[-800.0, 0.0, 800.0], [1.0, 2.0, 3.0]]))
        return x.softmax(1).sum_along(1), x.softplus()

    network, (totals, softplus) = Tape.record(model)
    run = network.forward(network.parameters())
    assert_close(run[totals], np.ones(2), F64, 4)
    assert_close(run[softplus], np.logaddexp(0.0, [[-800.0, 0.0, 800.0], [1.0, 2.0, 3.0]]), F64, 4)


def test_broadcast_to_the_same_shape_records_nothing():
    def model(tape):
        x = tape.input(np.zeros((2, 3), F32))
        return x, x.broadcast_to((2, 3))

    network, (x, y) = Tape.record(model)
    assert y == x and len(network) == 1


def test_concat_of_one_value_is_that_value():
    def model(tape):
        x = tape.input(np.zeros((2, 3), F32))
        return x, concat([x], 1)

    network, (x, y) = Tape.record(model)
    assert y == x and len(network) == 1


def test_concat_and_stack_take_any_sequence_of_values_and_join_them():
    def model(tape):
        a = tape.input(np.arange(6.0, dtype=F32).reshape(2, 3))
        b = tape.input(np.arange(6.0, 12.0, dtype=F32).reshape(2, 3))
        return concat((a, b), 1), stack(iter([a, b]), 2), stack([a], 0)

    network, (joined, stacked, single) = Tape.record(model)
    run = network.forward(network.parameters())
    a, b = np.arange(6.0).reshape(2, 3), np.arange(6.0, 12.0).reshape(2, 3)
    assert np.array_equal(run[joined], np.concatenate([a, b], 1))
    assert np.array_equal(run[stacked], np.stack([a, b], 2))
    assert np.array_equal(run[single], a[None])


def test_concat_turns_a_negative_zero_into_a_positive_zero():
    # concat is spelled with pads and adds: -0.0 + 0.0 is +0.0 (docs/recording.md says so).
    network, joined = Tape.record(lambda t: concat([t.leaf(np.array([-0.0])), t.leaf(np.array([1.0]))], 0))
    assert not np.signbit(network.forward(network.parameters())[joined][0])


def test_softmax_by_the_functional_takes_a_negative_axis():
    import topos.nn.functional as F

    network, (method, functional) = Tape.record(
        lambda t: (lambda x: (x.softmax(1), F.softmax(x)))(t.leaf(np.array([[1.0, 2.0, 3.0]])))
    )
    run = network.forward(network.parameters())
    assert np.array_equal(run[method], run[functional])


def test_reshape_and_broadcast_to_take_numpy_integer_extents():
    def model(tape):
        x = tape.input(np.ones((1, 6), F32))
        return x.reshape((np.int64(2), -1)), x.broadcast_to((np.int64(2), 6)), x.reshape(6)

    network, (reshaped, broadcast, flat) = Tape.record(model)
    assert network.node(reshaped).shape == (2, 3)
    assert network.node(broadcast).shape == (2, 6)
    assert network.node(flat).shape == (6,)


# ---- refusals ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source, target",
    [((3,), (2,)), ((2, 3), (3,)), ((2,), (2, 3)), ((2, 3), (2, 3, 1)), ((3, 1), (3, 2, 2))],
    ids=lambda shape: "x".join(map(str, shape)),
)
def test_broadcast_to_refuses_what_numpy_refuses_naming_line_and_shapes(source, target):
    with pytest.raises(ValueError):
        np.broadcast_to(np.zeros(source), target)  # the rule we claim to follow

    def model(tape):
        x = tape.input(np.zeros(source, F32))
        line = line_here() + 2
        with pytest.raises(ShapeError) as caught:
            x.broadcast_to(target)
        return line, str(caught.value)

    network, (line, message) = Tape.record(model)
    assert f"{__file__}:{line}" in message
    assert str(list(source)) in message and str(list(target)) in message and "broadcast_to" in message
    assert "hint" in message
    assert len(network) == 1


@pytest.mark.parametrize(
    "spell, words",
    [
        (lambda x: x.squeeze(0), ["squeeze", "axis 0", "[2, 1, 3]"]),
        (lambda x: x.squeeze(3), ["squeeze", "axis 3", "[2, 1, 3]"]),
        (lambda x: x.unsqueeze(4), ["unsqueeze", "axis 4", "[2, 1, 3]"]),
        (lambda x: x.unsqueeze(-1), ["unsqueeze", "axis -1", "[2, 1, 3]"]),
        (lambda x: concat([x, x], 3), ["concat", "axis 3", "[2, 1, 3]"]),
        (lambda x: stack([x, x], 4), ["stack", "axis 4", "[2, 1, 3]", "0..3"]),
        (lambda x: concat([x, x.squeeze(1)], 0), ["concat", "[2, 1, 3]", "[2, 3]", "axis 0"]),
        (lambda x: concat([x, x.transpose((1, 0, 2))], 2), ["concat", "[2, 1, 3]", "[1, 2, 3]", "axis 2"]),
    ],
    ids=["squeeze-not-one", "squeeze-out-of-range", "unsqueeze-out-of-range", "unsqueeze-negative",
         "concat-axis", "stack-axis", "concat-rank", "concat-extent"],
)
def test_shape_mistakes_in_composites_raise_shape_error_at_the_users_line(spell, words):
    def model(tape):
        x = tape.input(np.zeros((2, 1, 3), F32))
        with pytest.raises(ShapeError) as caught:
            spell(x)
        return caught.value

    _, error = Tape.record(model)
    message = str(error)
    assert isinstance(error, ToposError)
    # The spelling lambdas live in this file's parameter list: that is the user's line.
    assert f"{__file__}:" in message
    for word in words:
        assert word in message, f"{word!r} missing from: {message}"
