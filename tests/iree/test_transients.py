"""Transient storage on local-task: a module's transients live in buffers the CompiledPlan passes in and reuses.

``compile(driver="local-task")`` adds IREE's ``iree.abi.transients``
argument to ``@main`` (``with_transient_storage``) when the plan's
``transient_estimate`` reaches ``TRANSIENT_STORAGE_FROM``, or when asked
(``transient_storage=True``, as most tests here do); each call takes a spare
storage and gives it back, so calls one after another reuse one buffer and
calls on several threads at once each get their own (eight threads get the
serial bits: tests/iree/test_compiled_concurrency.py). What a call hands out
never lives in that storage. local-sync modules and exports allocate their
own transients.
"""

from __future__ import annotations

import numpy as np
import pytest

import topos.nn.functional as F
from topos import Tape, nn
from topos.dialect.iree import compile as compile_module
from topos.dialect.iree.compile import (
    TRANSIENT_SIZE,
    TRANSIENT_STORAGE,
    TRANSIENT_STORAGE_FROM,
    CompileError,
    transient_estimate,
    with_transient_storage,
)
from topos.dialect.iree.targets import TargetError

from iree_support import batch_feeds, mlp_step

STORED = {"target": "llvm-cpu", "driver": "local-task", "transient_storage": True}


def _step(width: int = 512):
    """A training step whose transients (activations the backward reads, gradients) are half a megabyte."""

    def record(tape):
        model = nn.Mlp([64, width, width, 10])
        loss = F.cross_entropy(model(tape.input(shape=(64, 64), name="x")),
                               tape.input(shape=(64,), extent=10, name="labels"))
        return loss, tape.differentiate(loss, model.parameters())

    network, (loss, adjoints) = Tape.record(record)
    return network, loss, adjoints


def _feeds(k: int) -> dict:
    rng = np.random.default_rng(k)
    return {"x": rng.standard_normal((64, 64)).astype(np.float32), "labels": rng.integers(0, 10, 64)}


def test_the_rewrite_puts_the_storage_first_and_keeps_the_rest_of_the_text():
    text = 'func.func @main(%arg0: tensor<2xf32> loc("%0 input x")) -> tensor<2xf32> {\n'
    assert with_transient_storage(text) == (
        f'func.func @main({TRANSIENT_STORAGE}, %arg0: tensor<2xf32> loc("%0 input x")) -> tensor<2xf32> {{\n')
    assert with_transient_storage("func.func @main() -> tensor<f32>") == (
        f"func.func @main({TRANSIENT_STORAGE}) -> tensor<f32>")
    with pytest.raises(CompileError, match="expected one: a compile.rewrite=.... must keep"):
        with_transient_storage("func.func @other(%arg0: tensor<f32>)")


def test_calls_one_after_another_reuse_one_storage_and_give_the_oracles_results():
    network, loss, adjoints = _step()
    compiled = network.entry(adjoints.roots()).lower().compile(**STORED, cache=False)
    parameters = network.parameters()
    for k in range(3):
        run = compiled.forward(parameters, _feeds(k))
        np.testing.assert_allclose(run[loss], network.forward(parameters, _feeds(k))[loss], rtol=1e-5)
    invoker = compiled._invoker
    assert invoker._storage_bytes == int(compiled._load().vm_function.reflection[TRANSIENT_SIZE]) > 0
    assert len(invoker._spare) == 1  # one buffer served all three calls


def test_what_a_call_hands_out_is_not_overwritten_by_later_calls():
    network, loss, adjoints = _step()
    compiled = network.entry(adjoints.roots()).lower().compile(**STORED, cache=False)
    parameters = network.parameters()
    expected = [network.forward(parameters, _feeds(k)) for k in range(2)]
    first = compiled.forward(parameters, _feeds(0))  # read only after the second call ran
    second = compiled.forward(parameters, _feeds(1))
    for run, want in ((first, expected[0]), (second, expected[1])):
        for symbol in adjoints.roots():
            np.testing.assert_allclose(run[symbol], want[symbol], rtol=1e-4, atol=1e-6)


