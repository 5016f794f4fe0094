"""Run NumPy without its AVX/AVX2/FMA3/AVX-512 code paths, to prove refmath does not depend on them.

``NPY_DISABLE_CPU_FEATURES`` only accepts names NumPy dispatches to at run
time (``__cpu_dispatch__``). NumPy 2.4 on x86_64 groups the SIMD features
into targets -- baseline ``X86_V2`` (SSE up to SSE4.2, POPCNT), dispatched
``X86_V3`` (AVX, AVX2, FMA3, F16C, BMI), ``X86_V4`` (AVX-512 F/CD/VL/BW/DQ),
``AVX512_ICL``, ``AVX512_SPR`` -- refuses to start if asked to disable a
baseline target, and ignores (with an ImportWarning) any name that is not
a dispatch target, such as ``AVX2``. Older NumPy dispatches on single
features (``AVX2``, ``FMA3``, ``AVX512F``, ...). So the helper disables the
dispatch targets this machine supports whose names are AVX/FMA/F16C/X86_V3/
X86_V4; the baseline (SSE4.2 here) always stays on.

Run as a script (``python _cpu_features.py refmath|numpy``) it prints the
SHA-256 digests of refmath's (or NumPy's own) outputs on a fixed grid as
JSON, so a test can compare a child process against itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np

try:  # NumPy 2.x
    from numpy._core import _multiarray_umath as _umath
except ImportError:  # NumPy 1.x
    from numpy.core import _multiarray_umath as _umath  # type: ignore[no-redef]

_SIMD_PREFIXES = ("AVX", "FMA", "F16C", "X86_V3", "X86_V4")


def dispatchable_simd_features() -> tuple[str, ...]:
    """The AVX-family dispatch targets NumPy can switch off on this machine (empty off x86)."""
    available = _umath.__cpu_features__
    baseline = set(getattr(_umath, "__cpu_baseline__", ()))
    dispatch = getattr(_umath, "__cpu_dispatch__", None)
    candidates = list(dispatch) if dispatch is not None else list(available)
    return tuple(
        name
        for name in candidates
        if available.get(name) and name not in baseline and name.startswith(_SIMD_PREFIXES)
    )


def disable_simd_env() -> dict[str, str] | None:
    """A copy of ``os.environ`` with ``NPY_DISABLE_CPU_FEATURES`` naming every dispatchable AVX-family target.

    None when this machine has no such target to switch off (not x86_64, or
    a CPU without AVX): then there is nothing for a comparison to prove.
    """
    features = dispatchable_simd_features()
    if not features:
        return None
    env = dict(os.environ)
    env["NPY_DISABLE_CPU_FEATURES"] = " ".join(features)
    return env


def active_disabled_features() -> tuple[str, ...]:
    """The targets named in ``NPY_DISABLE_CPU_FEATURES`` that this process reports as switched off."""
    requested = os.environ.get("NPY_DISABLE_CPU_FEATURES", "").replace(",", " ").split()
    return tuple(name for name in requested if _umath.__cpu_features__.get(name) is False)


def _grid(dtype) -> dict[str, tuple[np.ndarray, ...]]:
    """A fixed grid per function: long enough for every SIMD loop, covering normal and edge inputs."""
    def cast(values):
        return np.asarray(values, dtype=np.float64).astype(dtype)

    # Only IEEE-exact operations build the grid: np.exp2 would itself move
    # with the SIMD setting and make the comparison meaningless.
    def powers_of_two(low: int, high: int) -> np.ndarray:
        return ((np.arange(low, high + 1, dtype=np.int64) + 1023) << 52).view(np.float64)

    wide = np.linspace(-30.0, 30.0, 4099)
    positive = np.outer(powers_of_two(-120, 120), np.linspace(1.0, 2.0, 17, endpoint=False)).ravel()
    huge = np.outer(powers_of_two(0, 100), np.linspace(1.0, 2.0, 3, endpoint=False)).ravel()
    return {
        "exp": (cast(np.linspace(-100.0, 88.0, 4099)),),
        "log": (cast(positive),),
        "log1p": (cast(np.linspace(-0.999, 50.0, 4099)),),
        "expm1": (cast(np.linspace(-20.0, 80.0, 4099)),),
        "tanh": (cast(np.linspace(-12.0, 12.0, 4099)),),
        "sin": (cast(np.concatenate([wide, huge])),),
        "cos": (cast(np.concatenate([wide, huge])),),
        "erf": (cast(np.linspace(-7.0, 7.0, 4099)),),
        "erf_derivative": (cast(np.linspace(-10.0, 10.0, 4099)),),
        "pow": (cast(positive[1700:2400]), cast(np.linspace(-14.0, 14.0, 700))),
    }


def _digest(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def _dtypes():
    import ml_dtypes

    return (np.dtype(np.float32), np.dtype(np.float64), np.dtype(ml_dtypes.bfloat16))


def refmath_digests() -> dict[str, str]:
    """SHA-256 of every refmath function's output on the grid, per dtype."""
    from topos.base import refmath

    digests = {}
    for dtype in _dtypes():
        for name, args in _grid(dtype).items():
            digests[f"{name}/{dtype}"] = _digest(getattr(refmath, name)(*args))
    return digests


_NUMPY_OWN = {
    "exp": np.exp,
    "log": np.log,
    "log1p": np.log1p,
    "expm1": np.expm1,
    "tanh": np.tanh,
    "sin": np.sin,
    "cos": np.cos,
    "pow": np.power,
}


def numpy_digests() -> dict[str, str]:
    """SHA-256 of NumPy's own transcendental ufuncs on the same grid (float32 and float64)."""
    digests = {}
    with np.errstate(all="ignore"):
        for dtype in _dtypes()[:2]:
            grid = _grid(dtype)
            for name, function in _NUMPY_OWN.items():
                digests[f"{name}/{dtype}"] = _digest(function(*grid[name]))
    return digests


if __name__ == "__main__":
    which = sys.argv[1]
    report = {
        "disabled": list(active_disabled_features()),
        "digests": refmath_digests() if which == "refmath" else numpy_digests(),
    }
    print(json.dumps(report))
