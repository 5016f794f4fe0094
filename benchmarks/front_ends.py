"""One compiler, two front ends: each model's step as topos emits it and as jax lowers it, both compiled by IREE.

Where a topos step trails ``jax.jit`` (``versus_jax.py``), the gap is
either in what topos hands IREE or in IREE itself. This benchmark tells
the two apart. For each model of ``_zoo.py`` it takes two StableHLO
modules of the same mathematics: topos's own (``plan.export``'s
``module.stablehlo.mlir``) and jax's (``jax.jit(...).lower(...).as_text()``
of the twin in ``_zoo.py``). It compiles both with topos's flags for
that module (``module_flags``: data tiling, tile budget and distribution
chosen by the same plan; IREE's img2col added where jax's text holds a
``stablehlo.convolution``, as ``module_flags`` adds it to any StableHLO
that holds one) and times them the same way.

- **Compile.** In-process ``iree.compiler`` on each text, in alternating
  rounds. XLA's lower + compile of the twin is printed beside them.
- **Call.** ``iree-benchmark-module`` on each module's inputs (topos's:
  the export's ``inputs/``; jax's: its flattened arguments written as
  ``.npy``), with the caching allocator. ``--threads 1`` (the default)
  uses ``local-sync`` pinned to one CPU; ``--threads 2`` uses
  ``local-task`` with two workers, unpinned, on the module built for it.
  The two modules take turns, for ``--rounds`` rounds of ``--seconds``
  of calls each; a cell is the median of the rounds' means. No Python runs
  inside a timed call, so these are module times: read
  ``versus_jax.py`` for the whole step against ``jax.jit``.

Before timing, both modules are called once on their own inputs, and
the value the step reads back (its loss, or GPT-2's logits) is compared.
Ratio = jax's module over topos's: above 1, IREE runs topos's spelling
faster. Nothing is asserted.

Run: python benchmarks/front_ends.py [--threads 1|2] [--models mlp-m,gpt,...] [--rounds 5] [--seconds 0.5]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _pinning import PINNED_CPU, THREADS  # noqa: E402  (first: it pins before NumPy or JAX load)

# isort: split
import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from topos.dialect.iree.compile import compile_stablehlo, module_flags  # noqa: E402
from topos.dialect.iree.targets import target  # noqa: E402

from _timing import chosen_models, load_average, print_preamble, relative_difference, table  # noqa: E402
from _zoo import MODELS, jax_step, models_that_fit  # noqa: E402
from profile_dispatches import _UNITS, input_flags, tool  # noqa: E402

_ARGUMENT = re.compile(r"%arg\d+: ")


def jax_module(twin, folder: Path) -> tuple[str, list[str], int]:
    """(jax's StableHLO of the twin's step, iree-benchmark-module --input flags for its arguments, its results).

    The arguments are the ones the step was lowered for, flattened as jax
    flattens them (dicts by sorted key) and written to ``folder``.
    """
    import jax

    lowered, arguments = twin.lowering()
    text = lowered.as_text()
    # As jax.jit converts them: without x64, an int64 feed is passed as int32.
    avals = jax.tree_util.tree_leaves(lowered.in_avals)
    leaves = [np.asarray(leaf).astype(aval.dtype, copy=False)
              for leaf, aval in zip(jax.tree_util.tree_leaves(arguments), avals, strict=True)]
    signature = text[text.index("func.func public @main("):]
    declared = len(_ARGUMENT.findall(signature[:signature.index("{\n")]))
    if declared != len(leaves):  # jax drops an argument the step never reads (keep_unused=False)
        raise RuntimeError(f"jax's @main takes {declared} arguments, the twin passes {len(leaves)}")
    folder.mkdir(parents=True)
    inputs = []
    for k, leaf in enumerate(leaves):
        np.save(folder / f"{k}.npy", leaf)
        inputs.append(f"--input=@{folder / f'{k}.npy'}")
    return text, inputs, len(jax.tree_util.tree_leaves(lowered.out_info))


def _run(tool_name: str, vmfb: Path, inputs: list[str], driver: str, *extra: str) -> str:
    placement = ["taskset", "-c", str(PINNED_CPU)] if THREADS == 1 else []
    workers = ["--task_topology_max_group_count=2"] if driver == "local-task" else []
    done = subprocess.run([*placement, tool(tool_name), f"--module={vmfb}", f"--device={driver}", *workers,
                           "--function=main", *inputs, *extra], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{tool_name} on {vmfb.name} failed: {done.stderr.strip()[-2000:]}")
    return done.stdout


def module_call(vmfb: Path, inputs: list[str], driver: str, seconds: float) -> float:
    """Mean ms of one call of ``vmfb``'s @main over as many calls as fill ``seconds`` (at least one)."""
    said = _run("iree-benchmark-module", vmfb, inputs, driver, "--device_allocator=caching",
                f"--benchmark_min_time={seconds}s")
    timed = re.search(r"BM_main\S*\s+([\d.]+) (ms|us|ns|s)", said)
    if timed is None:
        raise RuntimeError(f"iree-benchmark-module printed no time:\n{said[-2000:]}")
    return float(timed.group(1)) * _UNITS[timed.group(2)]


def result(vmfb: Path, inputs: list[str], driver: str, count: int, wanted: int, folder: Path) -> np.ndarray:
    """Result ``wanted`` of the ``count`` that one call of ``vmfb``'s @main returns."""
    folder.mkdir()
    _run("iree-run-module", vmfb, inputs, driver, *(f"--output=@{folder / f'{k}.npy'}" for k in range(count)))
    return np.load(folder / f"{wanted}.npy")


