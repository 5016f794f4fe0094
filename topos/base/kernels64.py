"""float64 kernels whose bits do not depend on the machine: fdlibm's functions over NumPy arrays.

The functions of :mod:`topos.base.refmath` on float64, before any element
type: each kernel takes and returns float64 arrays and uses only
operations IEEE 754 defines exactly (see refmath's docstring for the
method and docs/refmath.md for the measured accuracy). Here too is the one
rounding from float64 to a narrower format (:func:`nearest_even`), which
an element type carries as its ``rounding``. This module knows no element
registry, so ``topos.base.element`` builds the built-in element types from
it and ``refmath`` dispatches on them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType

import ml_dtypes
import numpy as np

from topos.base.errors import ShapeError

SUPPORTED = (
    "exp",
    "log",
    "log1p",
    "expm1",
    "tanh",
    "sin",
    "cos",
    "erf",
    "erf_derivative",
    "pow",
)

_FLOAT32 = np.dtype(np.float32)
_FLOAT64 = np.dtype(np.float64)
_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def _w(high: int, low: int) -> float:
    """The float64 whose IEEE bit pattern is ``high:low`` (the form fdlibm publishes)."""
    return float(np.array([(high << 32) | low], dtype=np.uint64).view(np.float64)[0])


# --------------------------------------------------------------------------
# Bit access. fdlibm reasons about the high 32-bit word of a double (sign,
# 11 exponent bits, 20 mantissa bits); int64 views give the same words.
# --------------------------------------------------------------------------

_LOW_WORD = 0xFFFFFFFF
_HIGH_MASK = np.int64(-(1 << 32))  # 0xFFFFFFFF00000000


def _high(x: np.ndarray) -> np.ndarray:
    """Signed high word of each double, as int64."""
    return x.view(np.int64) >> 32


def _clear_low(x: np.ndarray) -> np.ndarray:
    """``x`` with its low 32 bits zeroed: at most 21 significant bits, so products of two are exact."""
    return (x.view(np.int64) & _HIGH_MASK).view(np.float64)


def _with_high(x: np.ndarray, high: np.ndarray) -> np.ndarray:
    """``x`` with its high word replaced (low word kept)."""
    return ((high.astype(np.int64) << 32) | (x.view(np.int64) & _LOW_WORD)).view(np.float64)


def _from_high(high: np.ndarray) -> np.ndarray:
    """The double with the given high word and a zero low word."""
    return (high.astype(np.int64) << 32).view(np.float64)


def _pow2(k: np.ndarray) -> np.ndarray:
    """2**k exactly for integer k in [-1022, 1023], built from bits (no ldexp, no libm)."""
    return ((k.astype(np.int64) + 1023) << 52).view(np.float64)


_TWO_M1000 = _w(0x01700000, 0)  # 2**-1000


def _scale(y: np.ndarray, k: np.ndarray) -> np.ndarray:
    """y * 2**k with one rounding, for y near 1 and any k a result can need.

    A subnormal result must be rounded once: scale into the normal range
    exactly first, then apply the last 2**-1000 (the only inexact step).
    Likewise k == 1024 needs two factors because 2**1024 is not a double.
    """
    big = k > 1023
    small = k < -1021
    kk = np.where(big, k - 1, np.where(small, k + 1000, k))
    kk = np.clip(kk, -1022, 1023)
    z = y * _pow2(kk)
    z = np.where(big, z * 2.0, z)
    return np.where(small, z * _TWO_M1000, z)


# --------------------------------------------------------------------------
# Rounding from float64 to a narrower format
# --------------------------------------------------------------------------


def nearest_even(dtype) -> Callable[[np.ndarray], np.ndarray]:
    """The rounding from float64 to ``dtype``: to nearest, ties to even, once; an Element's ``rounding``.

    float64: a copy. float32: NumPy's cast, which is the IEEE
    double-to-single conversion, a single correct rounding. bfloat16:
    ml_dtypes casts float64 through float32, which rounds twice (1 + 2**-8 +
    2**-30 comes out as 1.0, not 1 + 2**-7), so the rounding is done on the
    float64 bits (:func:`_round_to_bfloat16`). Any other binary format
    (float16, the ml_dtypes 8-bit floats) rounds by its ``finfo``: scale by
    the spacing of its binade, ``rint``, scale back (all exact), so only
    ``rint`` rounds (:func:`_nearest_even_by_spacing`).
    """
    dtype = np.dtype(dtype)
    if dtype == _FLOAT64:
        return _copy
    if dtype == _FLOAT32:
        return _round_to_float32
    if dtype == _BFLOAT16:
        return _round_to_bfloat16
    return _nearest_even_by_spacing(dtype)


def _copy(x64: np.ndarray) -> np.ndarray:
    return x64.copy()


def _round_to_float32(x64: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x64.astype(_FLOAT32)


def _nearest_even_by_spacing(dtype: np.dtype) -> Callable[[np.ndarray], np.ndarray]:
    """Round float64 to a binary format no wider than float32 through the spacing of each value's binade.

    With ``q`` the spacing of the element's values in the binade of ``|x|``
    (floored at the subnormal spacing), ``rint(|x| / q) * q`` is the
    nearest value, ties to even, and only ``rint`` rounds: division and
    multiplication by a power of two are exact here. A carry into the next
    binade lands on its first value, as it should. Past the largest finite
    value (and for infinities) the result is what the format's own cast
    makes of infinity: infinity, NaN (float8_e4m3fn) or the largest value
    (formats without either, which saturate); NaN becomes the cast's NaN.
    """
    info = ml_dtypes.finfo(dtype)
    digits, lowest, largest = int(info.nmant), int(info.minexp), float(info.max)
    with np.errstate(invalid="ignore"):
        beyond = float(np.array([np.inf]).astype(dtype).astype(_FLOAT64)[0])
        not_a_number = np.array([np.nan]).astype(dtype)[0]

    def rounding(x64: np.ndarray) -> np.ndarray:
        x64 = np.asarray(x64, dtype=_FLOAT64)
        magnitude = np.abs(x64)
        finite = np.isfinite(magnitude)
        safe = np.where(finite, magnitude, 1.0)
        binade = np.clip((safe.view(np.int64) >> 52) - 1023, lowest, None)  # the sign bit is clear
        spacing = _pow2(binade - digits)
        with np.errstate(invalid="ignore"):
            nearest = np.rint(safe / spacing) * spacing
            nearest = np.where((nearest > largest) | ~finite, beyond, nearest)
            out = np.copysign(nearest, x64).astype(dtype)
        return np.where(np.isnan(x64), not_a_number, out)

    rounding.__name__ = rounding.__qualname__ = f"nearest_even_{dtype.name}"
    return rounding


_BF16_MIN_NORMAL = 2.0**-126
_BF16_INF_BITS = 0x7F80
_BF16_NAN_BITS = 0x7FC0


def _round_to_bfloat16(x64: np.ndarray) -> np.ndarray:
    shape = x64.shape
    bits = np.ascontiguousarray(x64).reshape(-1).view(np.int64)
    sign = (bits >> 48) & 0x8000
    magnitude_bits = bits & 0x7FFF_FFFF_FFFF_FFFF
    magnitude = magnitude_bits.view(np.float64)
    # Normal range: keep 7 of the 52 stored mantissa bits. Adding
    # 2**44 - 1 plus the lowest kept bit rounds ties to even; a carry runs
    # into the exponent, which is exactly how rounding up to the next binade
    # (or to infinity) should behave.
    kept_lsb = (magnitude_bits >> 45) & 1
    rounded = (magnitude_bits + ((1 << 44) - 1) + kept_lsb) >> 45
    normal = np.minimum(rounded - ((1023 - 127) << 7), _BF16_INF_BITS)
    # Subnormal range: count units of 2**-133 (the scaling is exact), ties to
    # even by rint; 128 units is the smallest normal, whose bits are 0x0080.
    is_subnormal = magnitude < _BF16_MIN_NORMAL
    units = np.rint(np.where(is_subnormal, magnitude, 0.0) * 2.0**133).astype(np.int64)
    out = np.where(is_subnormal, units, normal)
    out = np.where(np.isnan(magnitude), _BF16_NAN_BITS, out)
    return (out | sign).astype(np.uint16).view(_BFLOAT16).reshape(shape)


def _horner(z: np.ndarray, coefficients: tuple[float, ...], leading_one: bool = False) -> np.ndarray:
    """c0 + z*(c1 + z*(c2 + ...)); with ``leading_one``, 1 + z*(c0 + z*(...)).

    One multiply and one add per step, each its own rounding (never fused).
    """
    acc = np.full_like(z, coefficients[-1])
    for coefficient in reversed(coefficients[:-1]):
        acc = coefficient + z * acc
    if leading_one:
        acc = 1.0 + z * acc
    return acc


# --------------------------------------------------------------------------
# exp (fdlibm e_exp.c)
# --------------------------------------------------------------------------

_INV_LN2 = _w(0x3FF71547, 0x652B82FE)
_LN2_HI = _w(0x3FE62E42, 0xFEE00000)  # 32 significant bits: k * _LN2_HI is exact for |k| < 2**21
_LN2_LO = _w(0x3DEA39EF, 0x35793C76)
_EXP_P1 = _w(0x3FC55555, 0x5555553E)
_EXP_P2 = _w(0xBF66C16C, 0x16BEBD93)
_EXP_P3 = _w(0x3F11566A, 0xAF25DE2C)
_EXP_P4 = _w(0xBEBBBD41, 0xC5D26BF1)
_EXP_P5 = _w(0x3E663769, 0x72BEA4D0)
_EXP_OVERFLOW = _w(0x40862E42, 0xFEFA39EF)  # above this exp(x) rounds to inf
_EXP_UNDERFLOW = _w(0xC0874910, 0xD52D3051)  # below this exp(x) rounds to 0


def _exp_parts(x: np.ndarray, dx: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """exp(x + dx) as ``(k, u)`` with exp(x + dx) = (1 - u) * 2**k; ``dx`` is a small tail of ``x``.

    x = k*ln2 + r with |r| <= ln2/2; r is kept as hi - lo, where hi is
    exact and lo collects k*ln2_lo and the caller's tail. On that interval
    fdlibm's degree-5 Remez polynomial in r*r approximates
    R(r) = r*(exp(r)+1)/(exp(r)-1) to 2**-59, and
    exp(r) = 1 + r + r*c/(2 - c) with c = r - (R(r) - 2). Returning 1 - y
    instead of y lets callers multiply by a constant before the one rounding.
    """
    k = np.rint((x + dx) * _INV_LN2)
    hi = x - k * _LN2_HI
    lo = k * _LN2_LO - dx
    r = hi - lo
    t = r * r
    c = r - t * (_EXP_P1 + t * (_EXP_P2 + t * (_EXP_P3 + t * (_EXP_P4 + t * _EXP_P5))))
    u = (lo - (r * c) / (2.0 - c)) - hi
    return k.astype(np.int64), u


def _exp64(x: np.ndarray) -> np.ndarray:
    safe = np.where(np.isnan(x), 0.0, np.clip(x, -746.0, 710.0))
    k, u = _exp_parts(safe, 0.0)
    y = _scale(1.0 - u, k)
    y = np.where(x > _EXP_OVERFLOW, np.inf, y)
    y = np.where(x < _EXP_UNDERFLOW, 0.0, y)
    return np.where(np.isnan(x), x, y)


# --------------------------------------------------------------------------
# log (fdlibm e_log.c)
# --------------------------------------------------------------------------

_LG1 = _w(0x3FE55555, 0x55555593)
_LG2 = _w(0x3FD99999, 0x9997FA04)
_LG3 = _w(0x3FD24924, 0x94229359)
_LG4 = _w(0x3FCC71C5, 0x1D8E78AF)
_LG5 = _w(0x3FC74664, 0x96CB03DE)
_LG6 = _w(0x3FC39A09, 0xD078C69F)
_LG7 = _w(0x3FC2F112, 0xDF3E5244)
_TWO54 = 2.0**54
_MIN_NORMAL = 2.0**-1022


def _log64(x: np.ndarray) -> np.ndarray:
    # x = 2**k * (1 + f) with sqrt(2)/2 < 1 + f < sqrt(2). With s = f/(2+f),
    # log(1+f) = 2s + s*R(s*s), and fdlibm's Remez polynomial gives R to
    # 2**-58.45. Writing 2s = f - s*f keeps the leading f exact.
    valid = (x > 0.0) & np.isfinite(x)
    xs = np.where(valid, x, 1.0)
    subnormal = xs < _MIN_NORMAL
    xs = np.where(subnormal, xs * _TWO54, xs)
    k = np.where(subnormal, -54, 0)
    hx = _high(xs)
    k = k + (hx >> 20) - 1023
    hx = hx & 0x000FFFFF
    # Pick the binade so that the mantissa lands in [sqrt(2)/2, sqrt(2)).
    i = (hx + 0x95F64) & 0x100000
    xn = _with_high(xs, hx | (i ^ 0x3FF00000))
    k = k + (i >> 20)
    f = xn - 1.0
    dk = k.astype(np.float64)
    is_k0 = k == 0

    # |f| < 2**-20: three terms of the series suffice.
    tiny_f = ((2 + hx) & 0x000FFFFF) < 3
    r_tiny = f * f * (0.5 - 0.33333333333333333 * f)
    tiny_value = np.where(
        f == 0.0,
        dk * _LN2_HI + dk * _LN2_LO,
        np.where(is_k0, f - r_tiny, dk * _LN2_HI - ((r_tiny - dk * _LN2_LO) - f)),
    )

    s = f / (2.0 + f)
    z = s * s
    w = z * z
    t1 = w * (_LG2 + w * (_LG4 + w * _LG6))
    t2 = z * (_LG1 + w * (_LG3 + w * (_LG5 + w * _LG7)))
    big_r = t2 + t1
    # For larger |f| subtracting f*f/2 first (hfsq) loses less than f - s*(f - R).
    large_f = ((hx - 0x6147A) | (0x6B851 - hx)) > 0
    hfsq = 0.5 * f * f
    large_value = np.where(
        is_k0,
        f - (hfsq - s * (hfsq + big_r)),
        dk * _LN2_HI - ((hfsq - (s * (hfsq + big_r) + dk * _LN2_LO)) - f),
    )
    small_value = np.where(
        is_k0,
        f - s * (f - big_r),
        dk * _LN2_HI - ((s * (f - big_r) - dk * _LN2_LO) - f),
    )
    y = np.where(tiny_f, tiny_value, np.where(large_f, large_value, small_value))
    y = np.where(x == 0.0, -np.inf, y)
    y = np.where(x < 0.0, np.nan, y)
    y = np.where(x == np.inf, np.inf, y)
    return np.where(np.isnan(x), x, y)


# --------------------------------------------------------------------------
# log1p (fdlibm s_log1p.c)
# --------------------------------------------------------------------------


_SIGNED_HIGH_MINUS_0_2929 = 0xBFD2BEC4 - (1 << 32)  # high word of -0.29289 (1 + x = sqrt(2)/2), signed


def _log1p64(x: np.ndarray) -> np.ndarray:
    # Same kernel as log, applied to u = 1 + x. When 1 + x is inexact its
    # rounding error c = (1 + x) - u is recovered exactly and added back
    # as c/u (the first-order change of log at u).
    valid = (x > -1.0) & np.isfinite(x)
    xs = np.where(valid, x, 0.5)
    hx = _high(xs)
    ax = hx & 0x7FFFFFFF

    # -0.2929 <= x < 0.4142: 1 + x is already in [sqrt(2)/2, sqrt(2)), f = x exactly.
    no_reduction = (hx < 0x3FDA827A) & ((hx > 0) | (hx <= _SIGNED_HIGH_MINUS_0_2929))

    u = 1.0 + xs
    below_2p53 = hx < 0x43400000
    u = np.where(below_2p53, u, xs)
    hu = _high(u)
    k = (hu >> 20) - 1023
    c = np.where(k > 0, 1.0 - (u - xs), xs - (u - 1.0)) / u
    c = np.where(below_2p53, c, 0.0)
    hu = hu & 0x000FFFFF
    below_sqrt2 = hu < 0x6A09E
    u = np.where(below_sqrt2, _with_high(u, hu | 0x3FF00000), _with_high(u, hu | 0x3FE00000))
    k = np.where(below_sqrt2, k, k + 1)
    hu = np.where(below_sqrt2, hu, (0x00100000 - hu) >> 2)
    f = np.where(no_reduction, xs, u - 1.0)
    k = np.where(no_reduction, 0, k)
    c = np.where(no_reduction, 0.0, c)
    hu = np.where(no_reduction, 1, hu)
    dk = k.astype(np.float64)
    is_k0 = k == 0

    hfsq = 0.5 * f * f
    # hu == 0: |f| < 2**-20, a short series is enough.
    r_tiny = hfsq * (1.0 - 0.66666666666666666 * f)
    tiny_value = np.where(
        f == 0.0,
        np.where(is_k0, 0.0, dk * _LN2_HI + (c + dk * _LN2_LO)),
        np.where(is_k0, f - r_tiny, dk * _LN2_HI - ((r_tiny - (dk * _LN2_LO + c)) - f)),
    )
    s = f / (2.0 + f)
    z = s * s
    big_r = z * (_LG1 + z * (_LG2 + z * (_LG3 + z * (_LG4 + z * (_LG5 + z * (_LG6 + z * _LG7))))))
    main_value = np.where(
        is_k0,
        f - (hfsq - s * (hfsq + big_r)),
        dk * _LN2_HI - ((hfsq - (s * (hfsq + big_r) + (dk * _LN2_LO + c))) - f),
    )
    y = np.where(hu == 0, tiny_value, main_value)

    # |x| < 2**-29: log1p(x) = x - x*x/2 to within rounding (and x itself below 2**-54).
    y = np.where(ax < 0x3E200000, np.where(ax < 0x3C900000, xs, xs - xs * xs * 0.5), y)
    y = np.where(x == -1.0, -np.inf, y)
    y = np.where(x < -1.0, np.nan, y)
    y = np.where(x == np.inf, np.inf, y)
    return np.where(np.isnan(x), x, y)


# --------------------------------------------------------------------------
# expm1 (fdlibm s_expm1.c)
# --------------------------------------------------------------------------

_EXPM1_Q1 = _w(0xBFA11111, 0x111110F4)
_EXPM1_Q2 = _w(0x3F5A01A0, 0x19FE5585)
_EXPM1_Q3 = _w(0xBF14CE19, 0x9EAADBB7)
_EXPM1_Q4 = _w(0x3ED0CFCA, 0x86E65239)
_EXPM1_Q5 = _w(0xBE8AFDB7, 0x6E09C32D)


def _expm1_64(x: np.ndarray) -> np.ndarray:
    # x = k*ln2 + r + c, where c is the rounding error of r (kept because
    # expm1 is small where exp is near 1). expm1(r) uses a Remez fit of
    # R1(r*r) = 6/r * ((exp(r)+1)/(exp(r)-1) - 2/r) to 2**-61; the final
    # combination with 2**k depends on k so the subtraction of 1 never
    # cancels bits that matter.
    xs = np.where(np.isnan(x), 0.0, np.clip(x, -40.0, 709.8))
    k = np.rint(xs * _INV_LN2)
    hi = xs - k * _LN2_HI
    lo = k * _LN2_LO
    r = hi - lo
    c = (hi - r) - lo
    ki = k.astype(np.int64)

    hfx = 0.5 * r
    hxs = r * hfx
    r1 = 1.0 + hxs * (_EXPM1_Q1 + hxs * (_EXPM1_Q2 + hxs * (_EXPM1_Q3 + hxs * (_EXPM1_Q4 + hxs * _EXPM1_Q5))))
    t = 3.0 - r1 * hfx
    e = hxs * ((r1 - t) / (6.0 - r * t))
    k0_value = r - (r * e - hxs)

    e = r * (e - c) - c
    e = e - hxs
    km1_value = 0.5 * (r - e) - 0.5
    k1_value = np.where(r < -0.25, -2.0 * (e - (r + 0.5)), 1.0 + 2.0 * (r - e))
    # Far from 0 the -1 no longer loses bits: exp(x) - 1 directly.
    far_value = _scale(1.0 - (e - r), ki) - 1.0
    kc = np.clip(ki, 2, 56)
    two_k = _pow2(kc)
    two_minus_k = _pow2(-kc)
    # 2 <= k < 20: 1 - 2**-k is exact, so fold the -1 in before scaling.
    near_value = ((1.0 - two_minus_k) - (e - r)) * two_k
    # 20 <= k <= 56: 2**-k is below r's ulp; add it last.
    mid_value = ((r - (e + two_minus_k)) + 1.0) * two_k

    y = np.where(ki < 20, near_value, mid_value)
    y = np.where((ki <= -2) | (ki > 56), far_value, y)
    y = np.where(ki == 1, k1_value, y)
    y = np.where(ki == -1, km1_value, y)
    y = np.where(ki == 0, k0_value, y)

    ax = np.abs(x)
    y = np.where(ax < 2.0**-54, x, y)  # keeps -0
    y = np.where(x < -56.0 * _LN2_HI, -1.0, y)  # exp(x) below half an ulp of 1
    y = np.where(x > _EXP_OVERFLOW, np.inf, y)
    return np.where(np.isnan(x), x, y)


# --------------------------------------------------------------------------
# tanh (Cephes tanh.c below 0.625, fdlibm s_tanh.c above)
# --------------------------------------------------------------------------

# Moshier's minimax rational for tanh(x) = x + x*z*P(z)/Q(z), z = x*x, on
# |x| < 0.625 (relative error about 2e-17). fdlibm's -t/(t + 2) with
# t = expm1(-2|x|) amplifies t's error up to 2.3 times there (measured
# 2.1 ulp); the rational keeps x exact as the leading term (0.75 ulp).
_TANH_P = (-1.61468768441708447952e3, -9.92877231001918586564e1, -9.64399179425052238628e-1)
_TANH_Q = (4.84406305325125486048e3, 2.23548839060100448583e3, 1.12811678491632931402e2)


def _tanh64(x: np.ndarray) -> np.ndarray:
    ax = np.abs(x)
    a = np.where(np.isnan(ax), 0.0, np.minimum(ax, 22.0))
    z = a * a
    p = _horner(z, _TANH_P)
    q = _horner(z, _TANH_Q + (1.0,))
    small = a + a * ((z * p) / q)
    # 1 - 2/(expm1(2a) + 2): the subtraction is benign once tanh > 0.55.
    # Past 22, 1 - tanh(a) < 2**-62 and the result rounds to 1.
    t = _expm1_64(2.0 * a)
    large = 1.0 - 2.0 / (t + 2.0)
    magnitude = np.where(ax < 0.625, small, large)
    magnitude = np.where(ax >= 22.0, 1.0, magnitude)
    y = np.copysign(magnitude, x)  # odd, and keeps -0
    return np.where(np.isnan(x), x, y)


# --------------------------------------------------------------------------
# sin, cos (fdlibm k_sin.c, k_cos.c, e_rem_pio2.c)
# --------------------------------------------------------------------------

_INV_PIO2 = _w(0x3FE45F30, 0x6DC9C883)
# pi/2 in three 33-bit pieces plus tails: fn * piece is exact for fn < 2**20.
_PIO2_1 = _w(0x3FF921FB, 0x54400000)
_PIO2_1T = _w(0x3DD0B461, 0x1A626331)
_PIO2_2 = _w(0x3DD0B461, 0x1A600000)
_PIO2_2T = _w(0x3BA3198A, 0x2E037073)
_PIO2_3 = _w(0x3BA3198A, 0x2E000000)
_PIO2_3T = _w(0x397B839A, 0x252049C1)
_MEDIUM_LIMIT_HIGH = 0x413921FB  # high word of 2**20 * pi/2

_S1 = _w(0xBFC55555, 0x55555549)
_S2 = _w(0x3F811111, 0x1110F8A6)
_S3 = _w(0xBF2A01A0, 0x19C161D5)
_S4 = _w(0x3EC71DE3, 0x57B1FE7D)
_S5 = _w(0xBE5AE5E6, 0x8A2B9CEB)
_S6 = _w(0x3DE5D93A, 0x5ACFD57C)
_C1 = _w(0x3FA55555, 0x5555554C)
_C2 = _w(0xBF56C16C, 0x16C15177)
_C3 = _w(0x3EFA01A0, 0x19CB1590)
_C4 = _w(0xBE927E4F, 0x809C52AD)
_C5 = _w(0x3E21EE9E, 0xBDB4B1C4)
_C6 = _w(0xBDA8FAE9, 0xBE8838D4)


def _kernel_sin(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """sin(x + y) for |x + y| <= ~pi/4, y a tail below x's ulp (degree-13 Remez, error 2**-58)."""
    z = x * x
    w = z * z
    r = (_S2 + z * (_S3 + z * _S4)) + z * w * (_S5 + z * _S6)
    v = z * x
    # sin(x + y) ~ sin(x) + y*cos(x), with cos(x) ~ 1 - x*x/2.
    return x - ((z * (0.5 * y - v * r) - y) - v * _S1)


