"""Long reductions in two stages, for a target that loses the elements of a long one (``Target.reduction_limit``).

IREE 3.13's ``vulkan`` target sums at most 65,535 elements along one
reduced axis and drops the rest, without a word. On Mesa's lavapipe,
2026-12-04: the full sum of 2^16 ones came back as 65,535, of 2^17, 2^18
and 2^20 ones as 65,535 too, while row sums of 1,024 rows of 256 were
right. The tiny GPT-2's cross-entropy (a sum of 16 x 64 x 256 terms) came
out a quarter of the oracle's loss, which the example's oracle check
caught.

So a reduction along an axis longer than the limit becomes two: the axis
is padded with the reduction's initial value (its identity: -0.0 for a
sum, -inf for a maximum) to a whole number of limit-long rows, split into
[rows, limit], reduced along the rows' elements, then along the rows
(again in two stages if there are still too many). A sum is then added
in another order, which the accumulation envelope allows for any
parallel target; a maximum is the same.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from topos.dialect.passes.freeze import ops_of_main

if TYPE_CHECKING:
    from iree.compiler import ir


def split_reductions(module: ir.Module, limit: int) -> None:
    """Every reduction of ``module`` along an axis longer than ``limit`` in stages."""
    for op in ops_of_main(module, "stablehlo.reduce"):
        _split(op, limit)


def _split(reduce: ir.Operation, limit: int) -> None:
    """One reduce as builders.reduce writes it (one operand, one axis, a splat initial value)."""
    from iree.compiler import ir

    from topos.dialect.passes.builders import producer, shape_of

    dimensions = list(ir.DenseI64ArrayAttr(reduce.attributes["dimensions"]))
    initial = producer(reduce.operands[1], "stablehlo.constant")
    body = list(reduce.regions[0].blocks[0].operations)
    if len(reduce.operands) != 2 or len(dimensions) != 1 or initial is None or len(body) != 2:
        return
    (axis,) = dimensions
    x = reduce.operands[0]
    if shape_of(x)[axis] <= limit:
        return
    combiner = body[0].operation.name
    start = ir.FloatAttr(ir.DenseElementsAttr(initial.attributes["value"]).get_splat_value()).value
    with ir.InsertionPoint(reduce), reduce.location:
        value = _staged(x, axis, combiner, start, limit)
    reduce.result.replace_all_uses_with(value)
    reduce.erase()


def _staged(x: ir.Value, axis: int, combiner: str, start: float, limit: int) -> ir.Value:
    from topos.dialect.passes.builders import pad, reduce, reshape, shape_of

    shape = shape_of(x)
    extent = shape[axis]
    if extent <= limit:
        return reduce(x, [axis], combiner, start)
    rows = math.ceil(extent / limit)
    padded = pad(x, axis, 0, rows * limit - extent, 0, start)
    split = reshape(padded, shape[:axis] + (rows, limit) + shape[axis + 1:])
    return _staged(reduce(split, [axis + 1], combiner, start), axis, combiner, start, limit)


__all__ = ["split_reductions"]