def test_a_call_begun_while_another_is_in_flight_takes_another_storage():
    network, _, adjoints = _step(64)
    compiled = network.entry(adjoints.roots()).lower().compile(**STORED, cache=False)
    compiled._load()
    invoker = compiled._invoker
    (_, first), (_, second) = invoker._begun(3), invoker._begun(3)  # two calls in flight, neither returned
    assert first is not second and invoker._spare == []
    invoker._spare.extend([first, second])  # what each call does when the module returns
    _, third = invoker._begun(3)
    assert third is second and invoker._spare == [first]  # the most recently returned, no new buffer


def test_training_steps_on_resident_state_match_the_module_called_without_the_invoke_path():
    """FunctionInvoker given fresh storage each call (``_storage_arguments``) and ``step`` reusing one agree bitwise."""
    step = mlp_step(np.float32)
    compiled = step.entry().lower().compile(**STORED, cache=False)
    function = compiled._load()
    parameters = step.network.parameters()
    state = compiled.resident(parameters)
    arrays = {i: parameters[step.network.symbol(i)] for i in compiled._parameters}
    for k in range(3):
        feeds = batch_feeds(step, k)
        state, run = compiled.step(state, feeds, step.updates)
        host = compiled._arguments(parameters, feeds)  # the first parameters, replaced below by updated ones
        arguments = [arrays.get(i, a) for i, a in zip(compiled.arguments, host)]
        outputs = function(*compiled._storage_arguments(), *arguments)
        for parameter, position in compiled._update_positions(step.updates):
            arrays[parameter] = outputs[position]
        assert run[step.loss].tobytes() == np.asarray(outputs[compiled.results.index(step.loss.index)]).tobytes()
    assert len(compiled._invoker._spare) == 1


def test_a_local_sync_module_and_an_export_allocate_their_own_transients(tmp_path):
    import iree.runtime as rt

    network, loss, adjoints = _step(64)
    plan = network.entry([loss]).lower()
    plan.export(tmp_path / "artifact", "llvm-cpu", parameters=network.parameters(), feeds=_feeds(0))
    module = rt.VmModule.copy_buffer(rt.VmInstance(), (tmp_path / "artifact" / "module.vmfb").read_bytes())
    assert TRANSIENT_SIZE not in module.lookup_function("main").reflection  # iree-run-module feeds it as it is
    assert TRANSIENT_SIZE not in plan.compile("llvm-cpu", cache=False)._load().vm_function.reflection
    assert TRANSIENT_SIZE in plan.compile(**STORED, cache=False)._load().vm_function.reflection


def test_a_local_task_module_is_cached_apart_from_the_local_sync_one(tmp_path):
    network, loss, adjoints = _step(64)
    plan = network.entry([loss]).lower()
    task = plan.compile(**STORED, cache=tmp_path)
    sync = plan.compile("llvm-cpu", cache=tmp_path)
    assert not sync.cache_hit and task.cache_key != sync.cache_key
    assert plan.compile(**STORED, cache=tmp_path).cache_hit


def test_a_frozen_local_task_module_takes_storage_before_its_inputs_and_gives_the_sync_modules_bits():
    network, loss, adjoints = _step(64)
    plan = network.entry([loss, *adjoints.roots()]).lower()
    table = network.parameters()
    frozen = plan.compile(**STORED, frozen=table, cache=False)
    plain = plan.compile("llvm-cpu", frozen=table, cache=False)  # local-sync: no storage
    assert frozen._storage_arguments() and not plain._storage_arguments()
    for k in range(2):
        got, want = frozen.forward(feeds=_feeds(k)), plain.forward(feeds=_feeds(k))
        for symbol in (loss, *adjoints.roots()):
            np.testing.assert_array_equal(got[symbol], want[symbol])


