"""Recorded graphs the dialect tests share: each returns (network, roots, observes).

Every graph is recorded here, in this file, so sites (file:line) that come
back through MLIR locations can be checked against these lines.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

import topos
from topos import Tape


def walkthrough():
    """The README's first graph: a parameter, an input, matmul, tanh, a power and a sum."""

    def model(tape):
        w = tape.parameter(np.ones((2, 2), np.float32))
        x = tape.input(np.array([[1.0, 2.0]], np.float32))
        loss = ((x @ w).tanh() ** 2.0).sum()
        return loss

    network, loss = Tape.record(model)
    return network, (loss,), ()


def mlp():
    """A two-layer MLP with log_softmax and a cross-entropy loss, plus its recorded gradients."""

    def model(tape):
        rng = np.random.default_rng(0)
        x = tape.input(rng.standard_normal((4, 3)).astype(np.float32))
        targets = tape.input(topos.selection([0, 2, 1, 2], 3))
        w1 = tape.parameter(rng.standard_normal((3, 5)).astype(np.float32))
        b1 = tape.parameter(np.zeros((5,), np.float32))
        w2 = tape.parameter(rng.standard_normal((5, 3)).astype(np.float32))
        hidden = (x @ w1 + b1.broadcast_along(0, 4)).tanh()
        logits = hidden @ w2
        log_probabilities = logits.log_softmax(1)
        one_hot = tape.leaf(np.eye(3, dtype=np.float32)).gather(targets)
        loss = -(log_probabilities * one_hot).sum() / 4.0
        gradients = tape.differentiate(loss, [w1, b1, w2])
        return loss, logits, gradients.roots()

    network, (loss, logits, gradient_roots) = Tape.record(model)
    return network, (loss, *gradient_roots), (logits,)


def every_opcode():
    """One graph that records all 27 opcodes, selections, unfold/fold, and bf16/f64 non-finite leaves."""

    def model(tape):
        table = tape.parameter(np.arange(12, dtype=np.float32).reshape(4, 3) / 7.0)
        picks = tape.input(topos.selection([[0, 3], [3, 1]], 4))
        fixed = tape.leaf(topos.selection([2, 2, 0], 4))
        rows = table.gather(picks)  # [2, 2, 3]
        back = rows.scatter(picks)  # [4, 3]
        more = table.gather(fixed).scatter(fixed, 4)
        x = back + more
        y = (x - table) * x / (table + 1.0)
        z = y.maximum(x).step(table) + (-y) ** table.map("sqrt")
        for name in topos.MAP_FUNCTIONS:
            z = z + (z * 0.1).map(name)
        m = z @ table.permute((1, 0))  # [4, 4]
        s = m.sum().broadcast((4, 4)) + m.sum_along(0).broadcast_along(1, 4)
        r = s.reshape((2, 8)).narrow(1, 2, 5).pad(1, 1, 8)
        windows = r.unfold(1, 3, 2, 2)  # [2, 2, 3]
        folded = windows.fold(1, 3, 2, 2, 8)
        stable = folded.log_softmax(1).logsumexp(0)
        wide = tape.leaf(np.array([np.nan, np.inf, -np.inf, -0.0, 5e-324, 1.0], np.float64))
        payload = np.array([0x7FF8000000000001], dtype=np.uint64).view(np.float64)
        wide_nan = tape.leaf(np.concatenate([payload, [2.0, 3.0, 4.0, 5.0, 6.0]]))
        brain = tape.leaf(
            np.array([np.nan, np.inf, -np.inf, -0.0, 1e-40, 3.140625], ml_dtypes.bfloat16)
        )
        brain_splat = tape.leaf(np.full((2, 3), np.nan, ml_dtypes.bfloat16))
        brain_big = tape.leaf((np.arange(130, dtype=np.float32) / 3).astype(ml_dtypes.bfloat16))
        wide_sum = (wide * wide_nan).sum()
        brain_sum = (brain.reshape((2, 3)) + brain_splat).sum() + brain_big.sum()
        return stable, wide_sum, brain_sum, z

    network, (stable, wide_sum, brain_sum, z) = Tape.record(model)
    return network, (stable, wide_sum, brain_sum), (z,)


def chain(length: int = 5000):
    """A long elementwise/matmul chain with about ``length`` nodes, for the emission figures."""

    def model(tape):
        rng = np.random.default_rng(1)
        x = tape.input(rng.standard_normal((8, 16)).astype(np.float32))
        w = tape.parameter(rng.standard_normal((16, 16)).astype(np.float32) / 4)
        h = x
        while len(tape) < length - 6:
            h = ((h @ w).tanh() * 0.5 + h).narrow(1, 0, 16)
        return h.sum()

    network, loss = Tape.record(model)
    return network, (loss,), ()


def conv_net():
    """A small conv net: conv2d, relu, max_pool, batch_norm; for the fuse/elect/raise passes."""
    from topos.nn import functional as F

    rng = np.random.default_rng(3)

    def model(tape):
        x = tape.input(rng.standard_normal((2, 3, 6, 6)).astype(np.float32))
        w = tape.parameter((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32))
        b = tape.parameter(np.zeros(4, np.float32))
        pooled = F.max_pool(F.conv2d(x, w, b, padding=1).relu(), 2)
        scale, shift = tape.parameter(np.ones(36, np.float32)), tape.parameter(np.zeros(36, np.float32))
        out, mean, variance = F.batch_norm(pooled.reshape((2, 36)), scale, shift)
        return (out * out).sum()

    network, loss = Tape.record(model)
    return network, (loss,), ()


GRAPHS = {"walkthrough": walkthrough, "mlp": mlp, "every_opcode": every_opcode, "conv_net": conv_net}