def _kernel_cos(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """cos(x + y) for |x + y| <= ~pi/4 (degree-14 Remez, error 2**-58)."""
    z = x * x
    w = z * z
    r = z * (_C1 + z * (_C2 + z * _C3)) + w * w * (_C4 + z * (_C5 + z * _C6))
    hz = 0.5 * z
    w = 1.0 - hz
    # (1 - w) - hz recovers the rounding error of w exactly.
    return w + (((1.0 - w) - hz) + (z * r - x * y))


def _rem_pio2_medium(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x = n*pi/2 + (y0 + y1) for |x| < 2**20 * pi/2 (Cody-Waite with up to 3 pieces of pi/2)."""
    fn = np.rint(x * _INV_PIO2)
    exponent_x = (_high(x) >> 20) & 0x7FF

    r1 = x - fn * _PIO2_1  # exact (Sterbenz)
    w1 = fn * _PIO2_1T
    y01 = r1 - w1
    # A second (third) piece is only needed when the reduced value lost more
    # than 16 (49) bits to cancellation; then the previous subtraction was
    # exact, so its rounding error can be dropped.
    cancel1 = exponent_x - ((_high(y01) >> 20) & 0x7FF)
    t = r1
    w = fn * _PIO2_2
    r2 = t - w
    w2 = fn * _PIO2_2T - ((t - r2) - w)
    y02 = r2 - w2
    cancel2 = exponent_x - ((_high(y02) >> 20) & 0x7FF)
    t = r2
    w = fn * _PIO2_3
    r3 = t - w
    w3 = fn * _PIO2_3T - ((t - r3) - w)
    y03 = r3 - w3

    use2 = cancel1 > 16
    use3 = use2 & (cancel2 > 49)
    r = np.where(use3, r3, np.where(use2, r2, r1))
    w = np.where(use3, w3, np.where(use2, w2, w1))
    y0 = np.where(use3, y03, np.where(use2, y02, y01))
    y1 = (r - y0) - w
    return fn.astype(np.int64), y0, y1


# Exact reduction for huge arguments: 2/pi and pi/2 as fixed-point integers.
_TWO_OVER_PI_BITS = 1344  # covers |x| < 2**1024 plus 256 fraction bits and 64 guard bits
_FRACTION_BITS = 256  # bits of x*2/pi kept below the binary point
_PIO2_BITS = 256


def _arctan_inverse(n: int, one: int) -> int:
    """arctan(1/n) * one, by its Taylor series in fixed point (error below the term count)."""
    power = one // n
    total = power
    n_squared = n * n
    term = 1
    while power:
        power //= n_squared
        term += 2
        if term % 4 == 3:
            total -= power // term
        else:
            total += power // term
    return total


@functools.cache
def _pi_fixed(bits: int) -> int:
    """floor(pi * 2**bits) up to +-1, from Machin's formula pi = 16 atan(1/5) - 4 atan(1/239)."""
    guard = 64
    one = 1 << (bits + guard)
    pi = 16 * _arctan_inverse(5, one) - 4 * _arctan_inverse(239, one)
    return pi >> guard


@functools.cache
def _reduction_constants() -> tuple[int, int]:
    """(floor(2/pi * 2**1344), floor(pi/2 * 2**256)), each within a few units."""
    guard = _TWO_OVER_PI_BITS + 64
    pi = _pi_fixed(guard)
    two_over_pi = (1 << (_TWO_OVER_PI_BITS + 1 + guard)) // pi
    pio2 = _pi_fixed(_PIO2_BITS) >> 1  # floor(pi * 2**256) / 2 = floor(pi/2 * 2**256)
    return two_over_pi, pio2


def _rem_pio2_huge(value: float) -> tuple[int, float, float]:
    """(n mod 4, y0, y1) with value = n*pi/2 + y0 + y1, exactly reduced with Python integers."""
    two_over_pi, pio2 = _reduction_constants()
    numerator, denominator = abs(value).as_integer_ratio()
    denominator_bits = denominator.bit_length() - 1  # denominator is a power of two
    shift = _TWO_OVER_PI_BITS + denominator_bits - _FRACTION_BITS
    scaled = (numerator * two_over_pi) >> shift  # |value| * 2/pi * 2**_FRACTION_BITS
    n = (scaled + (1 << (_FRACTION_BITS - 1))) >> _FRACTION_BITS
    fraction = scaled - (n << _FRACTION_BITS)  # in [-1/2, 1/2) * 2**_FRACTION_BITS
    product = fraction * pio2
    unit = 1 << (_FRACTION_BITS + _PIO2_BITS)
    y0 = product / unit  # CPython's int / int is correctly rounded
    y0_numerator, y0_denominator = y0.as_integer_ratio()
    y1 = (product * y0_denominator - y0_numerator * unit) / (unit * y0_denominator)
    if value < 0:
        return (-n) & 3, -y0, -y1
    return n & 3, y0, y1


def _rem_pio2(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    finite = np.isfinite(x)
    ix = _high(x) & 0x7FFFFFFF
    huge = finite & (ix >= _MEDIUM_LIMIT_HIGH)
    n, y0, y1 = _rem_pio2_medium(np.where(huge | ~finite, 0.0, x))
    if huge.any():
        where = np.flatnonzero(huge)
        for index, value in zip(where.tolist(), x[where].tolist()):
            n[index], y0[index], y1[index] = _rem_pio2_huge(value)
    return n, y0, y1


def _sin_cos64(x: np.ndarray, want_sin: bool = True, want_cos: bool = True):
    """(sin x, cos x) from one argument reduction and one pair of kernels; None for the one not wanted."""
    n, y0, y1 = _rem_pio2(x)
    s = _kernel_sin(y0, y1)
    c = _kernel_cos(y0, y1)
    q = n & 3
    finite = np.isfinite(x)
    sine = cosine = None
    if want_sin:
        sine = np.where(q == 0, s, np.where(q == 1, c, np.where(q == 2, -s, -c)))
        sine = np.where(finite, np.where(np.abs(x) < 2.0**-27, x, sine), np.nan)  # sin(x) rounds to x; keeps -0
    if want_cos:
        cosine = np.where(finite, np.where(q == 0, c, np.where(q == 1, -s, np.where(q == 2, -c, s))), np.nan)
    return sine, cosine


def _sin64(x: np.ndarray) -> np.ndarray:
    return _sin_cos64(x, want_cos=False)[0]


def _cos64(x: np.ndarray) -> np.ndarray:
    return _sin_cos64(x, want_sin=False)[1]


# --------------------------------------------------------------------------
# erf (fdlibm s_erf.c) and its derivative
# --------------------------------------------------------------------------

_ERX = _w(0x3FEB0AC1, 0x60000000)
_EFX8 = _w(0x3FF06EBA, 0x8214DB69)
_PP = (_w(0x3FC06EBA, 0x8214DB68), _w(0xBFD4CD7D, 0x691CB913), _w(0xBF9D2A51, 0xDBD7194F),
       _w(0xBF77A291, 0x236668E4), _w(0xBEF8EAD6, 0x120016AC))  # fmt: skip
_QQ = (_w(0x3FD97779, 0xCDDADC09), _w(0x3FB0A54C, 0x5536CEBA), _w(0x3F74D022, 0xC4D36B0F),
       _w(0x3F215DC9, 0x221C1A10), _w(0xBED09C43, 0x42A26120))  # fmt: skip
_PA = (_w(0xBF6359B8, 0xBEF77538), _w(0x3FDA8D00, 0xAD92B34D), _w(0xBFD7D240, 0xFBB8C3F1),
       _w(0x3FD45FCA, 0x805120E4), _w(0xBFBC6398, 0x3D3E28EC), _w(0x3FA22A36, 0x599795EB),
       _w(0xBF61BF38, 0x0A96073F))  # fmt: skip
_QA = (_w(0x3FBB3E66, 0x18EEE323), _w(0x3FE14AF0, 0x92EB6F33), _w(0x3FB2635C, 0xD99FE9A7),
       _w(0x3FC02660, 0xE763351F), _w(0x3F8BEDC2, 0x6B51DD1C), _w(0x3F888B54, 0x5735151D))  # fmt: skip
_RA = (_w(0xBF843412, 0x600D6435), _w(0xBFE63416, 0xE4BA7360), _w(0xC0251E04, 0x41B0E726),
       _w(0xC04F300A, 0xE4CBA38D), _w(0xC0644CB1, 0x84282266), _w(0xC067135C, 0xEBCCABB2),
       _w(0xC0545265, 0x57E4D2F2), _w(0xC023A0EF, 0xC69AC25C))  # fmt: skip
_SA = (_w(0x4033A6B9, 0xBD707687), _w(0x4061350C, 0x526AE721), _w(0x407B290D, 0xD58A1A71),
       _w(0x40842B19, 0x21EC2868), _w(0x407AD021, 0x57700314), _w(0x405B28A3, 0xEE48AE2C),
       _w(0x401A47EF, 0x8E484A93), _w(0xBFAEEFF2, 0xEE749A62))  # fmt: skip
_RB = (_w(0xBF843412, 0x39E86F4A), _w(0xBFE993BA, 0x70C285DE), _w(0xC031C209, 0x555F995A),
       _w(0xC064145D, 0x43C5ED98), _w(0xC083EC88, 0x1375F228), _w(0xC0900461, 0x6A2E5992),
       _w(0xC07E384E, 0x9BDC383F))  # fmt: skip
_SB = (_w(0x403E568B, 0x261D5190), _w(0x40745CAE, 0x221B9F0A), _w(0x409802EB, 0x189D5118),
       _w(0x40A8FFB7, 0x688C246A), _w(0x40A3F219, 0xCEDF3BE6), _w(0x407DA874, 0xE79FE763),
       _w(0xC03670E2, 0x42712D62))  # fmt: skip


def _erf64(x: np.ndarray) -> np.ndarray:
    ax = np.abs(x)
    a = np.where(np.isfinite(ax), np.minimum(ax, 6.0), 1.0)

    # |x| < 0.84375: erf(x) = x + x*P(x*x)/Q(x*x) (fdlibm rational fit, 2**-57.9).
    z = a * a
    y = _horner(z, _PP) / _horner(z, _QQ, leading_one=True)
    near0 = x + x * y
    # |x| < 2**-28: erf(x) = x * 2/sqrt(pi); scaled by 8 so subnormal x keeps its bits.
    tiny = (8.0 * x + _EFX8 * x) * 0.125

    # 0.84375 <= |x| < 1.25: erf(1 + s) - erx as P1(s)/Q1(s), erx = erf(1) to 24 bits.
    s = a - 1.0
    near1 = _ERX + _horner(s, _PA) / _horner(s, _QA, leading_one=True)

    # 1.25 <= |x| < 6: erfc(x) = exp(-x*x - 0.5625 + R(1/x**2)/S(1/x**2)) / x.
    # With z = x rounded to 21 bits, z*z and -z*z - 0.5625 are exact; the rest
    # of -x*x, (z - x)(z + x), rides along as the tail of the exponent.
    inv = 1.0 / (a * a)
    first = a < _from_high(np.array([0x4006DB6E]))[0]  # 1/0.35
    big_r = np.where(first, _horner(inv, _RA), _horner(inv, _RB))
    big_s = np.where(first, _horner(inv, _SA, leading_one=True), _horner(inv, _SB, leading_one=True))
    zh = _clear_low(a)
    head = -zh * zh - 0.5625
    tail = (zh - a) * (zh + a) + big_r / big_s
    k, u = _exp_parts(head, tail)
    tails = 1.0 - _scale(1.0 - u, k) / a

    mag = np.where(ax < 1.25, near1, tails)
    mag = np.where(ax >= 6.0, 1.0, mag)  # 1 - erfc(6) rounds to 1
    signed = np.copysign(mag, x)
    y = np.where(ax < 0.84375, np.where(ax < 2.0**-28, tiny, near0), signed)
    return np.where(np.isnan(x), x, y)


_TWO_OVER_SQRT_PI_HI = _w(0x3FF20DD7, 0x50429B6D)  # 2/sqrt(pi) rounded
_TWO_OVER_SQRT_PI_LO = _w(0x3C71AE3A, 0x914FED80)  # 2/sqrt(pi) - _HI
_VELTKAMP = 134217729.0  # 2**27 + 1: splits a double into two 26-bit halves


def _split(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """a = hi + lo exactly, each with at most 26 significant bits (Veltkamp), for |a| < 2**995."""
    t = _VELTKAMP * a
    hi = t - (t - a)
    return hi, a - hi


def _two_product(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """a*b = p + e exactly (Dekker), from separate multiplies and adds: there is no FMA to lean on."""
    p = a * b
    a_hi, a_lo = _split(a)
    b_hi, b_lo = _split(b)
    return p, ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo


def _two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """a + b = s + e exactly (Knuth), whatever the magnitudes."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _erf_derivative64(x: np.ndarray) -> np.ndarray:
    # 2/sqrt(pi) * exp(-x*x). Rounding x*x would cost up to |x|**2 * 2**-53
    # relative error (25 ulp at x = 5), so x*x is formed exactly as p + e
    # and e enters the exponential as a tail. The kernel returns
    # exp(-p - e) = (1 - u) * 2**k; C*(1 - u) is formed as an unevaluated
    # sum (C_hi - C_hi*u exactly, plus C_lo) and rounded once, which takes
    # the worst error from 1.25 to 0.9 ulp.
    ax = np.abs(x)
    a = np.where(np.isfinite(ax), np.minimum(ax, 30.0), 0.0)
    p, e = _two_product(a, a)
    k, u = _exp_parts(-p, -e)
    c_hi = np.full_like(u, _TWO_OVER_SQRT_PI_HI)
    cu, cu_err = _two_product(c_hi, u)
    head, head_err = _two_sum(c_hi, -cu)
    y = head + ((head_err + _TWO_OVER_SQRT_PI_LO) - cu_err)
    y = _scale(y, k)
    y = np.where(ax >= 30.0, 0.0, y)  # 2/sqrt(pi) * exp(-900) is far below the smallest subnormal
    return np.where(np.isnan(x), x, y)


# --------------------------------------------------------------------------
# pow (fdlibm e_pow.c)
# --------------------------------------------------------------------------

_BP = (1.0, 1.5)
_DP_H = (0.0, _w(0x3FE2B803, 0x40000000))  # log2(1.5) head
_DP_L = (0.0, _w(0x3E4CFDEB, 0x43CFD006))  # log2(1.5) tail
_POW_L = (_w(0x3FE33333, 0x33333303), _w(0x3FDB6DB6, 0xDB6FABFF), _w(0x3FD55555, 0x518F264D),
          _w(0x3FD17460, 0xA91D4101), _w(0x3FCD864A, 0x93C9DB65), _w(0x3FCA7E28, 0x4A454EEF))  # fmt: skip
_POW_LN2 = _w(0x3FE62E42, 0xFEFA39EF)
_POW_LN2_H = _w(0x3FE62E43, 0x00000000)
_POW_LN2_L = _w(0xBE205C61, 0x0CA86C39)
_OVT = 8.0085662595372944372e-17  # -(1024 - log2(overflow + half ulp))
_CP = _w(0x3FEEC709, 0xDC3A03FD)  # 2/(3 ln2)
_CP_H = _w(0x3FEEC709, 0xE0000000)
_CP_L = _w(0xBE3E2FE0, 0x145B01F5)
_IVLN2 = _w(0x3FF71547, 0x652B82FE)
_THIRD = _w(0x3FD55555, 0x55555555)


def _log2_extended(ax: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log2(ax) as t1 + t2 with t1 having 21 significant bits, to about 2**-64 relative (ax > 0 finite)."""
    n = np.zeros(ax.shape, dtype=np.int64)
    subnormal = ax < _MIN_NORMAL
    ax = np.where(subnormal, ax * 2.0**53, ax)
    n = np.where(subnormal, n - 53, n)
    ix = _high(ax)
    n = n + (ix >> 20) - 0x3FF
    j = ix & 0x000FFFFF
    # Reduce to [1, sqrt(3/2)) around 1 or [sqrt(3/2), sqrt(3)) around 1.5.
    k = np.where(j <= 0x3988E, 0, np.where(j < 0xBB67A, 1, 0))
    up = j >= 0xBB67A
    n = np.where(up, n + 1, n)
    ix = np.where(up, (j | 0x3FF00000) - 0x00100000, j | 0x3FF00000)
    ax = _with_high(ax, ix)
    bp = np.where(k == 1, _BP[1], _BP[0])
    dp_h = np.where(k == 1, _DP_H[1], _DP_H[0])
    dp_l = np.where(k == 1, _DP_L[1], _DP_L[0])

    # s = (ax - bp)/(ax + bp) = s_h + s_l, s_h with a zero low word.
    u = ax - bp
    v = 1.0 / (ax + bp)
    ss = u * v
    s_h = _clear_low(ss)
    t_h = _from_high(((ix >> 1) | 0x20000000) + 0x00080000 + (k << 18))  # head of ax + bp
    t_l = ax - (t_h - bp)
    s_l = v * ((u - s_h * t_h) - s_h * t_l)
    # log(ax/bp) = 2s + 2/3 s**3 + s**5 * R(s*s); carried as (3 + s*s + ...) * s.
    s2 = ss * ss
    r = s2 * s2 * _horner(s2, _POW_L)
    r = r + s_l * (s_h + ss)
    s2 = s_h * s_h
    t_h = _clear_low(3.0 + s2 + r)
    t_l = r - ((t_h - 3.0) - s2)
    u = s_h * t_h
    v = s_l * t_h + t_l * ss
    p_h = _clear_low(u + v)
    p_l = v - (p_h - u)
    # Multiply by 2/(3 ln2) to get log2.
    z_h = _CP_H * p_h
    z_l = _CP_L * p_h + p_l * _CP + dp_l
    t = n.astype(np.float64)
    t1 = _clear_low(((z_h + z_l) + dp_h) + t)
    t2 = z_l - (((t1 - t) - dp_h) - z_h)
    return t1, t2


_IVLN2_TAIL = _w(0x3C7777D0, 0xFFDA0D24)  # 1/ln2 - _IVLN2


def _log2_near_one(ax: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log2(ax) as t1 + t2 for |ax - 1| < 2**-20 and |y| > 2**31, to about 2**-72 relative.

    y*log2(x) can reach 1075 here, so log2(x) needs about 70 correct bits.
    fdlibm's version multiplies t = ax - 1 (up to 33 bits) by a 24-bit head
    of 1/ln2 and assumes the product is exact; it is not, and pow came out
    up to 600 ulp wrong. Here t*(1/ln2) is formed exactly (Dekker) and the
    small terms are added in the tail.
    """
    t = ax - 1.0  # exact
    w = (t * t) * (0.5 - t * (_THIRD - t * 0.25))  # t - log(1 + t), |w| < 2**-21 |t|
    head, head_err = _two_product(t, np.full_like(t, _IVLN2))
    v = (head_err + t * _IVLN2_TAIL) - w * _IVLN2
    t1 = _clear_low(head + v)
    t2 = v - (t1 - head)  # t1 - head is exact: they agree to 21 bits
    return t1, t2


def _exp2_extended(p_h: np.ndarray, p_l: np.ndarray) -> np.ndarray:
    """2**(p_h + p_l) for -1075 <= p_h + p_l <= 1024; p_h has at most 42 significant bits."""
    z = p_l + p_h
    n = np.rint(np.clip(z, -1100.0, 1100.0))
    p_h = p_h - n  # exact
    t = _clear_low(p_l + p_h)
    u = t * _POW_LN2_H
    v = (p_l - (t - p_h)) * _POW_LN2 + t * _POW_LN2_L
    z = u + v
    w = v - (z - u)
    t = z * z
    t1 = z - t * (_EXP_P1 + t * (_EXP_P2 + t * (_EXP_P3 + t * (_EXP_P4 + t * _EXP_P5))))
    r = (z * t1) / (t1 - 2.0) - (w + z * w)
    z = 1.0 - (r - z)
    return _scale(z, n.astype(np.int64))


def _pow64(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    ax = np.abs(x)
    ay = np.abs(y)
    negative_x = np.signbit(x)
    is_integer = np.isfinite(y) & (np.floor(ay) == ay)
    is_odd = is_integer & (ay < 2.0**53) & (np.floor(ay * 0.5) * 2.0 != ay)
    result_sign = np.where(negative_x & is_odd, -1.0, 1.0)

    # General case: |x| finite and nonzero, y finite and nonzero.
    general = np.isfinite(x) & (x != 0.0) & np.isfinite(y) & (y != 0.0)
    gx = np.where(general, ax, 2.0)
    gy = np.where(general, y, 2.0)
    ix = _high(gx)
    iy = _high(np.abs(gy))
    # |y| > 2**31: unless |x| is within 2**-20 of 1 the result over/underflows.
    huge_y = iy > 0x41E00000
    near_one = (ix >= 0x3FEFFFFF) & (ix <= 0x3FF00000)
    l1, l2 = _log2_extended(gx)
    n1, n2 = _log2_near_one(gx)
    use_near = huge_y & near_one
    t1 = np.where(use_near, n1, l1)
    t2 = np.where(use_near, n2, l2)

    # y * log2(x) = p_h + p_l with p_h = y1*t1 exact (21 x 21 bits).
    y1 = _clear_low(gy)
    p_l = (gy - y1) * t1 + gy * t2
    p_h = y1 * t1
    z = p_l + p_h
    overflow = (z > 1024.0) | ((z == 1024.0) & (p_l + _OVT > z - p_h))
    underflow = (z < -1075.0) | ((z == -1075.0) & (p_l <= z - p_h))
    magnitude = _exp2_extended(np.where(overflow | underflow, 0.0, p_h), np.where(overflow | underflow, 0.0, p_l))
    magnitude = np.where(overflow, np.inf, np.where(underflow, 0.0, magnitude))
    below_one = ix < 0x3FF00000
    grows = below_one == (gy < 0.0)  # |x| < 1 with y < 0, or |x| > 1 with y > 0
    magnitude = np.where(huge_y & ~near_one, np.where(grows, np.inf, 0.0), magnitude)
    value = result_sign * magnitude

    # (negative) ** (non-integer) is not real.
    value = np.where(negative_x & ~is_integer, np.nan, value)
    # x is +-0, +-inf or +-1: |x| or 1/|x|, with the sign of an odd power.
    special_x = (ax == 0.0) | (ax == np.inf) | (ax == 1.0)
    zx = np.where(y < 0.0, 1.0 / ax, ax)
    zx = np.where(negative_x & is_odd, -zx, zx)
    zx = np.where(negative_x & (ax == 1.0) & ~is_integer, np.nan, zx)
    value = np.where(special_x, zx, value)
    # Exact shortcuts: y = 1, -1, 2, and 0.5 for x >= +0.
    value = np.where(y == 2.0, x * x, value)
    value = np.where(y == -1.0, 1.0 / x, value)
    value = np.where(y == 1.0, x, value)
    value = np.where((y == 0.5) & ~negative_x, np.sqrt(np.where(negative_x, 0.0, x)), value)
    # y = +-inf: 1 for |x| = 1, otherwise inf or 0 by which side of 1 |x| is on.
    value = np.where(
        np.isinf(y),
        np.where(ax == 1.0, 1.0, np.where((ax > 1.0) == (y > 0.0), np.inf, 0.0)),
        value,
    )
    value = np.where(np.isnan(x) | np.isnan(y), np.nan, value)
    value = np.where(x == 1.0, 1.0, value)
    return np.where(y == 0.0, 1.0, value)


CHUNK = 1 << 12
"""Elements per kernel call (refmath's and topos.init's). The kernels build
a dozen float64 temporaries each: over 2^23 elements at once every one is
fresh memory from the kernel (page faults), and log took 603 ns an element
against 60 in chunks of 2^12, whose 32 KiB temporaries malloc reuses (2^14
and 2^16 ran 1.5-2x slower than 2^12 in fresh processes). The kernels are
pointwise, so the chunks change no bit."""


def chunks(size: int) -> Iterator[slice]:
    """The slices of ``range(size)``, CHUNK elements each (the last may be shorter)."""
    return (slice(start, start + CHUNK) for start in range(0, size, CHUNK))


def pointwise(kernel: Callable[..., np.ndarray], dtype, *flats: np.ndarray) -> np.ndarray:
    """``kernel`` over equal-length flat arrays, CHUNK elements a call, into a new ``dtype`` array."""
    if flats[0].size <= CHUNK:
        return np.asarray(kernel(*flats), dtype=dtype)
    out = np.empty(flats[0].size, dtype=dtype)
    for part in chunks(out.size):
        out[part] = kernel(*(flat[part] for flat in flats))
    return out


FLOAT64_KERNELS: Mapping[str, Callable[..., np.ndarray]] = MappingProxyType({
    "exp": _exp64, "log": _log64, "log1p": _log1p64, "expm1": _expm1_64, "tanh": _tanh64,
    "sin": _sin64, "cos": _cos64, "erf": _erf64, "erf_derivative": _erf_derivative64, "pow": _pow64,
})
"""The fdlibm kernels over float64 arrays, by function: the reference math of every built-in element.

An element's function is its kernel on the exactly widened input, rounded
once to the element (``pow`` takes two arrays).
"""


def sin_cos64(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """sin and cos of a float64 array at once: the bits of sin(x) and cos(x), one argument reduction.

    topos.init's Box-Muller needs both of every angle.
    """
    x = np.asarray(x)
    if x.dtype != _FLOAT64:
        raise ShapeError(f"sin_cos64 takes a float64 array, got {x.dtype}; widen it first")
    flat = np.ascontiguousarray(x).reshape(-1)
    sine, cosine = np.empty(flat.size), np.empty(flat.size)
    with np.errstate(all="ignore"):
        for part in chunks(flat.size):
            sine[part], cosine[part] = _sin_cos64(flat[part])
    return sine.reshape(x.shape), cosine.reshape(x.shape)