def test_the_estimate_counts_a_packed_weight_only_when_data_tiling_packs_it_per_call():
    def record(tape):
        logits = tape.input(shape=(128, 768), name="x") @ tape.parameter(np.zeros((768, 50257), np.float32), name="w")
        return logits, (logits * 2.0).reshape((128 * 50257,))

    network, (logits, doubled) = Tape.record(record)
    plan = network.entry([doubled]).lower()
    logits_bytes, weight_bytes, input_bytes = 128 * 50257 * 4, 768 * 50257 * 4, 128 * 768 * 4
    # Live at once: the product and its double (the product is freed before the reshape, the result).
    assert plan.peak()[0] == plan.working_peak() == 2 * logits_bytes
    assert transient_estimate(plan, data_tiled=False, frozen=False) == 2 * logits_bytes
    assert transient_estimate(plan, data_tiled=True, frozen=False) == 2 * logits_bytes + weight_bytes
    assert transient_estimate(plan, data_tiled=True, frozen=False) >= TRANSIENT_STORAGE_FROM
    # Frozen, the weight is packed once, at load; the input is still packed on every call.
    assert transient_estimate(plan, data_tiled=True, frozen=True) == 2 * logits_bytes + input_bytes
    results = network.entry([logits, doubled]).lower()  # a result lives in a buffer the call hands out
    assert results.working_peak() == logits_bytes and results.peak()[0] == 3 * logits_bytes


def test_a_reshape_or_transpose_is_not_counted_as_a_buffer_of_its_own():
    def record(tape):
        product = tape.input(shape=(64, 32), name="x") @ tape.input(shape=(32, 48), name="y")
        return product.permute((1, 0)).reshape((48 * 64,)).sum()

    network, total = Tape.record(record)
    plan = network.entry([total]).lower()
    product_bytes = 64 * 48 * 4
    assert plan.working_peak() == 2 * product_bytes  # the product and its transposed copy
    assert transient_estimate(plan, data_tiled=False, frozen=False) == product_bytes


def test_a_step_whose_transients_fit_the_pools_allocates_its_own_unless_asked():
    network, loss, adjoints = _step(64)
    plan = network.entry(adjoints.roots()).lower()
    chosen = plan.compile("llvm-cpu", driver="local-task", cache=False)
    assert not chosen._storage_arguments()
    assert TRANSIENT_SIZE not in chosen._load().vm_function.reflection
    assert plan.compile(**STORED, cache=False)._storage_arguments()


def test_a_step_estimated_past_the_threshold_takes_storage_by_itself(monkeypatch):
    network, loss, adjoints = _step(64)
    plan = network.entry(adjoints.roots()).lower()
    estimate = transient_estimate(plan, data_tiled=False, frozen=False)
    monkeypatch.setattr(compile_module, "TRANSIENT_STORAGE_FROM", estimate)  # as if the pools were this small
    compiled = plan.compile("llvm-cpu", driver="local-task", cache=False)
    assert compiled._storage_arguments()
    np.testing.assert_allclose(compiled.forward(network.parameters(), _feeds(0))[adjoints.roots()[0]],
                               network.forward(network.parameters(), _feeds(0))[adjoints.roots()[0]], rtol=1e-5)
    monkeypatch.setattr(compile_module, "TRANSIENT_STORAGE_FROM", estimate + 1)
    assert not plan.compile("llvm-cpu", driver="local-task", cache=False)._storage_arguments()


def test_asking_for_storage_on_a_driver_that_allocates_its_own_is_a_target_error():
    network, loss, adjoints = _step(64)
    with pytest.raises(TargetError, match="transient_storage=True needs a driver of.*local-task.*not 'local-sync'"):
        network.entry([loss]).lower().compile("llvm-cpu", cache=False, transient_storage=True)


def test_a_rewrite_that_renames_main_is_a_compile_error_naming_the_rewrite():
    network, loss, adjoints = _step(64)
    with pytest.raises(CompileError, match="has 0 'func.func @main.' heads.*rewrite"):
        network.entry([loss]).lower().compile(**STORED, cache=False,
                                              rewrite=lambda text: text.replace("@main(", "@renamed("))
