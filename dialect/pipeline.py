"""The pipeline: the one list of stages that takes a plan to the StableHLO IREE compiles.

Every way to StableHLO reads its stages here: ``Plan.emit_stablehlo``,
``Plan.compile`` (through ``topos.dialect.iree.compiled``), ``plan.export``,
and ``topos-opt``, whose pass ``topos-to-stablehlo`` runs the topos-IR part.

=========  ==============================================================  ==================================
stage      what it does                                                    where it lives
=========  ==============================================================  ==================================
emit       the plan's closure as topos IR, one op per node, constants       ``topos.dialect.ir.emit``
           folded by the oracle (``Plan.folded_constants``)
fuse       ``topos-fuse``: the plan's fusion offers, as annotations         ``topos.dialect.passes.plan_passes``
elect      ``topos-elect{kinds=...}``: the offers the lowering will serve   ``topos.dialect.passes.plan_passes``
raise      ``topos-raise{convolution=...}``: elected groups become the      ``topos.dialect.passes.raising``
           StableHLO they spell
lower      ``topos-lower-to-stablehlo``, then upstream ``canonicalize``     ``topos.dialect.passes.lowering``
           and ``cse``; every op verified, no topos op left
freeze     compiles with ``frozen=`` only: parameters become module         ``topos.dialect.passes.freeze``
           globals IREE loads by name
narrow,    what the chosen target needs (``Target`` says which): i32        ``topos.dialect.passes.narrow``,
scatters,  selections, large scatters in chunks, long reductions in         ``scatters``, ``reductions``,
...        stages, the optimization barriers IREE 3.13 needs                ``fences``
=========  ==============================================================  ==================================

Lowering needs IREE's compiler (iree-base-compiler). A machine with the
runtime alone never imports this module: a compile that hits the cache
does not lower, and the callers (``Plan``'s methods, ``compile_plan``)
ask ``topos.dialect.ir.bindings.require_compiler`` first, so the user is
told what is missing rather than shown an ImportError.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import NamedTuple

from iree.compiler import ir

from topos.base.arguments import flag
from topos.base.errors import PlanError
from topos.dialect.ir.context import configure, new_context
from topos.dialect.ir.emit import emit_module, emit_text
from topos.dialect.passes.fences import fence_narrow_constants, fence_widened_products, fence_widened_updates
from topos.dialect.passes.freeze import freeze_parameters, key_of, rewrite_module
from topos.dialect.passes.lowering import LOWERINGS, MAP_LOWERINGS, LoweringError
from topos.dialect.passes.narrow import check_extents, narrow_selections
from topos.dialect.passes.raising import CONVOLUTION_SPELLINGS
from topos.dialect.passes.reductions import split_reductions
from topos.dialect.passes.registry import load_pass_modules, run_pipeline
from topos.dialect.passes.scatters import check_rows, split_scatters
from topos.readings.plan.patterns import CATALOG
from topos.readings.plan.plan import Plan
from topos.spec.opcodes import MAP_FUNCTIONS, OPCODES

TOPOS_PASSES: tuple[str, ...] = ("topos-fuse", "topos-elect", "topos-raise")
"""The passes over topos IR, in order, before the lowering (``fuse``, ``elect``, ``raise``)."""

LOWERING: tuple[str, ...] = ("topos-lower-to-stablehlo", "canonicalize", "cse")
"""The ``lower`` stage: every topos op to StableHLO, then upstream clean-up."""

TARGET_STAGES: tuple[str, ...] = ("narrow", "scatters", "reductions", "fences", "products", "constants")
"""The rewrites a target may need, in the order they run (``target_stages`` says which it needs)."""

STAGES: tuple[str, ...] = ("emit", "fuse", "elect", "raise", "lower", "freeze", *TARGET_STAGES)
"""Every stage, in order: the pipeline."""

PASS_PIPELINE = "topos-to-stablehlo"
"""topos-opt's name for fuse, elect, raise and lower (``-p 'topos-to-stablehlo{kinds=...,convolution=...}'``)."""


