"""StableHLO builders: the small constructors every pass that writes StableHLO uses.

Each builder creates one StableHLO op (or a short fixed spelling of a few)
at the current insertion point and location, and returns its value. They
are shared, not private to the lowering, because ``topos-raise`` and the
target rewrites (``topos.dialect.passes.fences``, ``reductions``,
``scatters``) write StableHLO too, and must spell it the lowering's way:
a reshape of a one-element slice sliced again, a narrow element's rounding
as ``reduce_precision`` and ``convert``, a placement by edge padding alone.
Each of those spellings works around a measured IREE 3.13 problem, named
where it is made (docs/reliability.md); one copy keeps the workaround
wherever the op is written.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import ml_dtypes
import numpy as np
from iree.compiler import ir

from topos.base.element import element_of
from topos.dialect.ir.ops import registered_element


def create(name: str, operands: Sequence[ir.Value], result: ir.Type | None,
           attributes: dict | None = None, regions: int = 0) -> ir.Operation:
    """The op ``name`` with at most one result (None: none) and ``regions`` empty regions, for its caller to fill."""
    return ir.Operation.create(
        name,
        results=[] if result is None else [result],
        operands=list(operands),
        attributes=attributes or {},
        regions=regions,
    )


def one_result(name: str, operands: Sequence[ir.Value], result: ir.Type, **attributes) -> ir.Value:
    """The result of the op ``name``, which has exactly one; keyword arguments are its attributes."""
    return create(name, operands, result, attributes).result


def tensor_type(shape: Sequence[int], element: ir.Type) -> ir.RankedTensorType:
    """The ranked tensor type ``tensor<shape x element>``."""
    return ir.RankedTensorType.get(list(shape), element)


def shape_of(value: ir.Value) -> tuple[int, ...]:
    """The static shape of a ranked tensor value."""
    return tuple(ir.RankedTensorType(value.type).shape)


def element_type(value: ir.Value) -> ir.Type:
    """The element type of a ranked tensor value."""
    return ir.RankedTensorType(value.type).element_type


def i64_array(values: Sequence[int]) -> ir.Attribute:
    """``values`` as the ``array<i64: ...>`` attribute StableHLO takes for indices and dimensions."""
    return ir.DenseI64ArrayAttr.get([int(v) for v in values])


def constant(number: float, shape: Sequence[int], element: ir.Type) -> ir.Value:
    """A splat constant; ``number`` is a float for float elements, an int for integers."""
    type_ = tensor_type(shape, element)
    if isinstance(element, ir.IntegerType):
        scalar = ir.IntegerAttr.get(element, int(number))
    else:
        scalar = ir.FloatAttr.get(element, float(number))
    return one_result("stablehlo.constant", [], type_, value=ir.DenseElementsAttr.get_splat(type_, scalar))


def like(number: float, value: ir.Value) -> ir.Value:
    """A splat constant of ``number`` with ``value``'s shape and element type."""
    return constant(number, shape_of(value), element_type(value))


def unary(name: str, x: ir.Value) -> ir.Value:
    """The elementwise op ``name`` of ``x``, typed as ``x``."""
    return one_result(name, [x], x.type)


def binary(name: str, a: ir.Value, b: ir.Value) -> ir.Value:
    """The elementwise op ``name`` of ``a`` and ``b``, typed as ``a``."""
    return one_result(name, [a, b], a.type)


def compare(a: ir.Value, b: ir.Value, direction: str) -> ir.Value:
    """``a`` compared with ``b`` elementwise (``direction``: EQ, NE, LT, LE, GT or GE), as booleans."""
    predicate = tensor_type(shape_of(a), ir.IntegerType.get_signless(1))
    return one_result("stablehlo.compare", [a, b], predicate,
                      comparison_direction=ir.Attribute.parse(f"#stablehlo<comparison_direction {direction}>"))


def select(predicate: ir.Value, on_true: ir.Value, on_false: ir.Value) -> ir.Value:
    """``on_true`` where ``predicate`` holds, ``on_false`` elsewhere."""
    return one_result("stablehlo.select", [predicate, on_true, on_false], on_true.type)


