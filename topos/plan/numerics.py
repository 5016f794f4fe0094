"""Numerics postures: EXACT reproduces the oracle's bits; FAST may use BLAS and native math.

Under FAST a plan swaps some reference kernels for NumPy's own paths
(BLAS matmul, SIMD transcendentals, NumPy's sums). Each swap declares its
envelope here, next to the kernel, and the tests enforce it against the
oracle. Opcodes without a fast kernel run the reference kernel under both
postures.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..element import compute_type, round_to


class Numerics(enum.Enum):
    """How a plan may compute: EXACT (the oracle's bits) or FAST (within a declared envelope)."""

    EXACT = "exact"
    FAST = "fast"


@dataclass(frozen=True)
class Envelope:
    """How far a fast kernel may stray from the oracle, per element.

    ``|fast - exact| <= ulps * eps * scale + tiny``, where ``scale`` is
    ``|exact|`` for elementwise maps and the sum of absolute terms for
    accumulations (the classic rounding-error bound for a reordered sum),
    ``eps`` is the element type's machine epsilon and ``tiny`` its smallest
    normal number (absorbs underflow).
    """

    ulps: float
    accumulates: bool = False  # scale by the sum of |terms|, times the term count
    note: str = ""


def accumulation_scale(opcode_name: str, attributes, operands) -> np.ndarray:
    """The magnitude an accumulating kernel's envelope is proportional to.

    The term count times the sum of ``|terms|`` (matmul ``k * (|a| @ |b|)``,
    sums ``n * sum(|x|)``): the classic bound for a sum added in another
    order. log_softmax and logsumexp: ``n * (|x - max| + log S + 1)`` and
    ``n * (|max| + log S + 1)`` with ``S = sum(exp(x - max))``. One place
    for the FAST plan's envelopes and the IREE conformance table alike.
    """
    wide = [np.asarray(o).astype(np.float64) for o in operands]
    if opcode_name == "matmul":
        a, b = wide
        return a.shape[-1] * (np.abs(a) @ np.abs(b))
    if opcode_name == "sum":
        return np.asarray(wide[0].size * np.sum(np.abs(wide[0])))
    if opcode_name == "sum_along":
        axis = attributes["axis"]
        return wide[0].shape[axis] * np.sum(np.abs(wide[0]), axis=axis)
    if opcode_name in ("log_softmax", "logsumexp"):
        x, axis = wide[0], attributes["axis"]
        peak = np.max(x, axis=axis, keepdims=True)
        peak = np.where(np.isfinite(peak), peak, 0.0)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            log_total = np.log(np.sum(np.exp(x - peak), axis=axis, keepdims=True))
        first = np.abs(x - peak) if opcode_name == "log_softmax" else np.abs(peak)
        result = x.shape[axis] * (first + log_total + 1.0)
        return result if opcode_name == "log_softmax" else np.squeeze(result, axis)
    raise KeyError(f"no envelope scale is defined for the accumulating opcode {opcode_name!r}")


def _in_compute(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    def kernel(x):
        return round_to(fn(x.astype(compute_type(x.dtype), copy=False)), x.dtype)

    return kernel


def _fast_matmul(a, b):
    work = compute_type(a.dtype)
    return round_to(np.matmul(a.astype(work, copy=False), b.astype(work, copy=False)), a.dtype)


def _fast_sum(x):
    return round_to(np.asarray(np.sum(x.astype(compute_type(x.dtype), copy=False))), x.dtype)


def _fast_sum_along(x, axis):
    return round_to(np.sum(x.astype(compute_type(x.dtype), copy=False), axis=axis), x.dtype)


def _fast_log_softmax(x, axis):
    work = x.astype(compute_type(x.dtype), copy=False)
    peak = np.max(work, axis=axis, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0)
    shifted = work - peak
    return round_to(shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True)), x.dtype)


def _fast_logsumexp(x, axis):
    work = x.astype(compute_type(x.dtype), copy=False)
    peak = np.max(work, axis=axis, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0)
    total = np.log(np.sum(np.exp(work - peak), axis=axis))
    return round_to(np.squeeze(peak, axis) + total, x.dtype)


_MAP_FAST = {
    "exp": np.exp, "log": np.log, "tanh": np.tanh, "sin": np.sin, "cos": np.cos,
    "log1p": np.log1p, "expm1": np.expm1,
}

# opcode name (or "map:<function>") -> (fast kernel, envelope)
FAST_KERNELS: dict[str, tuple[Callable, Envelope]] = {
    "matmul": (_fast_matmul, Envelope(2.0, accumulates=True, note="BLAS; any summation order")),
    "sum": (_fast_sum, Envelope(2.0, accumulates=True, note="NumPy pairwise sum, SIMD-unrolled")),
    "sum_along": (_fast_sum_along, Envelope(2.0, accumulates=True, note="NumPy sum along an axis")),
    "log_softmax": (_fast_log_softmax, Envelope(8.0, accumulates=True, note="native exp/log, NumPy sum")),
    "logsumexp": (_fast_logsumexp, Envelope(8.0, accumulates=True, note="native exp/log, NumPy sum")),
    "pow": (lambda a, b: _in_compute_binary(np.power, a, b), Envelope(4.0, note="native power")),
    **{
        f"map:{name}": (_in_compute(fn), Envelope(4.0, note=f"native np.{name}"))
        for name, fn in _MAP_FAST.items()
    },
}


def _in_compute_binary(fn, a, b):
    work = compute_type(a.dtype)
    return round_to(fn(a.astype(work, copy=False), b.astype(work, copy=False)), a.dtype)


def kernel_for(opcode, attributes: dict, numerics: Numerics) -> Callable:
    """The kernel a plan runs for one node under a posture."""
    if numerics is Numerics.FAST:
        key = f"map:{attributes['function']}" if opcode.name == "map" else opcode.name
        fast = FAST_KERNELS.get(key)
        if fast is not None:
            kernel = fast[0]
            extra = {k: v for k, v in attributes.items() if k != "function"}
            return lambda *arrays: kernel(*arrays, **extra)
    return lambda *arrays: opcode.kernel(*arrays, **attributes)


def envelope_for(opcode_name: str, function: str | None = None) -> Envelope | None:
    """The declared envelope of the fast kernel, or None when FAST runs the reference kernel."""
    key = f"map:{function}" if opcode_name == "map" else opcode_name
    fast = FAST_KERNELS.get(key)
    return None if fast is None else fast[1]


__all__ = ["Envelope", "FAST_KERNELS", "Numerics", "accumulation_scale", "envelope_for", "kernel_for"]
