"""Shared by the IREE tests: a fresh compile cache per session, the linker check, a recorded MLP step.

This is a plain helper module, not ``conftest.py`` and not a package:
``tests/iree/__init__.py`` would make pytest import this folder as a
package named ``iree``, which hides the real ``iree`` (``iree.runtime``
fails to import), and a ``tests/iree/conftest.py`` is imported under the
module name ``conftest``, which hides ``tests/conftest.py`` from the core
tests' ``from conftest import ...``. Each test module imports the
``compile_cache`` fixture from here; it is autouse, so importing it is
enough.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass

import numpy as np
import pytest

import topos
from topos import Tape


@pytest.fixture(scope="session", autouse=True)
def compile_cache(tmp_path_factory):
    """TOPOS_CACHE_DIR points at one fresh directory for the whole session, shared by every module.

    Nothing a test compiles comes from an earlier run's cache, and
    nothing it compiles lands in the user's cache.
    """
    directory = tmp_path_factory.getbasetemp() / "topos-compile-cache"
    directory.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TOPOS_CACHE_DIR", str(directory))
        yield directory


HAS_LINKER = bool(shutil.which("ld") or shutil.which("cc"))
needs_linker = pytest.mark.skipif(
    not HAS_LINKER, reason="float64 on llvm-cpu links a system shared object: no ld or cc on PATH")

ELEMENT_PARAMETERS = [
    pytest.param(topos.float32, id="f32"),
    pytest.param(topos.float64, id="f64", marks=needs_linker),
    pytest.param(topos.bfloat16, id="bf16"),
]


@dataclass
class MlpStep:
    """A recorded training step: the network, its fed inputs, the loss and the in-graph SGD updates."""

    network: object
    x: object
    labels: object
    loss: object
    updates: object
    learning_rate: float

    def entry(self):
        return self.network.entry(self.updates.roots(self.loss))


def mlp_step(dtype=np.float32, batch: int = 16, sizes=(12, 16, 5), learning_rate: float = 0.1,
             seed: int = 0) -> MlpStep:
    """A two-layer tanh MLP with a log-softmax cross-entropy, its recorded gradients and an SGD update."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)

    def model(tape):
        x = tape.input(rng.standard_normal((batch, sizes[0])).astype(dtype))
        labels = tape.input(topos.selection(rng.integers(0, sizes[2], batch), sizes[2]))
        w1 = tape.parameter((rng.standard_normal(sizes[:2]) / np.sqrt(sizes[0])).astype(dtype))
        b1 = tape.parameter(np.zeros(sizes[1], dtype))
        w2 = tape.parameter((rng.standard_normal(sizes[1:]) / np.sqrt(sizes[1])).astype(dtype))
        hidden = (x @ w1 + b1.broadcast_along(0, batch)).tanh()
        logits = hidden @ w2
        picked = tape.leaf(np.eye(sizes[2], dtype=dtype)).gather(labels)
        loss = -(logits.log_softmax(1) * picked).sum() / float(batch)
        adjoints = tape.differentiate(loss, [w1, b1, w2])
        return x, labels, loss, topos.sgd(tape, adjoints, learning_rate)

    network, (x, labels, loss, updates) = Tape.record(model)
    return MlpStep(network, x, labels, loss, updates, learning_rate)


def batch_feeds(step: MlpStep, k: int, dtype=np.float32) -> dict:
    """Fresh seeded inputs for step ``k`` of a training loop."""
    rng = np.random.default_rng(1000 + k)
    spec = step.network.node(step.x)
    extent = step.network.node(step.labels).dtype.extent
    return {
        step.x: rng.standard_normal(spec.shape).astype(spec.dtype),
        step.labels: rng.integers(0, extent, step.network.node(step.labels).shape),
    }
