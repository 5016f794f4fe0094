"""Forward mode (topos.readings.forward_mode): every opcode's JVP rule graded against reverse mode and by differences.

Each row of the opcode table (``CASES`` in tests/test_differentiate.py:
every opcode, every map function, the composites) is recorded by
``record_case`` as ``loss = sum(out * u)`` with a non-uniform probe ``u``,
followed by ``tape.differentiate``. A direction ``v`` on the 1/64 grid is
drawn for the row's parameters and inputs, and ``jvp`` gives ``J v`` at
``out``.

* The transpose identity ``<J v, u> == <v, J^T u>`` holds to
  :data:`TRANSPOSE_EPSILONS` machine epsilons of the element type (float64,
  float32, bfloat16), with ``J^T u`` from ``run.backward(loss)``; the
  gradient nodes ``tape.differentiate`` recorded give the same bits.
* In float64, Richardson-extrapolated central differences of ``out`` along
  ``v`` agree with ``J v`` to :data:`FINITE_DIFFERENCE_TOLERANCE`
  (norm-wise relative), on the rows whose inputs stay off kinks.
* In every element type the replayed primal is ``network.forward``'s bits
  at every node.
* A completeness test fails when an opcode of ``topos.OPCODES`` or a map
  function has no tangent rule.

Measured worst cases (for scale): transpose identity 0.3 epsilon (bfloat16
softmax), finite differences 1.1e-11 (float64).
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import topos
from topos import DifferentiationError, Tape
from topos.readings.forward_mode import MAP_TANGENTS, TANGENT_RULES, Dual, Tangents, jvp

from conftest import EPSILON
from test_differentiate import CASES, DTYPES, assert_bitwise, grid, record_case, short

TRANSPOSE_EPSILONS = 4
"""|<J v, u> - <v, J^T u>| over the sum of both sides' term magnitudes, in epsilons of the element type."""

FINITE_DIFFERENCE_TOLERANCE = 1e-8
"""Norm-wise relative error of J v against central differences along v (float64, Richardson, step 2^-10)."""

STEP = 2.0**-10  # times a direction on the 1/64 grid, the perturbed points stay exact in float64


def directional_row(case, dtype=topos.float64):
    """A recorded row, its output, its probe ``u`` and a direction ``v`` over its parameters and inputs."""
    r = record_case(case, dtype)
    (product,) = r.network.node(r.loss).operands  # loss = sum(out * u)
    out, probe = r.network.node(product).operands
    rng = np.random.default_rng(zlib.crc32(case.name.encode()) + 1)
    direction = {w: grid(rng, r.network.node(w).shape, -1.0, 1.0).astype(dtype) for w in r.wrt}
    return r, out, r.network.payload(probe), direction


def moved(r, direction, h):
    """Parameters and feeds with every wrt moved by ``h`` along the direction."""
    parameters = r.network.parameters()
    shifted = {w: parameters[w] + h * v for w, v in direction.items() if r.network.node(w).trainable}
    feeds = {w: r.network.payload(w) + h * v for w, v in direction.items() if w not in shifted}
    return parameters.with_payloads(shifted), feeds


def central_difference(r, out, direction) -> np.ndarray:
    """d out / d h along the direction: Richardson-extrapolated central differences."""

    def quotient(h):
        up, down = (r.network.forward(*moved(r, direction, s))[out] for s in (h, -h))
        return (up - down) / (2 * h)

    return (4 * quotient(STEP / 2) - quotient(STEP)) / 3


def transpose_identity_error(r, out, u, v) -> float:
    """|<J v, u> - <v, J^T u>| relative to the magnitudes of the terms, from one JVP and one backward scan."""
    run, tangents = jvp(r.network, r.network.parameters(), None, v)
    left = tangents[out].astype(np.float64) * u  # <J v, u>, its terms
    gradients = run.backward(r.loss)
    right = [v[w].astype(np.float64) * gradients[w] for w in r.wrt]  # <v, J^T u>, its terms
    scale = np.abs(left).sum() + sum(np.abs(p).sum() for p in right)
    assert scale > 0, "a vacuous row: the direction moves nothing"
    for w in r.wrt:  # J^T u read from the recorded gradient nodes is the same
        assert_bitwise(run[r.adjoints[w]], gradients[w], f"recorded d loss / d {w!r}")
    return abs(left.sum() - sum(p.sum() for p in right)) / scale


