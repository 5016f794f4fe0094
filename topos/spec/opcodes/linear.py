"""Linear algebra and reductions: the opcodes whose bits depend on an accumulation order.

The order is fixed in ``topos.base.reference`` (ascending k for matmul, the
halving tree for sums) and computed in the element's compute type.
"""

from __future__ import annotations

from topos.base import reference
from topos.base.element import compute_type, round_to
from topos.spec.opcodes.base import Opcode, Refusal, Spec, check_axis, element_operand, register, same_specs


def _swap_last(x):
    order = tuple(range(x.ndim if hasattr(x, "ndim") else len(x.shape)))
    return x.permute(order[:-2] + (order[-1], order[-2]))


@register
class Matmul(Opcode):
    """[..., m, k] @ [..., k, n] -> [..., m, n]; batch axes must be identical."""

    name = "matmul"
    arity = 2
    READS = frozenset({0, 1})

    def infer(self, a: Spec, b: Spec) -> Spec:
        element_operand(a, "left operand")
        element_operand(b, "right operand")
        if len(a.shape) < 2 or len(b.shape) < 2:
            raise Refusal(
                f"matmul needs rank >= 2 on both sides, got {list(a.shape)} and {list(b.shape)}",
                "reshape a vector to [1, n] or [n, 1] first",
            )
        if len(a.shape) != len(b.shape) or a.shape[:-2] != b.shape[:-2]:
            raise Refusal(
                f"batch axes {list(a.shape[:-2])} and {list(b.shape[:-2])} differ "
                f"(shapes {list(a.shape)} and {list(b.shape)})",
                "batched matmul needs identical leading axes; use broadcast_to on one operand",
            )
        if a.shape[-1] != b.shape[-2]:
            raise Refusal(
                f"contracted extents differ: {list(a.shape)} has k={a.shape[-1]}, "
                f"{list(b.shape)} has k={b.shape[-2]}",
                "the left operand's last axis must equal the right operand's second-to-last; "
                "transpose() one side if it is stored the other way",
            )
        same_specs(Spec((), a.dtype), Spec((), b.dtype))
        return Spec(a.shape[:-1] + b.shape[-1:], a.dtype)

    def kernel(self, a, b):
        work = compute_type(a.dtype)
        out = reference.matmul(a.astype(work, copy=False), b.astype(work, copy=False))
        return round_to(out, a.dtype)

    def rule(self, a, b, out, g):
        return g @ _swap_last(b), _swap_last(a) @ g


@register
class Sum(Opcode):
    """The sum of every element, a rank-0 result (row-major halving tree)."""

    name = "sum"
    arity = 1

    def infer(self, x: Spec) -> Spec:
        element_operand(x)
        return Spec((), x.dtype)

    def kernel(self, x):
        return round_to(reference.full_sum(x.astype(compute_type(x.dtype), copy=False)), x.dtype)

    def rule(self, x, out, g):
        return (g.broadcast(x.shape),)


@register
class SumAlong(Opcode):
    """Sum along one axis, which disappears from the shape."""

    name = "sum_along"
    arity = 1
    attribute_names = ("axis",)

    def infer(self, x: Spec, axis) -> Spec:
        element_operand(x)
        axis = check_axis(axis, len(x.shape))
        return Spec(x.shape[:axis] + x.shape[axis + 1 :], x.dtype)

    def kernel(self, x, axis):
        work = x.astype(compute_type(x.dtype), copy=False)
        return round_to(reference.pairwise_sum(work, axis), x.dtype)

    def rule(self, x, out, g, axis):
        return (g.broadcast_along(axis, x.shape[axis]),)
