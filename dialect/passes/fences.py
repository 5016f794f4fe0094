"""Optimization barriers a target needs where IREE 3.13's code generation refuses what it would fuse.

An ``optimization_barrier`` hands its operand on unchanged; IREE then keeps
the value out of its readers' dispatches (it is computed in one of its
own, or stored as a buffer), which is all the rewrites below want. Each is
chosen by a field of the target (``topos.dialect.iree.targets``) and applied to
the parsed StableHLO module by ``compiled.lowered``:

* ``fence_widened_updates`` (``Target.fences_widened_updates``: cuda, rocm).
  A bfloat16 (or float16) scatter accumulates in float32, so its updates
  arrive through a ``stablehlo.convert`` up from the narrow type (through a
  reshape as well). IREE's LLVMGPU pipeline fuses that convert into the
  scatter's dispatch and then fails ("failed to apply fusion + hoisting
  patterns"); a float32 producer fused the same way compiles, and vulkan and
  metal compile both (measured 2026-12-04).
* ``fence_widened_products`` (``Target.fences_widened_products``: cuda, rocm).
  A batched bfloat16 product whose left operand is read transposed (it
  contracts an axis other than its last, in the memory it is read from: a
  gradient ``a.T @ g`` per batch) with both operands widened from bfloat16
  in its dispatch computes wrong values on CUDA: every batch but the last,
  up to 3e8 float32 eps off (IREE 3.13, sm_80 PTX on an H200; every shape
  measured from [2, 7, 3] x [2, 3, 5] to [2, 32, 8] x [2, 8, 32], and with
  3, 4 and 8 batches; [2, 64, 48] x [2, 48, 80] was right). The same
  product is right with either operand in float32, with the left operand
  untransposed, or with the operands fenced; so the left operand is fenced
  and read as a float32 buffer (the reproductions: docs/performance.md, "On a GPU").
  rocm shares the LLVMGPU code generation and is fenced too, unmeasured.
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

import re
from typing import TYPE_CHECKING

from topos.dialect.passes.freeze import ops_of_main

if TYPE_CHECKING:
    from iree.compiler import ir


def fence_widened_updates(module: ir.Module) -> None:
    """Every scatter's updates of ``module`` fenced where a widening convert makes them."""

    def fence(op: ir.Operation) -> list[int]:
        return [2] if op.name == "stablehlo.scatter" and _widened_by_a_convert(op.operands[2]) else []

    _fenced_operands(module, fence)


def fence_widened_products(module: ir.Module) -> None:
    """Every batched product's left operand fenced where both operands are widened and the left is read transposed."""

    def fence(op: ir.Operation) -> list[int]:
        if op.name != "stablehlo.dot_general":
            return []
        numbers = str(op.attributes["dot_dimension_numbers"])
        contracted = re.search(r"lhs_contracting_dimensions = \[(\d+)\]", numbers)
        if "lhs_batching_dimensions" not in numbers or contracted is None:
            return []
        lhs, rhs = _widened_order(op.operands[0]), _widened_order(op.operands[1])
        if lhs is None or rhs is None:
            return []
        axis = None if lhs[1] is None else lhs[1][int(contracted.group(1))]
        return [0] if axis is None or axis != lhs[0] - 1 else []

    _fenced_operands(module, fence)


def fence_narrow_constants(module: ir.Module) -> None:
    """Every read of a non-splat 16-bit float constant in ``module`` fenced."""

    def fence(op: ir.Operation) -> list[int]:
        return [k for k, operand in enumerate(op.operands) if _narrow_constant(operand)]

    _fenced_operands(module, fence)


def _fenced_operands(module: ir.Module, operands_of) -> None:
    """The operands ``operands_of(op)`` names of each op of ``module``'s @main behind a barrier."""
    from iree.compiler import ir

    from topos.dialect.passes.builders import one_result

    for op in ops_of_main(module):
        for k in operands_of(op):
            value = op.operands[k]
            with ir.InsertionPoint(op), op.location:
                op.operands[k] = one_result("stablehlo.optimization_barrier", [value], value.type)


def _widened_by_a_convert(value: ir.Value) -> bool:
    """Whether ``value`` is a float convert's result from a narrower float, seen through reshapes and transposes."""
    return _widened_order(value) is not None


def _widened_order(value: ir.Value) -> tuple[int, list[int] | None] | None:
    """For ``value`` a widening float convert's result seen through transposes and reshapes:
    (the convert's rank, the convert's axis each axis of ``value`` reads, or None past a reshape);
    None when ``value`` is not one."""
    from iree.compiler import ir

    from topos.dialect.passes.builders import producer

    order: list[int] | None = list(range(ir.RankedTensorType(value.type).rank))
    while True:
        if (transpose := producer(value, "stablehlo.transpose")) is not None:
            permutation = list(ir.DenseI64ArrayAttr(transpose.attributes["permutation"]))
            order = None if order is None else [permutation[axis] for axis in order]
            value = transpose.operands[0]
        elif (reshape := producer(value, "stablehlo.reshape")) is not None:
            order, value = None, reshape.operands[0]
        else:
            break
    convert = producer(value, "stablehlo.convert")
    if convert is None:
        return None
    source = ir.RankedTensorType(convert.operands[0].type).element_type
    result = ir.RankedTensorType(value.type).element_type
    floats = (source.maybe_downcast(), result.maybe_downcast())
    if not (all(isinstance(t, ir.FloatType) for t in floats) and floats[0].width < floats[1].width):
        return None
    return ir.RankedTensorType(value.type).rank, order


def _narrow_constant(value: ir.Value) -> bool:
    """Whether ``value`` is a ``stablehlo.constant`` of 16-bit floats holding more than one value."""
    from iree.compiler import ir

    from topos.dialect.passes.builders import producer

    constant = producer(value, "stablehlo.constant")
    if constant is None:
        return False
    element = ir.RankedTensorType(value.type).element_type.maybe_downcast()
    return (isinstance(element, ir.FloatType) and element.width == 16
            and not ir.DenseElementsAttr(constant.attributes["value"]).is_splat)


__all__ = ["fence_narrow_constants", "fence_widened_products", "fence_widened_updates"]