@pytest.mark.parametrize("dtype", DTYPES, ids=short)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_jvp_and_reverse_mode_satisfy_the_transpose_identity(case, dtype):
    r, out, u, v = directional_row(case, dtype)
    assert transpose_identity_error(r, out, u.astype(np.float64), v) <= TRANSPOSE_EPSILONS * EPSILON[dtype]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_transpose_identity_holds_along_many_directions(case):
    r, out, u, _ = directional_row(case)
    rng = np.random.default_rng(zlib.crc32(case.name.encode()) + 2)
    for _ in range(50):
        v = {w: rng.standard_normal(r.network.node(w).shape) for w in r.wrt}
        assert transpose_identity_error(r, out, u, v) <= TRANSPOSE_EPSILONS * EPSILON[topos.float64]


@pytest.mark.parametrize("case", [c for c in CASES if c.smooth], ids=lambda c: c.name)
def test_jvp_matches_central_finite_differences(case):
    r, out, _, v = directional_row(case)
    _, tangents = jvp(r.network, r.network.parameters(), None, v)
    computed, reference = tangents[out], central_difference(r, out, v)
    scale = max(np.abs(computed).max(), np.abs(reference).max())
    assert scale > 0
    assert np.abs(computed - reference).max() <= FINITE_DIFFERENCE_TOLERANCE * scale


@pytest.mark.parametrize("dtype", DTYPES, ids=short)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_primal_of_a_jvp_is_the_oracles_run_bitwise(case, dtype):
    r, _, _, v = directional_row(case, dtype)
    parameters = r.network.parameters()
    run, tangents = jvp(r.network, parameters, None, v)
    oracle = r.network.forward(parameters)
    for node in r.network.nodes():
        assert_bitwise(run[node.symbol], oracle[node.symbol], str(node))
    for w in r.wrt:
        assert_bitwise(tangents[w], v[w], "a source's tangent is its direction")


# ---- completeness: the test that fails when the seam breaks ---------------------------------------------


def test_every_opcode_and_every_map_function_has_a_tangent_rule():
    computed = {op.name for op in topos.OPCODES if not op.is_source}
    assert len(computed) == 24  # a new opcode: add its rule to TANGENT_RULES, and its row to CASES
    assert not computed - set(TANGENT_RULES), f"no tangent rule for {sorted(computed - set(TANGENT_RULES))}"
    assert set(TANGENT_RULES) == computed, "a tangent rule for an opcode that does not exist"
    assert set(MAP_TANGENTS) == set(topos.MAP_FUNCTIONS)


def test_an_opcode_without_a_tangent_rule_fails_by_name(monkeypatch):
    network, (w, loss) = Tape.record(lambda tape: (w := tape.parameter(np.ones(3)), (w * w).sum()))
    monkeypatch.delitem(TANGENT_RULES, "mul")
    with pytest.raises(NotImplementedError, match="no tangent rule for opcode 'mul'.*TANGENT_RULES"):
        jvp(network, network.parameters(), None, {w: np.ones(3)})


def test_a_map_function_without_a_tangent_fails_by_name(monkeypatch):
    network, (w, loss) = Tape.record(lambda tape: (w := tape.parameter(np.ones(3)), w.tanh().sum()))
    monkeypatch.delitem(MAP_TANGENTS, "tanh")
    with pytest.raises(NotImplementedError, match="map function 'tanh'.*MAP_TANGENTS"):
        jvp(network, network.parameters(), None, {w: np.ones(3)})


# ---- the API ----------------------------------------------------------------------------------------------


def small_model(tape):
    x = tape.input(np.array([0.5, -1.0, 2.0]), name="x")
    w = tape.parameter(np.array([0.25, 0.5, -0.75]), name="w")
    picks = tape.leaf(topos.selection(np.array([2, 0]), 3))
    unrelated = tape.parameter(np.ones(2))
    loss = (w * x).sin().gather(picks).sum()
    return x, w, unrelated, loss


