"""A whole training step with a recorded optimizer compiles to one IREE call, its state resident on the device."""

from __future__ import annotations

import numpy as np
import pytest

import topos
import topos.nn.functional as F
from topos import Tape, checkpoint, nn, optim
from topos.dialect.iree import conformance

from iree_support import compile_cache  # noqa: F401  (fixture)

F32 = np.float32
RNG = np.random.default_rng(4)
BATCHES = [(RNG.standard_normal((16, 6)).astype(F32), RNG.integers(0, 4, 16)) for _ in range(3)]


def _trained(make):
    holder = {}

    def record(tape):
        model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.LayerNorm(8), nn.Linear(8, 4))
        x = tape.input(shape=(16, 6), name="x")
        y = tape.input(shape=(16,), extent=4, name="y")
        loss = F.cross_entropy(model(x), y)
        holder["optimizer"] = make()
        return loss, holder["optimizer"].record(tape.differentiate(loss, model.parameters()))

    network, (loss, updates) = Tape.record(record)
    return network, loss, updates, holder["optimizer"]


@pytest.mark.parametrize("make", [
    lambda: optim.SGD(lr=0.1, momentum=0.9),
    lambda: optim.Adam(lr=0.01),
    lambda: optim.AdamW(lr=0.01, weight_decay=0.1, decay=lambda name: name.endswith("weight")),
], ids=["sgd-momentum", "adam", "adamw"])
def test_compiled_optimizer_steps_stay_within_the_envelope_of_the_oracle(make, monkeypatch):
    network, loss, updates, optimizer = _trained(make)
    compiled = network.entry(updates.roots(loss)).lower().compile("llvm-cpu")
    state = compiled.resident(network.parameters())  # loads the module: its call is made now
    calls = []
    original = compiled._main
    monkeypatch.setattr(compiled, "_main", lambda *a: calls.append(1) or original(*a))
    table = network.parameters()
    rates = [0.01, 0.02, 0.005, 0.01]
    for k, rate in enumerate(rates):
        x, y = BATCHES[k % 3]
        feeds = {"x": x, "y": y, optimizer.learning_rate: rate}
        state, run = compiled.step(state, feeds, updates)
        oracle = network.forward(table, feeds)
        bound = conformance.END_TO_END_ULPS * 2.0**-23 * max(1.0, abs(float(oracle[loss])))
        assert abs(float(run[loss]) - float(oracle[loss])) <= bound, k
        table = updates.apply(table, oracle)
    assert len(calls) == len(rates)  # forward, backward and optimizer: one call per step
    on_device = state.to_host()
    assert on_device.names() == table.names()  # moments and the step count came back with the weights
    worst = 0.0
    for name in table.names():
        want = np.asarray(table[name], np.float64)
        scale = max(1.0, float(np.max(np.abs(want))))
        worst = max(worst, float(np.max(np.abs(on_device[name] - want))) / (2.0**-23 * scale))
    # Measured worst over four steps on llvm-cpu: 0.25 to 0.75 ulps of the largest slot; the
    # bound is the end-to-end envelope.
    assert worst <= conformance.END_TO_END_ULPS, worst
    if "optim.step" in on_device:
        assert float(on_device["optim.step"]) == len(rates)


def test_resident_state_checkpoints_and_resumes(tmp_path):
    network, loss, updates, optimizer = _trained(lambda: optim.Adam(lr=0.01))
    compiled = network.entry(updates.roots(loss)).lower().compile("llvm-cpu")
    state = compiled.resident(network.parameters())
    x, y = BATCHES[0]
    for _ in range(2):
        state, _ = compiled.step(state, {"x": x, "y": y}, updates)
    path = tmp_path / "step2.safetensors"
    checkpoint.save(path, state)
    resumed = compiled.resident(checkpoint.load(path, network))
    a, run_a = compiled.step(state, {"x": x, "y": y}, updates)
    b, run_b = compiled.step(resumed, {"x": x, "y": y}, updates)
    assert run_a[loss].tobytes() == run_b[loss].tobytes()
    assert float(checkpoint.read(path)["optim.step"]) == 2.0
    assert isinstance(b.to_host(), topos.Parameters)