def _compute_type(element: ir.Type) -> ir.Type:
    """The MLIR type ``element`` computes in: float32 for bfloat16, itself for f32 and f64."""
    registered = registered_element(element)
    if registered is None or not registered.narrow:
        return element
    return ir.Type.parse(element_of(registered.compute).mlir)


@functools.cache
def _precision_bits(dtype, compute) -> tuple[int, int] | None:
    """(exponent bits, mantissa bits) for the reduce_precision before a rounding convert, or None for none.

    reduce_precision rounds to an IEEE format of those widths, and, as in
    XLA, flushes what would be subnormal there to zero. That is harmless
    only where the compute type flushes the same values anyway: bfloat16,
    whose exponent range is float32's (IREE's CPU runtime flushes float32
    subnormals). A narrower range (float16, the 8-bit floats) keeps its
    subnormals in the compute type, and a format without infinities
    (float8_e4m3fn) is not what reduce_precision rounds to: both take the
    convert alone.
    """
    info, wide = ml_dtypes.finfo(dtype), ml_dtypes.finfo(compute)
    with np.errstate(invalid="ignore"):
        has_infinity = bool(np.isinf(np.array([np.inf]).astype(dtype).astype(np.float64))[0])
    if not has_infinity or info.maxexp != 2 ** (info.nexp - 1) or info.minexp != wide.minexp:
        return None
    return int(info.nexp), int(info.nmant)


def convert(x: ir.Value, element: ir.Type) -> ir.Value:
    """``x`` as ``element``, rounded once; ``x`` itself when it already is.

    A rounding from the compute type down to a narrow element is spelled so
    that IREE keeps it: ``reduce_precision`` first where that is exact
    (bfloat16), and the 8-bit floats' lost carry restored first.
    """
    if element_type(x) == element:
        return x
    registered = registered_element(element)
    if registered is not None and registered.narrow and _compute_type(element) == element_type(x):
        # Round to the element's precision while still in the compute type. IREE
        # computes bfloat16 chains in float32 and folds a convert down followed by a
        # convert up, dropping the rounding; reduce_precision survives that.
        bits = _precision_bits(registered.dtype, registered.compute)
        if bits is not None:
            i32 = ir.IntegerType.get_signless(32)
            x = one_result("stablehlo.reduce_precision", [x], x.type,
                           exponent_bits=ir.IntegerAttr.get(i32, bits[0]),
                           mantissa_bits=ir.IntegerAttr.get(i32, bits[1]))
        if registered.dtype.itemsize == 1:
            x = _carry_into_smallest_normal(x, registered.dtype)
    return one_result("stablehlo.convert", [x], tensor_type(shape_of(x), element))


def _carry_into_smallest_normal(x: ir.Value, dtype) -> ir.Value:
    """``x`` with the values that round up from the subnormals to the smallest normal set to it.

    IREE 3.13 truncates to an 8-bit float in software (MLIR's arith
    expansion), and that expansion drops exactly this carry: values in
    ``[tiny - s/2, tiny)``, ``s`` the subnormal spacing, come out as zeros
    of their sign instead of ``tiny`` (measured against ``refmath.nearest_even``
    at every value of f8E5M2 and f8E4M3FN, every midpoint and their float32
    neighbours; nothing else differs). Setting them to ``+-tiny`` first,
    which the truncation keeps, gives the rounding's own bits.
    """
    info = ml_dtypes.finfo(dtype)
    tiny, spacing = float(info.tiny), float(info.smallest_subnormal)
    size = unary("stablehlo.abs", x)
    gap = binary("stablehlo.and", compare(size, like(tiny - spacing / 2, x), "GE"),
                 compare(size, like(tiny, x), "LT"))
    signed = select(compare(x, like(0.0, x), "LT"), like(-tiny, x), like(tiny, x))
    return select(gap, signed, x)


def widened(x: ir.Value) -> ir.Value:
    """``x`` in its compute type: float32 for bfloat16 (and any narrow registered element), itself otherwise."""
    wide = _compute_type(element_type(x))
    return x if wide == element_type(x) else convert(x, wide)


