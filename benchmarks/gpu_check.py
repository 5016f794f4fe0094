"""The GPU check: IREE conformance on a CUDA device, then a short MLP training-step benchmark.

A prepared script for a machine with an NVIDIA GPU (it runs in well under
five minutes there). It first checks that ``iree.runtime`` has a working
``cuda`` driver and device; without one it prints why and exits 0. Then:

1. Conformance: every family of ``topos.dialect.conformance_cases`` (every
   opcode, forward and recorded gradient) in float32, float64 and
   bfloat16, compiled for the target, run once with every node observed,
   each node graded against the oracle kernel on its operands within the
   envelope table. Printed: one line per family, every failure that no
   known divergence explains, and the measured worst deviation beside
   the declared envelope per opcode. The table's envelopes were measured
   on llvm-cpu (and vulkan on Mesa lavapipe); a CUDA failure here is the
   evidence for a ``TARGET_TABLES["cuda"]`` entry or a new divergence.
2. Benchmark: one step of every model of docs/performance.md (MLP
   784-128-10 and 784-1024-1024-10, the 2-block GPT, makemore's MLP and
   transformer, the MNIST example's LeNet training step, GPT-2 124M forward at
   T=128, and again with its parameters frozen into the module; float32)
   with parameters resident on the device, on the target and on
   llvm-cpu, and the NumPy FAST plan for scale; median milliseconds per
   step and compile seconds. It never asserts timings.

Exit status: 0 when every node conforms (or no device), 1 otherwise.

Run: python benchmarks/gpu_check.py [--target cuda] [--families map,linear] [--dtypes f32,bf16] [--steps N]
     [--models mlp-s,gpt,...]
(``--target vulkan`` or ``llvm-cpu`` runs the same check where those work.)
"""

from __future__ import annotations

import os

# One BLAS thread for the NumPy column, set before NumPy loads (its pool is sized then).
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

import argparse
import sys
import tempfile
import time

import numpy as np
from _timing import median_seconds, table  # noqa: E402

import topos
from topos import Numerics
from topos.dialect import conformance_cases
from topos.dialect.targets import target as find_target

DTYPES = {"f32": topos.float32, "f64": topos.float64, "bf16": topos.bfloat16}


def device_problem(driver: str) -> str | None:
    """Why ``driver`` cannot run here, or None when it has a device."""
    import iree.runtime as rt

    available = rt.query_available_drivers()
    if driver not in available:
        return f"this iree.runtime has no {driver!r} driver (it has {', '.join(available)})"
    try:
        rt.get_device(driver)
    except Exception as error:  # noqa: BLE001  (any failure means: no device to run on)
        return f"the {driver!r} driver is present but has no usable device: {error}"
    return None


# ---- 1. conformance ---------------------------------------------------------------------------


def conformance_check(target: str, families, dtypes) -> tuple[dict, int]:
    """Run every family on ``target``: (measured worst per (target, key, dtype), unexplained failures)."""
    measured: dict = {}
    failures = 0
    rows = []
    for name in families:
        for short in dtypes:
            dtype = DTYPES[short]
            started = time.perf_counter()
            try:
                result = conformance_cases.run_family(name, dtype, target, cache=False)
            except topos.ToposError as error:
                rows.append([name, short, "-", "-", "-", "not run: " + " ".join(str(error).split())[:110]])
                continue
            bad = result.unexplained()
            failures += len(bad)
            known = sum(1 for r in result.reports if not r.ok) - len(bad)
            if bad:
                verdict = f"{len(bad)} FAIL" + (f", {known} known divergences" if known else "")
            else:
                verdict = "ok" + (f" ({known} known divergences)" if known else "")
            rows.append([name, short, str(len(result.reports)), f"{result.compile_seconds:.1f}",
                         f"{time.perf_counter() - started:.1f}", verdict])
            for report in bad[:8]:
                print(f"  FAIL {name} {short}: {report}", flush=True)
            for key, worst in result.worst().items():
                slot = (target, key, short)
                measured[slot] = max(measured.get(slot, 0.0), worst)
    print(table(["family", "dtype", "nodes", "compile s", "total s", "verdict"], rows))
    return measured, failures


# ---- 2. benchmark -----------------------------------------------------------------------------
#
# Every model of docs/performance.md, recorded by _zoo.py. A step with updates runs as compiled.step
# with the parameters resident, one without (GPT-2's forward) as a resident step that updates nothing.

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _zoo import MODELS, build, too_large  # noqa: E402


