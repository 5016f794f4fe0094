"""Reverse mode, measured: the backward scan beside the oracle forward, and the gradient check.

Part 1 times a 784-128-10 MLP (batch 64, float32, tanh hidden layer,
log_softmax cross-entropy against one-hot targets fed as an input):
the oracle forward, the backward scan (``run.backward``), and one run of
the spec with ``tape.differentiate``'s nodes appended; it counts the nodes
``differentiate`` appends.

Part 2 runs ``check_gradients`` over every row of the opcode table in
tests/test_differentiate.py, first and second order, in each element type,
and prints the worst finite-difference error.

Timings are medians over a few runs on one BLAS thread; nothing here asserts.
Run: python benchmarks/backward.py [--repeats N]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before NumPy loads: one thread, stable timings

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

import topos  # noqa: E402
from topos import Tape  # noqa: E402
from topos.readings.gradcheck import TOLERANCES, check_gradients  # noqa: E402

from _timing import median_seconds  # noqa: E402

BATCH, FEATURES, HIDDEN, CLASSES = 64, 784, 128, 10


def record_mlp():
    """The MLP and its loss (a sealed network), with parameters and feeds."""
    rng = np.random.default_rng(0)

    def model(tape):
        x = tape.input(np.zeros((BATCH, FEATURES), np.float32))
        targets = tape.input(np.zeros((BATCH, CLASSES), np.float32))
        w1 = tape.parameter((rng.standard_normal((FEATURES, HIDDEN)) / np.sqrt(FEATURES)).astype(np.float32))
        b1 = tape.parameter(np.zeros((1, HIDDEN), np.float32))
        w2 = tape.parameter((rng.standard_normal((HIDDEN, CLASSES)) / np.sqrt(HIDDEN)).astype(np.float32))
        b2 = tape.parameter(np.zeros((1, CLASSES), np.float32))
        hidden = (x @ w1 + b1.broadcast_to((BATCH, HIDDEN))).tanh()
        logits = hidden @ w2 + b2.broadcast_to((BATCH, CLASSES))
        loss = -(logits.log_softmax(1) * targets).sum() / float(BATCH)
        return x, targets, loss, [w1, b1, w2, b2]

    network, (x, targets, loss, weights) = Tape.record(model)
    feeds = {
        x: rng.standard_normal((BATCH, FEATURES)).astype(np.float32),
        targets: np.eye(CLASSES, dtype=np.float32)[rng.integers(0, CLASSES, BATCH)],
    }
    return network, loss, weights, feeds


def mlp_table(repeats: int) -> None:
    plain, loss, weights, feeds = record_mlp()
    tape = plain.reopen()  # the same spec continued: every symbol stays valid
    adjoints = tape.differentiate(tape.resolve(loss), [tape.resolve(w) for w in weights]).detach()
    network = tape.seal()
    run = plain.forward(plain.parameters(), feeds)
    t_forward = median_seconds(lambda: plain.forward(plain.parameters(), feeds), repeats)
    t_backward = median_seconds(lambda: run.backward(loss), repeats)
    parameters = network.parameters()
    t_recorded = median_seconds(lambda: network.forward(parameters, feeds), repeats)
    forward_nodes, appended = len(plain), len(network) - len(plain)
    run = network.forward(parameters, feeds)
    gradients = run.backward(loss)
    same = all(
        np.array_equal(run[g].view(np.uint32), gradients[w].view(np.uint32)) for w, g in adjoints.pairs()
    )

    print(f"{FEATURES}-{HIDDEN}-{CLASSES} MLP, batch {BATCH}, float32, tanh, log_softmax cross-entropy "
          f"(median of {repeats}, OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']})")
    rows = [
        ("oracle forward (loss only)", t_forward),
        ("backward scan (run.backward)", t_backward),
        ("forward + recorded gradients, one run", t_recorded),
    ]
    print(f"  {'reading':<40} {'ms':>9} {'/ forward':>10}")
    for name, seconds in rows:
        print(f"  {name:<40} {seconds * 1e3:>9.2f} {seconds / t_forward:>10.2f}")
    print(f"  nodes: {forward_nodes} forward, {appended} appended by differentiate "
          f"({len(network)} in all)")
    print(f"  recorded gradients == backward scan, bit for bit: {same}")


def suite_table() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_differentiate import CASES, record_case  # the opcode table the tests use

    smooth = [c for c in CASES if c.smooth]
    print(f"\nfinite-difference check over the op suite ({len(smooth)} rows; float64 Richardson "
          "differences of the float64 twin)")
    print(f"  {'element':<8} {'order':<6} {'worst error':>12}  {'row':<22} {'f64 rule error':>15}  "
          f"{'tolerance':>9}  {'seconds':>7}")
    for dtype in topos.ELEMENTS:
        for order in (1, 2):
            start = time.perf_counter()
            worst, worst_row, worst_rule = 0.0, "", 0.0
            for case in smooth:
                r = record_case(case, dtype, second_order=order == 2)
                target = r.loss if order == 1 else r.second
                report = check_gradients(r.network, r.network.parameters(), None, target, wrt=r.wrt)
                if report.worst_error >= worst:
                    worst, worst_row = report.worst_error, case.name
                worst_rule = max(worst_rule, report.worst_rule_error)
            seconds = time.perf_counter() - start
            print(f"  {topos.base.element.short_name(dtype):<8} {order:<6} {worst:>12.2e}  {worst_row:<22} "
                  f"{worst_rule:>15.2e}  {TOLERANCES[dtype]:>9.0e}  {seconds:>7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    mlp_table(args.repeats)
    suite_table()


if __name__ == "__main__":
    main()
