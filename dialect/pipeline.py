"""From a topos module to StableHLO text: lower, then upstream ``canonicalize,cse``, then verify.

``to_stablehlo`` is what emission, the IREE backend and the tests call;
``lower_in_place`` is the same pipeline for callers that keep working on
the module object (for example handing it to an in-process IREE compile).
"""

from __future__ import annotations

from iree.compiler import ir

from topos import MAP_FUNCTIONS, OPCODES

from .context import configure, new_context
from .lowering import LOWERINGS, MAP_LOWERINGS, PASS_NAME, LoweringError
from .passes import run_pipeline

PIPELINE: tuple[str, ...] = (PASS_NAME, "canonicalize", "cse")


def lower_in_place(module: ir.Module | ir.Operation) -> None:
    """Run PIPELINE on ``module``, verifying after each pass; raise if any topos op survives."""
    # The lowering creates stablehlo and chlo ops; MLIR cannot load a dialect while a pass runs.
    configure(module.context)
    run_pipeline(module, list(PIPELINE))
    left = sorted(_topos_op_names(module.operation))
    if left:
        raise LoweringError.at(f"{PASS_NAME} left topos ops behind: {', '.join(left)}")


def to_stablehlo(module: ir.Module | str) -> str:
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


def to_stablehlo_with_locations(module: ir.Module) -> tuple[str, str]:
    """The StableHLO of a topos module twice: plain, and with every op's location.

    The located text is what IREE compiles, so its diagnostics name the
    node and the user's recording line; the plain text keys the compile
    cache (moving a line in the user's file does not recompile) and is
    what a reader is shown.
    """
    with module.context:
        copy = module.operation.clone(ip=False)
        lower_in_place(copy)
        return str(copy), copy.get_asm(enable_debug_info=True)


def _topos_op_names(root: ir.Operation) -> set[str]:
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


__all__ = ["PIPELINE", "lower_in_place", "lowering_coverage", "to_stablehlo"]
