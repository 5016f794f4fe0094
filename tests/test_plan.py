"""Entries and plans: declared reads, dead-node elimination, schedule, liveness, statelessness.

An entry declares what a run may read (roots, then observes); a plan is
derived from it and holds no state. These tests pin the contract of
``network.entry(...)``, ``entry.interpret``, ``entry.lower()`` and the
Plan's readings (``describe``, ``live_series``, ``peak``), and the errors a
user meets when an entry or a feed does not fit the network.

Most tests use the walkthrough's graph (an input [1, 2] times a parameter
[2, 2], tanh, square, sum) with recorded gradients for both the parameter
and the input, so that an entry asking only for d loss / d w leaves the
input's gradient dead.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from topos import FeedError, Numerics, SymbolError, Tape
from topos.readings.plan.numerics import FAST_KERNELS
from topos.spec.opcodes import by_name

from conftest import generator

W0 = np.array([[0.5, -0.25], [0.75, 1.0]], dtype=np.float32)
X0 = np.array([[1.0, 2.0]], dtype=np.float32)


def walkthrough(tape):
    """The walkthrough's graph, differentiated with respect to the parameter and the input."""
    w = tape.parameter(W0)
    x = tape.input(X0)
    h = (x @ w).tanh()
    loss = (h * h).sum()
    adjoints = tape.differentiate(loss, [w, x])
    return w, x, h, loss, adjoints


@pytest.fixture
def plate():
    network, (w, x, h, loss, adjoints) = Tape.record(walkthrough)
    return network, w, x, h, loss, adjoints


def bits(array: np.ndarray) -> bytes:
    """The exact bytes of an array, shape and element type included, for bitwise comparisons."""
    array = np.ascontiguousarray(array)
    return repr((array.shape, array.dtype.str)).encode() + array.tobytes()


def ancestors(network, symbols) -> set[int]:
    """The ancestor closure computed here from the public node list (independent of Entry)."""
    nodes = network.nodes()
    seen: set[int] = set()
    stack = [s.index for s in symbols]
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(o.index for o in nodes[n].operands)
    return seen


def nbytes(node) -> int:
    return int(np.prod(node.shape, dtype=np.int64)) * np.dtype(node.dtype).itemsize


# ---- entry.interpret: only the closure, only the declared reads ----------------------------


def test_interpret_evaluates_only_the_ancestor_closure(monkeypatch):
    """A poisoned branch outside the closure never runs; the oracle, which runs everything, trips on it."""

    def model(tape):
        x = tape.input(np.linspace(-1.0, 1.0, 12).reshape(3, 4))
        kept = (x * x).sum_along(1)
        poisoned = x.logsumexp(1)  # the only logsumexp in the graph
        observed = x.tanh()
        return x, kept, poisoned, observed

    network, (x, kept, poisoned, observed) = Tape.record(model)

    def refuse(*arrays, **attributes):
        raise AssertionError("a node outside the declared closure was evaluated")

    monkeypatch.setattr(by_name("logsumexp"), "kernel", refuse)
    _, envelope = FAST_KERNELS["logsumexp"]
    monkeypatch.setitem(FAST_KERNELS, "logsumexp", (refuse, envelope))
    with pytest.raises(AssertionError, match="outside the declared closure"):
        network.forward(network.parameters())
    for numerics in Numerics:
        entry = network.entry([kept], observe=[observed], numerics=numerics)
        run = entry.interpret(network.parameters())
        closure = ancestors(network, [kept, observed])
        assert poisoned.index not in closure
        assert entry.closure() == closure
        assert repr(run) == f"<Run over {len(closure)} of {len(network)} nodes>"
        plan_run = entry.lower().forward(network.parameters())
        assert bits(plan_run[kept]) == bits(run[kept])


def test_interpret_matches_the_oracle_bitwise_for_declared_results(plate):
    network, w, x, h, loss, adjoints = plate
    parameters = network.parameters()
    oracle = network.forward(parameters, {x: X0})
    run = network.entry([loss, adjoints[w]], observe=[h], numerics=Numerics.EXACT).interpret(parameters, {x: X0})
    for symbol in (loss, adjoints[w], h):
        assert bits(run[symbol]) == bits(oracle[symbol])


