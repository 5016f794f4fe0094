"""Grading refmath against mpmath: sample points, exact references, errors in ulps.

Development-only: it imports ``mpmath`` lazily, and only the refmath tests
and ``benchmarks/refmath_accuracy.py`` use it. Errors are measured in ulps
of the *target* type at the reference value (the ulp of the binade the true
value lies in, floored at the smallest subnormal spacing), so a correctly
rounded result scores at most 0.5.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from topos.base import refmath

FLOAT32 = np.dtype(np.float32)
FLOAT64 = np.dtype(np.float64)
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = (FLOAT64, FLOAT32, BFLOAT16)
REFERENCE_BITS = 120

# precision p (significand bits with the hidden one), minimum normal exponent.
_FORMAT = {FLOAT64: (53, -1022), FLOAT32: (24, -126), BFLOAT16: (8, -126)}


def _log_range(dtype: np.dtype) -> tuple[float, float]:
    """ln of the largest finite value and of the smallest subnormal of ``dtype``."""
    if dtype == FLOAT64:
        return 709.78, -744.44
    if dtype == FLOAT32:
        return 88.72, -103.28
    return 88.72, -92.19


def _max_exponent(dtype: np.dtype) -> int:
    return 1023 if dtype == FLOAT64 else 127


def _min_exponent(dtype: np.dtype) -> int:
    """log2 of the smallest subnormal."""
    return -1074 if dtype == FLOAT64 else (-149 if dtype == FLOAT32 else -133)


def _signed_log_uniform(rng, count: int, low: float, high: float) -> np.ndarray:
    magnitude = np.exp2(rng.uniform(low, high, count))
    return magnitude * rng.choice([-1.0, 1.0], count)


_BITS = {FLOAT64: np.int64, FLOAT32: np.int32, BFLOAT16: np.int16}


def _neighbours(points, dtype: np.dtype, steps: int = 3) -> np.ndarray:
    """Each point rounded to ``dtype`` and its ``steps`` neighbours on either side (by bit pattern)."""
    with np.errstate(over="ignore", invalid="ignore"):
        base = np.asarray(points, dtype=np.float64).astype(dtype)
        bits = base.view(_BITS[dtype])
        out = [base.astype(np.float64)]
        for step in range(1, steps + 1):
            for moved in (bits + step, bits - step):
                out.append(moved.astype(_BITS[dtype]).view(dtype).astype(np.float64))
    values = np.concatenate(out)
    return values[np.isfinite(values)]


def all_bfloat16() -> np.ndarray:
    """Every finite bfloat16 value, as float64."""
    with np.errstate(invalid="ignore"):
        values = np.arange(1 << 16, dtype=np.uint16).view(BFLOAT16).astype(np.float64)
    return values[np.isfinite(values)]


_DOMAIN = {
    "log": lambda x: x >= 0.0,
    "log1p": lambda x: x >= -1.0,
}


def sample(name: str, dtype, count: int, seed: int = 20240607, every: int = 1):
    """Points for grading ``name`` in ``dtype`` (float64 arrays holding exact ``dtype`` values).

    Returns ``x`` (or ``(x, y)`` for pow). float32/float64 get ``count``
    points mixing uniform draws over the useful range, log-uniform
    magnitudes and neighbours of special points; bfloat16 gets every finite
    value in the domain (pow: ``count`` sampled pairs), or every
    ``every``-th of them in order.
    """
    dtype = np.dtype(dtype)
    rng = np.random.default_rng([seed, refmath.SUPPORTED.index(name), DTYPES.index(dtype)])
    if name == "pow":
        return _sample_pow(rng, dtype, count)
    if dtype == BFLOAT16:
        x = all_bfloat16()
        keep = _DOMAIN.get(name, lambda v: np.isfinite(v))(x)
        return x[keep][::every]
    part = count // 3
    ln_max, ln_min = _log_range(dtype)
    e_max, e_min = _max_exponent(dtype), _min_exponent(dtype)
    special: list[float] = [0.0]
    if name == "exp":
        uniform = rng.uniform(ln_min - 1.0, ln_max + 0.5, part)
        logs = _signed_log_uniform(rng, part, -60, np.log2(ln_max))
        special = [ln_max, ln_min, -ln_max, 1.0, -1.0, 0.5 * np.log(2.0), np.log(2.0)]
    elif name == "log":
        uniform = rng.uniform(0.5, 2.0, part)
        logs = np.exp2(rng.uniform(e_min, e_max + 1, part))
        special = [1.0, 2.0, 0.5, np.sqrt(2.0), np.sqrt(0.5), 2.0**e_min, 2.0**(e_min + 10)]
    elif name == "log1p":
        uniform = rng.uniform(-1.0, 4.0, part)
        logs = np.concatenate([
            np.exp2(rng.uniform(-80, e_max + 1, part - part // 3)),
            -np.exp2(rng.uniform(-80, 0, part // 3)),
        ])
        special = [-1.0 + 2.0**-20, -0.5, np.sqrt(2.0) - 1.0, np.sqrt(0.5) - 1.0, 1.0, 2.0**-29, -(2.0**-29)]
    elif name == "expm1":
        uniform = rng.uniform(-40.0, ln_max + 0.5, part)
        logs = _signed_log_uniform(rng, part, -80, np.log2(ln_max))
        special = [ln_max] + [m * np.log(2.0) for m in (0.5, -0.5, 1.5, 20.0, 56.0)]
    elif name == "tanh":
        uniform = rng.uniform(-25.0, 25.0, part)
        logs = _signed_log_uniform(rng, part, -60, 5)
        special = [1.0, -1.0, 22.0, 2.0**-28, 0.55]
    elif name in ("sin", "cos"):
        uniform = rng.uniform(-10.0, 10.0, part)
        top: float = 73 if dtype == FLOAT64 else 127  # 2**73 ~ 1e22
        logs = _signed_log_uniform(rng, part, -30, top)
        k = np.concatenate([np.arange(1, 64), rng.integers(64, 2**21, 200), rng.integers(2**21, 2**50, 100)])
        # 6381956970095103 * 2**797 is the double closest to a multiple of pi/2.
        hard = [1e22, 6381956970095103 * 2.0**797, 2.0**-27, np.pi / 4, 2.0**20 * np.pi / 2]
        special = list(k * (np.pi / 2)) + hard
    elif name == "erf":
        uniform = rng.uniform(-7.0, 7.0, part)
        logs = _signed_log_uniform(rng, part, -60, 3)
        special = [0.84375, 1.25, 1 / 0.35, 6.0, 2.0**-28, 1.0]
    elif name == "erf_derivative":
        top = 28.0 if dtype == FLOAT64 else 10.5
        uniform = rng.uniform(-top, top, part)
        logs = _signed_log_uniform(rng, part, -60, np.log2(top))
        special = [top, 1.0, 5.0, 2.0**-28]
    else:
        raise KeyError(name)
    near = _neighbours(special + [-v for v in special], dtype)
    x = np.concatenate([uniform, logs]).astype(dtype).astype(np.float64)
    x = np.concatenate([near, x])
    rest = count - len(x)
    if rest > 0:  # top up with more uniform draws
        x = np.concatenate([x, rng.choice(uniform, rest).astype(dtype).astype(np.float64)])
    x = x[:count]
    keep = _DOMAIN.get(name, lambda v: np.isfinite(v))(x)
    return x[keep]


def _sample_pow(rng, dtype: np.dtype, count: int):
    part = count // 6
    ln_max, _ = _log_range(dtype)
    # positive bases over a wide range, exponents that keep most results finite
    x1 = np.exp2(rng.uniform(-30, 30, part))
    y1 = rng.uniform(-1.0, 1.0, part) * ln_max / np.maximum(np.abs(np.log(x1)), 1e-3)
    # bases near 1 with large exponents (the case pow exists for)
    x2 = 1.0 + rng.uniform(-(2.0**-10), 2.0**-10, part)
    y2 = _signed_log_uniform(rng, part, 0, 20 if dtype != FLOAT64 else 40)
    # |x - 1| < 2**-20 with |y| > 2**31: the extra-precise log2 branch
    x3 = 1.0 + rng.uniform(-(2.0**-21), 2.0**-20, part)
    y3 = _signed_log_uniform(rng, part, 31, 42)
    # negative bases with integer exponents
    x4 = -np.exp2(rng.uniform(-8, 8, part))
    y4 = np.rint(rng.uniform(-60, 60, part))
    # small integers: exact results must come out exact
    x5 = rng.integers(1, 20, part).astype(np.float64) * rng.choice([-1.0, 1.0], part)
    y5 = rng.integers(-12, 13, part).astype(np.float64)
    # anything positive: overflow, underflow and subnormal results included
    x6 = np.exp2(rng.uniform(-20, 20, count - 5 * part))
    y6 = _signed_log_uniform(rng, count - 5 * part, -10, 12)
    x = np.concatenate([x1, x2, x3, x4, x5, x6]).astype(dtype).astype(np.float64)
    y = np.concatenate([y1, y2, y3, y4, y5, y6]).astype(dtype).astype(np.float64)
    # rounding y to a narrow type can make a negative base's exponent non-integer
    keep = (x > 0) | (np.floor(y) == y)
    return x[keep], y[keep]


def _reference_function(name: str):
    from mpmath import mp

    two_over_sqrt_pi = 2 / mp.sqrt(mp.pi)
    return {
        "exp": mp.exp,
        "log": mp.log,
        "log1p": mp.log1p,
        "expm1": mp.expm1,
        "tanh": mp.tanh,
        "sin": mp.sin,
        "cos": mp.cos,
        "erf": mp.erf,
        "erf_derivative": lambda v: two_over_sqrt_pi * mp.exp(-v * v),
        "pow": mp.power,
    }[name]


def ulp_errors(name: str, dtype, inputs, outputs: np.ndarray) -> np.ndarray:
    """Error of each output in ulps of ``dtype`` against mpmath at 120 bits (inf when a special value is wrong)."""
    from mpmath import mp

    dtype = np.dtype(dtype)
    precision, min_exponent = _FORMAT[dtype]
    largest = mp.mpf(float(ml_dtypes.finfo(dtype).max))
    overflow_at = largest + mp.ldexp(1, _max_exponent(dtype) - precision)  # max + half an ulp
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    columns = [a.tolist() for a in args]
    produced = np.asarray(outputs, dtype=np.float64).tolist()
    errors = np.empty(len(produced))
    with mp.workprec(REFERENCE_BITS):
        function = _reference_function(name)
        for i, y in enumerate(produced):
            reference = function(*(mp.mpf(c[i]) for c in columns))
            if y != y:  # nan where a number was due
                errors[i] = np.inf
                continue
            if abs(reference) >= overflow_at:
                errors[i] = 0.0 if y == (np.inf if reference > 0 else -np.inf) else np.inf
                continue
            if abs(y) == np.inf:
                errors[i] = np.inf
                continue
            if reference == 0:
                errors[i] = 0.0 if y == 0 else np.inf
                continue
            binade = max(int(mp.frexp(reference)[1]) - 1, min_exponent)
            errors[i] = float(mp.ldexp(abs(mp.mpf(y) - reference), precision - 1 - binade))
    return errors


def evaluate(name: str, dtype, inputs) -> np.ndarray:
    """refmath's result for float64 arrays holding exact ``dtype`` values, widened back to float64."""
    dtype = np.dtype(dtype)
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    typed = [a.astype(dtype) for a in args]
    return getattr(refmath, name)(*typed).astype(np.float64)


def worst_error(name: str, dtype, count: int, seed: int = 20240607, every: int = 1) -> tuple[float, object, int]:
    """(worst ulp error, the argument where it occurs, number of points) for one function and dtype."""
    inputs = sample(name, dtype, count, seed, every)
    outputs = evaluate(name, dtype, inputs)
    errors = ulp_errors(name, dtype, inputs, outputs)
    i = int(np.argmax(errors))
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    where = tuple(float(a[i]) for a in args)
    return float(errors[i]), where if len(where) > 1 else where[0], len(errors)
