"""Where data tiling starts to pay on this machine: one SGD step of an MLP across its width, tiled and untiled.

``plan.compile`` turns IREE's data tiling on when the plan's largest
product reaches ``topos.dialect.iree.targets.data_tiling_threshold(target,
driver, cpu)`` multiply-adds. This script measures where that threshold
belongs on the machine it runs on: topos's compiled SGD step of a
``batch``-784-``H``-10 MLP (tanh, log-softmax cross-entropy) for each
width, compiled with ``data_tiling=False`` and ``True`` (every other
flag topos's own, including the large workgroups a tiled module gets on
one thread), and both steps timed in the same process in interleaved,
alternating rounds on the parameters resident on the device. Printed per
width: the largest product (log2 of its multiply-adds), both steps' ms
and their ratio (below 1: tiling pays), and what topos chooses here.
Nothing is asserted.

``--threads 1`` (the default): pinned to one CPU, IREE ``local-sync``,
process CPU time. ``--threads 2``: ``local-task`` with two workers, wall
time.

Run: python benchmarks/tiling_threshold.py [--threads 1|2] [--rounds 9]
[--shapes 64x128,64x256,64x384,64x512,128x512,128x1024]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _pinning import PINNED_CPU, THREADS  # noqa: E402  (first: pinned before NumPy loads)

# isort: split
import argparse  # noqa: E402
import math  # noqa: E402

import numpy as np  # noqa: E402

import topos  # noqa: E402
from topos import Tape  # noqa: E402
from topos.dialect.iree.compile import module_flags  # noqa: E402
from topos.dialect.iree.targets import DATA_TILING_FLAGS, data_tiling_threshold, target  # noqa: E402

from _timing import interleaved, print_preamble, table  # noqa: E402

SHAPES = "64x128,64x192,64x256,64x384,64x512,128x512,128x1024"


def sgd_mlp(batch: int, hidden: int):
    """(network, loss, updates) of one SGD step of a batch-784-hidden-10 MLP, its batch as input defaults."""
    rng = np.random.default_rng(0)

    def record(tape):
        x = tape.input(rng.standard_normal((batch, 784)).astype(np.float32), name="x")
        y = tape.input(np.eye(10, dtype=np.float32)[rng.integers(0, 10, batch)], name="y")
        w1 = tape.parameter((rng.standard_normal((784, hidden)) * 0.03).astype(np.float32), name="w1")
        b1 = tape.parameter(np.zeros(hidden, np.float32), name="b1")
        w2 = tape.parameter((rng.standard_normal((hidden, 10)) * 0.03).astype(np.float32), name="w2")
        hidden_values = (x @ w1 + b1.broadcast_to((batch, hidden))).tanh()
        loss = -((hidden_values @ w2).log_softmax(1) * y).sum() / batch
        return loss, topos.sgd(tape, tape.differentiate(loss, [w1, b1, w2]), 0.01)

    network, (loss, updates) = Tape.record(record)
    return network, loss, updates


def timed(batch: int, width: int, driver: str, rounds: int) -> tuple[float, float, bool]:
    """(untiled, tiled) median seconds of one step of ``sgd_mlp(batch, width)`` on ``driver``
    (process CPU time on local-sync, wall time on local-task), timed in alternating rounds, and
    whether topos's own rule tiles that step here."""
    network, loss, updates = sgd_mlp(batch, width)
    plan = network.entry(updates.roots(loss)).lower()
    chosen = set(DATA_TILING_FLAGS) <= set(module_flags(plan, target("llvm-cpu"), "host", None, driver=driver))
    steps = {}
    for tiled in (False, True):
        compiled = plan.compile("llvm-cpu", driver, cache=False, data_tiling=tiled)
        state = [compiled.resident(network.parameters())]

        def step(compiled=compiled, state=state):
            state[0], _ = compiled.step(state[0], {}, updates)

        steps["tiled" if tiled else "untiled"] = step
    timing = interleaved(steps, 5, rounds, warmup=2, alternate=True)
    clock = "cpu" if driver == "local-sync" else "wall"
    return getattr(timing["untiled"], clock), getattr(timing["tiled"], clock), chosen


def shapes(text: str) -> list[tuple[int, int]]:
    try:
        pairs = [tuple(int(n) for n in item.split("x")) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give BATCHxWIDTH pairs, such as 64x256,128x512") from None
    if not pairs or any(len(p) != 2 or min(p) < 1 for p in pairs):
        raise argparse.ArgumentTypeError(f"{text!r}: give BATCHxWIDTH pairs of positive integers, such as 64x256")
    return pairs  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, choices=(1, 2), default=1, help="1 (pinned, local-sync) or 2")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds (default 9)")
    parser.add_argument("--shapes", type=shapes, default=shapes(SHAPES), help=f"BATCHxWIDTH list (default {SHAPES})")
    args = parser.parse_args()
    if args.threads == 2:
        import iree.runtime as rt

        rt.flags.parse_flags("--task_topology_max_group_count=2")  # before the first local-task device
        driver, clock = "local-task", "wall"
        print_preamble("2 threads: IREE local-task with 2 workers, no affinity; wall-clock ms")
    else:
        driver, clock = "local-sync", "cpu"
        print_preamble(f"1 thread: pinned to CPU {PINNED_CPU}, IREE local-sync; process CPU ms")
    threshold = data_tiling_threshold(target("llvm-cpu"), driver, "host")
    print(f"topos tiles from 2^{math.log2(threshold):.0f} multiply-adds here (threads {THREADS})\n", flush=True)
    rows = []
    for batch, width in args.shapes:
        untiled, tiled, chosen = timed(batch, width, driver, args.rounds)
        largest = batch * 784 * width
        rows.append([f"{batch} x 784 x {width}", f"2^{math.log2(largest):.1f}", f"{untiled * 1e3:.3f}",
                     f"{tiled * 1e3:.3f}", f"{tiled / untiled:.2f}x",
                     "data tiling" if chosen else "untiled"])
        print(f"{batch}x{width}: done", flush=True)
    print(f"\nSGD step of the MLP, median {clock} ms over {args.rounds} rounds (ratio: tiled / untiled, below 1: "
          "tiling pays)\n")
    print(table(["largest product", "multiply-adds", "untiled", "tiled", "ratio", "topos chooses"], rows))


if __name__ == "__main__":
    main()
