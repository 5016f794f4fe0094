"""Numerics postures: EXACT reproduces the oracle's bits; FAST may use BLAS and native math.

Under FAST a plan swaps some reference kernels for NumPy's own paths
(BLAS matmul, SIMD transcendentals, NumPy's sums). Each swap declares its
envelope here, next to the kernel, and the tests enforce it against the
oracle. Opcodes without a fast kernel run the reference kernel under both
postures.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np

from topos.base.element import compute_type, round_to, short_name
from topos.base.errors import ArgumentError, ToposError
from topos.spec.opcodes import MAP_FUNCTIONS, by_name
from topos.spec.opcodes.base import REGISTRY

if TYPE_CHECKING:
    from topos.spec.network import Network


class Fidelity(enum.Enum):
    """What a kernel promises about its bits, against the reference kernel of the node it serves.

    ``IDENTICAL``: the reference's bits (the reference itself, or a kernel
    checked to give them); ``COMPOSED``: bit-identical parts run in the
    composition's order (a fusion executor walking the same IEEE
    operations), so the same bits; ``ENVELOPE``: within a declared
    ``Envelope`` (BLAS, native math, another summation order).
    """

    IDENTICAL = "bit-identical"
    COMPOSED = "composed of bit-identical parts"
    ENVELOPE = "within an envelope"


class Numerics(enum.Enum):
    """How a plan may compute: EXACT (the oracle's bits) or FAST (within a declared envelope)."""

    EXACT = "exact"
    FAST = "fast"

    def accepts(self, fidelity: Fidelity) -> bool:
        """EXACT accepts only kernels that give the reference's bits; FAST accepts every fidelity."""
        if not isinstance(fidelity, Fidelity):  # a string would pass the identity test below
            raise ArgumentError(f"accepts takes a topos.Fidelity, got {fidelity!r} ({type(fidelity).__name__})")
        return self is Numerics.FAST or fidelity is not Fidelity.ENVELOPE


_POSTURE: contextvars.ContextVar[Numerics] = contextvars.ContextVar("topos_posture", default=Numerics.EXACT)


@contextlib.contextmanager
def posture(numerics: Numerics):
    """Within the block, direct payload calls (``Opcode.express`` on arrays, Eager arithmetic) compute
    under ``numerics``: EXACT (the default) runs reference kernels, FAST may run the fast ones.

    Plans carry their own posture (``network.entry(..., numerics=)``); this
    is the same choice for code that calls opcodes on arrays itself.
    """
    if not isinstance(numerics, Numerics):
        raise ArgumentError(f"posture takes Numerics.EXACT or Numerics.FAST, got {numerics!r}")
    token = _POSTURE.set(numerics)
    try:
        yield numerics
    finally:
        _POSTURE.reset(token)


def exactly():
    """``with topos.exactly():`` direct payload calls give the oracle's bits (the default, made explicit)."""
    return posture(Numerics.EXACT)


def current_posture() -> Numerics:
    return _POSTURE.get()


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


# Kernels users register (register_kernel): opcode key -> (kernel, fidelity), tried before the
# built-in fast kernels; every one was checked against the reference when it was registered.
REGISTERED: dict[str, tuple[Callable, Fidelity]] = {}


def kernel_key(opcode_name: str, attributes) -> str:
    return f"map:{attributes['function']}" if opcode_name == "map" else opcode_name


def kernel_for(opcode, attributes: dict, numerics: Numerics, node: tuple[Network, int] | None = None) -> Callable:
    """The kernel a plan runs for one node under a posture: the first whose fidelity the posture accepts.

    A registered kernel first, then the built-in fast kernel (fidelity
    ENVELOPE), then the reference kernel (IDENTICAL, accepted by both).
    ``node`` (a network and the index of the node the kernel serves there)
    holds a registered kernel's every result to that node's spec.
    """
    key = kernel_key(opcode.name, attributes)
    extra = {k: v for k, v in attributes.items() if k != "function"}
    registered = REGISTERED.get(key)
    if registered is not None and numerics.accepts(registered[1]):
        chosen = registered[0]
        if node is not None:
            return lambda *arrays: _held_to_spec(chosen(*arrays, **extra), chosen, key, node)
        return lambda *arrays: chosen(*arrays, **extra)
    fast = FAST_KERNELS.get(key)
    if fast is not None and numerics.accepts(Fidelity.ENVELOPE):
        kernel = fast[0]
        return lambda *arrays: kernel(*arrays, **extra)
    return lambda *arrays: opcode.kernel(*arrays, **attributes)


def _held_to_spec(result, kernel: Callable, key: str, node: tuple[Network, int]) -> np.ndarray:
    """``result`` as an array, or a ToposError: its examples checked a registered kernel only on their shapes.

    A result of another shape or element type would flow on into every
    consumer, and into the values a run hands out, without a word.
    """
    out = np.asarray(result)
    network, n = node
    spec = network.columns.specs[n]
    if out.shape != spec.shape or out.dtype != spec.dtype:
        raise ToposError(
            f"the kernel {getattr(kernel, '__qualname__', repr(kernel))} registered for {key} (register_kernel) "
            f"returned {list(out.shape)} {short_name(out.dtype)} for %{n} (recorded at {network.columns.sites[n]}), "
            f"whose spec is {spec}; a registered kernel must return the reference kernel's shape and element "
            "type: fix it (and give register_kernel an example of this shape), or remove it with unregister_kernel"
        )
    return out


def register_kernel(opcode_name: str, kernel: Callable, fidelity: Fidelity, *, examples,
                    envelope: Envelope | None = None, function: str | None = None) -> None:
    """Offer ``kernel`` to serve ``opcode_name`` (``function`` for map) wherever a posture accepts ``fidelity``.

    ``examples`` is a list of ``(operands, attributes)``; the kernel runs on
    each beside the reference kernel before it is accepted: a kernel that
    declares IDENTICAL or COMPOSED must give the reference's bits on every
    one, and an ENVELOPE kernel must stay inside ``envelope``. A kernel that
    does not keep its promise is refused with the first example it failed.
    """
    key = _kernel_key("register_kernel", opcode_name, function)
    opcode = by_name(opcode_name)
    if not isinstance(fidelity, Fidelity):
        raise ToposError(f"register_kernel: fidelity must be a topos Fidelity, got {fidelity!r}")
    if fidelity is Fidelity.ENVELOPE and envelope is None:
        raise ToposError(f"register_kernel: the {key} kernel declares ENVELOPE fidelity: give its envelope=")
    if not examples:
        raise ToposError(f"register_kernel: the {key} kernel needs examples to be checked against the reference")
    for k, (operands, attributes) in enumerate(examples):
        attributes = dict(attributes or {})
        if function is not None:
            attributes["function"] = function
        arrays = [np.asarray(o) for o in operands]
        want = np.asarray(opcode.kernel(*arrays, **attributes))
        got = np.asarray(kernel(*arrays, **{a: v for a, v in attributes.items() if a != "function"}))
        if got.shape != want.shape or got.dtype != want.dtype:
            raise ToposError(f"register_kernel: the {key} kernel gave {list(got.shape)} {got.dtype} on example {k}, "
                             f"the reference {list(want.shape)} {want.dtype}")
        if fidelity is not Fidelity.ENVELOPE:
            got_bytes = np.ascontiguousarray(got).reshape(-1).view(np.uint8).reshape(got.size, -1)
            want_bytes = np.ascontiguousarray(want).reshape(-1).view(np.uint8).reshape(want.size, -1)
            if not np.array_equal(got_bytes, want_bytes):
                differ = int(np.any(got_bytes != want_bytes, axis=1).sum())
                raise ToposError(
                    f"register_kernel: the {key} kernel declares {fidelity.value} fidelity, but on example {k} "
                    f"{differ} of {want.size} elements differ from the reference kernel's bits; declare "
                    "Fidelity.ENVELOPE with its envelope, or fix the kernel")
        else:
            assert envelope is not None  # checked above: an ENVELOPE kernel names its envelope
            wide_got, wide_want = got.astype(np.float64), want.astype(np.float64)
            eps = float(ml_dtypes.finfo(want.dtype).eps)  # the envelope counts units of the element
            scale = (accumulation_scale(opcode_name, attributes, arrays) if envelope.accumulates
                     else np.abs(wide_want))
            bound = envelope.ulps * eps * scale + np.finfo(np.float64).tiny
            if not np.all((np.abs(wide_got - wide_want) <= bound) | (np.isnan(wide_got) & np.isnan(wide_want))):
                raise ToposError(f"register_kernel: the {key} kernel leaves its envelope ({envelope.ulps:g} ulps) "
                                 f"on example {k}")
    REGISTERED[key] = (kernel, fidelity)


def unregister_kernel(opcode_name: str, function: str | None = None) -> None:
    """Remove the kernel registered for ``opcode_name`` (``function`` for map); the built-ins serve again.

    Removing what is not registered does nothing; a name no opcode has is an ArgumentError (a typo).
    """
    REGISTERED.pop(_kernel_key("unregister_kernel", opcode_name, function), None)


def envelope_for(opcode_name: str, function: str | None = None) -> Envelope | None:
    """The declared envelope of the fast kernel, or None when FAST runs the reference kernel."""
    fast = FAST_KERNELS.get(_kernel_key("envelope_for", opcode_name, function))
    return None if fast is None else fast[1]


def _kernel_key(caller: str, opcode_name: str, function: str | None) -> str:
    """``map:<function>`` or the opcode's name, once both are known names: a typo would read as "none"."""
    names = sorted(REGISTRY)
    if opcode_name not in names:
        raise ArgumentError(f"{caller}: no opcode is named {opcode_name!r}; the opcodes are {', '.join(names)}")
    if opcode_name != "map":
        if function is not None:
            raise ArgumentError(f"{caller}: function= names a map function; {opcode_name} takes none")
        return opcode_name
    if function not in MAP_FUNCTIONS:
        raise ArgumentError(f"{caller}: map needs function= one of {', '.join(sorted(MAP_FUNCTIONS))}, "
                            f"got {function!r}")
    return f"map:{function}"


__all__ = ["Envelope", "FAST_KERNELS", "Fidelity", "Numerics", "REGISTERED", "accumulation_scale", "current_posture",
           "envelope_for", "exactly", "kernel_for", "posture", "register_kernel", "unregister_kernel"]
