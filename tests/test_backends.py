"""topos.backends(): what this machine can run; plan.tally(): which backend and kernel served each node."""

from __future__ import annotations

import numpy as np
import pytest

import topos
from topos import Numerics, Tape
from topos.readings.plan.numerics import FAST_KERNELS
from topos.views.backends import describe_tally


def step():
    def record(tape):
        w = tape.parameter(np.linspace(-1, 1, 48, dtype=np.float32).reshape(8, 6), name="w")
        x = tape.input(np.linspace(0, 1, 32, dtype=np.float32).reshape(4, 8), name="x")
        h = (x @ w).tanh()
        loss = (h * h * 0.5 + h).sum()
        return loss, topos.sgd(tape, tape.differentiate(loss, [w]), 0.1)

    network, (loss, updates) = Tape.record(record)
    return network, loss, updates


def test_every_backend_is_listed_with_a_status_and_a_reason():
    listed = {b.name: b for b in topos.backends()}
    assert listed["oracle"].status == listed["numpy-fast"].status == listed["numpy-fused"].status == "available"
    assert f"{len(FAST_KERNELS)} fast kernels" in listed["numpy-fast"].detail
    iree = [b for b in listed.values() if b.name.startswith("iree")]
    assert iree, "the [mlir] extra is installed in the test environment"
    from topos.dialect.iree.targets import TARGETS

    assert {b.name for b in iree} == {f"iree:{t}" for t in TARGETS}
    assert listed["iree:llvm-cpu"].status == "available"
    for b in iree:
        assert b.status in ("available", "compiled-only") and b.detail  # never silent about why


def test_an_iree_target_is_compiled_only_when_its_driver_cannot_run_here():
    import iree.runtime as rt

    from topos.dialect.iree.targets import TARGETS

    drivers = set(rt.query_available_drivers())
    for b in topos.backends():
        if b.name.startswith("iree:"):
            driver = TARGETS[b.name.split(":", 1)[1]].driver
            if driver not in drivers:
                assert b.status == "compiled-only" and "not in this IREE runtime build" in b.detail


@pytest.mark.parametrize("numerics", [Numerics.EXACT, Numerics.FAST])
def test_a_plans_tally_names_one_server_per_scheduled_node(numerics):
    network, loss, updates = step()
    plan = network.entry(updates.roots(loss), numerics=numerics).lower()
    tally = plan.tally()
    assert [d.node for d in tally] == list(plan.schedule)
    grouped = {n: k for k, g in enumerate(plan.fusions()) for n in g.nodes}
    for d in tally:
        node = network.nodes()[d.node]
        if node.is_source:
            assert d.backend == "source"
        elif d.node in grouped:
            assert d.backend == "numpy-fused" and d.kernel.startswith(f"G{grouped[d.node]} ")
        elif numerics is Numerics.FAST and (node.opcode.name in FAST_KERNELS or
                                            f"map:{node.attributes.get('function')}" in FAST_KERNELS):
            assert d.backend == "numpy-fast"
        else:
            assert d.backend == "oracle" and d.kernel.startswith("reference ")
    served = {d.backend for d in tally}
    assert ("numpy-fast" in served) == (numerics is Numerics.FAST)
    assert describe_tally(tally).splitlines()[-1].startswith("served: source ")
