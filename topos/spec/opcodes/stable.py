"""Stable log-domain opcodes: max-shifted so large logits neither overflow nor lose digits.

They are opcodes, not compositions, because the shift needs a maximum the
other opcodes cannot express with the same bits.
"""

from __future__ import annotations

import numpy as np

from topos.base import reference, refmath
from topos.base.element import compute_type, round_to
from topos.spec.opcodes.base import OUTPUT, Opcode, Spec, check_axis, element_operand, register


def _shifted(x: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """x - max(x) along axis (in the compute type), and that max with infinities made 0."""
    work = x.astype(compute_type(x.dtype), copy=False)
    peak = np.max(work, axis=axis, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, np.zeros_like(peak))
    return work - peak, peak


def _log_of_sum_exp(shifted: np.ndarray, axis: int) -> np.ndarray:
    return refmath.log(reference.pairwise_sum(refmath.exp(shifted), axis))


@register
class LogSoftmax(Opcode):
    """log(softmax(x)) along ``axis``: x - max - log(sum(exp(x - max)))."""

    name = "log_softmax"
    arity = 1
    attribute_names = ("axis",)
    READS = frozenset({OUTPUT})

    def infer(self, x: Spec, axis) -> Spec:
        element_operand(x)
        check_axis(axis, len(x.shape))
        return x

    def kernel(self, x, axis):
        shifted, _ = _shifted(x, axis)
        total = np.expand_dims(_log_of_sum_exp(shifted, axis), axis)
        return round_to(shifted - total, x.dtype)

    def rule(self, x, out, g, axis):
        total = g.sum_along(axis).broadcast_along(axis, x.shape[axis])
        return (g - out.exp() * total,)


@register
class LogSumExp(Opcode):
    """log(sum(exp(x))) along ``axis`` (removed): max + log(sum(exp(x - max)))."""

    name = "logsumexp"
    arity = 1
    attribute_names = ("axis",)
    READS = frozenset({0})

    def infer(self, x: Spec, axis) -> Spec:
        element_operand(x)
        axis = check_axis(axis, len(x.shape))
        return Spec(x.shape[:axis] + x.shape[axis + 1 :], x.dtype)

    def kernel(self, x, axis):
        shifted, peak = _shifted(x, axis)
        return round_to(np.squeeze(peak, axis) + _log_of_sum_exp(shifted, axis), x.dtype)

    def rule(self, x, out, g, axis):
        # The weights are softmax(x), spelled exp(log_softmax(x)) rather than exp(x - out): at
        # large magnitudes out = max + log(sum) loses the log to rounding, and exp(x - out)
        # would no longer sum to 1 (logsumexp([1e30, 1e30]) has gradient [0.5, 0.5], not [1, 1]).
        extent = x.shape[axis]
        return (g.broadcast_along(axis, extent) * x.log_softmax(axis).exp(),)
