"""The compiled benchmark's models compute the same training step in every column it times.

``benchmarks/compiled.py`` times one SGD step of each model (two MLPs and
a small GPT from ``benchmarks/_gpt.py``) as the topos oracle, a FAST
plan, the IREE-compiled step, ``jax.jit`` and PyTorch eager
(``benchmarks/_peers.py``). A speed comparison means nothing unless the
columns compute the same thing, so each column's first step from the
same parameters is checked here against the oracle: the loss, and every
updated parameter. The models are the benchmark's builders at reduced
sizes (same code paths: tanh layers, log_softmax cross-entropy, gather
with a selection, LayerNorm, causal mask, GELU, tied embedding), so the
test stays fast. JAX and PyTorch are benchmark extras: a missing one is
skipped with the reason.

Tolerances: float32 steps whose sums run in different orders (BLAS,
IREE, XLA, oneDNN) agree with the oracle to a few ulps of the loss
(measured: at most 4e-7 relative) and to about 1e-6 of each parameter's
largest entry (measured on the full-size models); the bounds below leave
an order of magnitude of room and would still catch any wrong formula.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from topos import Numerics

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from _gpt import GptConfig, MlpConfig, Workload, causal_mask, gpt, mlp
from _peers import available

LOSS_TOLERANCE = 1e-5  # relative to the oracle's loss
PARAMETER_TOLERANCE = 1e-4  # relative to each parameter's largest entry after the oracle's step

MODELS = {
    "mlp-s": lambda: mlp(MlpConfig((784, 128, 10), 64)),  # the benchmark's size
    "mlp-m": lambda: mlp(MlpConfig((96, 64, 64, 10), 16)),  # MLP M's shape (two tanh layers), smaller
    "gpt": lambda: gpt(GptConfig(layers=2, width=32, heads=4, context=16, vocabulary=65, batch=2)),
}
COLUMNS = ("FAST plan", "topos IREE", "jax", "torch")


def _sgd(rate):
    return lambda p, g: p - g * np.asarray(rate, dtype=p.dtype)


def oracle_step(workload: Workload):
    run = workload.forward.forward(workload.parameters, workload.feeds)
    gradients = run.backward(workload.loss).parameters(workload.parameters)
    after = workload.parameters.step(gradients, _sgd(workload.learning_rate))
    return float(run[workload.loss]), workload.named_parameters(after)


def fast_plan_step(workload: Workload):
    plan = workload.trained.entry(workload.adjoints.roots(), numerics=Numerics.FAST).lower()
    run = plan.forward(workload.parameters, workload.feeds)
    gradients = run.recorded_gradients(workload.adjoints, workload.parameters)
    after = workload.parameters.step(gradients, _sgd(workload.learning_rate))
    return float(run[workload.loss]), workload.named_parameters(after)


def compiled_step(workload: Workload, cache):
    pytest.importorskip("iree.runtime", reason="the IREE runtime (topos[mlir]) is not installed")
    from topos.dialect.iree.cache import CompileCache

    plan = workload.trained.entry(workload.updates.roots(workload.loss)).lower()
    compiled = plan.compile("llvm-cpu", cache=CompileCache(cache))
    state, run = compiled.step(compiled.resident(workload.parameters), workload.feeds, workload.updates)
    return float(run[workload.loss]), workload.named_parameters(state.to_host())


def peer_step(workload: Workload, name: str):
    builder = available()[name]
    if isinstance(builder, str):
        pytest.skip(builder)
    peer = builder(workload)
    state, loss = peer.step(peer.start())
    return peer.loss(loss), peer.parameters(state)


STEPS = {
    "FAST plan": lambda w, cache: fast_plan_step(w),
    "topos IREE": compiled_step,
    "jax": lambda w, cache: peer_step(w, "jax"),
    "torch": lambda w, cache: peer_step(w, "torch"),
}


@pytest.fixture(scope="module")
def vmfb_cache(pytestconfig, tmp_path_factory):
    """A compile cache kept in pytest's cache folder: keyed by StableHLO, flags and compiler, so reruns skip IREE.

    Under ``-p no:cacheprovider`` there is no such folder, and a fresh one per run serves.
    """
    if getattr(pytestconfig, "cache", None) is None:
        return tmp_path_factory.mktemp("topos-benchmark-vmfb")
    return pytestconfig.cache.mkdir("topos-benchmark-vmfb")


@pytest.fixture(scope="module")
def reference():
    """Each model and the oracle's first step, built once per model."""
    cache = {}

    def get(key):
        if key not in cache:
            workload = MODELS[key]()
            cache[key] = (workload, oracle_step(workload))
        return cache[key]

    return get


@pytest.mark.parametrize("column", COLUMNS)
@pytest.mark.parametrize("model", list(MODELS))
def test_benchmark_column_matches_oracle_step(reference, vmfb_cache, model, column):
    workload, (want_loss, want) = reference(model)
    got_loss, got = STEPS[column](workload, vmfb_cache)
    assert np.isfinite(want_loss)
    assert abs(got_loss - want_loss) <= LOSS_TOLERANCE * abs(want_loss), (
        f"{column} loss {got_loss!r} vs oracle {want_loss!r}")
    assert set(got) == set(want)
    for name, expected in want.items():
        actual = np.asarray(got[name], np.float64)
        expected = np.asarray(expected, np.float64)
        assert actual.shape == expected.shape, f"{name}: {actual.shape} vs {expected.shape}"
        scale = float(np.max(np.abs(expected)))
        error = float(np.max(np.abs(actual - expected)))
        assert error <= PARAMETER_TOLERANCE * scale, (
            f"{column}: parameter {name} differs from the oracle's step by {error:.3g} "
            f"(largest entry {scale:.3g})")


def test_gpt_one_hot_embedding_is_the_gather_embedding():
    """The one-hot diagnostic variant computes the gather GPT's loss (same parameters and tokens)."""
    config = GptConfig(layers=1, width=32, heads=4, context=16, vocabulary=65, batch=2)
    gathered = gpt(config)
    one_hot = gpt(replace(config, embedding="one-hot"))
    a = gathered.forward.forward(gathered.parameters, gathered.feeds)[gathered.loss]
    b = one_hot.forward.forward(one_hot.parameters, one_hot.feeds)[one_hot.loss]
    assert abs(float(a) - float(b)) <= LOSS_TOLERANCE * abs(float(a))


def test_causal_mask_blocks_only_later_positions():
    mask = causal_mask(4)
    assert mask.dtype == np.float32
    assert np.all(mask[np.tril_indices(4)] == 0.0)
    assert np.all(mask[np.triu_indices(4, k=1)] < -1e8)


def test_gpt_loss_ignores_the_future_of_each_position():
    """With the last position left out of the loss, changing the last token changes nothing (the mask works)."""
    workload = gpt(GptConfig(layers=1, width=32, heads=4, context=8, vocabulary=65, batch=1))
    tokens = workload.named_feeds["tokens"].copy()
    targets = workload.named_feeds["targets"].copy()
    targets[-1] = 0.0  # the last position's prediction no longer counts

    def loss_with(last_token):
        changed = tokens.copy()
        changed[0, -1] = last_token
        feeds = {workload.inputs["tokens"]: changed, workload.inputs["targets"]: targets}
        return float(workload.forward.forward(workload.parameters, feeds)[workload.loss])

    assert loss_with(0) == loss_with(1) == loss_with(64)
