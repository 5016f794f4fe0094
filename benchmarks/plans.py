"""Plans, measured: one SGD training step four ways, and predicted against measured peak memory.

For each model (the 784-128-10 MLP, batch 64, float32, tanh, log_softmax
cross-entropy; and a small conv net recorded with
``topos.nn.functional.conv2d`` / ``max_pool``), one training step is:

* oracle      ``network.forward`` + ``run.backward(loss)`` (the README loop)
* EXACT plan  a forward plan over ``adjoints.roots()`` (loss and recorded
              gradients), reference kernels: the oracle's bits
* FAST plan   the same plan under Numerics.FAST (BLAS matmul, native math)
* NumPy       the same mathematics written by hand with BLAS matmuls

each followed by the same SGD update in NumPy. Timings are medians over
repeated runs on one BLAS thread; ratios are against the NumPy column.
The memory table compares the plan's predicted peak (``plan.peak()``)
and retain-all volume (``plan.retain_all_bytes()``) with tracemalloc's
measured peak during ``plan.forward`` and during the oracle's
whole-spec run, which keeps every value. Nothing here asserts timings;
it checks (and prints) that the EXACT plan's step equals the oracle's
bit for bit and that the hand-written step computes the same numbers.

Run: python benchmarks/plans.py [--repeats N]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before NumPy loads: one thread, stable timings

import argparse  # noqa: E402
import gc  # noqa: E402
import sys  # noqa: E402
import tracemalloc  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from _timing import median_seconds  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from topos import Numerics  # noqa: E402

from _models import Model, conv_net, mlp  # noqa: E402

RATE = 0.1


def traced_peak(fn) -> int:
    """Bytes above the starting level at tracemalloc's high-water mark during ``fn()``."""
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        fn()
        return tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()


def _sgd(p, g):
    return p - g * np.asarray(RATE, dtype=p.dtype)


def steps(model: Model):
    """The four training steps: each takes a parameter table and returns the next one."""
    exact = model.trained.entry(model.adjoints.roots(), numerics=Numerics.EXACT).lower()
    fast = model.trained.entry(model.adjoints.roots(), numerics=Numerics.FAST).lower()

    def oracle(parameters):
        run = model.forward.forward(parameters, model.feeds)
        return parameters.step(run.backward(model.loss).parameters(parameters), _sgd)

    def planned(plan):
        def step(parameters):
            run = plan.forward(parameters, model.feeds)
            return parameters.step(run.recorded_gradients(model.adjoints, parameters), _sgd)

        return step

    def by_hand(parameters):
        arrays = [parameters[w] for w in model.weights]
        _, gradients = model.numpy_step(arrays, model.numpy_feeds)
        return parameters.with_payloads({w: _sgd(a, g) for w, a, g in zip(model.weights, arrays, gradients)})

    return {"oracle": oracle, "EXACT plan": planned(exact), "FAST plan": planned(fast), "NumPy": by_hand}, exact, fast


def agreement(model: Model, step) -> tuple[bool, float]:
    """(EXACT plan step == oracle step bitwise, worst relative difference of the NumPy step's update)."""
    start = model.parameters
    after = {name: fn(start) for name, fn in step.items()}
    identical = all(
        after["EXACT plan"][w].tobytes() == after["oracle"][w].tobytes() for w in model.weights
    )
    worst = 0.0
    for w in model.weights:
        want = (start[w] - after["oracle"][w]).astype(np.float64)
        got = (start[w] - after["NumPy"][w]).astype(np.float64)
        worst = max(worst, float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-30)))
    return identical, worst


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.2f} ms"


def _mib(n: int) -> str:
    return f"{n / 2**20:8.2f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9, help="timed runs per cell (median reported)")
    args = parser.parse_args()
    models = [mlp(), conv_net()]

    print(f"NumPy {np.__version__}, OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}, "
          f"median of {args.repeats} runs\n")
    names = ["oracle", "EXACT plan", "FAST plan", "NumPy"]
    header = f"{'training step':<58}" + "".join(f"{n:>13}" for n in names) + "   " + "  ".join(
        f"{n + '/NumPy':>16}" for n in names[:3])
    print(header)
    print("-" * len(header))
    checks, memory_rows = [], []
    for model in models:
        step, exact, fast = steps(model)
        times = {name: median_seconds(lambda fn=fn: fn(model.parameters), args.repeats) for name, fn in step.items()}
        ratios = "  ".join(f"{times[n] / times['NumPy']:>15.1f}x" for n in names[:3])
        print(f"{model.name:<58}" + "".join(f"{_ms(times[n]):>13}" for n in names) + "   " + ratios)
        checks.append((model.name, *agreement(model, step), exact))
        memory_rows.append((model, exact, fast))

    print("\nagreement (one step from the same table)")
    for name, identical, worst, exact in checks:
        print(f"  {name}: EXACT plan == oracle bitwise: {'yes' if identical else 'NO'}; "
              f"NumPy update vs oracle: max relative difference {worst:.1e}; "
              f"plan evaluates {len(exact.schedule)} of {len(exact.network)} nodes, "
              f"{len(exact.fusions())} fused groups ({', '.join(sorted({g.kind for g in exact.fusions()})) or 'none'})")

    print("\npeak memory of one run of the training spec (forward + recorded gradients), "
          "predicted by the plan vs measured by tracemalloc")
    columns = ["retain-all predicted", "oracle measured", "planned predicted", "EXACT measured", "FAST measured",
               "planned/retain-all"]
    header = f"{'model':<58}" + "".join(f"{c:>22}" for c in columns)
    print(header)
    print("-" * len(header))
    for model, exact, fast in memory_rows:
        parameters = model.parameters
        oracle_peak = traced_peak(lambda: model.trained.forward(parameters, model.feeds))
        exact_peak = traced_peak(lambda: exact.forward(parameters, model.feeds))
        fast_peak = traced_peak(lambda: fast.forward(parameters, model.feeds))
        predicted, _ = exact.peak()
        retain = exact.retain_all_bytes()
        cells = [_mib(retain), _mib(oracle_peak), _mib(predicted), _mib(exact_peak), _mib(fast_peak),
                 f"{predicted / retain:.2f}"]
        print(f"{model.name:<58}" + "".join(f"{c:>22}" for c in cells))
    feed_bytes = {m.name: sum(a.nbytes for a in m.feeds.values()) for m, _, _ in memory_rows}
    print("\n(measured peaks include one copy of the feeds, which every run makes: "
          + ", ".join(f"{name}: {_mib(n).strip()}" for name, n in feed_bytes.items())
          + "; and each kernel's scratch, which the plan does not count: under EXACT, refmath's "
          "tanh widens to float64 and holds about 30 temporaries of its operand's size)")


if __name__ == "__main__":
    main()