def test_reading_an_undeclared_symbol_fails_even_when_the_value_exists(plate):
    """The interpreter computed h (it is an ancestor of the loss), but h was not declared."""
    network, w, x, h, loss, adjoints = plate
    entry = network.entry([loss])
    run = entry.interpret(network.parameters(), {x: X0})
    assert h.index in entry.closure()  # the value was computed ...
    with pytest.raises(SymbolError, match=re.escape(f"{h!r} was not declared")):
        run[h]  # ... and still may not be read
    assert h not in run and loss in run
    for undeclared in (w, x, adjoints[w], adjoints[x]):
        with pytest.raises(SymbolError):
            run[undeclared]
    plan_run = entry.lower().forward(network.parameters(), {x: X0})
    with pytest.raises(SymbolError, match="not declared"):
        plan_run[h]


def test_observing_makes_an_intermediate_readable(plate):
    network, w, x, h, loss, adjoints = plate
    run = network.entry([loss], observe=[h]).lower().forward(network.parameters(), {x: X0})
    oracle = network.forward(network.parameters(), {x: X0})
    np.testing.assert_allclose(run[h], oracle[h], rtol=1e-6)


# ---- lower(): dead nodes, schedule, results ----------------------------------------------------


def test_lowering_never_schedules_the_gradient_nobody_asked_for(plate):
    """Only d loss / d w is a root, so the recorded d loss / d x (and its private nodes) are dead."""
    network, w, x, h, loss, adjoints = plate
    plan = network.entry([loss, adjoints[w]]).lower()
    scheduled = set(plan.schedule)
    dead = ancestors(network, [adjoints[x]]) - ancestors(network, [loss, adjoints[w]])
    assert adjoints[x].index in dead and dead, "the input's gradient has nodes of its own"
    assert scheduled == ancestors(network, [loss, adjoints[w]])
    assert not scheduled & dead
    assert len(scheduled) < len(network)
    assert [n.index for n in plan.nodes()] == list(plan.schedule)


def test_schedule_runs_every_node_after_its_operands(plate):
    network, w, x, h, loss, adjoints = plate
    plan = network.entry(adjoints.roots()).lower()
    position = {n: k for k, n in enumerate(plan.schedule)}
    assert len(position) == len(plan.schedule), "a node is scheduled twice"
    for node in plan.nodes():
        for operand in node.operands:
            assert position[operand.index] < position[node.index]
    assert list(plan.schedule) == sorted(plan.schedule), "the schedule follows recording order"
    steps = [n for n, _ in plan.live_series()]
    assert steps == sorted(steps) and set(steps) <= set(plan.schedule)


def test_results_are_roots_then_observes_each_once(plate):
    network, w, x, h, loss, adjoints = plate
    gw = adjoints[w]
    entry = network.entry([gw, loss, gw], observe=[h, loss, x, h])
    assert entry.results == (gw, loss, h, x)
    plan = entry.lower()
    assert plan.results == (gw, loss, h, x)
    run = plan.forward(network.parameters(), {x: X0})
    for symbol in plan.results:
        assert symbol in run


def test_describe_numbers_results_in_declared_order(plate):
    network, w, x, h, loss, adjoints = plate
    text = network.entry([adjoints[w], loss], observe=[h]).lower().describe()
    lines = {int(line.split()[0]): line for line in text.splitlines() if line[:5].strip().isdigit()}
    assert lines[adjoints[w].index].endswith("kept (result 0)")
    assert lines[loss.index].endswith("kept (result 1)")
    assert lines[h.index].endswith("kept (result 2)")


# ---- plans hold no state ------------------------------------------------------------------------


def _snapshot(plan) -> tuple:
    return (
        plan.describe(), plan.schedule, plan.live_series(), plan.peak(), plan.retain_all_bytes(),
        plan.fusions(), plan.candidates(), plan.results, repr(plan),
    )


@pytest.mark.parametrize("numerics", list(Numerics), ids=lambda n: n.name)
def test_one_plan_serves_two_parameter_tables_and_stays_unchanged(plate, numerics):
    network, w, x, h, loss, adjoints = plate
    plan = network.entry(adjoints.roots(), observe=[h], numerics=numerics).lower()
    before = _snapshot(plan)
    first = network.parameters()
    second = first.map(lambda p: (p * np.float32(-1.5) + np.float32(0.125)).astype(np.float32))
    feeds = [{x: X0}, {x: np.array([[-0.5, 3.0]], dtype=np.float32)}]
    outputs = []
    for parameters, feed in [(first, feeds[0]), (second, feeds[1]), (first, feeds[0])]:
        run = plan.forward(parameters, feed)
        oracle = network.forward(parameters, feed)
        for symbol in plan.results:
            if numerics is Numerics.EXACT:
                assert bits(run[symbol]) == bits(oracle[symbol])
            else:
                np.testing.assert_allclose(run[symbol], oracle[symbol], rtol=1e-5, atol=1e-6)
        outputs.append([bits(run[s]) for s in plan.results])
    assert outputs[0] == outputs[2], "running with another table left a trace"
    assert outputs[0] != outputs[1]
    assert _snapshot(plan) == before


