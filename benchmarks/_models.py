"""Model builders shared by the benchmarks: a recorded training step and its hand-written NumPy twin.

Each builder returns a :class:`Model`: the forward network (what the
README's loop runs with ``network.forward`` + ``run.backward``), the same
network reopened with ``tape.differentiate``'s nodes appended (what a
training plan runs over ``adjoints.roots()``), one parameter table that
serves both, a fixed batch of feeds, and ``numpy_step``: the same
mathematics written directly in NumPy (BLAS matmuls, native
transcendentals) returning the loss and the gradients by parameter, for
the "hand-written" column.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from topos import Tape
from topos.nn.functional import conv2d, max_pool


@dataclass(frozen=True)
class Model:
    name: str
    forward: object  # Network: the forward graph only
    trained: object  # Network: the forward graph plus the recorded gradients
    loss: object  # Symbol (valid in both networks)
    adjoints: object  # Adjoints over ``trained`` (detached)
    parameters: object  # Parameters: serves both networks
    weights: tuple  # parameter symbols, in numpy_step's order
    feeds: dict  # input symbol -> array
    numpy_step: Callable  # (list of arrays in ``weights`` order, feeds by name) -> (loss, [gradients])
    numpy_feeds: dict  # name -> array, for numpy_step


def _with_gradients(forward, loss, weights):
    """Reopen ``forward`` and append d loss / d weights; return the longer network and its adjoints."""
    tape = forward.reopen()
    adjoints = tape.differentiate(tape.resolve(loss), [tape.resolve(w) for w in weights])
    return tape.seal(), adjoints.detach()


def _cross_entropy_numpy(logits, targets):
    """Mean log_softmax cross-entropy against one-hot targets, and d loss / d logits."""
    batch = logits.shape[0]
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probabilities = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = -(log_probabilities * targets).sum() / batch
    return loss, (np.exp(log_probabilities) - targets) / batch


def _one_hot(rng, batch, classes, dtype):
    return np.eye(classes, dtype=dtype)[rng.integers(0, classes, batch)]


# ---- the 784-128-10 MLP -------------------------------------------------------------------------


def mlp(batch: int = 64, sizes=(784, 128, 10), dtype=np.float32, seed: int = 0) -> Model:
    """A tanh MLP with log_softmax cross-entropy against one-hot targets fed as an input."""
    rng = np.random.default_rng(seed)
    features, hidden, classes = sizes

    def model(tape):
        x = tape.input(np.zeros((batch, features), dtype))
        targets = tape.input(np.zeros((batch, classes), dtype))
        w1 = tape.parameter((rng.standard_normal((features, hidden)) / np.sqrt(features)).astype(dtype))
        b1 = tape.parameter(np.zeros(hidden, dtype))
        w2 = tape.parameter((rng.standard_normal((hidden, classes)) / np.sqrt(hidden)).astype(dtype))
        b2 = tape.parameter(np.zeros(classes, dtype))
        h = (x @ w1 + b1.broadcast_along(0, batch)).tanh()
        logits = h @ w2 + b2.broadcast_along(0, batch)
        loss = -(logits.log_softmax(1) * targets).sum() / float(batch)
        return x, targets, loss, (w1, b1, w2, b2)

    forward, (x, targets, loss, weights) = Tape.record(model)
    trained, adjoints = _with_gradients(forward, loss, weights)
    images = rng.standard_normal((batch, features)).astype(dtype)
    labels = _one_hot(rng, batch, classes, dtype)

    def numpy_step(arrays, feeds):
        w1, b1, w2, b2 = arrays
        x, t = feeds["x"], feeds["targets"]
        h = np.tanh(x @ w1 + b1)
        loss, g = _cross_entropy_numpy(h @ w2 + b2, t)
        gh = (g @ w2.T) * (1 - h * h)
        return loss, [x.T @ gh, gh.sum(axis=0), h.T @ g, g.sum(axis=0)]

    return Model(
        f"mlp {features}-{hidden}-{classes}, batch {batch}", forward, trained, loss, adjoints,
        forward.parameters(), weights, {x: images, targets: labels}, numpy_step,
        {"x": images, "targets": labels},
    )


# ---- a small convolutional net -----------------------------------------------------------------


def _conv2d(x, weight, bias):
    return conv2d(x, weight, bias, stride=1, padding=1)


def _max_pool(x, size):
    return max_pool(x, size)


def conv_net(batch: int = 16, channels: int = 3, side: int = 16, filters: int = 8, classes: int = 10,
             dtype=np.float32, seed: int = 1) -> Model:
    """conv 3x3 (padding 1) -> tanh -> max_pool 2 -> linear -> log_softmax cross-entropy."""
    rng = np.random.default_rng(seed)
    pooled = filters * (side // 2) * (side // 2)

    def model(tape):
        x = tape.input(np.zeros((batch, channels, side, side), dtype))
        targets = tape.input(np.zeros((batch, classes), dtype))
        kernel = tape.parameter((rng.standard_normal((filters, channels, 3, 3)) / np.sqrt(9 * channels)).astype(dtype))
        bias = tape.parameter(np.zeros(filters, dtype))
        w = tape.parameter((rng.standard_normal((pooled, classes)) / np.sqrt(pooled)).astype(dtype))
        b = tape.parameter(np.zeros(classes, dtype))
        features = _max_pool(_conv2d(x, kernel, bias).tanh(), 2).reshape((batch, pooled))
        logits = features @ w + b.broadcast_along(0, batch)
        loss = -(logits.log_softmax(1) * targets).sum() / float(batch)
        return x, targets, loss, (kernel, bias, w, b)

    forward, (x, targets, loss, weights) = Tape.record(model)
    trained, adjoints = _with_gradients(forward, loss, weights)
    images = rng.standard_normal((batch, channels, side, side)).astype(dtype)
    labels = _one_hot(rng, batch, classes, dtype)

    def numpy_step(arrays, feeds):
        kernel, bias, w, b = arrays
        x, t = feeds["x"], feeds["targets"]
        padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
        windows = sliding_window_view(padded, (3, 3), axis=(2, 3))  # [B, C, H, W, 3, 3]
        columns = windows.transpose(0, 2, 3, 1, 4, 5).reshape(batch * side * side, channels * 9)
        flat_kernel = kernel.reshape(filters, channels * 9)
        z = (columns @ flat_kernel.T).reshape(batch, side, side, filters).transpose(0, 3, 1, 2)
        a = np.tanh(z + bias[None, :, None, None])
        half = side // 2
        lanes = a.reshape(batch, filters, half, 2, half, 2).transpose(0, 1, 2, 4, 3, 5).reshape(
            batch, filters, half, half, 4)
        winner = lanes.argmax(axis=4)  # the first maximum, as maximum's ties go left
        pooled_values = np.take_along_axis(lanes, winner[..., None], axis=4)[..., 0]
        features = pooled_values.reshape(batch, pooled)
        loss, g = _cross_entropy_numpy(features @ w + b, t)
        g_pooled = (g @ w.T).reshape(batch, filters, half, half)
        g_lanes = np.zeros_like(lanes)
        np.put_along_axis(g_lanes, winner[..., None], g_pooled[..., None], axis=4)
        g_a = g_lanes.reshape(batch, filters, half, half, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(a.shape)
        g_z = g_a * (1 - a * a)
        g_rows = g_z.transpose(0, 2, 3, 1).reshape(batch * side * side, filters)
        g_kernel = (g_rows.T @ columns).reshape(kernel.shape)
        return loss, [g_kernel, g_z.sum(axis=(0, 2, 3)), features.T @ g, g.sum(axis=0)]

    return Model(
        f"conv net {channels}x{side}x{side} -> {filters} 3x3 -> pool 2 -> {classes}, batch {batch}",
        forward, trained, loss, adjoints, forward.parameters(), weights,
        {x: images, targets: labels}, numpy_step, {"x": images, "targets": labels},
    )
