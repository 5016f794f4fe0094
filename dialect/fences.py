"""Optimization barriers a target needs where IREE 3.13's code generation refuses what it would fuse.

An ``optimization_barrier`` hands its operand on unchanged; IREE then keeps
the value out of its readers' dispatches (it is computed in one of its
own, or stored as a buffer), which is all the rewrites below want. Each is
chosen by a field of the target (``topos.dialect.targets``) and applied to
the parsed StableHLO module by ``compiled.lowered``:

* ``fence_widened_updates`` (``Target.fences_widened_updates``: cuda, rocm).
  A bfloat16 (or float16) scatter accumulates in float32, so its updates
  arrive through a ``stablehlo.convert`` up from the narrow type (through a
  reshape as well). IREE's LLVMGPU pipeline fuses that convert into the
  scatter's dispatch and then fails ("failed to apply fusion + hoisting
  patterns"); a float32 producer fused the same way compiles, and vulkan and
  metal compile both (measured 2026-12-04).
* ``fence_narrow_constants`` (``Target.fences_narrow_constants``: metal).
  IREE's metal-spirv target cannot materialize a bfloat16 constant of more
  than one value inside a dispatch ("'spirv.Bitcast' op mismatch in result
  type bitwidth 16 and operand type bitwidth 32"); a splat compiles, and so
  does the same array fed as an input. Fenced, such a constant is a buffer,
  read as an input is.

The lowering itself fences recorded constants that hold a NaN or an
infinity on every target (``lowering._fenced``): that one is about values,
not about compiling.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .freeze import ops_of_main

if TYPE_CHECKING:
    from iree.compiler import ir


def fence_widened_updates(module: ir.Module) -> None:
    """Every scatter's updates of ``module`` fenced where a widening convert makes them."""

    def fence(op: ir.Operation) -> list[int]:
        return [2] if op.name == "stablehlo.scatter" and _widened_by_a_convert(op.operands[2]) else []

    _fenced_operands(module, fence)


def fence_narrow_constants(module: ir.Module) -> None:
    """Every read of a non-splat 16-bit float constant in ``module`` fenced."""

    def fence(op: ir.Operation) -> list[int]:
        return [k for k, operand in enumerate(op.operands) if _narrow_constant(operand)]

    _fenced_operands(module, fence)


def _fenced_operands(module: ir.Module, operands_of) -> None:
    """The operands ``operands_of(op)`` names of each op of ``module``'s @main behind a barrier."""
    from iree.compiler import ir

    from .lowering import _one

    for op in ops_of_main(module):
        for k in operands_of(op):
            value = op.operands[k]
            with ir.InsertionPoint(op), op.location:
                op.operands[k] = _one("stablehlo.optimization_barrier", [value], value.type)


def _widened_by_a_convert(value: ir.Value) -> bool:
    """Whether ``value`` is a float convert's result from a narrower float type, or a reshape of one."""
    from iree.compiler import ir

    from .lowering import _producer

    while (reshape := _producer(value, "stablehlo.reshape")) is not None:
        value = reshape.operands[0]
    convert = _producer(value, "stablehlo.convert")
    if convert is None:
        return False
    source = ir.RankedTensorType(convert.operands[0].type).element_type
    result = ir.RankedTensorType(value.type).element_type
    floats = (source.maybe_downcast(), result.maybe_downcast())
    return all(isinstance(t, ir.FloatType) for t in floats) and floats[0].width < floats[1].width


def _narrow_constant(value: ir.Value) -> bool:
    """Whether ``value`` is a ``stablehlo.constant`` of 16-bit floats holding more than one value."""
    from iree.compiler import ir

    from .lowering import _producer

    constant = _producer(value, "stablehlo.constant")
    if constant is None:
        return False
    element = ir.RankedTensorType(value.type).element_type.maybe_downcast()
    return (isinstance(element, ir.FloatType) and element.width == 16
            and not ir.DenseElementsAttr(constant.attributes["value"]).is_splat)


__all__ = ["fence_narrow_constants", "fence_widened_updates"]