def test_a_plan_survives_reopen(plate):
    """Record more after sealing; the old plan runs on the carried table with feeds keyed by old symbols."""
    network, w, x, h, loss, adjoints = plate
    plan = network.entry([loss, adjoints[w]], observe=[h], numerics=Numerics.EXACT).lower()
    before = _snapshot(plan)
    tape = network.reopen()
    scale = tape.parameter(np.float32(3.0))
    extra = (tape.resolve(h).sum() * scale).exp()
    longer = tape.seal()
    assert len(longer) > len(network)
    carried = network.parameters().carried(longer)
    assert scale.symbol in carried and len(carried) == 2
    run = plan.forward(carried, {x: X0})
    oracle = network.forward(network.parameters(), {x: X0})
    for symbol in plan.results:
        assert bits(run[symbol]) == bits(oracle[symbol])
    assert _snapshot(plan) == before
    # The new network's own plan still agrees about the old prefix.
    newer = longer.entry([loss, extra.symbol], numerics=Numerics.EXACT).lower().forward(carried, {x: X0})
    assert bits(newer[loss]) == bits(run[loss])
    with pytest.raises(SymbolError, match="recorded after this network was sealed"):
        run[extra.symbol]


# ---- describe and live_series --------------------------------------------------------------------


def _steps_and_readers(plan, network):
    """Independent liveness: each node's executing step (a fused node runs at its group's root) and last reader."""
    step_of = {n: n for n in plan.schedule}
    for group in plan.fusions():
        for n in group.nodes:
            step_of[n] = group.root
    last = {}
    for node in plan.nodes():
        for operand in node.operands:
            j = operand.index
            if step_of[j] == step_of[node.index] and j != node.index:
                continue  # read inside its own group
            last[j] = max(last.get(j, -1), step_of[node.index])
    return step_of, last


def _chain_graph(tape):
    """A graph with an elementwise chain (fused), a shared value (kept alive), and a matmul."""
    rng = generator("plan", "chain")
    a = tape.parameter(rng.standard_normal((8, 8)))
    b = tape.input(rng.standard_normal((8, 8)))
    shared = (a @ b).tanh()
    chain = ((shared * 2.0 + 1.0) * shared - 3.0).exp()
    other = (shared @ a).sum_along(0)
    total = chain.sum() + other.sum()
    return a, b, shared, chain, other, total


def test_describe_labels_every_scheduled_node_and_summarizes():
    network, (a, b, shared, chain, other, total) = Tape.record(_chain_graph)
    plan = network.entry([total], observe=[other]).lower()
    assert plan.fusions(), "the chain should be fused"
    text = plan.describe()
    body = [line for line in text.splitlines() if line[:5].strip().isdigit()]
    summary = [line for line in text.splitlines() if not line[:5].strip().isdigit()]
    assert [int(line.split()[0]) for line in body] == list(plan.schedule)
    step_of, last = _steps_and_readers(plan, network)
    numbers = {g.root: k for k, g in enumerate(plan.fusions())}
    declared = {s.index: k for k, s in enumerate(plan.results)}
    for line in body:
        n = int(line.split()[0])
        if step_of[n] != n:
            assert line.endswith(f"fused into G{numbers[step_of[n]]}"), line
        elif n in declared:
            assert re.search(rf"kept \(result {declared[n]}\)", line), line
        else:
            assert re.search(rf"freed after {last[n]}\b", line), line
        if n in numbers:
            group = plan.fusions()[numbers[n]]
            assert f"G{numbers[n]} = {group.kind} of {len(group.nodes)} nodes" in line
    peak, at = plan.peak()
    assert summary[0].startswith(f"plan: {len(plan.schedule)} of {len(network)} nodes evaluated")
    assert f"live bytes: peak {peak} at node {at}, retain-all {plan.retain_all_bytes()}" in summary
    assert any(line.startswith("fused: ") for line in summary)