def test_feeds_move_the_primal_and_unreached_nodes_read_as_zero():
    network, (x, w, unrelated, loss) = Tape.record(small_model)
    parameters = network.parameters()
    fed = {x: np.array([1.0, 2.0, -3.0])}
    run, tangents = jvp(network, parameters, fed, {"w": np.array([1.0, 0.0, 0.0])})
    assert isinstance(tangents, Tangents) and tangents.network is network
    assert run[loss].tobytes() == network.forward(parameters, fed)[loss].tobytes()
    gradient = network.forward(parameters, fed).backward(loss)[w]
    assert tangents[loss] == gradient[0]  # one basis direction picks one gradient entry
    assert not tangents.reached(unrelated) and not tangents[unrelated].any()
    assert not tangents.reached(x) and tangents.reached(loss)


def test_a_tangent_must_be_a_float_source_of_the_right_shape():
    network, (x, w, unrelated, loss) = Tape.record(small_model)
    parameters = network.parameters()
    with pytest.raises(DifferentiationError, match="a sum node.*parameters and inputs"):
        jvp(network, parameters, None, {loss: np.ones(())})
    with pytest.raises(DifferentiationError, match=r"shape \[2\], the node is \[3\] f64"):
        jvp(network, parameters, None, {w: np.ones(2)})
    picks = next(n.symbol for n in network.nodes() if isinstance(n.dtype, topos.SelectionType))
    with pytest.raises(DifferentiationError, match="leaf node"):
        jvp(network, parameters, None, {picks: np.zeros(2)})


def test_tangents_that_are_not_a_mapping_say_to_pair_each_source_with_its_direction():
    network, (x, w, unrelated, loss) = Tape.record(small_model)
    parameters = network.parameters()
    with pytest.raises(DifferentiationError, match=r"tangents map .*\(Symbols or names\) to arrays.*got list; "
                                                   r"pair each with its direction"):
        jvp(network, parameters, None, [w])
    with pytest.raises(DifferentiationError, match=r"tangents map .* got int$"):
        jvp(network, parameters, None, 5)
    _, tangents = jvp(network, parameters, None, parameters)  # a Parameters table is a direction too
    assert tangents[w].tolist() == parameters[w].tolist()


def test_a_tangent_of_another_element_type_or_out_of_range_is_refused_not_narrowed():
    network, w = Tape.record(lambda tape: tape.parameter(np.ones(3, np.float32), name="w"))
    parameters = network.parameters()
    with pytest.raises(DifferentiationError, match=r"tangent of %0 is float64 and the parameter recorded at .* is f32"):
        jvp(network, parameters, {}, {w: np.full(3, 1e300)})
    with pytest.raises(DifferentiationError, match=r"tangent of %0 holds 1e\+300 .* f32.*become inf"):
        jvp(network, parameters, {}, {"w": [1e300, 0.0, 0.0]})
    _, tangents = jvp(network, parameters, {}, {w: np.array([1.0, 0.5, 0.0], np.float32)})
    assert tangents[w].dtype == np.float32 and tangents[w].tolist() == [1.0, 0.5, 0.0]
    _, tangents = jvp(network, parameters, {}, {w: [1, 2, 3]})  # Python numbers convert
    assert tangents[w].dtype == np.float32 and tangents[w].tolist() == [1.0, 2.0, 3.0]


def test_a_dual_over_tape_values_records_its_tangent_as_nodes():
    w0, v0 = np.array([0.5, -1.0]), np.array([1.0, 2.0])

    def recorded(tape):
        w = tape.parameter(w0)
        out = (Dual(w, tape.leaf(v0)) ** 2.0).exp().sum()
        return out.primal, out.tangent

    def plain(tape):
        w = tape.parameter(w0)
        return w, (w**2.0).exp().sum()

    network, (value, tangent) = Tape.record(recorded)
    run = network.forward(network.parameters())
    twin, (w, loss) = Tape.record(plain)
    eager_run, eager = jvp(twin, twin.parameters(), None, {w: v0})
    assert_bitwise(run[value], eager_run[loss], "the recorded primal")
    assert_bitwise(run[tangent], eager[loss], "the recorded tangent is the eager one")