def _median_ms(run, steps: int) -> float:
    return 1000 * median_seconds(run, steps)


def _device_cells(built, target: str, steps: int, frozen: bool) -> list[str]:
    """[median ms a step, compile s] of ``built`` on ``target``: resident parameters, or ``frozen`` into the module."""
    feeds, updates, read = built.feeds(0), built.updates, built.read
    started = time.perf_counter()
    try:
        options = {"frozen": built.parameters} if frozen else {}
        compiled = built.network.entry(built.roots).lower().compile(target, cache=False, **options)
    except topos.ToposError as error:
        return [f"refused: {str(error).splitlines()[0][:50]}", "-"]
    seconds = time.perf_counter() - started
    if frozen:
        def one_step():
            return float(np.asarray(compiled.forward(feeds=feeds)[read]).reshape(-1)[0])
    else:
        state = [compiled.resident(built.parameters)]

        def one_step():
            state[0], run = compiled.step(state[0], feeds, updates)
            return float(np.asarray(run[read]).reshape(-1)[0])

    return [f"{_median_ms(one_step, steps):.3f}", f"{seconds:.1f}"]


def _numpy_cell(built, steps: int) -> str:
    """Median ms of ``built``'s NumPy FAST plan, for scale."""
    plan = built.network.entry(built.roots, numerics=Numerics.FAST).lower()
    parameters, feeds = built.parameters, built.feeds(0)
    return f"{_median_ms(lambda: plan.forward(parameters, feeds), max(3, steps // 10)):.3f}"


def benchmark(target: str, steps: int, models=MODELS) -> None:
    """One step of every model on ``target`` and on llvm-cpu, parameters resident; the NumPy FAST plan for scale."""
    rows = []
    for model in models:
        if (reason := too_large(model)) is not None:
            print(reason, flush=True)
            continue
        built = build(model)
        # A model that updates nothing (GPT-2's forward) gets a second row compiled with frozen parameters.
        for frozen in (False, True) if not built.updates.pairs() else (False,):
            cells = [model + (" (frozen)" if frozen else "")]
            for name in dict.fromkeys([target, "llvm-cpu"]):
                cells += _device_cells(built, name, steps, frozen)
            # A 124M-weight NumPy forward takes seconds a call.
            cells.append("-" if model == "gpt2-124m-forward" or frozen else _numpy_cell(built, steps))
            rows.append(cells)
    header = ["model (one step, float32)", f"{target} ms", f"{target} compile s"]
    if target != "llvm-cpu":
        header += ["llvm-cpu ms", "llvm-cpu compile s"]
    print(table(header + ["NumPy FAST plan ms"], rows))
    print("jax.jit on the same device: run benchmarks/versus_jax.py (the same models) where jax has that device's "
          "plugin; this script needs only topos and IREE")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--families", default=",".join(conformance_cases.FAMILIES))
    parser.add_argument("--dtypes", default="f32,f64,bf16")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"benchmark models (default all: {', '.join(MODELS)})")
    args = parser.parse_args(argv)
    chosen = find_target(args.target)
    problem = device_problem(chosen.driver)
    if problem is not None:
        print(f"gpu_check: skipped: {problem}")
        return 0
    os.environ.setdefault("TOPOS_CACHE_DIR", tempfile.mkdtemp(prefix="topos-gpu-check-"))
    started = time.perf_counter()
    print(f"gpu_check: target {chosen.name} (driver {chosen.driver}), flags {' '.join(chosen.flags)}\n")
    print("1. conformance (every opcode, forward and recorded gradient; cache off)")
    dtypes = [d for d in args.dtypes.split(",") if d]
    if not chosen.supports_f64 and "f64" in dtypes:
        dtypes.remove("f64")
    if not chosen.supports_bf16 and "bf16" in dtypes:
        dtypes.remove("bf16")
    measured, failures = conformance_check(chosen.name, [f for f in args.families.split(",") if f], dtypes)
    print(f"\nworst deviation beside the envelope ({chosen.name}; '-' not measured or all known divergences):")
    print(conformance_cases.format_table(measured, chosen.name))
    print(f"\nconformance: {'all nodes conform' if not failures else f'{failures} unexplained failures'} "
          f"({time.perf_counter() - started:.0f} s)\n")
    print("2. benchmark")
    benchmark(chosen.name, args.steps, [m for m in args.models.split(",") if m])
    print(f"\ngpu_check: done in {time.perf_counter() - started:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
