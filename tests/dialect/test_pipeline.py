"""The pipeline is one list in one place: every way to StableHLO runs the stages of topos.dialect.pipeline."""

import subprocess
import sys

import numpy as np
import pytest

from topos import Tape
from topos.dialect import pipeline
from topos.dialect.passes.lowering import PASS_NAME
from topos.dialect.passes.registry import load_pass_modules, lookup
from topos.readings.plan.plan import Plan


def _plan():
    def model(tape):
        w = tape.parameter(np.ones((2, 2), np.float32))
        x = tape.input(np.array([[1.0, 2.0]], np.float32))
        loss = ((x @ w).tanh() ** 2.0).sum()
        return loss, tape.differentiate(loss, [w])

    network, (loss, adjoints) = Tape.record(model)
    return network.entry([loss, *adjoints.roots()]).lower()


def test_the_stage_list_names_registered_passes_in_order():
    load_pass_modules()
    assert pipeline.LOWERING[0] == PASS_NAME
    for name in (*pipeline.TOPOS_PASSES, PASS_NAME):
        assert lookup(name) is not None and not lookup(name).upstream, name
    assert pipeline.STAGES[:5] == ("emit", "fuse", "elect", "raise", "lower")
    assert pipeline.pass_pipeline().split(",")[-3:] == list(pipeline.LOWERING)


def test_plan_methods_hold_no_stage_list_of_their_own():
    assert not [name for name in vars(Plan) if "stablehlo" in name and name.startswith("_")]


def test_emit_stablehlo_is_the_pipeline_and_reports_its_stages():
    plan = _plan()
    lowered = pipeline.stablehlo(plan)
    assert plan.emit_stablehlo() == lowered.plain
    assert plan.emit_stablehlo(debug_info=True) == lowered.located
    assert set(lowered.seconds) <= set(pipeline.STAGES)
    assert {"emit", "raise", "lower"} <= set(lowered.seconds)


def test_compile_runs_the_pipeline_with_its_target(monkeypatch):
    plan = _plan()
    seen = []
    original = pipeline.stablehlo
    monkeypatch.setattr(pipeline, "stablehlo", lambda p, **options: seen.append(options) or original(p, **options))
    compiled = plan.compile("llvm-cpu", cache=False)
    assert len(seen) == 1 and seen[0]["target"].name == "llvm-cpu" and seen[0]["frozen"] is False
    assert compiled.stablehlo == original(plan, target=seen[0]["target"]).plain


def test_topos_opt_topos_to_stablehlo_is_what_emit_stablehlo_prints():
    plan = _plan()
    done = subprocess.run([sys.executable, "-m", "topos.dialect.opt", "-", "-p", pipeline.PASS_PIPELINE],
                          input=plan.emit_mlir(debug_info=False), capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == plan.emit_stablehlo()


@pytest.mark.parametrize("kinds", ["no_such_kind", 3])
def test_emit_stablehlo_refuses_an_unknown_fusion_kind(kinds):
    from topos import PlanError

    with pytest.raises(PlanError, match="kinds"):
        _plan().emit_stablehlo(kinds=kinds)


def test_every_raise_is_of_a_kind_the_catalog_offers():
    from topos.dialect.passes.plan_passes import ELECTED_BY_DEFAULT
    from topos.dialect.passes.raising import RAISABLE, RAISES
    from topos.readings.plan.patterns import CATALOG

    assert RAISABLE == tuple(RAISES) == ELECTED_BY_DEFAULT  # one list: the table of raises
    assert set(RAISABLE) <= {pattern.kind for pattern in CATALOG}


def test_the_pipeline_refuses_what_is_not_a_plan_or_a_target():
    from topos import PlanError
    from topos.base.errors import ArgumentError

    plan = _plan()
    with pytest.raises(PlanError, match=r"stablehlo takes a Plan, such as network.entry\(\[loss\]\).lower\(\)"):
        pipeline.stablehlo(plan.entry)
    with pytest.raises(PlanError, match=r"emit_mlir takes a Plan"):
        pipeline.emit_mlir(plan.network)
    with pytest.raises(PlanError, match=r"target=...\) takes a Target"):
        pipeline.stablehlo(plan, target="llvm-cpu")
    with pytest.raises(ArgumentError, match=r"frozen must be True or False"):
        pipeline.stablehlo(plan, frozen="yes")
