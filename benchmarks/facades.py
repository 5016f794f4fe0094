"""What the facades cost: recording an MLP through topos.nn against by hand, and compiled optimizer steps.

Two tables, one process, one core (pinned before anything loads, BLAS and
PyTorch at one thread, IREE's local-sync driver):

1. Recording: ``Tape.record`` of an MLP written with ``nn.Mlp`` and the
   same MLP written with ``tape.parameter`` and opcodes, drawing the same
   initial weights, timed in alternation; median milliseconds and node
   counts (rule 5 says the counts are equal).
2. Training steps of the MLP with cross-entropy over integer labels:
   topos's compiled step (forward, backward and optimizer in one IREE
   call, optimizer state on the device) with ``optim.SGD`` and with
   ``optim.Adam``, against PyTorch eager with ``torch.optim.SGD`` and
   ``torch.optim.Adam``. Columns are timed in interleaved rounds; each
   cell is the median CPU time of a step; ratios are over topos Adam.

Run: python benchmarks/facades.py [--rounds N] [--batch B] [--sizes 784,128,10]
Nothing is asserted; the numbers and the machine go in docs/performance.md.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _pinning import PINNED_CPU  # noqa: E402  (first: one core is the measurement's, pinned before NumPy loads)

# isort: split
import argparse  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402

import numpy as np  # noqa: E402

import topos.nn.functional as F  # noqa: E402
from topos import Tape, init, nn, optim  # noqa: E402

from _timing import interleaved, median_seconds, table  # noqa: E402


def _by_module(sizes, batch):
    def record(tape):
        model = nn.Mlp(list(sizes))
        x = tape.input(shape=(batch, sizes[0]), name="x")
        y = tape.input(shape=(batch,), extent=sizes[-1], name="y")
        return F.cross_entropy(model(x), y)
    return record


def _by_hand(sizes, batch):
    def record(tape):
        x = tape.input(shape=(batch, sizes[0]), name="x")
        y = tape.input(shape=(batch,), extent=sizes[-1], name="y")
        weights = []
        for layer, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:])):
            bound = 1.0 / math.sqrt(fan_in)
            draw = init.uniform(-bound, bound)
            w = tape.parameter(draw(tape.generator, (fan_out, fan_in), np.float32), name=f"{2 * layer}.weight")
            b = tape.parameter(draw(tape.generator, (fan_out,), np.float32), name=f"{2 * layer}.bias")
            weights.append((w, b))
        h = x
        for layer, (w, b) in enumerate(weights):
            if layer:
                h = h.tanh()
            h = h @ w.permute((1, 0)) + b.broadcast_along(0, batch)
        one_hot = tape.leaf(np.eye(sizes[-1], dtype=np.float32)).gather(y)
        return -(h.log_softmax(1) * one_hot).sum() / float(batch)
    return record


def recording_rows(sizes, batch, repeats):
    """Both recordings timed in alternation (one of each per round), so machine load hits both alike."""
    records = {"nn.Mlp": _by_module(sizes, batch), "by hand": _by_hand(sizes, batch)}
    times = {label: [] for label in records}
    for _ in range(repeats):
        for label, record in records.items():
            times[label].append(median_seconds(lambda record=record: Tape.record(record), 1))
    return [[label, f"{statistics.median(times[label]) * 1000:.2f}", str(len(Tape.record(record)[0]))]
            for label, record in records.items()]


def training_columns(sizes, batch):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    y = rng.integers(0, sizes[-1], batch)
    columns = {}
    for label, make in (("topos SGD", lambda: optim.SGD(lr=0.01)), ("topos Adam", lambda: optim.Adam(lr=1e-3))):
        holder = {}

        def record(tape, make=make):
            model = nn.Mlp(list(sizes))
            loss = F.cross_entropy(model(tape.input(shape=(batch, sizes[0]), name="x")),
                                   tape.input(shape=(batch,), extent=sizes[-1], name="y"))
            holder["loss"] = loss.symbol
            return make().record(tape.differentiate(loss, model.parameters()))

        network, updates = Tape.record(record)
        compiled = network.entry(updates.roots(holder["loss"])).lower().compile("llvm-cpu")
        state = {"device": compiled.resident(network.parameters())}
        feeds = {"x": x, "y": y}

        def step(compiled=compiled, state=state, updates=updates, feeds=feeds):
            state["device"], run = compiled.step(state["device"], feeds, updates)
            return run

        columns[label] = step
    try:
        import torch
    except ImportError:
        return columns
    torch.set_num_threads(1)
    tx, ty = torch.tensor(x), torch.tensor(y)
    for label, make in (("torch SGD", lambda p: torch.optim.SGD(p, lr=0.01)),
                        ("torch Adam", lambda p: torch.optim.Adam(p, lr=1e-3))):
        layers = []
        for position, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:])):
            if position:
                layers.append(torch.nn.Tanh())
            layers.append(torch.nn.Linear(fan_in, fan_out))
        model = torch.nn.Sequential(*layers)
        optimizer = make(model.parameters())

        def step(model=model, optimizer=optimizer):
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(tx), ty)
            loss.backward()
            optimizer.step()
            return loss

        columns[label] = step
    return columns


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--sizes", default="784,128,10")
    parser.add_argument("--repeats", type=int, default=20, help="recordings timed per column")
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(","))
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, pinned to CPU {PINNED_CPU}; "
          f"Python {platform.python_version()}, NumPy {np.__version__}")
    print(f"\nRecording an MLP {'-'.join(map(str, sizes))}, batch {args.batch} (median of {args.repeats}):\n")
    print(table(["recording", "ms", "nodes"], recording_rows(sizes, args.batch, args.repeats)))
    columns = training_columns(sizes, args.batch)
    timing = interleaved(columns, args.per_round, args.rounds, warmup=3)  # warm-up: first-call allocations
    medians = {label: t.cpu for label, t in timing.items()}
    reference = medians["topos Adam"]
    rows = [[label, f"{m * 1000:.3f}", f"{m / reference:.2f}x"] for label, m in medians.items()]
    print(f"\nOne training step (CPU ms per step, median of {args.rounds} x {args.per_round}); "
          "ratio = the column's time over topos Adam's:\n")
    print(table(["step", "ms", "time / topos Adam"], rows))


if __name__ == "__main__":
    main()
