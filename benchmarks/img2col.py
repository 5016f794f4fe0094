"""IREE's img2col for raised convolutions: each conv model's module with and without it, on one core.

A plan whose emission raises a convolution (a forward plan: inference,
evaluation, an exported classifier) gets
``targets.IMG2COL_FLAGS`` on llvm-cpu: IREE rewrites each
``stablehlo.convolution`` as an im2col copy and a matmul instead of
compiling it into a direct loop nest. A training step raises no
convolution by default (its convolution gradients keep the composition's
im2col matmuls; ``plan_passes.ELECTED_BY_DEFAULT``); the last two rows
per model measure that choice again: the default step against the step
with every convolution kind raised (``emit_stablehlo(kinds=RAISABLE)``),
compiled with img2col.

Models: the MNIST example's LeNet (``_zoo.py``, 28 x 28, batch 64), the
benchmark conv net (``_models.conv_net``) and the LeNet-like net of the
raise tests (batch 16, 28 x 28). Each module is called directly on its
arguments already on the device (local-sync, pinned to one CPU), rounds
interleaved; median wall ms per call and the range over rounds. Nothing
is asserted.

Run: python benchmarks/img2col.py [--rounds 9]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from _timing import cpu_model, median_seconds, table  # noqa: E402


def models() -> dict:
    """name -> (network, training roots, parameters, feeds): the three conv models."""
    import _models
    from _zoo import build
    from test_patterns_training import lenet

    lenet_zoo = build("lenet")
    conv = _models.conv_net()
    like, like_roots = lenet(np.float32, batch=16, side=28)
    return {"MNIST LeNet, batch 64": (lenet_zoo.network, lenet_zoo.roots, lenet_zoo.parameters, lenet_zoo.feeds(0)),
            "conv net, batch 16": (conv.trained, conv.adjoints.roots(), conv.trained.parameters(), conv.feeds),
            "LeNet-like, batch 16": (like, like_roots, like.parameters(), None)}


def variants(network, roots, parameters, feeds) -> dict:
    """label -> (vmfb, arguments) for one model."""
    from compiled import module_runner

    from topos.dialect.compiled import compile_stablehlo
    from topos.dialect.plan_passes import RAISABLE
    from topos.dialect.targets import IMG2COL_FLAGS

    forward = network.entry([roots[0]]).lower()  # the loss alone: convolutions raised by default
    compiled = forward.compile("llvm-cpu", cache=False)
    arguments = compiled._arguments(parameters, feeds)
    without = [f for f in compiled.flags if f not in IMG2COL_FLAGS]
    training = network.entry(roots).lower()
    step = training.compile("llvm-cpu", cache=False)
    step_arguments = step._arguments(parameters, feeds)
    raised = training.emit_stablehlo(kinds=RAISABLE)
    return {
        "forward, topos flags (img2col)": module_runner(compile_stablehlo(compiled.stablehlo, list(compiled.flags)),
                                                        arguments),
        "forward, without img2col": module_runner(compile_stablehlo(compiled.stablehlo, without), arguments),
        "training step, default emission": module_runner(compile_stablehlo(step.stablehlo, list(step.flags)),
                                                         step_arguments),
        "training step, every kind raised + img2col": module_runner(
            compile_stablehlo(raised, list(step.flags) + list(IMG2COL_FLAGS)), step_arguments),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=15, help="calls per round (default 15)")
    args = parser.parse_args()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    runners = {}
    for name, model in models().items():
        for label, runner in variants(*model).items():
            runners[(name, label)] = runner
        print(f"compiled {name}", flush=True)
    seconds: dict = {key: [] for key in runners}
    for _ in range(args.rounds):
        for key, runner in runners.items():
            seconds[key].append(1000 * median_seconds(runner.step, args.calls))
    print(f"\n{cpu_model()}, one core, {args.rounds} interleaved rounds of {args.calls} calls\n")
    rows = []
    for (name, label), series in seconds.items():
        rows.append([name, label, f"{statistics.median(series):.3f}", f"{min(series):.3f}-{max(series):.3f}"])
    print(table(["model", "module", "median ms", "range"], rows))


if __name__ == "__main__":
    main()
