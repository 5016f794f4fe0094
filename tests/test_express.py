"""The spec surface: replaying nodes with Opcode.express and Opcode.vjp outside the core.

Every row of the opcode table (tests/test_differentiate.py), recorded
together with its first and second-order gradient nodes, is replayed

* over arrays, node by node with ``Opcode.express``: the oracle's bits;
* over a fresh tape's Values: a spec whose ``describe`` is identical;
* backward, by a reverse scan written here with ``Opcode.vjp``: the bits
  of ``run.backward``.

The forward-mode example (examples/forward_mode.py), a dual-number payload
replayed the same way, is graded against reverse mode here too.
"""

from __future__ import annotations

import importlib.util
import zlib
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import topos
from topos import Tape

from test_differentiate import CASES, DTYPES, assert_bitwise, grid, record_case, short

ROOT = Path(__file__).resolve().parents[1]


def source_array(network, node, parameters):
    """What a run reads for a source node when nothing is fed."""
    if node.opcode.name == "parameter":
        return parameters[node.symbol]
    return network.payload(node.symbol)


def replay_arrays(network, parameters) -> dict[int, np.ndarray]:
    values = {}
    for node in network.nodes():
        if node.is_source:
            values[node.index] = source_array(network, node, parameters)
        else:
            operands = [values[s.index] for s in node.operands]
            values[node.index] = node.opcode.express(operands, node.attributes)
    return values


def reverse_scan(network, values, target: int) -> dict[int, np.ndarray]:
    """The documented backward contract, written outside the core with Opcode.vjp.

    Reverse recording order from the target; only reached nodes that depend
    on a parameter or an input run their rule; a node's cotangent is its
    first contribution, then ``add`` each later one as it arrives.
    """
    nodes = network.nodes()
    varying = []
    for node in nodes:
        if node.is_source:
            varying.append(node.opcode.name in ("parameter", "input"))
        else:
            varying.append(any(varying[s.index] for s in node.operands))
    add = topos.by_name("add")
    cotangents = {target: np.ones((), nodes[target].dtype)}
    for node in reversed(nodes[: target + 1]):
        g = cotangents.get(node.index)
        if g is None or node.is_source or not varying[node.index]:
            continue
        operands = [values[s.index] for s in node.operands]
        contributions = node.opcode.vjp(operands, values[node.index], g, node.attributes)
        for operand, c in zip(node.operands, contributions):
            j = operand.index
            if c is None or not varying[j]:
                continue
            cotangents[j] = c if j not in cotangents else add.express([cotangents[j], c])
    return cotangents


@pytest.mark.parametrize("dtype", DTYPES, ids=short)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_replay_with_express_over_arrays_reproduces_forward_bitwise(case, dtype):
    r = record_case(case, dtype, second_order=True)
    parameters = r.network.parameters()
    run = r.network.forward(parameters)
    replayed = replay_arrays(r.network, parameters)
    for node in r.network.nodes():
        if not node.is_source:
            assert_bitwise(np.asarray(replayed[node.index]), run[node.symbol], str(node))


@pytest.mark.parametrize("dtype", DTYPES, ids=short)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_replay_over_a_fresh_tape_records_an_identical_spec(case, dtype):
    r = record_case(case, dtype, second_order=True)
    parameters = r.network.parameters()
    tape = Tape()
    values = {}
    for node in r.network.nodes():
        if node.is_source:
            payload = source_array(r.network, node, parameters)
            if isinstance(node.dtype, topos.SelectionType):
                payload = topos.selection(payload, node.dtype.extent)
            values[node.index] = getattr(tape, node.opcode.name)(payload)
        else:
            operands = [values[s.index] for s in node.operands]
            values[node.index] = node.opcode.express(operands, node.attributes)
    assert tape.seal().describe() == r.network.describe()


@pytest.mark.parametrize("dtype", DTYPES, ids=short)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_reverse_scan_written_with_opcode_vjp_matches_backward_bitwise(case, dtype):
    r = record_case(case, dtype, second_order=True)
    run = r.network.forward(r.network.parameters())
    values = {node.index: run[node.symbol] for node in r.network.nodes()}
    for target in (r.loss, r.second):
        cotangents = reverse_scan(r.network, values, target.index)
        gradients = run.backward(target)
        for w in r.wrt:
            assert cotangents.get(w.index) is not None or not gradients.reached(w)
            if w.index in cotangents:
                assert_bitwise(np.asarray(cotangents[w.index]), gradients[w], f"d {target!r}/d {w!r}")


