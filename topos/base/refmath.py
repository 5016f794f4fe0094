"""Reference transcendental functions whose bits do not depend on the machine.

The NumPy oracle must give identical results on every CPU and NumPy build.
NumPy's own ``exp``, ``log``, ``log1p``, ``expm1``, ``tanh``, ``sin``,
``cos`` and ``power`` do not: their float32 and float64 bits change when
``NPY_DISABLE_CPU_FEATURES`` switches off the AVX2/AVX-512 code paths. This
module rebuilds those functions, and adds ``erf`` and ``erf_derivative``,
from operations IEEE 754 defines exactly -- one ``+``, ``-``, ``*``, ``/``
or ``sqrt`` per ufunc call (so no fused multiply-add), comparisons,
``np.where``, sign and rounding-to-integer functions, and integer views of
the float bits -- so every result is a fixed function of the input bits.

Method: argument reduction, then a minimax polynomial or rational
approximation with published coefficients (fdlibm / FreeBSD msun for all
but tanh below 0.625, which uses Cephes), with the reduction's error terms
carried along, evaluated in float64. float32 and bfloat16 inputs are
widened exactly to float64, evaluated, and rounded once to their own type
by :func:`round_once`. ``sin``/``cos`` reduce huge arguments exactly with
Python integers and a 1344-bit value of 2/pi derived from Machin's formula.
Measured accuracy (under 1 ulp in float64 except tanh, 1.2 ulp; float32
and bfloat16 correctly rounded on every sampled point) and caveats are in
``docs/refmath.md``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from topos.base.element import ELEMENTS, element_of
from topos.base.errors import ShapeError
from topos.base.kernels64 import (
    CHUNK,
    FLOAT64_KERNELS,
    SUPPORTED,
    chunks,
    nearest_even,
    pointwise,
    sin_cos64,
)

_FLOAT64 = np.dtype(np.float64)


# --------------------------------------------------------------------------
# Rounding to the element type
# --------------------------------------------------------------------------


def round_once(x64: np.ndarray, dtype) -> np.ndarray:
    """Round a float64 array to a registered element type with one round-to-nearest-even.

    The element's own ``rounding`` does it (``topos.base.element.register``);
    for the built-in three that is :func:`nearest_even`.
    """
    x64 = np.asarray(x64)
    if x64.dtype != _FLOAT64:
        raise ShapeError(f"round_once takes a float64 array, got {x64.dtype}; widen it first")
    element = _element(dtype, "round_once")
    return pointwise(element.rounding, element.dtype, x64.reshape(-1)).reshape(x64.shape)


def _element(dtype, name: str):
    """The registered element of ``dtype``, or a ShapeError naming it (the registry lives in topos.base.element)."""
    if dtype not in ELEMENTS:
        raise ShapeError(
            f"refmath.{name}: unsupported element type {dtype}; "
            f"the registered ones are {', '.join(d.name for d in ELEMENTS)}; register another with "
            "topos.base.element.register(Element(...))"
        )
    return element_of(dtype)


# --------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------


def _widen(x, name: str):
    """``x`` flattened and widened exactly to float64, its registered element, and its shape."""
    array = np.asarray(x)
    element = _element(array.dtype, name)
    return np.ascontiguousarray(array, dtype=np.float64).reshape(-1), element, array.shape


def _unary(name: str) -> Callable[[np.ndarray], np.ndarray]:
    def apply(x: np.ndarray) -> np.ndarray:
        flat, element, shape = _widen(x, name)
        kernel, rounding = element.reference_math[name], element.rounding
        with np.errstate(all="ignore"):
            y = pointwise(lambda part: rounding(np.ascontiguousarray(kernel(part), dtype=np.float64)),
                          element.dtype, flat)
        return y.reshape(shape)

    apply.__name__ = name
    apply.__qualname__ = name
    return apply


exp = _unary("exp")
exp.__doc__ = "e**x, elementwise (fdlibm e_exp.c; under 1 ulp in float64)."
log = _unary("log")
log.__doc__ = "Natural logarithm; log(0) = -inf, log(negative) = nan (fdlibm e_log.c)."
log1p = _unary("log1p")
log1p.__doc__ = "log(1 + x) without losing small x; log1p(-1) = -inf (fdlibm s_log1p.c)."
expm1 = _unary("expm1")
expm1.__doc__ = "e**x - 1 without losing small x (fdlibm s_expm1.c)."
tanh = _unary("tanh")
tanh.__doc__ = "Hyperbolic tangent, built on expm1 (fdlibm s_tanh.c)."
sin = _unary("sin")
sin.__doc__ = "Sine; huge arguments are reduced exactly (fdlibm k_sin.c + e_rem_pio2.c)."
cos = _unary("cos")
cos.__doc__ = "Cosine; huge arguments are reduced exactly (fdlibm k_cos.c + e_rem_pio2.c)."
erf = _unary("erf")
erf.__doc__ = "The error function 2/sqrt(pi) * integral of exp(-t*t) from 0 to x (fdlibm s_erf.c)."
erf_derivative = _unary("erf_derivative")
erf_derivative.__doc__ = "2/sqrt(pi) * exp(-x*x), with x*x kept exact so large |x| stays accurate."


def pow(x: np.ndarray, y: np.ndarray) -> np.ndarray:  # noqa: A001 - the opcode's name
    """x**y elementwise with the C99 special cases (fdlibm e_pow.c); x and y share dtype and shape."""
    fx, element, shape = _widen(x, "pow")
    fy, element_y, shape_y = _widen(y, "pow")
    if element is not element_y or shape != shape_y:
        raise ShapeError(
            f"refmath.pow: operands must match, got {np.asarray(x).dtype}{list(shape)} and "
            f"{np.asarray(y).dtype}{list(shape_y)}"
        )
    kernel, rounding = element.reference_math["pow"], element.rounding
    with np.errstate(all="ignore"):
        value = pointwise(lambda a, b: rounding(np.ascontiguousarray(kernel(a, b), dtype=np.float64)),
                          element.dtype, fx, fy)
    return value.reshape(shape)


__all__ = [
    "CHUNK", "FLOAT64_KERNELS", "SUPPORTED", "chunks", "cos", "erf", "erf_derivative", "exp", "expm1", "log",
    "log1p", "nearest_even", "pointwise", "pow", "round_once", "sin", "sin_cos64", "tanh",
]