def test_live_series_is_the_liveness_the_schedule_implies():
    """Recomputed here from shapes and last readers: bytes just after each executed step."""
    network, (a, b, shared, chain, other, total) = Tape.record(_chain_graph)
    plan = network.entry([total], observe=[other]).lower()
    nodes = network.nodes()
    step_of, last = _steps_and_readers(plan, network)
    declared = {s.index for s in plan.results}
    steps = [n for n in plan.schedule if step_of[n] == n]
    series = plan.live_series()
    assert [n for n, _ in series] == steps
    for n, live in series:
        expected = sum(
            nbytes(nodes[m]) for m in steps
            if m <= n and not nodes[m].is_source and (m in declared or last[m] >= n)
        )
        assert live == expected, f"live bytes after node {n}"
    assert all(isinstance(v, int) and v >= 0 for _, v in series)
    peak, at = plan.peak()
    assert (at, peak) in series and peak == max(v for _, v in series)
    computed = [m for m in plan.schedule if not nodes[m].is_source]
    assert plan.retain_all_bytes() == sum(nbytes(nodes[m]) for m in computed)
    assert peak < plan.retain_all_bytes()
    # The last step still holds its operands; the results are among what it holds.
    assert series[-1][1] >= sum(nbytes(nodes[m]) for m in declared if not nodes[m].is_source)


# ---- bad input --------------------------------------------------------------------------------------


def test_a_root_of_another_tape_is_refused_naming_it(plate):
    network, w, x, h, loss, adjoints = plate
    other, (_, _, foreign_h, foreign_loss, _) = Tape.record(walkthrough)
    with pytest.raises(SymbolError, match=re.escape(f"root {foreign_loss!r} belongs to another tape")):
        network.entry([foreign_loss]).lower()
    with pytest.raises(SymbolError, match=re.escape(f"observed symbol {foreign_h!r} belongs to another tape")):
        network.entry([loss], observe=[foreign_h]).lower()


def test_a_root_recorded_after_sealing_is_refused_naming_it(plate):
    network, w, x, h, loss, adjoints = plate
    tape = network.reopen()
    later = (tape.resolve(h) * 2.0).sum().symbol
    tape.seal()
    with pytest.raises(SymbolError, match=re.escape(f"root {later!r} was recorded after this network was sealed")):
        network.entry([later]).lower()
    with pytest.raises(SymbolError, match="recorded after this network was sealed"):
        network.entry([loss], observe=[later])


def test_roots_must_be_symbols_and_not_empty(plate):
    network, w, x, h, loss, adjoints = plate
    with pytest.raises(SymbolError, match="at least one root"):
        network.entry([])
    with pytest.raises(SymbolError, match="is a int, not a Symbol"):
        network.entry([3])


def test_feeding_a_plan_the_wrong_shape_names_the_input(plate):
    network, w, x, h, loss, adjoints = plate
    plan = network.entry([loss]).lower()
    with pytest.raises(FeedError, match=re.escape(f"input {x!r}") + r".*expects shape \[1, 2\], got \[2, 2\]"):
        plan.forward(network.parameters(), {x: np.ones((2, 2), np.float32)})
    with pytest.raises(FeedError, match=re.escape(f"input {x!r}") + ".*expects element type f32"):
        plan.forward(network.parameters(), {x: np.ones((1, 2), np.float64)})
    with pytest.raises(FeedError, match=re.escape(f"{h!r} is a map, not an input")):
        plan.forward(network.parameters(), {h: np.ones((1, 2), np.float32)})


def test_a_plan_refuses_a_table_of_another_network(plate):
    network, w, x, h, loss, adjoints = plate
    other, _ = Tape.record(walkthrough)
    plan = network.entry([loss]).lower()
    with pytest.raises(SymbolError, match="another network family"):
        plan.forward(other.parameters(), {x: X0})


def test_folded_constants_take_a_gather_of_a_uniform_table_whatever_the_selection():
    # iree-splat-reduction (docs/reliability.md): a sum over constants is computed on the
    # host. A gather of a table whose elements all share their bits is constant too.
    import topos

    def model(tape):
        rows = tape.input(topos.selection([0, 2], 3))
        uniform = tape.leaf(np.ones((3, 4), np.float32)).gather(rows).sum_along(0)
        mixed = tape.leaf(np.array([[1.0], [2.0], [1.0]], np.float32)).gather(rows).sum()
        signed = tape.leaf(np.array([0.0, -0.0, 0.0], np.float32)).gather(rows).sum()  # -0.0 is not 0.0
        return rows, uniform, mixed, signed

    network, (rows, uniform, mixed, signed) = Tape.record(model)
    plan = network.entry([uniform, mixed, signed]).lower()
    folded = plan.folded_constants()
    assert set(folded) == {uniform.index}
    assert np.array_equal(folded[uniform.index], np.full(4, 2.0, np.float32))
    other_rows = network.forward(network.parameters(), {rows: topos.selection([1, 1], 3)})
    assert np.array_equal(other_rows[uniform], folded[uniform.index])


