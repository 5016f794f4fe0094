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
2. Benchmark: one SGD step of a 784-128-10 MLP (batch 64, float32) with
   parameters resident on the device, on the target and on llvm-cpu, and
   the NumPy FAST plan of the loss and gradients (one BLAS thread) for
   scale; median milliseconds per step. It never asserts timings.

Exit status: 0 when every node conforms (or no device), 1 otherwise.

Run: python benchmarks/gpu_check.py [--target cuda] [--families map,linear] [--dtypes f32,bf16] [--steps N]
(``--target vulkan`` or ``llvm-cpu`` runs the same check where those work.)
"""

from __future__ import annotations

import os

# One BLAS thread for the NumPy column, set before NumPy loads (its pool is sized then).
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

import argparse
import statistics
import sys
import tempfile
import time

import numpy as np
from _timing import table  # noqa: E402

import topos
from topos import Numerics, Tape
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


def _mlp(batch: int = 64, sizes=(784, 128, 10), seed: int = 0):
    rng = np.random.default_rng(seed)

    def model(tape):
        x = tape.input(rng.standard_normal((batch, sizes[0])).astype(np.float32))
        labels = tape.input(topos.selection(rng.integers(0, sizes[2], batch), sizes[2]))
        w1 = tape.parameter((rng.standard_normal(sizes[:2]) / np.sqrt(sizes[0])).astype(np.float32))
        b1 = tape.parameter(np.zeros(sizes[1], np.float32))
        w2 = tape.parameter((rng.standard_normal(sizes[1:]) / np.sqrt(sizes[1])).astype(np.float32))
        hidden = (x @ w1 + b1.broadcast_along(0, batch)).tanh()
        logits = hidden @ w2
        picked = tape.leaf(np.eye(sizes[2], dtype=np.float32)).gather(labels)
        loss = -(logits.log_softmax(1) * picked).sum() / float(batch)
        adjoints = tape.differentiate(loss, [w1, b1, w2])
        return x, labels, loss, adjoints, topos.sgd(tape, adjoints, 0.05)

    network, (x, labels, loss, adjoints, updates) = Tape.record(model)
    return network, x, labels, loss, adjoints, updates


def _median_ms(run, steps: int) -> float:
    for _ in range(3):
        run()
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def benchmark(target: str, steps: int) -> None:
    network, x, labels, loss, adjoints, updates = _mlp()
    feeds = {x: network.payload(x), labels: network.payload(labels)}
    rows = []
    losses = {}
    for name in dict.fromkeys([target, "llvm-cpu"]):
        started = time.perf_counter()
        compiled = network.entry(updates.roots(loss)).lower().compile(name, cache=False)
        seconds = time.perf_counter() - started
        state = [compiled.resident(network.parameters())]

        def one_step(compiled=compiled, state=state):
            state[0], run = compiled.step(state[0], feeds, updates)
            return run

        losses[name] = float(compiled.step(compiled.resident(network.parameters()), feeds, updates)[1][loss])
        rows.append([f"IREE {name} (resident)", f"{_median_ms(one_step, steps):.3f}", f"{seconds:.2f}"])
    plan = network.entry(adjoints.roots(), numerics=Numerics.FAST).lower()
    parameters = network.parameters()
    rows.append(["NumPy FAST plan (loss and gradients)",
                 f"{_median_ms(lambda: plan.forward(parameters, feeds), steps):.3f}", "-"])
    oracle = float(network.forward(network.parameters(), feeds)[loss])
    base = float(rows[0][1])
    for row in rows:
        row.append(f"{float(row[1]) / base:.2f}")
    print(table(["MLP 784-128-10, batch 64, one SGD step", "median ms", "compile s", f"ratio to {target}"], rows))
    print("first-step loss: " + ", ".join(f"{k} {v:.7g}" for k, v in losses.items()) + f", oracle {oracle:.7g}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--families", default=",".join(conformance_cases.FAMILIES))
    parser.add_argument("--dtypes", default="f32,f64,bf16")
    parser.add_argument("--steps", type=int, default=200)
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
    benchmark(chosen.name, args.steps)
    print(f"\ngpu_check: done in {time.perf_counter() - started:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
