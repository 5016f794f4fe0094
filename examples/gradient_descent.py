"""Fit y = w * x + b to a handful of samples: one spec, many states.

The network is recorded once. Training never touches it: each step feeds
one sample, runs the oracle, and steps the caller-owned parameters.
Three learning rates train side by side from the same network, because
state lives in Parameters tables, not in the graph.

Then the same three runs go through one compiled module: the step (the
gradients and SGD, with the rate fed as an input) recorded once, compiled
once by IREE, and called with each rate's own state on the device. Each
run must end where the oracle's did.

Run: python examples/gradient_descent.py [--target llvm-cpu] [--oracle-only]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _training

import numpy as np  # noqa: E402

import topos  # noqa: E402
from topos import Tape  # noqa: E402
from topos.dialect.iree.targets import TARGETS  # noqa: E402

from _training import run  # noqa: E402

SAMPLES = [(1.0, 3.0), (2.0, 5.0), (3.0, 7.0), (-1.0, -1.0)]  # y = 2x + 1


def line(tape):
    w = tape.parameter(np.float64(0.0))
    b = tape.parameter(np.float64(0.0))
    x = tape.input(np.float64(0.0))
    y = tape.input(np.float64(0.0))
    error = w * x + b - y
    return w, b, x, y, error * error


def train(network, symbols, learning_rate: float, steps: int = 600):
    w, b, x, y, loss = symbols
    parameters = network.parameters()
    for step in range(steps):
        sample_x, sample_y = SAMPLES[step % len(SAMPLES)]
        run = network.forward(parameters, {x: sample_x, y: sample_y})
        gradients = run.backward(loss).parameters(parameters)
        parameters = parameters.step(gradients, lambda p, g: p - g * learning_rate)
    return parameters


def trained_line(tape):
    """``line`` and its SGD step: the rate is an input, so one module serves every rate."""
    symbols = line(tape)
    w, b, *_, loss = symbols
    rate = tape.input(np.float64(0.0), name="rate")
    return symbols, rate, topos.sgd(tape, tape.differentiate(loss, [w, b]), rate)


def train_compiled(rates, target: str = "llvm-cpu", steps: int = 600) -> tuple[dict, tuple]:
    """(rate -> the Parameters table it reaches, (w, b) of the recording), every step one call of one module."""
    network, ((w, b, x, y, loss), rate, updates) = Tape.record(trained_line)
    compiled = network.entry(updates.roots(loss)).lower().compile(target)
    print(f"\n{compiled.describe()}")
    results = {}
    for learning_rate in rates:
        state = compiled.resident(network.parameters())
        for step in range(steps):
            sample_x, sample_y = SAMPLES[step % len(SAMPLES)]
            state, _ = compiled.step(state, {x: sample_x, y: sample_y, rate: learning_rate}, updates)
        results[learning_rate] = state.to_host()
    return results, (w, b)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="llvm-cpu", choices=sorted(TARGETS),
                        help="where the compiled runs go (default llvm-cpu)")
    parser.add_argument("--oracle-only", action="store_true", help="skip the compiled runs")
    args = parser.parse_args(argv)
    network, symbols = Tape.record(line)
    w, b = symbols[0], symbols[1]
    print(network.describe())
    print(f"\n{'learning rate':>14} {'w':>12} {'b':>12}")
    results = {}
    for rate in (0.005, 0.02, 0.05):
        parameters = train(network, symbols, rate)
        results[rate] = parameters
        print(f"{rate:>14} {float(parameters[w]):>12.6f} {float(parameters[b]):>12.6f}")
    best = results[0.05]
    assert abs(float(best[w]) - 2.0) < 1e-6 and abs(float(best[b]) - 1.0) < 1e-6
    print("\nw -> 2 and b -> 1; the network was never modified.")
    if args.oracle_only:
        return results
    on_module, (cw, cb) = train_compiled(tuple(results), args.target)
    print(f"\n{'learning rate':>14} {'w, compiled':>12} {'b, compiled':>12} {'largest gap to the oracle':>26}")
    for rate, table in on_module.items():
        gap = max(abs(float(table[cw]) - float(results[rate][w])), abs(float(table[cb]) - float(results[rate][b])))
        print(f"{rate:>14} {float(table[cw]):>12.6f} {float(table[cb]):>12.6f} {gap:>26.3g}")
        # float64 throughout; 600 steps of a contraction leave rounding differences far below this
        assert gap < 1e-9, f"the compiled run at rate {rate} left the oracle's by {gap}"
    print("\nOne module, three states: each ends where the oracle's run did.")
    return results


if __name__ == "__main__":
    run(main)
