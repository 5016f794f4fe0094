"""Every benchmark model's step, topos on IREE against jax.jit: step time, first compile and cache hit.

The issue's table: for each model of ``_zoo.py`` (the two MLPs, the
2-block GPT, makemore's MLP and transformer, the MNIST example's LeNet,
GPT-2 124M forward at T=128) one training step (or GPT-2's forward)
compiled by topos for llvm-cpu and run with ``compiled.step`` (parameters
resident), beside the same mathematics under ``jax.jit`` (parameters on the
device, donated where the step updates them). Both read the step's loss
(or the logits) back to the host every step, and both start from the same
weights: the first two steps' values are compared before anything is
timed, so a twin that computes something else shows in the last column.

``--threads 1`` (the default): the process pins itself to one CPU before
anything loads (XLA sizes its pool by the affinity mask), sets
OPENBLAS/OMP/MKL_NUM_THREADS=1, and IREE runs on its single-threaded
``local-sync`` driver; cells are medians of process CPU time.
``--threads 2``: no pinning; IREE runs on ``local-task`` with two workers
(``--task_topology_max_group_count=2``) and jax uses its default
threading; cells are medians of wall-clock time (CPU time would add the
threads up).

Steps are timed in interleaved rounds (each round a few steps of each
column, every other round jax first), so drifting load lands on both and
neither gains from its place in the round. Compile: topos's entry lowered
and compiled into an empty cache directory (first), then the same again
(cache hit: the plan's digest finds the artifact before any lowering);
jax: ``lower(...).compile()`` of the jitted step (for the makemore twins,
which have no lower, the first call less a second). Ratios are jax's time
over topos's: above 1, topos is faster. Nothing is asserted.

``--frozen``: a model that updates nothing (GPT-2's forward) is compiled
with ``frozen=`` its parameters and called with its feeds alone; its row
says "(frozen)". jax's column is unchanged (closing over the weights as
constants measured no faster: benchmarks/gpt2.py).

Run: python benchmarks/versus_jax.py [--threads 1|2] [--rounds 5] [--models mlp-s,gpt,...] [--frozen]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _pinning import PINNED_CPU, THREADS  # noqa: E402  (first: it pins before NumPy or JAX load)

# isort: split

import argparse  # noqa: E402
import gc  # noqa: E402
import itertools  # noqa: E402
import resource  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

# Loaded before anything is timed, as jax is: a cache hit checks its module with the runtime, whose
# first import in a process costs 20 ms warm and up to about 100 ms from a cold disk.
import iree.runtime  # noqa: E402, F401

from topos.dialect.iree.cache import CompileCache  # noqa: E402

from _timing import chosen_models, interleaved, load_average, print_preamble, relative_difference, table  # noqa: E402
from _zoo import MODELS, PER_ROUND, build, jax_step, too_large, topos_step  # noqa: E402


def topos_column(model, driver: str, frozen: bool = False):
    """(step(k) -> the read value, first-compile seconds, cache-hit seconds, the CompiledPlan).

    ``frozen`` (a model that updates nothing: GPT-2's forward): compiled with
    ``frozen=`` its parameters, each call ``forward(feeds=...)``.
    """
    frozen = frozen and not model.updates.pairs()
    options = {"frozen": model.parameters} if frozen else {}
    with tempfile.TemporaryDirectory(prefix="topos-versus-jax-") as directory:
        cache = CompileCache(directory)
        began = time.perf_counter()
        compiled = model.network.entry(model.roots).lower().compile("llvm-cpu", driver, cache=cache, **options)
        first = time.perf_counter() - began
        began = time.perf_counter()
        again = model.network.entry(model.roots).lower().compile("llvm-cpu", driver, cache=cache, **options)
        hit = time.perf_counter() - began
    if compiled.cache_hit or not again.cache_hit:
        raise RuntimeError("the compile-cache measurement did not see one miss then one hit")
    return topos_step(model, compiled), first, hit, compiled


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}" if seconds < 0.01 else f"{seconds * 1e3:.2f}" if seconds < 1 else \
        f"{seconds * 1e3:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, choices=(1, 2), default=1, help="1 (pinned, local-sync) or 2")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {', '.join(MODELS)}")
    parser.add_argument("--frozen", action="store_true",
                        help="forward-only models (GPT-2) compiled with frozen parameters (compile(frozen=...))")
    args = parser.parse_args()
    chosen = chosen_models(parser, args.models, MODELS)
    try:
        import jax
    except ImportError as error:
        print(f"jax.jit column absent: jax is not importable ({error}); install the bench extra")
        jax = None

    if THREADS == 2:
        import iree.runtime as rt

        rt.flags.parse_flags("--task_topology_max_group_count=2")  # before the first local-task device
        driver, clock_name = "local-task", "wall-clock"
        setting = "2 threads: IREE local-task with 2 workers, jax's default threading, no affinity"
    else:
        driver, clock_name = "local-sync", "process CPU"
        setting = f"1 thread: pinned to CPU {PINNED_CPU}, IREE local-sync, OPENBLAS/OMP/MKL_NUM_THREADS=1"
    print_preamble(setting)

    rows, compile_rows = [], []
    for key in chosen:
        if (reason := too_large(key)) is not None:
            print(reason, flush=True)
            continue
        began = time.perf_counter()
        model = build(key)
        recorded = time.perf_counter() - began
        ours, first, hit, compiled = topos_column(model, driver, args.frozen)
        columns = {"topos": ours}
        opening = {"topos": [ours(0), ours(1)]}
        twin = None
        if jax is not None:
            twin = jax_step(model)
            columns["jax"] = twin.step
            opening["jax"] = [twin.opening[0], twin.opening[1]] if twin.opening else [twin.step(0), twin.step(1)]
        calls = itertools.count(2)  # steps 0 and 1 were the agreement check
        counted = {name: lambda step=step, calls=calls: step(next(calls)) for name, step in columns.items()}
        measured = interleaved(counted, PER_ROUND[key], args.rounds, alternate=True)
        timing = {name: t.wall if THREADS == 2 else t.cpu for name, t in measured.items()}
        busy = {name: t.cpu / t.wall for name, t in measured.items()}  # CPU over wall: threads at work
        agree = "—" if twin is None else \
            f"{max(relative_difference(a, b) for a, b in zip(opening['topos'], opening['jax'])):.1e}"
        jax_ms = "absent" if twin is None else _ms(timing["jax"])
        ratio = "—" if twin is None else f"{timing['jax'] / timing['topos']:.2f}x"
        label = model.name + (" (frozen)" if compiled.frozen is not None else "")
        rows.append([label, _ms(timing["topos"]), jax_ms, ratio, agree] + (
            [f"{busy['topos']:.2f}", "—" if twin is None else f"{busy['jax']:.2f}"] if THREADS == 2 else []))
        compile_rows.append([label, f"{first:.2f}", f"{compiled.timings.get('iree-compile', 0.0):.2f}",
                             f"{hit * 1e3:.1f}", "—" if twin is None else f"{twin.compile_seconds:.2f}",
                             "—" if twin is None else f"{first / twin.compile_seconds:.2f}x", f"{recorded:.1f}"])
        print(f"{key}: done ({len(model.network)} nodes)", flush=True)
        del columns, compiled, ours, twin, model
        gc.collect()

    print(f"\nstep, median {clock_name} ms ({args.rounds} interleaved rounds); ratio = jax.jit / topos "
          "(above 1: topos is faster); agreement = worst scale-relative difference of the first two steps' "
          "read-back values"
          + ("; CPU / wall: how many threads were at work on average" if THREADS == 2 else "") + "\n")
    busy_columns = ["topos CPU / wall", "jax CPU / wall"] if THREADS == 2 else []
    print(table(["model", "topos IREE", "jax.jit", "ratio", "agreement", *busy_columns], rows))
    print("\ncompile: topos first compile into an empty cache (of which iree-compile), the cache hit, jax.jit's "
          "lower + compile, their ratio (below 1.5x: the issue's goal), and the recording's seconds\n")
    print(table(["model", "topos first s", "iree-compile s", "cache hit ms", "jax.jit s", "topos / jax",
                 "recording s"], compile_rows))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"\npeak resident memory of this process: {peak:.1f} GiB")
    print(f"load average at end: {load_average()}")


if __name__ == "__main__":
    main()