def reshape(x: ir.Value, shape: Sequence[int]) -> ir.Value:
    """``x`` with ``shape`` (the same elements in row-major order); ``x`` itself when the shape is its own."""
    source, shape = shape_of(x), tuple(shape)
    if source == shape:
        return x
    if math.prod(shape) == 1 and len(shape) > len(source):
        # IREE 3.13 refuses a one-element slice taken to more axes, by reshape or broadcast, when
        # the value is also returned or read twice ('expected rank to be smaller or equal to the
        # other rank'): the slice is taken again from its operand widened by unit axes, which
        # compiles (docs/reliability.md, iree-unit-slice-reshape).
        offset = len(shape) - len(source)
        sliced = producer(x, "stablehlo.slice")
        if sliced is None:
            return broadcast_in_dim(x, shape, list(range(offset, len(shape))))
        operand = sliced.operands[0]
        unit_axes = reshape(operand, shape_of(operand) + (1,) * offset)
        starts = list(ir.DenseI64ArrayAttr(sliced.attributes["start_indices"])) + [0] * offset
        return one_result("stablehlo.slice", [unit_axes], tensor_type(shape, element_type(x)),
                          start_indices=i64_array(starts), limit_indices=i64_array([i + 1 for i in starts]),
                          strides=i64_array([1] * len(starts)))
    return one_result("stablehlo.reshape", [x], tensor_type(shape, element_type(x)))


def producer(x: ir.Value, name: str) -> ir.Operation | None:
    """The op that defines ``x`` when it is a ``name`` op (not a block argument), else None."""
    owner = x.owner
    if not isinstance(owner, ir.Operation):
        owner = getattr(owner, "operation", None)
    return owner if owner is not None and owner.name == name else None


def broadcast_in_dim(x: ir.Value, shape: Sequence[int], dimensions: Sequence[int]) -> ir.Value:
    """``x`` broadcast to ``shape``, its axis k becoming axis ``dimensions[k]``."""
    if math.prod(shape) == 1 and len(shape) > len(shape_of(x)) and producer(x, "stablehlo.slice") is not None:
        return reshape(x, shape)  # one element to more axes is a reshape, and reshape re-slices a slice
    return one_result("stablehlo.broadcast_in_dim", [x], tensor_type(shape, element_type(x)),
                      broadcast_dimensions=i64_array(dimensions))


def slice_along(x: ir.Value, axis: int, start: int, limit: int, stride: int = 1) -> ir.Value:
    """Elements ``start:limit:stride`` of ``x``'s ``axis``, every element of the others."""
    shape = shape_of(x)
    starts, limits, strides = [0] * len(shape), list(shape), [1] * len(shape)
    starts[axis], limits[axis], strides[axis] = start, limit, stride
    out = list(shape)
    out[axis] = (limit - start + stride - 1) // stride
    if out[axis] == 1:  # one element: the same slice with stride 1 ([0:1:2] of a [1] tensor, then
        limits[axis], strides[axis] = start + 1, 1  # broadcast, was refused: reliability.md, iree-unit-slice-reshape)
    return one_result("stablehlo.slice", [x], tensor_type(out, element_type(x)), start_indices=i64_array(starts),
                      limit_indices=i64_array(limits), strides=i64_array(strides))


def pad(x: ir.Value, axis: int, low: int, high: int, interior: int, filler: float) -> ir.Value:
    """``x`` padded along ``axis`` with ``filler``: ``low`` before, ``high`` after, ``interior`` between elements."""
    if low == high == interior == 0:
        return x
    shape = shape_of(x)
    lows, highs, interiors = [0] * len(shape), [0] * len(shape), [0] * len(shape)
    lows[axis], highs[axis], interiors[axis] = low, high, interior
    out = list(shape)
    out[axis] = low + high + shape[axis] + interior * (shape[axis] - 1)
    return one_result("stablehlo.pad", [x, constant(filler, (), element_type(x))], tensor_type(out, element_type(x)),
                      edge_padding_low=i64_array(lows), edge_padding_high=i64_array(highs),
                      interior_padding=i64_array(interiors))


