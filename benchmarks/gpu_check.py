"""The GPU check: IREE conformance on a CUDA device, then every benchmark model's step against jax.jit there.

A prepared script for a machine with an NVIDIA GPU. It first checks that
``iree.runtime`` has a working ``cuda`` driver and device; without one it
prints why and exits 0. Then:

1. Conformance: every family of ``topos.dialect.iree.conformance_cases`` (every
   opcode, forward and recorded gradient) in float32, float64 and
   bfloat16, compiled for the target, run once with every node observed,
   each node graded against the oracle kernel on its operands within the
   envelope table. Printed: one line per family, every failure that no
   known divergence explains, and the measured worst deviation beside
   the declared envelope per opcode. The table's envelopes were measured
   on llvm-cpu (and vulkan on Mesa lavapipe, cuda on an H200 on
   2026-12-04); a new CUDA failure here is the evidence for a
   ``TARGET_TABLES["cuda"]`` entry, a new divergence or a fix.
2. Benchmark: one step of every model of docs/performance.md (MLP
   784-128-10 and 784-1024-1024-10, the 2-block GPT, makemore's MLP and
   transformer, the MNIST example's LeNet training step, GPT-2 124M forward at
   T=128, and again with its parameters frozen into the module; float32)
   with parameters resident on the device; beside it the model's jax.jit
   twin on jax's default device (the same GPU where jax has its CUDA
   plugin), with the agreement of their first two steps; llvm-cpu where
   IREE's compiler is here; and the NumPy FAST plan for scale. Median
   milliseconds per step and compile seconds; topos's step and jax's take
   turns in five rounds (ABBA), a fifth of ``--steps`` each, so that the
   GPU's drift over a run moves both alike. It never asserts timings.

In two halves where the GPU machine has no IREE compiler (the lent
machines have jax with CUDA but not IREE, and the compiler's 84 MB wheel
may not travel there): ``--prepare DIR`` compiles every module for the
target into the compile cache DIR, here, without a device; on the GPU
machine ``--cache DIR`` serves them, with only iree-base-runtime
installed. ``benchmarks/gpu_prepare.sh`` and ``benchmarks/gpu_run.sh`` do
both halves, wheels included (docs/performance.md, "On a GPU").

Exit status: 0 when every node conforms (or no device), 1 otherwise.

Run: python benchmarks/gpu_check.py [--target cuda] [--families map,linear] [--dtypes f32,bf16] [--steps N]
     [--models mlp-s,gpt,...] [--prepare DIR | --cache DIR]
(``--target vulkan`` or ``llvm-cpu`` runs the same check where those work.)
"""

from __future__ import annotations

import os

# One BLAS thread for the NumPy column, set before NumPy loads (its pool is sized then).
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")
# jax takes 75% of the GPU's memory when it starts unless told not to; IREE shares the device here.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import topos  # noqa: E402
from topos import Numerics  # noqa: E402
from topos.dialect.ir.bindings import compiler_missing, require_compiler  # noqa: E402
from topos.dialect.iree import conformance_cases  # noqa: E402
from topos.dialect.iree.cache import CompileCache  # noqa: E402
from topos.dialect.iree.targets import target as find_target  # noqa: E402

from _timing import chosen_models, interleaved, median_seconds, relative_difference, table  # noqa: E402

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


def conformance_check(target: str, families, dtypes, cache) -> tuple[dict, int]:
    """Run every family on ``target``: (measured worst per (target, key, dtype), unexplained failures)."""
    measured: dict = {}
    failures = 0
    rows = []
    for name in families:
        for short in dtypes:
            dtype = DTYPES[short]
            started = time.perf_counter()
            try:
                result = conformance_cases.run_family(name, dtype, target, cache=cache)
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
# with the parameters resident, one without (GPT-2's forward) as a resident step that updates nothing,
# and again with its parameters frozen into the module.

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _zoo import MODELS, build, jax_step, too_large, topos_step  # noqa: E402

ROUNDS = 5  # topos's step and its jax.jit twin take turns this many times (ABBA), a fifth of --steps each


