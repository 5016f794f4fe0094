"""Convolution spellings: each conv model's forward and training modules as topos emits them and the other ways.

topos-raise spells a convolution group as *columns* by default (the
batch's im2col matrix, transposed, times the weight in one ``dot_general``;
the gradients likewise) or *named* (``stablehlo.convolution``, which
llvm-cpu compiles with IREE's img2col preprocessing, ``targets.IMG2COL_FLAGS``).
Per model: the forward plan (the loss alone) spelled as columns, named
with img2col, and named without it; the training step (every group
raised, the default) as columns and named with img2col, and with the
convolutions left to the composition (``kinds`` without them: its
unfold chain compiled as recorded, the pools still raised).

Models: the MNIST example's LeNet (``_zoo.py``, 28 x 28, batch 64), the
benchmark conv net (``_models.conv_net``), the LeNet-like net of the
raise tests (batch 16, 28 x 28), and a deep layer: one 3 x 3 convolution
of 128 channels to 128 on 8 x 8, padding 1, batch 32 (tanh, squared sum),
where the filters outnumber the positions. Each module is called directly on its
arguments already on the device (local-sync, pinned to one CPU), rounds
interleaved; median wall ms per call and the range over rounds. Every
variant's results are compared with the default's first. Nothing is
asserted.

Run: python benchmarks/convolutions.py [--rounds 9]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _pinning  # noqa: E402, F401  (first: one core is the measurement's, pinned before NumPy loads)

# isort: split
import argparse  # noqa: E402
import statistics  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from _timing import cpu_model, median_seconds, table  # noqa: E402


def models() -> dict:
    """name -> (network, training roots, parameters, feeds): the four conv models."""
    import _models
    from _zoo import build
    from test_patterns_training import conv_training, lenet

    lenet_zoo = build("lenet")
    conv = _models.conv_net()
    like, like_roots = lenet(np.float32, batch=16, side=28)
    deep, deep_roots = conv_training(np.float32, (32, 128, 8, 8), (128, 128, 3, 3), 1, 1)
    return {"MNIST LeNet, batch 64": (lenet_zoo.network, lenet_zoo.roots, lenet_zoo.parameters, lenet_zoo.feeds(0)),
            "conv net, batch 16": (conv.trained, conv.adjoints.roots(), conv.trained.parameters(), conv.feeds),
            "LeNet-like, batch 16": (like, like_roots, like.parameters(), None),
            "deep layer, batch 32": (deep, deep_roots, deep.parameters(), None)}


def variants(network, roots, parameters, feeds) -> dict:
    """label -> a Runner of that module on its arguments, for one model."""
    from topos.dialect.iree.targets import IMG2COL_FLAGS
    from topos.dialect.passes.plan_passes import RAISABLE

    from compiled import standalone_module

    composed = [k for k in RAISABLE if not k.startswith("convolution")]
    runners = {}
    for label, entry in (("forward", network.entry([roots[0]])), ("training step", network.entry(roots))):
        plan = entry.lower()
        compiled = plan.compile("llvm-cpu", cache=False)  # the default: columns
        arguments = compiled._arguments(parameters, feeds)
        flags = list(compiled.flags)
        named = plan.emit_stablehlo(convolution="named")
        texts = {"columns (default)": (compiled.stablehlo, flags),
                 "named + img2col": (named, flags + list(IMG2COL_FLAGS))}
        if label == "forward":
            texts["named, without img2col"] = (named, flags)
        else:
            texts["convolutions composed"] = (plan.emit_stablehlo(kinds=composed), flags)
        for spelling, (text, chosen) in texts.items():
            runners[f"{label}: {spelling}"] = standalone_module(text, chosen, arguments)
    return runners


def _agree(runners) -> str:
    """The largest difference of each variant's results from its plan's default spelling, over the results' scale."""
    results = {}
    for label, runner in runners.items():
        out = runner.step()
        results[label] = [np.asarray(r) for r in (out if isinstance(out, (list, tuple)) else [out])]
    worst = 0.0
    for label, values in results.items():
        default = results[label.split(":")[0] + ": columns (default)"]
        for got, want in zip(values, default):
            scale = max(float(np.max(np.abs(want))), 1e-30)
            worst = max(worst, float(np.max(np.abs(got - want))) / scale)
    return f"{worst:.1e}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=15, help="calls per round (default 15)")
    args = parser.parse_args()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    runners = {}
    for name, model in models().items():
        mine = variants(*model)
        runners.update({(name, label): runner for label, runner in mine.items()})
        print(f"compiled {name}; every spelling within {_agree(mine)} of the default's results (relative)",
              flush=True)
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