class Lowered(NamedTuple):
    """What the pipeline made of a plan: StableHLO without and with locations, and each stage's seconds."""

    plain: str  # what keys the compile cache and what a reader is shown: moving a line recompiles nothing
    located: str  # what IREE compiles: every op located at its node and the user's recording line
    seconds: dict[str, float]


def topos_passes(kinds=None, convolution: str = "columns") -> str:
    """``fuse``, ``elect`` and ``raise`` as one pipeline text, with their options."""
    if kinds is not None and not isinstance(kinds, str):  # a str is already topos-opt's "a,b" spelling
        kinds = ",".join(kinds)
    fuse, elect, raise_ = TOPOS_PASSES
    elect = elect if kinds is None else f"{elect}{{kinds={kinds}}}"
    return f"{fuse},{elect},{raise_}{{convolution={convolution}}}"


def pass_pipeline(kinds=None, convolution: str = "columns") -> str:
    """``fuse``, ``elect``, ``raise`` and ``lower`` as one pipeline text: what topos-opt runs for PASS_PIPELINE."""
    return f"{topos_passes(kinds, convolution)},{','.join(LOWERING)}"


def check_options(kinds=None, convolution: str = "columns") -> None:
    """A PlanError naming the option when ``kinds`` names no fusion kind or ``convolution`` no spelling."""
    if not isinstance(convolution, str) or convolution not in CONVOLUTION_SPELLINGS:
        choices = " or ".join(f'"{name}"' for name in CONVOLUTION_SPELLINGS)
        raise PlanError(f"emit_stablehlo(convolution=...) is {convolution!r}; choose {choices}")
    if kinds is None:
        return
    known = [p.kind for p in CATALOG]
    if not isinstance(kinds, (str, Iterable)):
        raise PlanError(f"emit_stablehlo(kinds=...) is {type(kinds).__name__} {kinds!r}; give fusion kinds "
                        f"as a list or a comma-separated str, among {', '.join(known)}, or None for all")
    names = kinds.split(",") if isinstance(kinds, str) else list(kinds)
    for name in names:
        if isinstance(name, str) and not name.strip():
            continue  # "a,,b" or no kinds at all: topos-elect skips empty names
        if not isinstance(name, str) or name.strip() not in known:
            raise PlanError(f"emit_stablehlo(kinds=...) names {name!r}, which is no fusion kind; "
                            f"choose among {', '.join(known)}")


def emit_mlir(plan, debug_info: bool = True) -> str:
    """The ``emit`` stage alone, as text: ``plan`` as topos-dialect MLIR, results in declared order."""
    _check_plan("emit_mlir", plan)
    roots, observes = plan.declared()
    return emit_text(plan.network, roots, observes, debug_info=debug_info)


def stablehlo(plan, *, kinds=None, convolution: str = "columns", frozen: bool = False, target=None) -> Lowered:
    """Run the pipeline on ``plan``: every stage in order, ``freeze`` when ``frozen``, and what ``target`` needs.

    ``target`` is a ``topos.dialect.iree.targets.Target`` (None: no target
    rewrites, the StableHLO ``Plan.emit_stablehlo`` shows). A target's
    refusals (an index past what i32 holds, a scatter row wider than the
    target's limit) come before any lowering.
    """
    _check_plan("stablehlo", plan)
    check_options(kinds, convolution)
    flag("stablehlo", "frozen", frozen)
    if target is not None and not hasattr(target, "narrows_selections"):
        raise PlanError(f"stablehlo(target=...) takes a Target, such as topos.dialect.iree.targets.target('llvm-cpu'), "
                        f"or None; got {type(target).__name__} {target!r}")
    if target is not None:
        _refuse_for(plan, target)
    load_pass_modules()
    roots, observes = plan.declared()
    began = time.perf_counter()
    module = emit_module(plan.network, roots, observes, constants=plan.folded_constants())
    emitted = time.perf_counter()
    run_pipeline(module, topos_passes(kinds, convolution))
    raised = time.perf_counter()
    plain, located = to_stablehlo_with_locations(module)
    seconds = {"emit": emitted - began, "raise": raised - emitted, "lower": time.perf_counter() - raised}
    if frozen:
        began = time.perf_counter()
        plain, located = freeze_parameters(located, [key_of(plan.network, i) for i in plan.parameter_nodes()])
        seconds["freeze"] = time.perf_counter() - began
    stages = [] if target is None else target_stages(target, located)
    if stages:  # on one parse of the module
        plain, located, rewritten = rewrite_module(located, stages)
        seconds.update(rewritten)
    return Lowered(plain, located, seconds)