def test_the_offers_a_plan_hands_out_cannot_be_edited_into_its_results():
    import topos.nn.functional as F

    def record(tape):
        x = tape.parameter(np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
        return x, F.max_pool(x, 2)

    network, (x, y) = Tape.record(record)
    plan = network.entry([y], numerics=Numerics.EXACT).lower()
    (offer,) = [c for c in plan.candidates() if c.kind == "max_pool"]
    with pytest.raises(TypeError):
        offer.details["maxima"] = ()  # the executor reads these: an edit would change the plan's results
    with pytest.raises(AttributeError):
        offer.details["maxima"].append(0)
    assert plan.forward(network.parameters())[y].ravel().tolist() == [5.0, 7.0, 13.0, 15.0]


def test_working_peak_refuses_an_uncounted_node_the_network_lacks():
    network, loss = Tape.record(lambda t: (t.input(np.ones((2, 3), np.float32), name="x").tanh() * 2.0).sum())
    other, other_loss = Tape.record(lambda t: t.input(np.ones(3, np.float32), name="x").sum())
    plan = network.entry([loss]).lower()
    assert plan.working_peak([loss]) == plan.working_peak([loss.index])
    with pytest.raises(SymbolError, match=r"uncounted names node 12345, but this network has nodes 0\.\.\d+"):
        plan.working_peak(uncounted=[12345])
    with pytest.raises(SymbolError):
        plan.working_peak(uncounted=[other_loss])


def test_numerics_and_kernel_names_are_checked_not_read_as_none():
    import topos
    from topos import ArgumentError, Fidelity
    from topos.readings.plan.numerics import envelope_for

    assert Numerics.EXACT.accepts(Fidelity.COMPOSED) and not Numerics.EXACT.accepts(Fidelity.ENVELOPE)
    for wrong in ("ENVELOPE", None, 42):  # a string used to pass as "not ENVELOPE"
        with pytest.raises(ArgumentError, match="accepts takes a topos.Fidelity"):
            Numerics.EXACT.accepts(wrong)
    with pytest.raises(ArgumentError, match="posture takes Numerics.EXACT or Numerics.FAST"):
        with topos.posture("fast"):
            pass
    network, loss = Tape.record(lambda t: t.input(np.ones(3, np.float32), name="x").sum())
    with pytest.raises(ArgumentError, match="numerics must be"):
        network.entry([loss], numerics="exact")
    assert envelope_for("matmul") is not None and envelope_for("map", "exp") is not None
    for call, match in [
        (lambda: envelope_for("matmull"), "no opcode is named 'matmull'; the opcodes are .*matmul"),
        (lambda: envelope_for("map"), "map needs function= one of .*exp"),
        (lambda: envelope_for("map", "sinh"), r"got 'sinh'"),
        (lambda: envelope_for("add", "exp"), "add takes none"),
        (lambda: topos.unregister_kernel("warp"), "unregister_kernel: no opcode is named 'warp'"),
        (lambda: topos.register_kernel("warp", np.add, Fidelity.IDENTICAL, examples=[((1.0, 2.0), {})]),
         "register_kernel: no opcode is named 'warp'"),
    ]:
        with pytest.raises(ArgumentError, match=match):
            call()


def test_a_registered_kernel_that_leaves_the_nodes_spec_is_named_at_run_time():
    import topos
    from topos import Fidelity, ToposError

    def narrowing_add(a, b):
        out = np.add(a, b)
        return out if a.shape == (2,) else out[:, :1].astype(np.float64)  # its one example is all it gets right

    x = np.array([1.0, 2.0], np.float32)
    topos.register_kernel("add", narrowing_add, Fidelity.IDENTICAL, examples=[((x, x), {})])
    try:
        network, total = Tape.record(lambda t: t.input(np.ones((3, 2), np.float32)) + np.float32(1.0))
        with pytest.raises(ToposError, match=r"narrowing_add registered for add .* returned \[3, 1\] f64 for %2 "
                                             r"\(recorded at .*test_plan\.py.*whose spec is \[3, 2\] f32"):
            network.entry([total], numerics=Numerics.EXACT).lower().forward(network.parameters())
    finally:
        topos.unregister_kernel("add")
    assert network.entry([total], numerics=Numerics.EXACT).lower().forward(network.parameters())[total].shape == (3, 2)
