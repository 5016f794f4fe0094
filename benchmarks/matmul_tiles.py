"""Matmul tile sizes through an IREE tuning spec: one model's step with each, against IREE's own choice.

IREE picks a lowering config per matmul dispatch (on this Zen 3 machine,
untiled: distribution 64 x 64, register tile 8 x 8, reduction 8; see
``--iree-hal-dump-executable-configurations-to``). A tuning spec
(``--iree-codegen-tuning-spec-path``, a transform-dialect library) can set
another on every ``linalg.matmul``; this script writes one per variant,
compiles the model's step untiled with it, and times every module
interleaved on one pinned core (module called on device-resident
arguments, local-sync; median wall ms over rounds and the range). The
rows "IREE default" (topos's flags: data tiling where the threshold says)
and "IREE untiled" are the baselines. Nothing is asserted.

Run: python benchmarks/matmul_tiles.py [--model gpt] [--rounds 5]
     [--variant label:DM,DN:VM,VN:K ...]   (distribution, register tile, reduction tile)
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _pinning  # noqa: E402, F401  (first: one core is the measurement's, pinned before NumPy loads)

# isort: split
import argparse  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from _timing import cpu_model, median_seconds, table  # noqa: E402
from _zoo import MODELS, build  # noqa: E402

SPEC = """module @topos_matmul_tiles attributes {{ transform.with_named_sequence }} {{
  transform.named_sequence @apply(%op: !transform.any_op {{transform.readonly}},
                                  %config: !transform.any_param {{transform.readonly}}) {{
    transform.annotate %op "compilation_info" = %config : !transform.any_op, !transform.any_param
    transform.yield
  }}
  transform.named_sequence @match(%op: !transform.any_op {{transform.readonly}})
      -> (!transform.any_op, !transform.any_param) {{
    transform.match.operation_name %op ["linalg.matmul"] : !transform.any_op
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_cpu.lowering_config<cache_parallel = [{dm}, {dn}, 0], distribution = [{dm}, {dn}, 0],
                                                   vector_common_parallel = [{vm}, {vn}, 0],
                                                   vector_reduction = [0, 0, {k}]>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<DoubleTilingExpert>,
                                                        {{enable_loop_peeling}}>> -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }}
  transform.named_sequence @main(%variant: !transform.any_op {{transform.consumed}}) -> (!transform.any_op)
      attributes {{ iree_codegen.tuning_spec_entrypoint }} {{
    %done = transform.foreach_match in %variant @match -> @apply : (!transform.any_op) -> !transform.any_op
    transform.yield %done : !transform.any_op
  }}
}}
"""
# IREE's own choice first (to show the spec applies), then wider, taller and deeper register
# and cache tiles for AVX2's 16 vector registers.
VARIANTS = ("same as IREE:64,64:8,8:8", "4x16:64,64:4,16:8", "8x16:64,64:8,16:8", "16x8:64,64:16,8:8",
            "k1:64,64:8,8:1", "k16:64,64:8,8:16", "cache 32:32,32:8,8:8", "cache 128:128,128:8,8:8")


def main() -> None:
    from topos.dialect.iree.compile import compile_stablehlo
    from topos.dialect.iree.targets import DATA_TILING_FLAGS

    from compiled import module_runner

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt", choices=MODELS)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--variant", action="append", help="label:DM,DN:VM,VN:K (repeatable)")
    args = parser.parse_args()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    model = build(args.model)
    compiled = model.network.entry(model.roots).lower().compile("llvm-cpu", cache=False)
    arguments = compiled._arguments(model.parameters, model.feeds(0))
    untiled = [f for f in compiled.flags if f not in DATA_TILING_FLAGS]
    modules = {"IREE default (topos flags)": compile_stablehlo(compiled.stablehlo, list(compiled.flags)),
               "IREE untiled": compile_stablehlo(compiled.stablehlo, untiled)}
    with tempfile.TemporaryDirectory(prefix="topos-tiles-") as scratch:
        for variant in args.variant or VARIANTS:
            label, distribution, register, k = variant.split(":")
            (dm, dn), (vm, vn) = distribution.split(","), register.split(",")
            spec = Path(scratch) / f"spec{len(modules)}.mlir"
            spec.write_text(SPEC.format(dm=dm, dn=dn, vm=vm, vn=vn, k=k))
            modules[f"spec {label} ({dm}x{dn} / {vm}x{vn} / k {k})"] = compile_stablehlo(
                compiled.stablehlo, untiled + [f"--iree-codegen-tuning-spec-path={spec}"])
    runners = {label: module_runner(vmfb, arguments) for label, vmfb in modules.items()}
    seconds: dict = {label: [] for label in runners}
    for _ in range(args.rounds):
        for label, runner in runners.items():
            seconds[label].append(1000 * median_seconds(runner.step, args.calls))
    print(f"{model.name}; {cpu_model()}, one core, {args.rounds} interleaved rounds of {args.calls} calls\n")
    print(table(["module", "median ms", "range"],
                [[label, f"{statistics.median(s):.2f}", f"{min(s):.2f}-{max(s):.2f}"] for label, s in seconds.items()]))


if __name__ == "__main__":
    main()