def topos_read(folder: Path, read) -> tuple[int, int]:
    """(results of the export's module, the position of the value the step reads back), from its manifest."""
    results = json.loads((folder / "manifest.json").read_text())["results"]
    return len(results), next(r["position"] for r in results if r["node"] == read.index)


def compile_rounds(texts: dict[str, str], flags: dict[str, tuple], rounds: int) -> tuple[dict, dict]:
    """(name -> median seconds of compiling its text, the names taking turns; name -> its last module)."""
    seconds: dict[str, list[float]] = {name: [] for name in texts}
    modules: dict[str, bytes] = {}
    for r in range(rounds):
        for name in (list(texts) if r % 2 == 0 else list(texts)[::-1]):
            began = time.perf_counter()
            modules[name] = compile_stablehlo(texts[name], flags[name])
            seconds[name].append(time.perf_counter() - began)
    return {name: statistics.median(values) for name, values in seconds.items()}, modules


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, choices=(1, 2), default=1,
                        help="1 (local-sync pinned to one CPU, the default) or 2 (local-task, two workers)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {', '.join(MODELS)}")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds of calls (default 5)")
    parser.add_argument("--seconds", type=float, default=0.5, help="seconds of calls per round (default 0.5)")
    parser.add_argument("--compiles", type=int, default=2, help="alternating compiles of each text (default 2)")
    args = parser.parse_args()
    chosen = chosen_models(parser, args.models, MODELS)
    try:
        import jax  # noqa: F401
    except ImportError as error:
        raise SystemExit(f"jax's column is the point of this benchmark, and jax is not importable ({error}); "
                         "install the bench extra: pip install -e '.[bench]'") from None
    driver = "local-task" if THREADS == 2 else "local-sync"
    setting = "IREE local-task, 2 workers, unpinned" if THREADS == 2 else f"IREE local-sync pinned to CPU {PINNED_CPU}"
    print_preamble(setting)
    rows, compile_rows = [], []
    for key, model in models_that_fit(chosen):
        plan = model.network.entry(model.roots).lower()
        with tempfile.TemporaryDirectory(prefix="topos-front-ends-") as scratch:
            folder = Path(scratch) / "topos"
            plan.export(folder, "llvm-cpu", parameters=model.parameters, feeds=model.feeds(0), cpu="host")
            ours = (folder / "module.stablehlo.mlir").read_text()
            twin = jax_step(model)
            theirs, their_inputs, theirs_count = jax_module(twin, Path(scratch) / "jax")
            texts = {"topos": ours, "jax": theirs}
            # Each text's flags as compile() builds them; jax's convolutions bring IREE's img2col.
            flags = {name: module_flags(plan, target("llvm-cpu"), "host", None, text=text, driver=driver)
                     for name, text in texts.items()}
            seconds, compiled = compile_rounds(texts, flags, max(1, args.compiles))
            modules = {name: Path(scratch) / f"{name}.vmfb" for name in texts}
            for name, path in modules.items():
                path.write_bytes(compiled[name])
            inputs = {"topos": input_flags(folder), "jax": their_inputs}
            ours_count, ours_read = topos_read(folder, model.read)
            agree = relative_difference(  # jax's step returns the state, then the loss: its last result
                result(modules["jax"], inputs["jax"], driver, theirs_count, theirs_count - 1, Path(scratch) / "out-j"),
                result(modules["topos"], inputs["topos"], driver, ours_count, ours_read, Path(scratch) / "out-t"))
            medians: dict[str, list[float]] = {"topos": [], "jax": []}
            for r in range(args.rounds):
                for name in (["topos", "jax"] if r % 2 == 0 else ["jax", "topos"]):
                    medians[name].append(module_call(modules[name], inputs[name], driver, args.seconds))
        ms = {name: statistics.median(values) for name, values in medians.items()}
        rows.append([model.name, f"{ms['topos']:.3f}", f"{ms['jax']:.3f}", f"{ms['jax'] / ms['topos']:.2f}x",
                     f"{agree:.1e}"])
        compile_rows.append([model.name, f"{seconds['topos']:.2f}", f"{seconds['jax']:.2f}",
                             f"{seconds['jax'] / seconds['topos']:.2f}x", f"{twin.compile_seconds:.2f}",
                             f"{ours.count('stablehlo.')}", f"{theirs.count('stablehlo.')}"])
        print(f"{key}: done", flush=True)
        del twin, model, plan
        gc.collect()
    print(f"\nmodule call, median ms ({args.rounds} alternating rounds of {args.seconds} s of calls; "
          f"iree-benchmark-module, {driver}); ratio = jax's StableHLO / topos's through the same IREE and flags "
          "(above 1: topos's spelling runs faster); agreement = scale-relative difference of the value read back\n")
    print(table(["model", "topos's StableHLO", "jax's StableHLO", "ratio", "agreement"], rows))
    print("\ncompile, median seconds of iree-compile in this process on each text (same flags), their ratio, "
          "XLA's lower + compile of the twin, and each text's StableHLO operations\n")
    print(table(["model", "IREE on topos's", "IREE on jax's", "jax's / topos's", "XLA (jax.jit)",
                 "topos's ops", "jax's ops"], compile_rows))
    print(f"\nload average at end: {load_average()}")


if __name__ == "__main__":
    main()