def _check_plan(owner: str, plan) -> None:
    if not isinstance(plan, Plan):
        raise PlanError(f"{owner} takes a Plan, such as network.entry([loss]).lower(); got {type(plan).__name__}")


def _refuse_for(plan, target) -> None:
    closure = plan.entry.closure()
    if target.narrows_selections:
        check_extents(plan.network, closure, target.name)
    if target.scatter_limit is not None:
        check_rows(plan.network, closure, target.name, target.scatter_limit)


def target_stages(target, located: str) -> list:
    """(stage, rewrite of the parsed module) for what ``target`` needs of this StableHLO, in TARGET_STAGES order."""
    stages: list = []
    if target.narrows_selections:
        stages.append(("narrow", narrow_selections))
    scatters, reductions = target.scatter_limit, target.reduction_limit
    if scatters is not None and "stablehlo.scatter" in located:
        stages.append(("scatters", lambda module: split_scatters(module, scatters)))
    if reductions is not None and "stablehlo.reduce" in located:
        stages.append(("reductions", lambda module: split_reductions(module, reductions)))
    if target.fences_widened_updates and "stablehlo.scatter" in located:
        stages.append(("fences", fence_widened_updates))
    if target.fences_widened_products and "stablehlo.dot_general" in located and "f16>" in located:
        stages.append(("products", fence_widened_products))
    if target.fences_narrow_constants and "f16>" in located:  # bf16 and f16
        stages.append(("constants", fence_narrow_constants))
    return stages


# ---- the lower stage, on a module ---------------------------------------------------------


def lower_in_place(module) -> None:
    """Run LOWERING on ``module`` (an ``ir.Module`` or its op), verifying after each pass; no topos op may survive."""
    # The lowering creates stablehlo and chlo ops; MLIR cannot load a dialect while a pass runs.
    configure(module.context)
    run_pipeline(module, list(LOWERING))
    left = sorted(_topos_op_names(module.operation))
    if left:
        raise LoweringError.at(f"{LOWERING[0]} left topos ops behind: {', '.join(left)}")


def to_stablehlo(module) -> str:
    """The StableHLO text of a topos module (text or ``ir.Module``; a module is left unchanged)."""
    if isinstance(module, str):
        with new_context():
            parsed = ir.Module.parse(module)
            lower_in_place(parsed)
            return str(parsed)
    with module.context:
        copy = module.operation.clone(ip=False)
        lower_in_place(copy)
        return str(copy)


def to_stablehlo_with_locations(module) -> tuple[str, str]:
    """The StableHLO of a topos module twice: plain, and with every op's location (see Lowered)."""
    with module.context:
        copy = module.operation.clone(ip=False)
        lower_in_place(copy)
        return str(copy), copy.get_asm(enable_debug_info=True)


def _topos_op_names(root) -> set[str]:
    found: set[str] = set()

    def visit(op):
        if op.operation.name.startswith("topos."):
            found.add(op.operation.name)
        return ir.WalkResult.ADVANCE

    root.walk(visit)
    return found


def lowering_coverage() -> dict[str, bool]:
    """Whether each opcode, and each map function as ``map/<function>``, has a lowering rule."""
    coverage = {opcode.name: opcode.name in LOWERINGS for opcode in OPCODES}
    coverage.update({f"map/{name}": name in MAP_LOWERINGS for name in MAP_FUNCTIONS})
    return coverage


__all__ = [
    "LOWERING", "PASS_PIPELINE", "STAGES", "TARGET_STAGES", "TOPOS_PASSES", "Lowered", "check_options", "emit_mlir",
    "lower_in_place", "lowering_coverage", "pass_pipeline", "stablehlo", "target_stages", "to_stablehlo",
    "to_stablehlo_with_locations", "topos_passes",
]
