"""How fast recording is: nodes per second for 10,000-node chains, printed as a table.

Run: ``python benchmarks/recording.py [--nodes N] [--repeats R]``. Each row
records one chain shape, seals it, and (separately) describes it and runs
the oracle over it, so the cost of recording can be compared with the
cost of reading. Timings are the best of R repeats; nothing is asserted.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from topos import Tape


def _chain_add(tape, x, n):
    y = x
    for _ in range(n):
        y = y + x
    return y


def _chain_scalar(tape, x, n):
    # Each step records two nodes: the constant leaf and the mul.
    y = x
    for _ in range(n // 2):
        y = y * 1.0
    return y


def _chain_tanh(tape, x, n):
    y = x
    for _ in range(n):
        y = y.tanh()
    return y


def _chain_shape(tape, x, n):
    y = x
    for _ in range(n // 2):
        y = y.permute((1, 0)).permute((1, 0))
    return y


CHAINS = {
    "x + x (value operands)": _chain_add,
    "x * 1.0 (scalar -> leaf)": _chain_scalar,
    "tanh (map)": _chain_tanh,
    "permute (attributes)": _chain_shape,
}


def _best(repeats, fn):
    best = float("inf")
    result = None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    print(f"recording chains of about {args.nodes} nodes (best of {args.repeats})")
    header = f"{'chain':<28} {'nodes':>7} {'record+seal s':>14} {'nodes/s':>10} {'describe s':>11} {'forward s':>10}"
    print(header)
    print("-" * len(header))
    for label, chain in CHAINS.items():
        def record():
            return Tape.record(lambda tape: chain(tape, tape.input(np.ones((2, 2), np.float32)), args.nodes))

        seconds, (network, _) = _best(args.repeats, record)
        described, _ = _best(args.repeats, network.describe)
        parameters = network.parameters()
        forward, _ = _best(args.repeats, lambda: network.forward(parameters))
        rate = len(network) / seconds
        print(
            f"{label:<28} {len(network):>7} {seconds:>14.4f} {rate:>10.0f} "
            f"{described:>11.4f} {forward:>10.4f}"
        )


if __name__ == "__main__":
    main()
