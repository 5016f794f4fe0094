"""Fit y = w * x + b to a handful of samples: one spec, many states.

The network is recorded once. Training never touches it: each step feeds
one sample, runs the oracle, and steps the caller-owned parameters.
Three learning rates train side by side from the same network, because
state lives in Parameters tables, not in the graph.

Run: python examples/gradient_descent.py
"""

import numpy as np

from topos import Tape

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


def main():
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
    return results


if __name__ == "__main__":
    main()
