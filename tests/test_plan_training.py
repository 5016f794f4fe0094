"""Compiled training: a forward-only plan over the loss and its recorded gradients.

``tape.differentiate`` appends the chain rule as ordinary nodes, so a
training step is one forward plan over ``adjoints.roots()`` (the loss,
then one gradient per parameter). Under Numerics.EXACT, N steps of SGD
driven by that plan leave the parameters bit-identical to the canonical
loop (``network.forward`` + ``run.backward(loss).parameters(p)``); under
FAST they stay close. The plan's liveness frees forward temporaries once
the gradient no longer needs them, so its peak is below retain-all.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from topos import Numerics, Tape

from conftest import generator

STEPS = 6


def walkthrough(tape):
    """An input [1, 2] times a parameter [2, 2], tanh, square, sum."""
    w = tape.parameter(np.array([[0.5, -0.25], [0.75, 1.0]], dtype=np.float32))
    x = tape.input(np.array([[1.0, 2.0]], dtype=np.float32))
    h = (x @ w).tanh()
    loss = (h * h).sum()
    return loss, [(x, "normal")], tape.differentiate(loss, [w])


def mlp(tape, dtype=np.float32, batch=8, sizes=(16, 32, 4)):
    """A 16-32-4 tanh MLP with log_softmax cross-entropy against one-hot targets fed as an input."""
    rng = generator("training", "mlp", np.dtype(dtype).name)
    x = tape.input(rng.standard_normal((batch, sizes[0])).astype(dtype))
    targets = tape.input(np.eye(sizes[-1], dtype=dtype)[rng.integers(0, sizes[-1], batch)])
    parameters, h = [], x
    for k, (m, n) in enumerate(zip(sizes[:-1], sizes[1:])):
        w = tape.parameter((rng.standard_normal((m, n)) / np.sqrt(m)).astype(dtype))
        b = tape.parameter(np.zeros(n, dtype=dtype))
        parameters += [w, b]
        h = h @ w + b.broadcast_along(0, batch)
        if k < len(sizes) - 2:
            h = h.tanh()
    loss = -(h.log_softmax(1) * targets).sum() / float(batch)
    return loss, [(x, "normal"), (targets, "one-hot")], tape.differentiate(loss, parameters)


def _feeds(network, inputs, step):
    """A different batch every step (deterministic), keyed by the input symbols."""
    rng = generator("training", "feeds", step)
    feeds = {}
    for symbol, kind in inputs:
        default = network.payload(symbol)
        if kind == "one-hot":
            labels = rng.integers(0, default.shape[1], default.shape[0])
            feeds[symbol] = np.eye(default.shape[1], dtype=default.dtype)[labels]
        else:
            feeds[symbol] = rng.standard_normal(default.shape).astype(default.dtype)
    return feeds


def _sgd(rate):
    return lambda p, g: (p - g * np.asarray(rate, dtype=p.dtype)).astype(p.dtype)


def train_with_backward_scan(network, loss, inputs, steps, rate):
    parameters, losses = network.parameters(), []
    for step in range(steps):
        run = network.forward(parameters, _feeds(network, inputs, step))
        losses.append(float(run[loss]))
        parameters = parameters.step(run.backward(loss).parameters(parameters), _sgd(rate))
    return parameters, losses


def train_with_plan(plan, adjoints, inputs, steps, rate):
    network = plan.network
    parameters, losses = network.parameters(), []
    for step in range(steps):
        run = plan.forward(parameters, _feeds(network, inputs, step))
        losses.append(float(run[adjoints.target]))
        parameters = parameters.step(run.recorded_gradients(adjoints, parameters), _sgd(rate))
    return parameters, losses


def _record(model):
    network, (loss, inputs, adjoints) = Tape.record(model)
    return network, loss, inputs, adjoints


@pytest.mark.parametrize("model, rate", [(walkthrough, 0.1), (mlp, 0.5)], ids=["walkthrough", "mlp"])
def test_exact_training_plan_is_bit_identical_to_the_backward_scan_loop(model, rate):
    network, loss, inputs, adjoints = _record(model)
    plan = network.entry(adjoints.roots(), numerics=Numerics.EXACT).lower()
    by_plan, plan_losses = train_with_plan(plan, adjoints, inputs, STEPS, rate)
    by_scan, scan_losses = train_with_backward_scan(network, loss, inputs, STEPS, rate)
    assert plan_losses == scan_losses
    for symbol in by_scan:
        assert by_plan[symbol].tobytes() == by_scan[symbol].tobytes(), f"parameter {symbol!r} drifted"
        assert by_plan[symbol].tobytes() != network.parameters()[symbol].tobytes(), "nothing was trained"


def test_the_walkthrough_loss_falls_on_a_fixed_sample():
    network, loss, inputs, adjoints = _record(walkthrough)
    plan = network.entry(adjoints.roots(), numerics=Numerics.EXACT).lower()
    parameters, losses = network.parameters(), []
    sample = {inputs[0][0]: np.array([[1.0, 2.0]], dtype=np.float32)}
    for _ in range(STEPS):
        run = plan.forward(parameters, sample)
        losses.append(float(run[loss]))
        parameters = parameters.step(run.recorded_gradients(adjoints, parameters), _sgd(0.1))
    assert all(later < earlier for earlier, later in zip(losses, losses[1:]))


def test_the_mlp_learns_a_fixed_batch():
    network, loss, inputs, adjoints = _record(mlp)
    plan = network.entry(adjoints.roots(), numerics=Numerics.EXACT).lower()
    feeds = _feeds(network, inputs, 0)
    parameters = network.parameters()
    first = float(plan.forward(parameters, feeds)[loss])
    for _ in range(30):
        run = plan.forward(parameters, feeds)
        parameters = parameters.step(run.recorded_gradients(adjoints, parameters), _sgd(0.5))
    assert float(plan.forward(parameters, feeds)[loss]) < 0.5 * first


def test_fast_training_plan_stays_close_to_the_backward_scan_loop():
    network, loss, inputs, adjoints = _record(mlp)
    plan = network.entry(adjoints.roots(), numerics=Numerics.FAST).lower()
    by_plan, plan_losses = train_with_plan(plan, adjoints, inputs, STEPS, 0.5)
    by_scan, scan_losses = train_with_backward_scan(network, loss, inputs, STEPS, 0.5)
    np.testing.assert_allclose(plan_losses, scan_losses, rtol=1e-5)
    for symbol in by_scan:
        np.testing.assert_allclose(by_plan[symbol], by_scan[symbol], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("model", [walkthrough, mlp], ids=["walkthrough", "mlp"])
def test_liveness_frees_forward_temporaries_the_gradient_no_longer_needs(model):
    """A forward value the chain rule reads is freed after its last gradient reader, before the end."""
    network, loss, inputs, adjoints = _record(model)
    plan = network.entry(adjoints.roots(), numerics=Numerics.EXACT).lower()
    text = plan.describe()
    end = plan.schedule[-1]
    nodes = network.nodes()
    freed_early = []
    for line in text.splitlines():
        found = re.match(r"\s*(\d+)\s.*freed after (\d+)", line)
        if found:
            n, last = int(found[1]), int(found[2])
            # recorded before the loss (a forward value), last read by a gradient node, then freed
            if n < loss.index and not nodes[n].is_source and loss.index < last < end:
                freed_early.append((n, last))
    assert freed_early, f"no forward temporary is freed before the last step\n{text}"
    peak, _ = plan.peak()
    assert peak < plan.retain_all_bytes()
