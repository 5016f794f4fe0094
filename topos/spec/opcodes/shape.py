"""Shape opcodes: they move, copy or place elements and never round anything.

Each one's adjoint is another opcode of this family (broadcast <-> sum,
narrow <-> pad, unfold <-> fold), which keeps the vocabulary closed under
differentiation.
"""

from __future__ import annotations

import numpy as np

from topos.base.element import compute_type, round_to
from topos.spec.opcodes.base import (
    Opcode,
    Refusal,
    Spec,
    check_axis,
    check_extent,
    check_shape,
    element_operand,
    register,
    volume,
)


@register
class Broadcast(Opcode):
    """Fill ``shape`` with the single element of a volume-1 operand."""

    name = "broadcast"
    arity = 1
    attribute_names = ("shape",)

    def infer(self, x: Spec, shape) -> Spec:
        element_operand(x)
        shape = check_shape(shape)
        if volume(x.shape) != 1:
            raise Refusal(
                f"broadcast needs a single-element operand, got shape {list(x.shape)} -> {list(shape)}",
                "use broadcast_to(shape) for NumPy's rule, or broadcast_along(axis, extent)",
            )
        return Spec(shape, x.dtype)

    def kernel(self, x, shape):
        return np.full(shape, x.reshape(()), dtype=x.dtype)

    def rule(self, x, out, g, shape):
        total = g.sum()
        return (total if x.shape == () else total.reshape(x.shape),)


@register
class BroadcastAlong(Opcode):
    """Insert a new axis at ``axis`` holding ``extent`` copies of the operand."""

    name = "broadcast_along"
    arity = 1
    attribute_names = ("axis", "extent")

    def infer(self, x: Spec, axis, extent) -> Spec:
        element_operand(x)
        axis = check_axis(axis, len(x.shape) + 1)
        extent = check_extent(extent, "extent")
        return Spec(x.shape[:axis] + (extent,) + x.shape[axis:], x.dtype)

    def kernel(self, x, axis, extent):
        return np.ascontiguousarray(np.repeat(np.expand_dims(x, axis), extent, axis=axis))

    def rule(self, x, out, g, axis, extent):
        return (g.sum_along(axis),)


@register
class Reshape(Opcode):
    """The same elements in row-major order under a new shape of equal volume."""

    name = "reshape"
    arity = 1
    attribute_names = ("shape",)

    def infer(self, x: Spec, shape) -> Spec:
        element_operand(x)
        shape = tuple(check_shape(shape)) if len(tuple(shape)) else ()
        if volume(shape) != volume(x.shape):
            raise Refusal(
                f"cannot reshape {list(x.shape)} ({volume(x.shape)} elements) "
                f"to {list(shape)} ({volume(shape)} elements)",
                "the new shape must hold the same number of elements",
            )
        return Spec(shape, x.dtype)

    def kernel(self, x, shape):
        return np.ascontiguousarray(x).reshape(shape).copy()

    def rule(self, x, out, g, shape):
        return (g.reshape(x.shape),)


@register
class Permute(Opcode):
    """Reorder axes: output axis i is operand axis ``order[i]``."""

    name = "permute"
    arity = 1
    attribute_names = ("order",)

    def infer(self, x: Spec, order) -> Spec:
        element_operand(x)
        try:
            order = tuple(order)
        except TypeError:
            raise Refusal(f"order must be a sequence of axes, got {order!r}") from None
        if not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in order):
            raise Refusal(f"order {list(order)} must list integer axes", "spell each axis as an int")
        if sorted(order) != list(range(len(x.shape))):
            raise Refusal(
                f"order {list(order)} is not a permutation of the {len(x.shape)} axes of {list(x.shape)}",
                f"list each axis 0..{len(x.shape) - 1} exactly once",
            )
        return Spec(tuple(x.shape[i] for i in order), x.dtype)

    def kernel(self, x, order):
        # .copy() rather than ascontiguousarray, which turns a rank-0 result into shape (1,).
        return np.transpose(x, order).copy()

    def rule(self, x, out, g, order):
        inverse = tuple(int(i) for i in np.argsort(order))
        return (g.permute(inverse),)


@register
class Narrow(Opcode):
    """The window ``[start, start + length)`` of one axis."""

    name = "narrow"
    arity = 1
    attribute_names = ("axis", "start", "length")

    def infer(self, x: Spec, axis, start, length) -> Spec:
        element_operand(x)
        axis = check_axis(axis, len(x.shape))
        start = check_extent(start, "start", minimum=0)
        length = check_extent(length, "length")
        if start + length > x.shape[axis]:
            raise Refusal(
                f"window [{start}, {start + length}) runs past extent {x.shape[axis]} "
                f"of axis {axis} in {list(x.shape)}",
                "start + length must not exceed the axis extent",
            )
        return Spec(x.shape[:axis] + (length,) + x.shape[axis + 1 :], x.dtype)

    def kernel(self, x, axis, start, length):
        index = [slice(None)] * x.ndim
        index[axis] = slice(start, start + length)
        # A copy, never a view: a window must not pin its (often much larger) operand
        # past the plan's free, nor share memory with it.
        return x[tuple(index)].copy()

    def rule(self, x, out, g, axis, start, length):
        return (g.pad(axis, start, x.shape[axis]),)


