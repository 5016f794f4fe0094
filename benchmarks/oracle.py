"""The oracle's price: a 784-128-10 MLP forward at batch 64 (float32), next to hand-written NumPy.

The oracle walks reference paths (fixed-order matmul without BLAS, refmath
transcendentals); the hand-written column uses BLAS and NumPy's own math.
Both run in this one process with one BLAS thread.

Run: python benchmarks/oracle.py
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from topos import Tape  # noqa: E402

from _timing import median_seconds  # noqa: E402


def mlp(batch=64, sizes=(784, 128, 10), seed=0):
    rng = np.random.default_rng(seed)
    weights = [
        (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32) for a, b in zip(sizes, sizes[1:])
    ]
    biases = [np.zeros(b, np.float32) for b in sizes[1:]]
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    return weights, biases, x


def record(weights, biases, x):
    def model(tape):
        h = tape.input(x)
        for k, (w, b) in enumerate(zip(weights, biases)):
            z = h @ tape.parameter(w) + tape.parameter(b).broadcast_along(0, x.shape[0])
            h = z.tanh() if k < len(weights) - 1 else z
        return h.log_softmax(1)

    return Tape.record(model)


def numpy_forward(weights, biases, x):
    h = x
    for k, (w, b) in enumerate(zip(weights, biases)):
        z = h @ w + b
        h = np.tanh(z) if k < len(weights) - 1 else z
    shifted = h - h.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def median_ms(fn, repeats=15):
    return median_seconds(fn, repeats) * 1e3


def main():
    weights, biases, x = mlp()
    network, out = record(weights, biases, x)
    parameters = network.parameters()
    oracle = median_ms(lambda: network.forward(parameters))
    blas = median_ms(lambda: numpy_forward(weights, biases, x))
    difference = np.max(np.abs(network.forward(parameters)[out] - numpy_forward(weights, biases, x)))
    print("784-128-10 MLP forward, batch 64, float32, one BLAS thread (median ms)")
    print(f"{'path':<34}{'ms':>10}{'ratio':>10}")
    print(f"{'hand-written NumPy (BLAS)':<34}{blas:>10.3f}{1.0:>10.2f}")
    print(f"{'topos oracle (reference paths)':<34}{oracle:>10.3f}{oracle / blas:>10.2f}")
    print(f"max |oracle - numpy| = {difference:.2e}")


if __name__ == "__main__":
    main()
