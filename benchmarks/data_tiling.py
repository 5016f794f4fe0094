"""When IREE's data tiling pays: every benchmark model's step compiled with and without it, timed on one core.

``plan.compile`` turns data tiling on when the plan's largest matmul
reaches ``topos.dialect.iree.targets.data_tiling_threshold(...)`` multiply-adds.
This script is the evidence for that number: each model of ``_zoo.py``
is lowered once, its StableHLO compiled (no cache) under topos's llvm-cpu
flags without data tiling, with ``--iree-opt-data-tiling`` (IREE's default
ukernel choice), with topos's ``DATA_TILING_FLAGS`` (the mmt4d and pack
microkernels, multi-use fusion off) and with every microkernel
(``--iree-llvmcpu-enable-ukernels=all``); each module is called on the same
device-resident arguments (IREE local-sync, one pinned CPU) in
interleaved rounds. Printed: the largest matmul (log2 of its
multiply-adds), what topos chooses by default, and the median ms of each
variant with its ratio to the untiled one (below 1: faster). Nothing is
asserted.

Run: python benchmarks/data_tiling.py [--rounds 5] [--models mlp-s,gpt,...]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _pinning import PINNED_CPU  # noqa: E402  (first: one core is the measurement's, pinned before NumPy loads)

# isort: split
import argparse  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402

from topos.dialect.iree.compile import CompileError, compile_stablehlo, largest_matmul, module_flags  # noqa: E402
from topos.dialect.iree.targets import DATA_TILING_FLAGS, data_tiling_threshold, target  # noqa: E402

from _timing import chosen_models, cpu_model, table, versions  # noqa: E402
from _zoo import MODELS, PER_ROUND, models_that_fit  # noqa: E402
from compiled import measure, module_runner  # noqa: E402

# Every tiled variant keeps multi-use fusion off: without it IREE 3.13 cannot compile some tiled
# steps at all (the makemore transformer's; docs/performance.md, "Multi-use fusion off").
_FUSION = next(flag for flag in DATA_TILING_FLAGS if "fuse-multi-use" in flag)
VARIANTS = {
    "untiled": (),
    "data tiling": ("--iree-opt-data-tiling", _FUSION),
    "+ ukernels mmt4d,pack (topos)": DATA_TILING_FLAGS,
    "+ ukernels all": ("--iree-opt-data-tiling", "--iree-llvmcpu-enable-ukernels=all", _FUSION),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {', '.join(MODELS)}")
    args = parser.parse_args()
    print(f"machine: {cpu_model()}, {os.cpu_count()} CPUs; pinned to CPU {PINNED_CPU}; IREE local-sync")
    print(f"versions: {versions()}")
    threshold = data_tiling_threshold(target("llvm-cpu"), "local-sync", "host")
    print(f"topos's rule on this machine: {' '.join(DATA_TILING_FLAGS)} when the largest matmul reaches "
          f"2^{math.log2(threshold):.0f} multiply-adds")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n", flush=True)
    rows = []
    for key, model in models_that_fit(chosen_models(parser, args.models, MODELS)):
        compiled = model.network.entry(model.roots).lower().compile("llvm-cpu", cache=False, data_tiling=False)
        base = [f for f in compiled.flags if f not in DATA_TILING_FLAGS]
        arguments = compiled._arguments(model.parameters, model.feeds(0))
        runners, seconds, failed = {}, {}, {}
        for name, extra in VARIANTS.items():
            began = time.perf_counter()
            try:
                vmfb = compile_stablehlo(compiled.stablehlo, [*base, *extra])
            except CompileError as error:  # a variant IREE cannot build is a finding, not the end of the run
                if name == "untiled":  # topos's own flags: a failure there is a bug to see whole
                    raise
                failed[name] = next((line.strip() for line in str(error).splitlines()[1:]), str(error))
                print(f"{key}, {name}: does not compile: {failed[name]}", flush=True)
                continue
            seconds[name] = time.perf_counter() - began
            runners[name] = module_runner(vmfb, arguments)
        timing = measure(runners, dict.fromkeys(runners, PER_ROUND[key]), args.rounds)
        untiled = timing["untiled"].cpu
        largest = largest_matmul(compiled.plan)
        chosen = "data tiling" if set(DATA_TILING_FLAGS) <= set(
            module_flags(compiled.plan, target("llvm-cpu"), "host", None, driver="local-sync")) else "untiled"
        rows.append([model.name, f"2^{math.log2(largest):.1f}" if largest else "—", chosen] + [
            "does not compile" if name in failed else f"{timing[name].cpu * 1e3:.3f}"
            + ("" if name == "untiled" else f" ({timing[name].cpu / untiled:.2f}x)")
            for name in VARIANTS] + [" / ".join(f"{seconds[name]:.1f}" if name in seconds else "—"
                                                for name in VARIANTS)])
        print(f"{key}: done", flush=True)
        del runners, compiled
    print("\nmodule alone, arguments on the device: median CPU ms per call (ratio to untiled; below 1: faster)\n")
    print(table(["model", "largest matmul", "topos chooses", *VARIANTS, "compile s (each)"], rows))
    print(f"\nload average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