def _timed(steps: dict, count: int) -> dict[str, str]:
    """name -> median ms of one call of each step, ``count`` calls each, the steps taking turns in ``ROUNDS``
    rounds so that a GPU whose state drifts over the run (clocks, other work) moves every column alike;
    a cell that is already text (a refusal) stays as it is."""
    calls = {name: step for name, step in steps.items() if callable(step)}
    timings = interleaved(calls, max(1, count // ROUNDS), ROUNDS, warmup=1, alternate=True) if calls else {}
    return {name: f"{1000 * timings[name].wall:.3f}" if name in timings else step for name, step in steps.items()}


def _compile(built, target: str, cache, frozen: bool):
    options = {"frozen": built.parameters} if frozen else {}
    return built.network.entry(built.roots).lower().compile(target, cache=cache, **options)


def _topos_step(built, target: str, frozen: bool, cache) -> tuple[object, str, list]:
    """(one step of ``built`` on ``target`` to time, or the cell saying why it was refused; the compile cell;
    the first two steps' read-back values). Parameters resident, or ``frozen`` into the module."""
    started = time.perf_counter()
    try:
        compiled = _compile(built, target, cache, frozen)
    except topos.ToposError as error:
        return _refusal(error), "-", []
    seconds = time.perf_counter() - started
    one_step = _counted(topos_step(built, compiled), 0)
    opening = [one_step(), one_step()]  # steps 0 and 1, as the jax twin takes them
    return one_step, f"{seconds:.1f}{' (cached)' if compiled.cache_hit else ''}", opening


def _jax_step(built, opening: list) -> tuple[object, str, str]:
    """(one step of the model's jax.jit twin to time, or the cell saying why it failed; its lower + compile
    seconds; the agreement of its first two steps with topos's)."""
    try:
        twin = jax_step(built)
    except Exception as error:  # noqa: BLE001  (a twin jax cannot build here: say so in its cell)
        return f"failed: {' '.join(str(error).split())[:50]}", "-", "-"
    theirs = twin.opening[:2] if twin.opening else [twin.step(0), twin.step(1)]
    agreement = f"{max(relative_difference(a, b) for a, b in zip(opening, theirs)):.1e}" if opening else "-"
    return _counted(twin.step, 2), f"{twin.compile_seconds:.1f}", agreement


def _counted(step, k: int):
    """``step(k)``, then ``step(k + 1)``, ...: one call per step, as a timer calls it."""
    counter = [k]

    def next_step():
        counter[0] += 1
        return step(counter[0] - 1)

    return next_step


def _number(cell: str) -> bool:
    try:
        return float(cell) > 0
    except ValueError:
        return False


def _numpy_cell(built, steps: int) -> str:
    """Median ms of ``built``'s NumPy FAST plan, for scale."""
    plan = built.network.entry(built.roots, numerics=Numerics.FAST).lower()
    parameters, feeds = built.parameters, built.feeds(0)
    return f"{1000 * median_seconds(lambda: plan.forward(parameters, feeds), max(3, steps // 10)):.3f}"


def _rows(models) -> list:
    """(row label, the model built, frozen) for each model that fits this machine; GPT-2's forward twice."""
    rows = []
    for key in models:
        if (reason := too_large(key)) is not None:
            print(reason, flush=True)
            continue
        built = build(key)
        for frozen in (False, True) if not built.updates.pairs() else (False,):
            rows.append((key + (" (frozen)" if frozen else ""), built, frozen))
    return rows


def _jax_device() -> tuple[object, str]:
    """(the jax module or None, what its column runs on or why it is absent)."""
    try:
        import jax
    except ImportError as error:
        return None, f"absent: jax is not importable ({error})"
    device = jax.devices()[0]
    return jax, f"{device.platform}: {getattr(device, 'device_kind', device)}"


def benchmark(target: str, steps: int, models=MODELS, cache=None) -> None:
    """One step of every model on ``target``, against jax.jit on jax's default device and, where IREE's
    compiler is here, on llvm-cpu; the NumPy FAST plan for scale. ``cache``: the compile cache to use."""
    jax, where = _jax_device()
    print(f"jax.jit column: {where}")
    cpu_column = target != "llvm-cpu" and compiler_missing() is None
    if target != "llvm-cpu" and not cpu_column:
        print("llvm-cpu column: absent, IREE's compiler is not installed here (the prepared cache holds "
              f"{target} modules only: a module for another machine's CPU could stop this one on SIGILL)")
    rows = []
    for label, built, frozen in _rows(models):
        ours, compiled_in, opening = _topos_step(built, target, frozen, cache)
        twin = _jax_step(built, opening) if jax is not None and not frozen else None  # one jax row per model
        timed = _timed({"topos": ours, **({"jax": twin[0]} if twin else {})}, steps)
        cells = [timed["topos"], compiled_in]
        if jax is not None:
            theirs = [timed["jax"], *twin[1:]] if twin else ["-", "-", "-"]
            ratio = f"{float(theirs[0]) / float(cells[0]):.2f}x" if _number(theirs[0]) and _number(cells[0]) else "-"
            cells += [*theirs, ratio]
        if cpu_column:
            on_cpu, cpu_compiled_in, _ = _topos_step(built, "llvm-cpu", frozen, cache)
            cells += [_timed({"llvm-cpu": on_cpu}, steps)["llvm-cpu"], cpu_compiled_in]
        # A 124M-weight NumPy forward takes seconds a call.
        cells.append("-" if built.key == "gpt2-124m-forward" else _numpy_cell(built, steps))
        rows.append([label, *cells])
        print(f"{label}: done", flush=True)
    header = ["model (one step, float32)", f"{target} ms", f"{target} compile s"]
    if jax is not None:
        header += ["jax.jit ms", "jax.jit compile s", "agreement", "jax / topos"]
    if cpu_column:
        header += ["llvm-cpu ms", "llvm-cpu compile s"]
    print()
    print(table(header + ["NumPy FAST plan ms"], rows))
    print("agreement: the worst scale-relative difference of the first two steps' read-back values, topos on "
          f"{target} against jax.jit; jax / topos: above 1, topos is faster")


# ---- preparing a cache where the compiler is --------------------------------------------------


def _refusal(error: Exception) -> str:
    """A refused module's cell: IREE's first complaint, without the target's long description."""
    said = getattr(error, "bare", "") or str(error)  # a TargetError's message without the line it names
    lines = [line.strip() for line in said.splitlines() if "error:" in line] or [said]
    return "refused: " + lines[0].split("error:", 1)[-1].strip()[:70]


def prepare(target: str, families, dtypes, models, directory: str) -> int:
    """Compile every conformance family and model for ``target`` into the compile cache ``directory``.

    Runs where IREE's compiler is installed and needs no device: the machine
    with the GPU then runs this script with ``--cache directory`` and needs
    only iree-base-runtime (docs/deploy.md, "Compiled on one machine, run on another").
    """
    require_compiler("gpu_check.py --prepare")
    cache = CompileCache(directory)
    started = time.perf_counter()
    rows = []
    for name in families:
        for short in dtypes:
            began = time.perf_counter()
            try:
                compiled = conformance_cases.record_family(name, DTYPES[short]).entry().lower().compile(
                    target, cache=cache)
                rows.append([f"conformance {name} {short}", f"{time.perf_counter() - began:.1f}",
                             f"{len(compiled.vmfb) / 2**10:.0f}"])
            except topos.ToposError as error:
                rows.append([f"conformance {name} {short}", "-", _refusal(error)])
    for label, built, frozen in _rows(models):
        began = time.perf_counter()
        try:
            compiled = _compile(built, target, cache, frozen)
            rows.append([label, f"{time.perf_counter() - began:.1f}", f"{len(compiled.vmfb) / 2**10:.0f}"])
        except topos.ToposError as error:
            rows.append([label, "-", _refusal(error)])
        print(f"{label}: done", flush=True)
    print(table(["module", "compile s", "KiB"], rows))
    size = sum(f.stat().st_size for f in Path(directory).glob("*.vmfb"))
    print(f"\n{directory}: {size / 2**20:.1f} MiB of {target} modules, compiled in "
          f"{time.perf_counter() - started:.0f} s; on the device: python benchmarks/gpu_check.py --cache {directory}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--families", default=",".join(conformance_cases.FAMILIES))
    parser.add_argument("--dtypes", default="f32,f64,bf16")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"benchmark models (default all: {', '.join(MODELS)})")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--prepare", metavar="DIR",
                       help="compile every module for --target into the compile cache DIR, here (no device needed)")
    where.add_argument("--cache", metavar="DIR", help="the compile cache to run from (one --prepare filled)")
    args = parser.parse_args(argv)
    chosen = find_target(args.target)
    dtypes = [d for d in args.dtypes.split(",") if d]
    if not chosen.supports_f64 and "f64" in dtypes:
        dtypes.remove("f64")
    if not chosen.supports_bf16 and "bf16" in dtypes:
        dtypes.remove("bf16")
    families = [f for f in args.families.split(",") if f]
    models = chosen_models(parser, args.models, MODELS)
    if args.prepare:
        return prepare(chosen.name, families, dtypes, models, args.prepare)
    problem = device_problem(chosen.driver)
    if problem is not None:
        print(f"gpu_check: skipped: {problem}")
        return 0
    # Without --cache every module is compiled here, afresh.
    cache = CompileCache(args.cache or tempfile.mkdtemp(prefix="topos-gpu-check-"))
    started = time.perf_counter()
    print(f"gpu_check: target {chosen.name} (driver {chosen.driver}), flags {' '.join(chosen.flags)}; "
          f"compile cache {cache.directory}{'' if compiler_missing() is None else ' (no compiler here)'}\n")
    print("1. conformance (every opcode, forward and recorded gradient)")
    measured, failures = conformance_check(chosen.name, families, dtypes, cache)
    print(f"\nworst deviation beside the envelope ({chosen.name}; '-' not measured or all known divergences):")
    print(conformance_cases.format_table(measured, chosen.name))
    print(f"\nconformance: {'all nodes conform' if not failures else f'{failures} unexplained failures'} "
          f"({time.perf_counter() - started:.0f} s)\n")
    print("2. benchmark")
    benchmark(chosen.name, args.steps, models, cache)
    print(f"\ngpu_check: done in {time.perf_counter() - started:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
