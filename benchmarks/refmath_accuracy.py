"""Print refmath's worst error in ulps against mpmath, per function and element type.

    .venv/bin/python benchmarks/refmath_accuracy.py [--points 100000] [--jobs 2]

The points and the 120-bit mpmath references come from ``topos.base.ulp`` (the
same sampler the tests use: uniform draws over each function's useful
range, log-uniform magnitudes and neighbours of special points; every
finite bfloat16 in the domain). A second table times each function on a
64x128 float32 array. Nothing here asserts: the bounds live in
``tests/test_refmath.py``.
"""

from __future__ import annotations

import argparse
import platform
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from topos.base import refmath
from topos.base import ulp as _ulp


def _measure(job: tuple[str, str, int]) -> tuple[str, str, float, object, int, float]:
    name, dtype_name, points = job
    dtype = {str(d): d for d in _ulp.DTYPES}[dtype_name]
    start = time.perf_counter()
    worst, where, count = _ulp.worst_error(name, dtype, points)
    return name, dtype_name, worst, where, count, time.perf_counter() - start


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def accuracy_table(points: int, jobs: int) -> None:
    dtype_names = [str(d) for d in _ulp.DTYPES]
    work = [(name, d, points) for name in refmath.SUPPORTED for d in dtype_names]
    with np.errstate(all="ignore"):
        if jobs > 1:
            with ProcessPoolExecutor(jobs) as pool:
                results = list(pool.map(_measure, work))
        else:
            results = [_measure(job) for job in work]
    table = {(name, d): (worst, where, count) for name, d, worst, where, count, _ in results}
    print(f"worst error in ulps of the result type (mpmath at {_ulp.REFERENCE_BITS} bits)")
    print(f"machine: {platform.machine()} {_cpu_name()}, numpy {np.__version__}, {points} points per f32/f64 sweep")
    print()
    print("| function | " + " | ".join(dtype_names) + " |")
    print("|---|" + "---:|" * len(dtype_names))
    for name in refmath.SUPPORTED:
        print(f"| {name} | " + " | ".join(f"{table[name, d][0]:.4f}" for d in dtype_names) + " |")
    print()
    print("where the worst case occurs (argument, points graded):")
    for name in refmath.SUPPORTED:
        for d in dtype_names:
            worst, where, count = table[name, d]
            print(f"  {name:15s} {d:9s} {worst:.6f} at {where!r} ({count} points)")
    print(f"\ntotal measuring time {sum(r[-1] for r in results):.1f} s")


def timing_table() -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64, 128)) * 3).astype(np.float32)
    print("\ntime per call on a 64x128 float32 array (best of 5 x 20 calls)")
    print("| function | refmath ms | numpy ms | ratio |")
    print("|---|---:|---:|---:|")
    numpy_own = {"exp": np.exp, "log": np.log, "log1p": np.log1p, "expm1": np.expm1, "tanh": np.tanh,
                 "sin": np.sin, "cos": np.cos, "pow": np.power}  # fmt: skip
    for name in refmath.SUPPORTED:
        args = (np.abs(x), x) if name == "pow" else (np.abs(x),) if name in ("log", "log1p") else (x,)
        ours = _best(lambda: getattr(refmath, name)(*args))
        theirs = _best(lambda: numpy_own[name](*args)) if name in numpy_own else float("nan")
        print(f"| {name} | {ours * 1e3:.3f} | {theirs * 1e3:.3f} | {ours / theirs:.1f} |")


def _best(call) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(20):
            call()
        best = min(best, (time.perf_counter() - start) / 20)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=100_000, help="points per float32/float64 sweep")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--no-timing", action="store_true", help="skip the timing table")
    options = parser.parse_args()
    accuracy_table(options.points, options.jobs)
    if not options.no_timing:
        timing_table()


if __name__ == "__main__":
    main()
