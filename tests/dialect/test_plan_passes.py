"""The plan passes write exactly what the core's Plan and catalog decide, as topos.* attributes."""

import numpy as np
import pytest

pytest.importorskip("iree.compiler")

from iree.compiler import ir  # noqa: E402

from topos import Numerics, Tape  # noqa: E402
from topos.dialect.ir.context import new_context  # noqa: E402
from topos.dialect.ir.parse import parse_module  # noqa: E402
from topos.dialect.passes.registry import PassFailure, load_pass_modules, run_pipeline  # noqa: E402

load_pass_modules()


def _mlp():
    def model(tape):
        w = tape.parameter(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3))
        x = tape.input(np.array([[1.0, 2.0]], dtype=np.float32))
        h = (x @ w).tanh()
        return w, (h * h * 2.0).sum()

    return Tape.record(model)


def _has(op, name):
    return name in list(op.attributes)


def _ops(module):
    function = module.body.operations[0]
    return function, [op for op in function.regions[0].blocks[0].operations if op.name.startswith("topos.")]


def _run(network, pipeline):
    context = new_context()
    with context:
        module = parse_module(network.emit_mlir())
        run_pipeline(module, pipeline)
        return context, module


def test_plan_pass_annotates_the_plans_liveness():
    network, (w, loss) = _mlp()
    plan = network.entry([loss], numerics=Numerics.EXACT).lower()
    context, module = _run(network, "topos-plan")
    with context:
        function, ops = _ops(module)
        for op in ops:
            node = ir.IntegerAttr(op.attributes["node"]).value
            if node == loss.index:
                assert _has(op, "topos.kept")
            elif node in plan._group_of and plan._group_of[node].root != node:
                assert ir.IntegerAttr(op.attributes["topos.fused_into"]).value == plan._group_of[node].root
            else:
                freed = ir.IntegerAttr(op.attributes["topos.freed_after"]).value
                assert freed == plan._last_reader[node]
        assert ir.IntegerAttr(function.attributes["topos.peak_bytes"]).value == plan.peak()[0]
        assert ir.IntegerAttr(function.attributes["topos.retain_all_bytes"]).value == plan.retain_all_bytes()


def test_fuse_pass_records_every_candidate_and_elect_marks_the_chosen_group():
    network, (w, loss) = _mlp()
    candidates = network.entry([loss]).lower().candidates()
    context, module = _run(network, "topos-fuse,topos-elect{kinds=elementwise}")
    with context:
        function, ops = _ops(module)
        offers = ir.ArrayAttr(function.attributes["topos.offers"])
        assert len(offers) == len(candidates)
        first = ir.DictAttr(offers[0])
        assert ir.StringAttr(first["kind"]).value == candidates[0].kind
        assert list(ir.DenseI64ArrayAttr(first["nodes"])) == list(candidates[0].nodes)
        grouped = [ir.IntegerAttr(op.attributes["node"]).value for op in ops if _has(op, "topos.fusion_group")]
        assert grouped == list(candidates[0].nodes)
        roots = [op for op in ops if _has(op, "topos.fusion_kind")]
        assert [ir.IntegerAttr(op.attributes["node"]).value for op in roots] == [candidates[0].root]


def test_elect_without_offers_is_an_error_naming_the_missing_pass():
    network, _ = _mlp()
    with pytest.raises(PassFailure, match="run topos-fuse first"):
        _run(network, "topos-elect")


def test_differentiate_pass_appends_the_same_nodes_as_tape_differentiate():
    network, (w, loss) = _mlp()
    context, module = _run(network, f"topos-differentiate{{target={loss.index}}}")
    with context:
        from topos.dialect.ir.parse import parse_spec

        grown, roots, _ = parse_spec(module)
    tape = network.reopen()
    adjoints = tape.differentiate(tape.resolve(loss), [tape.resolve(w)])
    expected = tape.seal()
    assert grown.describe() == expected.describe()
    assert [r.index for r in roots] == [loss.index, adjoints.gradients[0].symbol.index]
    parameters = expected.parameters()
    # Initials and input defaults are state, not spec: the module carries none, so hand them over.
    same = grown.parameters().with_payloads(
        {grown.symbol(s.index): parameters[s] for s in expected.parameter_symbols()}
    )
    feeds = {grown.symbol(s.index): expected.payload(s) for s in expected.input_symbols()}
    run = grown.forward(same, feeds)
    assert np.array_equal(run[roots[1]], expected.forward(parameters)[adjoints.gradients[0].symbol])


def test_differentiate_pass_refuses_a_non_scalar_target():
    network, (w, loss) = _mlp()
    with pytest.raises(PassFailure, match="rank-0"):
        _run(network, "topos-differentiate{target=2}")
