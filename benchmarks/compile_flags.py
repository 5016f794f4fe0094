"""What each IREE flag costs at compile time and buys at run time: the first-compile budget, measured.

For the training steps of benchmarks/compiled.py (MLP 784-128-10, the
2-block GPT; float32, SGD), the step's StableHLO is compiled (no cache)
under topos's flags and under each variant below, and the module is timed
on the same arguments (device copies, one core, IREE local-sync): median
compile seconds over ``--repeats`` compiles, median step milliseconds.
jax.jit's lower + compile of the same step is the reference the issue sets
(first compile within 1.5x of it). Nothing is asserted.

Variants (each added to, or replacing in, topos's llvm-cpu flags):

* ``const-eval``      without topos's --iree-opt-const-eval=false (IREE JITs constant expressions)
* ``O1``              --iree-opt-level=O1
* ``codegen O1``      --iree-llvmcpu-mlir-opt-level=O1
* ``generic cpu``     --iree-llvmcpu-target-cpu=generic instead of host
* ``no source map``   --iree-vm-bytecode-module-strip-source-map=true --iree-llvmcpu-debug-symbols=false
* ``no LLVM unroll``  --iree-llvmcpu-loop-unrolling=false (LLVM's own loop unrolling after IREE's codegen)
* ``no LLVM SLP``     --iree-llvmcpu-slp-vectorization=false
* ``no LLVM loop vec`` --iree-llvmcpu-loop-vectorization=false
* ``no LLVM passes``  all three LLVM passes above off
* ``propagate transposes`` --iree-opt-aggressively-propagate-transposes=true

Run: python benchmarks/compile_flags.py [--models mlp-s,gpt] [--repeats 2]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _pinning  # noqa: E402, F401  (first: one core is the measurement's, pinned before NumPy loads)

# isort: split
import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

from _gpt import mlp_s, small_gpt  # noqa: E402
from _timing import chosen_models, median_seconds, table  # noqa: E402
from compiled import module_runner  # noqa: E402  (the same local-sync harness as the compiled benchmark)

VARIANTS = {
    "topos flags": ((), ()),
    "const-eval": ((), ("--iree-opt-const-eval=false",)),
    "O1": (("--iree-opt-level=O1",), ()),
    "codegen O1": (("--iree-llvmcpu-mlir-opt-level=O1",), ()),
    "generic cpu": (("--iree-llvmcpu-target-cpu=generic",), ("--iree-llvmcpu-target-cpu=host",)),
    "no source map": (("--iree-vm-bytecode-module-strip-source-map=true", "--iree-llvmcpu-debug-symbols=false"), ()),
    "no LLVM unroll": (("--iree-llvmcpu-loop-unrolling=false",), ()),
    "no LLVM SLP": (("--iree-llvmcpu-slp-vectorization=false",), ()),
    "no LLVM loop vec": (("--iree-llvmcpu-loop-vectorization=false",), ()),
    "no LLVM passes": (("--iree-llvmcpu-loop-unrolling=false", "--iree-llvmcpu-slp-vectorization=false",
                        "--iree-llvmcpu-loop-vectorization=false"), ()),
    "propagate transposes": (("--iree-opt-aggressively-propagate-transposes=true",), ()),
}
MODELS = {"mlp-s": mlp_s, "gpt": small_gpt}


def step_ms(vmfb: bytes, arguments, steps: int = 50) -> float:
    return 1000 * median_seconds(module_runner(vmfb, arguments).step, steps)


def main() -> None:
    from topos.dialect.iree.compile import compile_stablehlo

    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--models", default=",".join(MODELS))
    options.add_argument("--repeats", type=int, default=2)
    options.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names from the list above")
    args = options.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if unknown := sorted(set(variants) - set(VARIANTS)):
        options.error(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    rows = []
    for name in chosen_models(options, args.models, MODELS):
        workload = MODELS[name]()
        plan = workload.trained.entry(workload.updates.roots(workload.loss)).lower()
        compiled = plan.compile("llvm-cpu", cache=False)
        text, base = compiled.stablehlo, list(compiled.flags)
        arguments = compiled._arguments(workload.parameters, workload.feeds)
        try:
            from _peers import jax_peer

            jax_seconds = jax_peer(workload).compile_seconds
        except ImportError:
            jax_seconds = None
        for variant in variants:
            added, removed = VARIANTS[variant]
            keys = {flag.split("=")[0] for flag in added}
            flags = [f for f in base if f not in removed and f.split("=")[0] not in keys] + list(added)
            seconds, vmfb = [], b""
            for _ in range(args.repeats):
                started = time.perf_counter()
                vmfb = compile_stablehlo(text, flags)
                seconds.append(time.perf_counter() - started)
            compile_s = statistics.median(seconds)
            ratio = f"{compile_s / jax_seconds:.2f}" if jax_seconds else "absent (no jax)"
            rows.append([workload.name[:24], variant, f"{compile_s:.2f}", ratio, f"{step_ms(vmfb, arguments):.3f}"])
        rows.append([workload.name[:24], "jax.jit lower + compile",
                     f"{jax_seconds:.2f}" if jax_seconds else "absent", "1.00", ""])
    print(table(["model", "flags", "compile s", "over jax.jit", "step ms"], rows))


if __name__ == "__main__":
    main()
