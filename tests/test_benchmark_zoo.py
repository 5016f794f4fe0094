"""The benchmark zoo (benchmarks/_zoo.py): its models, its memory guard, and the jax.jit twin it writes itself."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import _zoo  # noqa: E402


def test_an_unknown_model_names_the_choices():
    with pytest.raises(KeyError, match="choose from mlp-s, mlp-m, gpt"):
        _zoo.build("resnet")


def test_a_model_too_large_for_the_machine_is_skipped_with_a_message(monkeypatch):
    monkeypatch.setitem(_zoo.NEEDS_GIB, "lenet", 1e9)
    reason = _zoo.too_large("lenet")
    assert reason is not None and reason.startswith("skipped lenet: it needs about") and "GiB is available" in reason
    monkeypatch.setitem(_zoo.NEEDS_GIB, "lenet", 0.0)
    assert _zoo.too_large("lenet") is None


def test_the_lenet_twin_computes_the_oracles_loss_and_step():
    pytest.importorskip("jax")
    model = _zoo.build("lenet")
    oracle = model.network.forward(model.parameters, model.feeds(0))
    twin = _zoo.jax_step(model)
    first = float(twin.step(0))
    assert abs(first - float(oracle[model.read])) <= 1e-5 * abs(float(oracle[model.read]))
    after = model.updates.apply(model.parameters, oracle)  # the oracle's SGD step: the twin's second loss
    second = float(model.network.forward(after, model.feeds(1))[model.read])
    assert abs(float(twin.step(1)) - second) <= 1e-5 * abs(second)
    assert not np.isclose(first, second)  # the twin's state did advance