@register
class Pad(Opcode):
    """Place the operand at ``start`` inside zeros of ``extent`` along one axis."""

    name = "pad"
    arity = 1
    attribute_names = ("axis", "start", "extent")

    def infer(self, x: Spec, axis, start, extent) -> Spec:
        element_operand(x)
        axis = check_axis(axis, len(x.shape))
        start = check_extent(start, "start", minimum=0)
        extent = check_extent(extent, "extent")
        if start + x.shape[axis] > extent:
            raise Refusal(
                f"operand extent {x.shape[axis]} placed at {start} does not fit in {extent} "
                f"along axis {axis} of {list(x.shape)}",
                "extent must be at least start + the operand's extent",
            )
        return Spec(x.shape[:axis] + (extent,) + x.shape[axis + 1 :], x.dtype)

    def kernel(self, x, axis, start, extent):
        shape = list(x.shape)
        shape[axis] = extent
        out = np.zeros(shape, dtype=x.dtype)
        index = [slice(None)] * x.ndim
        index[axis] = slice(start, start + x.shape[axis])
        out[tuple(index)] = x
        return out


    def rule(self, x, out, g, axis, start, extent):
        return (g.narrow(axis, start, x.shape[axis]),)


def _window_count(extent: int, size: int, step: int, dilation: int) -> int:
    span = dilation * (size - 1) + 1
    return (extent - span) // step + 1 if extent >= span else 0


def _positions(count: int, size: int, step: int, dilation: int) -> np.ndarray:
    return np.arange(count)[:, None] * step + np.arange(size)[None, :] * dilation


def _window_attributes(size, step, dilation) -> tuple[int, int, int]:
    return (
        check_extent(size, "size"),
        check_extent(step, "step"),
        check_extent(dilation, "dilation"),
    )


@register
class Unfold(Opcode):
    """Sliding windows: axis of extent L becomes (count, size); window i, lane j reads i*step + j*dilation."""

    name = "unfold"
    arity = 1
    attribute_names = ("axis", "size", "step", "dilation")

    def infer(self, x: Spec, axis, size, step, dilation) -> Spec:
        element_operand(x)
        axis = check_axis(axis, len(x.shape))
        size, step, dilation = _window_attributes(size, step, dilation)
        count = _window_count(x.shape[axis], size, step, dilation)
        if count < 1:
            raise Refusal(
                f"a window of size {size} with dilation {dilation} spans "
                f"{dilation * (size - 1) + 1} elements, more than extent {x.shape[axis]} "
                f"of axis {axis} in {list(x.shape)}",
                "pad the axis first or use a smaller window",
            )
        return Spec(x.shape[:axis] + (count, size) + x.shape[axis + 1 :], x.dtype)

    def kernel(self, x, axis, size, step, dilation):
        count = _window_count(x.shape[axis], size, step, dilation)
        return np.ascontiguousarray(np.take(x, _positions(count, size, step, dilation), axis=axis))

    def rule(self, x, out, g, axis, size, step, dilation):
        return (g.fold(axis, size, step, dilation, x.shape[axis]),)


@register
class Fold(Opcode):
    """Unfold's adjoint: sum (count, size) windows back onto an axis of ``extent``.

    Contributions are added to zeros lane by lane (j = 0, 1, ...), so each
    output element accumulates its windows in ascending lane order.
    """

    name = "fold"
    arity = 1
    attribute_names = ("axis", "size", "step", "dilation", "extent")

    def infer(self, x: Spec, axis, size, step, dilation, extent) -> Spec:
        element_operand(x)
        if len(x.shape) < 2:
            raise Refusal(f"fold needs a (count, size) axis pair, got shape {list(x.shape)}")
        axis = check_axis(axis, len(x.shape) - 1)
        size, step, dilation = _window_attributes(size, step, dilation)
        extent = check_extent(extent, "extent")
        count = _window_count(extent, size, step, dilation)
        if x.shape[axis : axis + 2] != (count, size):
            raise Refusal(
                f"axes {axis}, {axis + 1} of {list(x.shape)} should be (count={count}, size={size}) "
                f"for windows of size {size}, step {step}, dilation {dilation} over extent {extent}",
                "fold takes exactly what unfold of that extent produced",
            )
        return Spec(x.shape[:axis] + (extent,) + x.shape[axis + 2 :], x.dtype)

    def kernel(self, x, axis, size, step, dilation, extent):
        work = x.astype(compute_type(x.dtype), copy=False)
        count = x.shape[axis]
        shape = x.shape[:axis] + (extent,) + x.shape[axis + 2 :]
        out = np.zeros(shape, dtype=work.dtype)
        lead = (slice(None),) * axis
        for lane in range(size):
            targets = np.arange(count) * step + lane * dilation
            out[lead + (targets,)] += work[lead + (slice(None), lane)]
        return round_to(out, x.dtype)

    def rule(self, x, out, g, axis, size, step, dilation, extent):
        return (g.unfold(axis, size, step, dilation),)
