"""Narrow selections: ``@main`` takes and returns its selections as ``i32``, for targets without 64-bit integers.

Vulkan's portable SPIR-V target has no 64-bit integers, and IREE 3.13
emulates them only in part: a scatter of ``i64`` indices (every embedding's
gradient) or a gather through a two-axis index failed to compile ("failed
to legalize operation 'vector.broadcast' ... (i64)"; "unresolved target
materialization from ('i64') to ('vector<2xi32>')"), so makemore's steps
and the small GPT's did not compile for ``vulkan``. Such a target compiles
with IREE's ``--iree-input-demote-i64-to-i32``, which turns every ``i64``
tensor of the module into ``i32``.

That flag would also change ``@main``'s signature, and IREE prints a
warning on every compile when it does. So this rewrite changes it first:
each ``i64`` argument becomes ``i32`` and is converted back to ``i64`` at
the top of ``@main``, and each ``i64`` result is converted to ``i32`` on
its way out. The demotion then finds the signature already narrow and
turns the conversions into nothing. The values themselves do not change:
a selection's indices lie in ``[0, extent)``, and ``check_extents`` refuses
an extent past ``i32``. A CompiledPlan converts the feeds to ``int32`` on
upload and its results back to ``int64`` (docs/compiling.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from topos.base.errors import TargetError
from topos.dialect.passes.freeze import main_of

if TYPE_CHECKING:
    from iree.compiler import ir

I32_LIMIT = 2**31


def check_extents(network, closure, target_name: str) -> None:
    """TargetError when a selection of ``closure`` indexes past what ``i32`` holds."""
    from topos.base.element import SelectionType

    for i in sorted(closure):
        dtype = network.columns.specs[i].dtype
        if isinstance(dtype, SelectionType) and dtype.extent > I32_LIMIT:
            raise TargetError(
                f"node %{i} is a selection of extent {dtype.extent}, and {target_name} takes selections as "
                f"32-bit integers (at most {I32_LIMIT}); compile this plan for llvm-cpu or cuda")


def narrow_selections(module: ir.Module) -> None:
    """``module``'s ``@main`` with its ``i64`` arguments and results as ``i32``.

    Each conversion keeps the location of the value it converts, so a
    diagnostic about it still names the input and its recording line.
    """
    from iree.compiler import ir  # here, not above: a CompiledPlan runs where only IREE's runtime is installed

    from topos.dialect.ir.ops import is_selection_type

    main = main_of(module)
    block = main.regions[0].blocks[0]
    signature = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
    top = ir.InsertionPoint.at_block_begin(block)
    for argument in block.arguments:
        wide = argument.type
        if is_selection_type(wide):
            argument.set_type(_as_i32(wide))
            with argument.location:
                convert = ir.Operation.create("stablehlo.convert", results=[wide], operands=[argument])
            top.insert(convert)
            argument.replace_all_uses_with(convert.result)
            convert.operands[0] = argument  # the line above pointed the conversion at itself
    ending = block.operations[len(block.operations) - 1]
    for k, value in enumerate(ending.operands):
        if is_selection_type(value.type):
            with ending.location:
                convert = ir.Operation.create("stablehlo.convert", results=[_as_i32(value.type)],
                                              operands=[value], ip=ir.InsertionPoint(ending))
            ending.operands[k] = convert.result
    main.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
        [a.type for a in block.arguments], [_as_i32(t) if is_selection_type(t) else t for t in signature.results]))


def _as_i32(mlir_type: ir.Type) -> ir.Type:
    from iree.compiler import ir

    return ir.RankedTensorType.get(ir.RankedTensorType(mlir_type).shape, ir.IntegerType.get_signless(32),
                                   loc=ir.Location.unknown())


__all__ = ["I32_LIMIT", "check_extents", "narrow_selections"]