def reduce(x: ir.Value, dimensions: Sequence[int], combiner: str, initial: float) -> ir.Value:
    """Reduce ``dimensions`` of ``x`` with the binary op ``combiner`` starting from ``initial``."""
    element = element_type(x)
    kept = [d for i, d in enumerate(shape_of(x)) if i not in dimensions]
    scalar = tensor_type((), element)
    reduction = create("stablehlo.reduce", [x, constant(initial, (), element)], tensor_type(kept, element),
                       {"dimensions": i64_array(dimensions)}, regions=1)
    body = reduction.regions[0].blocks.append(scalar, scalar)
    with ir.InsertionPoint(body):
        create("stablehlo.return", [binary(combiner, *body.arguments)], None)
    return reduction.result


def maximum_of(a: ir.Value, b: ir.Value) -> ir.Value:
    """The reference's maximum: ties and a NaN on the left go left."""
    left = binary("stablehlo.or", compare(a, b, "GE"), compare(a, a, "NE"))
    return select(left, a, b)


def transpose(x: ir.Value, permutation: Sequence[int]) -> ir.Value:
    """``x`` with its axes reordered: result axis k is ``x``'s axis ``permutation[k]``."""
    shape = shape_of(x)
    return one_result("stablehlo.transpose", [x], tensor_type([shape[p] for p in permutation], element_type(x)),
                      permutation=i64_array(permutation))


def concatenate(values: list[ir.Value], axis: int) -> ir.Value:
    """``values`` joined along ``axis``; one value is itself (IREE need not see a one-operand concatenate)."""
    if len(values) == 1:
        return values[0]
    shape = list(shape_of(values[0]))
    shape[axis] = sum(shape_of(v)[axis] for v in values)
    return one_result("stablehlo.concatenate", values, tensor_type(tuple(shape), element_type(values[0])),
                      dimension=ir.IntegerAttr.get(ir.IntegerType.get_signless(64), axis))


def dot(a: ir.Value, b: ir.Value, batch: list[int], lhs: int, rhs: int, shape) -> ir.Value:
    """``stablehlo.dot_general`` contracting ``a``'s axis ``lhs`` with ``b``'s axis ``rhs``."""
    numbers = ir.Attribute.parse(
        f"#stablehlo.dot<lhs_batching_dimensions = {batch}, rhs_batching_dimensions = {batch}, "
        f"lhs_contracting_dimensions = [{lhs}], rhs_contracting_dimensions = [{rhs}]>"
    )
    return one_result("stablehlo.dot_general", [a, b], tensor_type(tuple(shape), element_type(a)),
                      dot_dimension_numbers=numbers)


def placed(lanes: ir.Value, axis: int, first: int, extent: int, step: int) -> ir.Value:
    """Values ``[..., count, 1, ...]`` (a unit axis after ``axis``) placed along ``axis`` at
    first, first + step, ...: ``[..., extent, ...]``, +0.0 everywhere else.

    The step - 1 zeros between values are the unit axis padded at its high
    edge, then merged into ``axis``: edge padding only. IREE 3.13
    miscompiles interior padding of a value that was itself padded: it
    composes the two pads as if the inner low edge were not stretched too
    (``pad(pad(x, low=1), interior=1)`` put x one place early;
    docs/reliability.md, iree-pad-of-pad).
    """
    shape = shape_of(lanes)
    count = shape[axis]
    if step > 1:
        lanes = pad(lanes, axis + 1, 0, step - 1, 0, 0.0)  # [..., count, step, ...]
    spread = reshape(lanes, shape[:axis] + (count * step,) + shape[axis + 2 :])
    high = extent - first - count * step
    if high < 0:  # the zeros after the last value run past the extent
        spread, high = slice_along(spread, axis, 0, count * step + high), 0
    return pad(spread, axis, first, high, 0, 0.0)


__all__ = [
    "binary", "broadcast_in_dim", "compare", "concatenate", "constant", "convert", "create", "dot", "element_type",
    "i64_array", "like", "maximum_of", "one_result", "pad", "placed", "producer", "reduce", "reshape", "select",
    "shape_of", "slice_along", "tensor_type", "transpose", "unary", "widened",
]
