"""The backward posture: an entry whose runs the backward scan will differentiate keeps exactly what the rules read.

``network.entry(roots, backward=loss)`` makes a plan keep the loss and
every value a derivative rule on its path declares in ``reads()``, and
free the rest; ``run.backward(loss)`` then gets the oracle's gradients
bit for bit. A rule that reads something its opcode did not declare gets
a stand-in that refuses, naming the node: that is the completeness test
of every opcode's ``reads()``.
"""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest

from topos import DifferentiationError, Numerics, SymbolError, Tape
from topos.dialect.iree.conformance_cases import FAMILIES, record_family
from topos.spec.opcodes import OUTPUT


def deep_mlp(layers: int = 6, width: int = 64, batch: int = 128, dtype=np.float64):
    rng = np.random.default_rng(3)

    def record(tape):
        h = tape.input(rng.standard_normal((batch, width)).astype(dtype), name="x")
        weights = []
        for k in range(layers):
            w = tape.parameter((rng.standard_normal((width, width)) / np.sqrt(width)).astype(dtype), name=f"w{k}")
            weights.append(w)
            h = (h @ w).tanh()
        return weights, (h * h).sum()

    network, (weights, loss) = Tape.record(record)
    return network, weights, loss


def node_gradients(gradients, network):
    return {n.index: np.asarray(gradients[n.symbol]) for n in network.nodes()
            if gradients.reached(n.symbol)}


@pytest.mark.parametrize("numerics", [Numerics.EXACT, Numerics.FAST])
def test_a_posture_plan_gives_the_oracles_gradients(numerics):
    network, weights, loss = deep_mlp(layers=3)
    parameters = network.parameters()
    oracle = network.forward(parameters).backward(loss)
    plan = network.entry([loss], numerics=numerics, backward=loss).lower()
    run = plan.forward(parameters)
    got = run.backward(loss)
    for w in weights:
        if numerics is Numerics.EXACT:
            assert np.array_equal(got[w], oracle[w])
        else:
            np.testing.assert_allclose(got[w], oracle[w], rtol=1e-10)
    interpreted = network.entry([loss], numerics=Numerics.EXACT, backward=loss).interpret(parameters)
    assert np.array_equal(interpreted.backward(loss)[weights[0]], oracle[weights[0]])


def test_the_plan_keeps_exactly_the_values_the_rules_read():
    network, weights, loss = deep_mlp(layers=3)
    plan = network.entry([loss], backward=loss).lower()
    nodes = network.nodes()
    # Derived independently: a computed value is needed when some consumer on the path declares it.
    needed = {loss.index}
    for node in nodes:
        if node.is_source:
            continue
        declared = node.opcode.reads(**dict(node.attributes))
        needed |= {node.index} if OUTPUT in declared else set()
        needed |= {node.operands[p].index for p in declared if p != OUTPUT}
    kept = {n for n in plan.entry.kept() if not nodes[n].is_source}
    assert kept == {n for n in needed if not nodes[n].is_source}
    run = plan.forward(network.parameters())
    computed = {n for n in run._values if not nodes[n].is_source}
    assert computed == kept  # everything else was freed
    assert plan.release_floor() == sum(run._values[n].nbytes for n in kept)
    matmuls = [node.index for node in nodes if node.opcode.name == "matmul"]
    assert not set(matmuls) & kept  # tanh reads its output, so no matmul output survives the forward


def test_without_the_posture_the_scan_names_what_was_freed_and_how_to_keep_it():
    network, weights, loss = deep_mlp(layers=2)
    run = network.entry([loss]).lower().forward(network.parameters())
    with pytest.raises(SymbolError, match=r"did not keep; run the whole spec, or declare the backward posture"):
        run.backward(loss)
    with pytest.raises(DifferentiationError, match="a rank-0 loss"):
        network.entry([loss], backward=weights[0])


def test_describe_reports_the_release_floor_beside_the_forward_only_peak():
    network, weights, loss = deep_mlp(layers=3)
    plan = network.entry([loss], backward=loss).lower()
    alone = network.entry([loss]).lower()
    line = plan.describe().splitlines()[-1]
    assert line == (f"backward posture (target %{loss.index}): keeps {len(plan.entry.kept()) - 4} values for the "
                    f"scan, release floor {plan.release_floor()}; forward-only peak {alone.peak()[0]}")
    assert alone.release_floor() == 8 and plan.release_floor() > alone.release_floor()
    assert plan.peak()[0] >= plan.release_floor()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_opcodes_reads_is_enough_for_its_rule(family):
    """The completeness test: each family's loss differentiated from a posture plan equals the oracle's."""
    graph = record_family(family, np.float64)
    network, loss = graph.network, graph.loss
    parameters = network.parameters()
    oracle = network.forward(parameters).backward(loss)
    got = network.entry([loss], numerics=Numerics.EXACT, backward=loss).lower().forward(parameters).backward(loss)
    want = node_gradients(oracle, network)
    have = node_gradients(got, network)
    assert have.keys() == want.keys()
    for n in want:
        assert np.array_equal(have[n], want[n], equal_nan=True), f"%{n} {network.nodes()[n].opcode.name}"


def test_a_reads_that_leaves_out_what_the_rule_uses_fails_naming_the_node(monkeypatch):
    from topos.spec.opcodes.elementwise import Mul

    def record(tape):
        x = tape.input(np.linspace(0, 1, 12).reshape(3, 4), name="x")
        w = tape.parameter(np.linspace(-1, 1, 8).reshape(4, 2), name="w")
        product = x @ w  # matmul's rule reads its operands, never its output
        return (product * product).sum()

    network, loss = Tape.record(record)
    monkeypatch.setattr(Mul, "READS", frozenset())  # mul's rule reads both operands
    run = network.entry([loss], backward=loss).lower().forward(network.parameters())
    with pytest.raises(RuntimeError, match=r"a derivative rule read %2 \(matmul, recorded at .*its consumers: %3 mul"):
        run.backward(loss)


def _peak_of(action) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        kept = action()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    del kept
    return peak


def test_tracemalloc_sees_the_posture_hold_more_than_a_forward_and_less_than_the_oracle():
    network, weights, loss = deep_mlp(layers=8, width=96, batch=256)
    parameters = network.parameters()
    alone = network.entry([loss]).lower()
    posture = network.entry([loss], backward=loss).lower()
    forward_peak = _peak_of(lambda: alone.forward(parameters))
    posture_peak = _peak_of(lambda: posture.forward(parameters))
    oracle_peak = _peak_of(lambda: network.forward(parameters))
    assert forward_peak < posture_peak < oracle_peak
    # The posture's run holds the release floor at its end (plus bookkeeping and the read-only copies).
    assert posture.release_floor() <= posture_peak < posture.release_floor() + 2 * alone.peak()[0] + 2**16
