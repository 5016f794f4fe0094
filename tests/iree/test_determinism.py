"""Compiled runs repeat bit for bit, on both CPU drivers, and compiling twice gives the same module bytes."""

from __future__ import annotations

import functools
import hashlib

import numpy as np
import pytest

from iree_support import batch_feeds, compile_cache, mlp_step  # noqa: F401  (autouse fixture)

CALLS = 100


@functools.cache
def _step():
    return mlp_step(batch=32, sizes=(24, 32, 6))


def _digest(run, symbols) -> str:
    h = hashlib.sha256()
    for symbol in symbols:
        array = np.ascontiguousarray(run[symbol])
        h.update(str(array.dtype).encode() + str(array.shape).encode() + array.tobytes())
    return h.hexdigest()


@functools.cache
def _digests(driver: str) -> frozenset:
    step = _step()
    compiled = step.entry().lower().compile("llvm-cpu", driver)
    assert compiled.driver == driver
    parameters, feeds = step.network.parameters(), batch_feeds(step, 0)
    roots = step.updates.roots(step.loss)
    return frozenset(_digest(compiled.forward(parameters, feeds), roots) for _ in range(CALLS))


@pytest.mark.parametrize("driver", ["local-sync", "local-task"])
def test_a_hundred_calls_of_a_compiled_training_step_give_one_digest(driver):
    assert len(_digests(driver)) == 1


def test_local_sync_and_local_task_agree_bit_for_bit():
    assert _digests("local-sync") == _digests("local-task")


def test_resident_steps_repeat_bit_for_bit():
    """Two training loops of five device-resident steps from the same start end in the same bits."""
    step = _step()
    compiled = step.entry().lower().compile("llvm-cpu")
    finals = []
    for _ in range(2):
        state = compiled.resident(step.network.parameters())
        for k in range(5):
            state, _ = compiled.step(state, batch_feeds(step, k), step.updates)
        host = state.to_host()
        finals.append(b"".join(np.ascontiguousarray(host[s]).tobytes() for s in host.symbols()))
    assert finals[0] == finals[1]


def test_two_compiles_of_the_same_spec_give_byte_identical_modules():
    first = _step().entry().lower().compile("llvm-cpu", cache=False)
    second = _step().entry().lower().compile("llvm-cpu", cache=False)
    assert not first.cache_hit and not second.cache_hit
    assert first.vmfb == second.vmfb


def test_two_recordings_of_the_same_model_compile_to_byte_identical_modules():
    one, two = mlp_step(batch=8, sizes=(4, 6, 3)), mlp_step(batch=8, sizes=(4, 6, 3))
    assert one.network.family is not two.network.family
    first = one.entry().lower().compile("llvm-cpu", cache=False)
    second = two.entry().lower().compile("llvm-cpu", cache=False)
    assert first.stablehlo == second.stablehlo
    assert first.vmfb == second.vmfb