# ---- forward mode, the example -----------------------------------------------------------------------


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


forward_mode = load_example("forward_mode")


def test_forward_mode_example_runs_and_its_claims_hold(capsys):
    results = forward_mode.main()
    printed = capsys.readouterr().out
    assert "bitwise equal: True" in printed and "False" not in printed
    jvp, dot = results["dyadic"]
    assert jvp == dot
    over_reverse, reverse_reverse = results["hvp"]
    for a, b in zip(over_reverse, reverse_reverse):
        assert_bitwise(a, b, "forward-over-reverse vs reverse-over-reverse")
    jvp, dot, relative = results["tanh"]
    assert relative < 1e-13
    eager, recorded = results["recorded"]
    assert_bitwise(np.asarray(recorded), np.asarray(eager), "recorded vs eager JVP")


def test_dyadic_jvp_is_the_exact_directional_derivative():
    # The same MLP in exact rational arithmetic, differentiated by hand.
    network, weights, loss, _, _, tangents = forward_mode.mlp(lambda z: z.relu(), np.random.default_rng(7))
    parameters = network.parameters()
    exact = np.vectorize(Fraction, otypes=[object])
    x, y = (exact(network.payload(s)) for s in network.input_symbols())
    w1, b1, w2, b2 = (exact(parameters[w]) for w in weights)
    t1, tb1, t2, tb2 = (exact(tangents[w]) for w in weights)
    h, dh = x.dot(w1) + b1, x.dot(t1) + tb1
    assert not (h == 0).any()  # off the kink: the derivative is the calculus one
    r, dr = np.where(h > 0, h, 0 * h), np.where(h > 0, dh, 0 * dh)
    e = r.dot(w2) + b2 - y
    derivative = (2 * e * (dr.dot(w2) + r.dot(t2) + tb2)).sum()
    _, _, jvp = forward_mode.jvp(network, parameters, tangents, loss)
    assert Fraction(float(jvp)) == derivative


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_forward_mode_rules_agree_with_reverse_mode_for_every_opcode(case):
    r = record_case(case, topos.float64)
    parameters = r.network.parameters()
    rng = np.random.default_rng(zlib.crc32(case.name.encode()) + 1)
    tangents = {w: grid(rng, r.network.node(w).shape, -1.0, 1.0) for w in r.wrt}
    values, value, jvp = forward_mode.jvp(r.network, parameters, tangents, r.loss)
    run = r.network.forward(parameters)
    assert_bitwise(np.asarray(value), run[r.loss], "the Dual's primal is the oracle's value")
    gradients = run.backward(r.loss)
    products = [gradients[w] * tangents[w] for w in r.wrt]
    dot = sum(float(p.sum()) for p in products)
    scale = sum(float(np.abs(p).sum()) for p in products)
    assert abs(float(jvp) - dot) <= 1e-13 * scale


def test_eager_arrays_are_held_to_the_shape_rules_a_recording_is_held_to():
    """What a recording refuses, an Eager expression refuses with the same words; what it records, Eager computes."""
    from topos import Eager, ShapeError

    mine = np.ones((2, 3), np.float32)
    a = Eager(mine)
    mine[0, 0] = 5.0  # the caller's array stays the caller's: the Eager kept its own copy
    assert a.array[0, 0] == 1.0 and not a.array.flags.writeable
    assert np.array_equal((a + 1.0).tanh().array, np.tanh(np.full((2, 3), 2.0, np.float32)))
    assert Eager([1.0, 2.0]).dtype == np.float64  # a list becomes an array, as np.asarray would make it
    others = [np.ones(3, np.float32), np.ones((2, 3), np.float64)]
    for other, words in zip(others, [r"add: shapes \[2, 3\] and \[3\] differ", r"add: .*f32.*f64"]):
        with pytest.raises(ShapeError, match=words) as eagerly:
            a + Eager(other)
        with pytest.raises(ShapeError, match=words) as recorded:
            Tape.record(lambda tape, other=other: tape.input(np.ones((2, 3), np.float32)) + tape.input(other))
        assert "test_express.py" in str(eagerly.value)
        assert str(eagerly.value).split(": add: ")[1] == str(recorded.value).split(": add: ")[1]
    with pytest.raises(ShapeError, match=r"matmul: contracted extents differ"):
        a @ a
