"""How long topos.draw takes: building the DOT text, and Graphviz rendering it to SVG.

Three subjects, each a training step as a network (forward, derivative and
update shaded) and as its plan: the walkthrough's graph, makemore's MLP
step (examples/makemore/mlp.py, SGD, batch 64) and the 2-block GPT step
of benchmarks/compiled.py (546 nodes: over the default max_nodes, so it
is drawn as a summary, and once more with every node). The StableHLO
drawings (which lower and parse the emitted module) are timed for the
walkthrough and the makemore step. Each cell
is the median of a few repeats; ``dot`` is Graphviz's, whichever is on
PATH (its version is printed). Nothing is asserted.

Run: python benchmarks/drawing.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import topos  # noqa: E402
from topos import Tape  # noqa: E402
from topos.views.drawing import graphviz_available  # noqa: E402

from _gpt import small_gpt  # noqa: E402
from _timing import median_seconds, table  # noqa: E402


def walkthrough():
    def plate(tape):
        w = tape.parameter(np.array([[0.5, -0.25], [0.75, 1.0]], dtype=np.float32))
        x = tape.input(np.array([[1.0, 2.0]], dtype=np.float32))
        h = (x @ w).tanh()
        loss = (h * h).sum()
        adjoints = tape.differentiate(loss, [w])
        return loss, adjoints, topos.sgd(tape, adjoints, 0.1)

    network, (loss, adjoints, updates) = Tape.record(plate)
    return network, loss, adjoints, updates


def makemore_mlp():
    spec = importlib.util.spec_from_file_location("makemore_mlp", HERE.parent / "examples/makemore/mlp.py")
    mlp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mlp)
    from names import load  # examples/makemore is on sys.path once the example is loaded

    args = mlp.command_line().parse_args([])
    network, (loss, updates) = mlp.recorder(load(), args, args.batch, "sgd")
    return network, loss, None, updates


def gpt():
    workload = small_gpt()
    return workload.trained, workload.loss, workload.adjoints, workload.updates


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--repeats", type=int, default=3)
    repeats = options.parse_args().repeats
    rendering = graphviz_available()
    if rendering:
        version = subprocess.run(["dot", "-V"], capture_output=True, text=True).stderr.strip()
        print(f"Graphviz: {version}")
    else:
        print("Graphviz's dot is not installed: the SVG columns are absent (apt install graphviz)")
    rows = []
    for name, build in (("walkthrough", walkthrough), ("makemore MLP step", makemore_mlp), ("2-block GPT step", gpt)):
        network, loss, adjoints, updates = build()
        plan = network.entry(updates.roots(loss)).lower()
        subjects = [("network", lambda: topos.draw(network, adjoints=adjoints or (), updates=updates)),
                    ("plan", lambda: topos.draw(plan, updates=updates))]
        if name != "2-block GPT step":
            subjects.append(("StableHLO", lambda: topos.draw(plan, stage="stablehlo")))
        else:  # over max_nodes: the default is a summary; this is what drawing every node costs
            subjects += [("network, all", lambda: topos.draw(network, adjoints=adjoints, updates=updates,
                                                             max_nodes=len(network))),
                         ("plan, all", lambda: topos.draw(plan, updates=updates, max_nodes=len(network)))]
        for what, make in subjects:
            drawing = make()
            dot_time = median_seconds(make, repeats)
            svg_time = median_seconds(drawing.svg, repeats) if rendering else None
            rows.append([name, what, str(drawing.nodes), f"{dot_time * 1000:.1f}",
                         f"{svg_time * 1000:.0f}" if svg_time is not None else "absent (no dot)",
                         drawing.note and "summary"])
    print(table(["subject", "drawing", "boxes", "DOT ms", "SVG ms", "note"], rows))


if __name__ == "__main__":
    main()
