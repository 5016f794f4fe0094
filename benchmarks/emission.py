"""Emission, measured: record a spec of about 5,000 nodes, emit topos IR, verify it, print it, read it back.

The graph is a long chain of matmul, tanh, mul, add and narrow on 8x16
float32 tensors (the shape of a deep MLP's forward pass), plus an MLP with
its recorded gradients for a second, more varied, row. Each step is timed
on its own; medians over a few runs. Nothing here asserts.

Steps:
  record         Tape.record of the graph (the core alone, no MLIR)
  emit           emit_module: one topos op per node, locations included
  verify         topos-verify: every op against its opcode's shape rule
  print          the module as text with locations
  parse text     the text back into a module (MLIR's parser)
  parse spec     parse_spec: the module replayed onto a fresh tape
  lower          topos-lower-to-stablehlo, canonicalize, cse, verify (to_stablehlo)
  iree-compile   IREE compiling that StableHLO for llvm-cpu in-process (--iree-compile)

Run: python benchmarks/emission.py [--nodes N] [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "dialect"))

from topos.dialect import emit_module, parse_spec, run_pipeline  # noqa: E402
from topos.dialect.ir.parse import parse_module  # noqa: E402

import graphs  # noqa: E402  (the graphs the dialect tests use)

# Each step takes the state so far (a dict) and returns what it adds.
Step = tuple[str, Callable[[dict], dict]]


def _record(state):
    network, roots, observes = state["build"]()
    return {"network": network, "roots": roots, "observes": observes}


def _emit(state):
    return {"module": emit_module(state["network"], state["roots"], state["observes"])}


def _verify(state):
    run_pipeline(state["module"], "topos-verify", verify_each=False)
    return {}


def _print(state):
    return {"text": state["module"].operation.get_asm(enable_debug_info=True)}


def _parse_text(state):
    return {"parsed": parse_module(state["text"])}


def _parse_spec(state):
    network, _, _ = parse_spec(state["parsed"])
    assert network.describe() == state["network"].describe()
    return {}


def _lower(state):
    from topos.dialect.pipeline import to_stablehlo

    return {"stablehlo": to_stablehlo(state["module"])}


def _iree_compile(state):
    from topos.dialect.iree.compile import compile_stablehlo
    from topos.dialect.iree.targets import flags_for, target

    return {"vmfb": compile_stablehlo(state["stablehlo"], flags_for(target("llvm-cpu"), False, "generic"))}


STEPS: list[Step] = [("record", _record), ("emit", _emit), ("verify", _verify), ("print", _print)]
STEPS_AFTER_PRINT: list[Step] = [("parse text", _parse_text), ("parse spec", _parse_spec), ("lower", _lower)]
COMPILE_STEP: Step = ("iree-compile", _iree_compile)


def measure(build, repeats: int, steps) -> tuple[int, dict[str, float], int]:
    """Median seconds per step over ``repeats`` runs, the node count and the text size."""
    times: dict[str, list[float]] = {}
    nodes = size = 0
    for _ in range(repeats):
        state = {"build": build}
        for name, step in steps:
            start = time.perf_counter()
            state.update(step(state))
            times.setdefault(name, []).append(time.perf_counter() - start)
        nodes, size = len(state["network"]), len(state["text"])
    return nodes, {name: statistics.median(t) for name, t in times.items()}, size


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iree-compile", action="store_true", help="also time IREE compiling the StableHLO")
    arguments = parser.parse_args(argv)
    steps = STEPS + STEPS_AFTER_PRINT + ([COMPILE_STEP] if arguments.iree_compile else [])
    rows = [
        (f"chain ({arguments.nodes} nodes)", lambda: graphs.chain(arguments.nodes)),
        ("mlp + gradients", graphs.mlp),
    ]
    names = [name for name, _ in steps]
    print(f"{'graph':<24}{'nodes':>7}" + "".join(f"{n:>13}" for n in names) + f"{'text KiB':>10}")
    for label, build in rows:
        nodes, medians, size = measure(build, arguments.repeats, steps)
        cells = "".join(f"{medians[n] * 1e3:>10.1f} ms" for n in names)
        print(f"{label:<24}{nodes:>7}{cells}{size / 1024:>10.0f}")
        per_node = "".join(f"{medians[n] * 1e6 / nodes:>10.1f} us" for n in names)
        print(f"{'  per node':<24}{'':>7}{per_node}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
