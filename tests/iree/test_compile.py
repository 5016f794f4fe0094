"""plan.compile for llvm-cpu: runs readable by symbol, device-resident training, and clear errors on bad input."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import topos
from topos import FeedError, SymbolError, Tape, ToposError
from topos.dialect.iree import conformance
from topos.dialect.iree.cache import plan_key
from topos.dialect.iree.calling import DeviceMemoryError
from topos.dialect.iree.compile import toolchain_version
from topos.dialect.iree.compiled import CompiledRun, ResidentParameters
from topos.dialect.iree.devices import device_for
from topos.dialect.iree.targets import TargetError

from iree_support import ELEMENT_PARAMETERS, batch_feeds, compile_cache, mlp_step  # noqa: F401  (fixture)

HERE = Path(__file__).resolve().parent
EPS = {topos.float32: 2.0**-23, topos.float64: 2.0**-52, topos.bfloat16: 2.0**-7}


def _walkthrough(dtype):
    """The README's graph with its recorded gradient, in ``dtype``."""

    def model(tape):
        w = tape.parameter(np.array([[0.5, -0.25], [0.75, 1.0]], dtype))
        x = tape.input(np.array([[1.0, 2.0]], dtype))
        loss = ((x @ w).tanh() ** 2.0).sum()
        return w, x, loss, tape.differentiate(loss, [w]).gradients[0]

    return Tape.record(model)


def _within(got, want, dtype, what=""):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    bound = conformance.END_TO_END_ULPS * EPS[np.dtype(dtype)] * np.max(np.abs(want))
    assert np.max(np.abs(got - want)) <= bound, f"{what}: {got} vs {want}"


@pytest.mark.parametrize("dtype", ELEMENT_PARAMETERS)
def test_plan_compiles_and_its_run_is_readable_by_symbol(dtype):
    network, (_, x, loss, gradient) = _walkthrough(dtype)
    compiled = network.entry([loss, gradient]).lower().compile("llvm-cpu")
    feeds = {x: np.array([[-1.5, 0.25]], dtype)}
    run = compiled.forward(network.parameters(), feeds)
    assert isinstance(run, CompiledRun)
    oracle = network.forward(network.parameters(), feeds)
    for symbol in (loss, gradient):
        assert run[symbol].dtype == np.dtype(dtype) and run[symbol].shape == oracle[symbol].shape
        assert not run[symbol].flags.writeable
        _within(run[symbol], oracle[symbol], dtype, repr(symbol))


def test_reading_an_undeclared_or_foreign_symbol_raises():
    network, (_, x, loss, gradient) = _walkthrough(np.float32)
    run = network.entry([loss]).lower().compile("llvm-cpu").forward(network.parameters())
    with pytest.raises(SymbolError, match=r"not a result of this compiled plan \(its results: .*\); add it to"):
        run[gradient]
    with pytest.raises(SymbolError, match="not a result of this compiled plan"):
        run[x]  # an input exists in the run's arguments but was not declared
    with pytest.raises(SymbolError, match=r"run\['x'\]: 'x' is a str, not a Symbol; a run is read by Symbol"):
        run["x"]
    _, (_, _, other_loss, _) = _walkthrough(np.float32)
    with pytest.raises(SymbolError, match="another tape"):
        run[other_loss]


def test_training_step_keeps_parameters_on_the_device_until_to_host():
    import iree.runtime as rt

    step = mlp_step()
    compiled = step.entry().lower().compile("llvm-cpu")
    parameters = step.network.parameters()
    state = compiled.resident(parameters)
    assert isinstance(state, ResidentParameters)
    symbols = step.network.parameter_symbols()
    for _ in range(3):
        state, run = compiled.step(state, batch_feeds(step, 0), step.updates)
        for parameter, new in step.updates.pairs():
            array = state.device(parameter)
            assert isinstance(array, rt.DeviceArray)
            assert array is run.device(new)  # the step's own output, handed on as is
            assert not array.is_host_accessible  # never copied or mapped to the host
    host = state.to_host()
    assert all(state.device(s).is_host_accessible for s in symbols)  # to_host is the transfer
    assert isinstance(host, topos.Parameters) and set(host.symbols()) == set(symbols)
    with pytest.raises(SymbolError):
        state.device(step.loss)


def test_forward_reads_device_state_where_it_lives():
    """An evaluation between steps runs on the resident arrays: the same bits as a run on their host copy."""
    step = mlp_step()
    compiled = step.entry().lower().compile("llvm-cpu")
    evaluation = step.network.entry([step.loss]).lower().compile("llvm-cpu")
    state = compiled.resident(step.network.parameters())
    for k in range(3):
        state, _ = compiled.step(state, batch_feeds(step, k), step.updates)
    feeds = batch_feeds(step, 9)
    host = state.to_host()
    for plan in (compiled, evaluation):
        on_device = plan.forward(state, feeds)[step.loss]
        assert np.array_equal(on_device, plan.forward(host, feeds)[step.loss]), plan
    assert not np.array_equal(host[step.network.parameter_symbols()[0]],
                              step.network.parameters()[step.network.parameter_symbols()[0]])
    again, _ = compiled.step(state, feeds, step.updates)  # the state a forward read is still the step's to take
    assert np.array_equal(again.to_host()[step.network.parameter_symbols()[0]],
                          compiled.step(compiled.resident(host), feeds, step.updates)[0].to_host()[
                              step.network.parameter_symbols()[0]])



@pytest.mark.parametrize("dtype", ELEMENT_PARAMETERS)
def test_compiled_training_steps_match_oracle_steps(dtype):
    """N steps of compiled.step against N of network.forward + run.backward + SGD in NumPy."""
    steps = 5
    step = mlp_step(dtype)
    compiled = step.entry().lower().compile("llvm-cpu")
    rate = np.asarray(step.learning_rate, dtype)
    parameters = step.network.parameters()
    state = compiled.resident(parameters)
    for k in range(steps):
        feeds = batch_feeds(step, k)
        state, run = compiled.step(state, feeds, step.updates)
        oracle = step.network.forward(parameters, feeds)
        gradients = oracle.backward(step.loss).parameters(parameters)
        _within(run[step.loss], oracle[step.loss], dtype, f"loss at step {k}")
        parameters = parameters.step(gradients, lambda p, g: (p - rate * g).astype(dtype))
        for parameter, new in step.updates.pairs():  # the recorded SGD is the NumPy SGD, bit for bit
            assert oracle[new].tobytes() == parameters[parameter].tobytes()
    compiled_parameters = state.to_host()
    for symbol in step.network.parameter_symbols():
        _within(compiled_parameters[symbol], parameters[symbol], dtype, f"{symbol!r} after {steps} steps")


# ---- bad input: a clear error or a rebuild, never a crash ----------------------------------------


def test_unknown_target_raises_a_target_error_listing_the_targets():
    network, (_, _, loss, _) = _walkthrough(np.float32)
    with pytest.raises(TargetError, match="unknown target 'tpu'.*llvm-cpu.*cuda.*vulkan.*metal.*rocm"):
        network.entry([loss]).lower().compile("tpu")


def test_a_driver_the_runtime_lacks_raises_a_target_error():
    network, (_, _, loss, _) = _walkthrough(np.float32)
    compiled = network.entry([loss]).lower().compile("llvm-cpu", driver="no-such-driver")
    with pytest.raises(TargetError, match="no 'no-such-driver' driver"):
        compiled.forward(network.parameters())


@functools.cache
def _guarded():
    """A compiled walkthrough whose IREE call is replaced by a tripwire, to prove checks come first."""
    network, (w, x, loss, gradient) = _walkthrough(np.float32)
    compiled = network.entry([loss, gradient]).lower().compile("llvm-cpu")
    return network, w, x, loss, gradient, compiled


@pytest.mark.parametrize("feed, message", [
    (np.zeros((2, 2), np.float32), r"expects shape \[1, 2\], got \[2, 2\]"),
    (np.zeros((1, 2), np.float64), "expects element type f32, got float64"),
    ([[1.0, "two"]], "does not convert"),
])
def test_a_wrong_feed_raises_a_feed_error_before_reaching_iree(monkeypatch, feed, message):
    network, w, x, _, _, compiled = _guarded()

    def tripwire(*_):
        raise AssertionError("the bad feed reached IREE")

    monkeypatch.setattr(compiled, "_call", tripwire)
    with pytest.raises(FeedError, match=message):
        compiled.forward(network.parameters(), {x: feed})
    with pytest.raises(FeedError, match="not an input"):
        compiled.forward(network.parameters(), {w: np.zeros((2, 2), np.float32)})


def test_a_wrong_parameter_table_raises_before_reaching_iree(monkeypatch):
    _, w, _, _, _, compiled = _guarded()
    monkeypatch.setattr(compiled, "_call", lambda *_: pytest.fail("reached IREE"))
    other, _ = _walkthrough(np.float32)
    with pytest.raises(SymbolError, match="another network"):
        compiled.forward(other.parameters())
    with pytest.raises(FeedError, match="expected a Parameters table"):
        compiled.resident({w: np.zeros((2, 2), np.float32)})
    with pytest.raises(FeedError, match="expected a Parameters table"):
        compiled.forward(None)


def test_an_update_that_is_not_a_result_raises_before_the_step_runs(monkeypatch):
    step = mlp_step()
    compiled = step.network.entry([step.loss]).lower().compile("llvm-cpu")
    state = compiled.resident(step.network.parameters())  # loaded: every run calls compiled._main
    monkeypatch.setattr(compiled, "_main", lambda *_: pytest.fail("reached IREE"))
    with pytest.raises(FeedError, match="not a result of this plan's entry"):
        compiled.step(state, {}, step.updates)


def test_a_corrupt_cache_entry_is_rebuilt(compile_cache):  # noqa: F811  (the fixture)
    network, (_, _, loss, _) = _walkthrough(np.float32)
    plan = network.entry([loss]).lower()
    built = plan.compile("llvm-cpu")
    assert built.cache_key == plan_key(plan, "llvm-cpu", built.flags, toolchain_version())
    entry = compile_cache / f"{built.cache_key}.vmfb"
    assert entry.exists()
    entry.write_bytes(entry.read_bytes()[:100])
    rebuilt = plan.compile("llvm-cpu")
    assert not rebuilt.cache_hit and rebuilt.vmfb == built.vmfb
    assert rebuilt.forward(network.parameters())[loss] == built.forward(network.parameters())[loss]
    assert plan.compile("llvm-cpu").cache_hit


def test_device_out_of_memory_raises_a_device_memory_error(compile_cache):  # noqa: F811  (the fixture)
    """A 256 GiB result on the CPU device: IREE's RESOURCE_EXHAUSTED becomes a DeviceMemoryError.

    Runs in a child process whose address space is capped at 16 GiB, so the
    allocation fails at once even where the kernel overcommits memory.
    """
    script = textwrap.dedent("""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (16 << 30, 16 << 30))
        import numpy as np
        from topos import Tape
        from topos.dialect.iree.calling import DeviceMemoryError
        network, big = Tape.record(lambda tape: tape.input(np.ones((1,), np.float32)).broadcast((1 << 36,)))
        compiled = network.entry([big]).lower().compile("llvm-cpu")
        try:
            compiled.forward(network.parameters())  # the caller's line, named by the error
        except DeviceMemoryError as error:
            print("DeviceMemoryError:", error)
    """)
    env = {**os.environ, "TOPOS_CACHE_DIR": str(compile_cache)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "DeviceMemoryError: <string>:10 in <module>: the llvm-cpu device (local-sync) ran out of memory" \
        in done.stdout, done.stdout
    assert "RESOURCE_EXHAUSTED" in done.stdout
    assert issubclass(DeviceMemoryError, ToposError) and issubclass(DeviceMemoryError, MemoryError)


def test_data_tiling_follows_the_size_of_the_largest_matmul(monkeypatch):
    from topos.dialect.iree import targets
    from topos.dialect.iree.compile import largest_matmul, module_flags
    from topos.dialect.iree.targets import (
        DATA_TILING_FLAGS,
        DATA_TILING_THRESHOLD,
        SHARED_DATA_TILING_THRESHOLD,
        target,
    )

    def plan_of(m, k, n):
        def model(tape):
            a = tape.input(np.zeros((m, k), np.float32))
            b = tape.parameter(np.zeros((k, n), np.float32))
            return (a @ b).sum()

        network, loss = Tape.record(model)
        return network.entry([loss]).lower()

    small, large = plan_of(4, 8, 2), plan_of(128, 1024, 1024)
    assert largest_matmul(small) == 4 * 8 * 2
    assert largest_matmul(large) == 128 * 1024 * 1024 >= DATA_TILING_THRESHOLD
    assert not set(DATA_TILING_FLAGS) & set(small.compile("llvm-cpu").flags)
    assert set(DATA_TILING_FLAGS) <= set(large.compile("llvm-cpu").flags)
    forced = small.compile("llvm-cpu", data_tiling=True)
    assert set(DATA_TILING_FLAGS) <= set(forced.flags)

    def tiled(plan, driver=None, cpu_name="host"):
        return set(DATA_TILING_FLAGS) <= set(module_flags(plan, cpu, cpu_name, None, driver=driver))

    cpu, middle = target("llvm-cpu"), plan_of(32, 1024, 1024)  # the small GPT's size: tiled on one thread only
    assert largest_matmul(middle) == DATA_TILING_THRESHOLD < SHARED_DATA_TILING_THRESHOLD <= largest_matmul(large)
    monkeypatch.setattr(targets, "narrow_vector_host", lambda: False)  # a host with AVX-512
    assert tiled(middle) and not tiled(middle, "local-task") and tiled(large, "local-task")

    # An x86 host without AVX-512 tiles from NARROW_DATA_TILING_THRESHOLD on every driver; a named CPU
    # keeps the AVX-512 machines' rule.
    narrow = plan_of(16, 1024, 1024)
    assert largest_matmul(narrow) == targets.NARROW_DATA_TILING_THRESHOLD < DATA_TILING_THRESHOLD
    assert not tiled(narrow) and not tiled(narrow, "local-task")
    monkeypatch.setattr(targets, "narrow_vector_host", lambda: True)
    assert tiled(narrow) and tiled(narrow, "local-task") and tiled(middle, "local-task")
    assert not tiled(plan_of(8, 1024, 1024)) and not tiled(narrow, "local-task", "generic")


def test_the_narrow_vector_rule_reads_the_hosts_features(monkeypatch):
    from topos.dialect.iree import targets

    for isa, narrow in (("x86_64 avx avx2 fma sse2", True), ("x86_64 avx2 avx512bw avx512f fma", False),
                        ("aarch64 asimd fp sve", False), ("x86_64 i386", False)):  # the last: features unread
        monkeypatch.setattr(targets, "host_isa", lambda isa=isa: isa)
        assert targets.narrow_vector_host() is narrow, isa


def test_a_tiled_product_returned_beside_its_gelu_compiles():
    """IREE 3.13 fails on a tiled product whose epilogue hands out two plain results; topos's flags avoid it."""
    rng = np.random.default_rng(3)

    def model(tape):
        x = tape.input(rng.uniform(-1.0, 1.0, (256, 128)).astype(np.float32))
        w = tape.parameter(rng.uniform(-0.1, 0.1, (128, 256)).astype(np.float32))
        b = tape.parameter(rng.uniform(-0.1, 0.1, 256).astype(np.float32))
        hidden = x @ w + b.broadcast_to((256, 256))
        return hidden, hidden.gelu()

    network, (hidden, gelu) = Tape.record(model)
    compiled = network.entry([hidden, gelu]).lower().compile("llvm-cpu", cache=False, data_tiling=True)
    got, want = compiled.forward(network.parameters()), network.forward(network.parameters())
    for root in (hidden, gelu):
        np.testing.assert_allclose(got[root], want[root], rtol=1e-5, atol=1e-5)


def test_a_narrow_product_does_not_turn_data_tiling_on_unless_the_weights_are_frozen():
    """One row (a decode step) packs as much weight per call as it multiplies; frozen weights are packed at load."""
    from topos.dialect.iree.compile import largest_matmul, module_flags
    from topos.dialect.iree.targets import DATA_TILING_FLAGS, DATA_TILING_THRESHOLD, TILED_MIN_ROWS, target

    def plan_of(m, k, n, left_weight=False):
        def model(tape):
            a = tape.input(np.zeros((m, k) if not left_weight else (k, m), np.float32))
            b = tape.parameter(np.zeros((k, n) if not left_weight else (n, k), np.float32))
            return ((b @ a) if left_weight else (a @ b)).sum()

        network, loss = Tape.record(model)
        return network.entry([loss]).lower()

    cpu = target("llvm-cpu")
    for narrow in (plan_of(1, 1024, 40000), plan_of(1, 1024, 40000, left_weight=True),
                   plan_of(TILED_MIN_ROWS - 1, 1024, 4000)):
        assert largest_matmul(narrow) >= DATA_TILING_THRESHOLD > largest_matmul(narrow, TILED_MIN_ROWS) == 0
        assert not set(DATA_TILING_FLAGS) & set(module_flags(narrow, cpu, "host", None))
        assert set(DATA_TILING_FLAGS) <= set(module_flags(narrow, cpu, "host", None, frozen=True))
    wide = plan_of(TILED_MIN_ROWS, 1024, 4000)
    assert largest_matmul(wide, TILED_MIN_ROWS) == TILED_MIN_ROWS * 1024 * 4000 >= DATA_TILING_THRESHOLD
    assert set(DATA_TILING_FLAGS) <= set(module_flags(wide, cpu, "host", None))


def test_a_tiled_module_for_one_thread_gets_large_workgroups_and_compiles_with_the_tool():
    """local-sync's tiled products get LARGE_TILE_FLAGS, an option only the iree-compile tool takes,
    and keep IREE's workgroups (IREE 3.13 refused a data-tiled module undistributed); untiled, one workgroup.
    On local-task only a product of LARGE_TILES_FROM multiply-adds gets the large workgroups."""
    from iree.compiler.api import Session

    from topos.dialect.iree.compile import largest_matmul, module_flags
    from topos.dialect.iree.targets import (
        LARGE_TILE_FLAGS,
        LARGE_TILES_FROM,
        PROCESS_WIDE_OPTIONS,
        SINGLE_THREAD_FLAGS,
        target,
    )

    def model(tape):
        a = tape.input(np.linspace(-1.0, 1.0, 32 * 48, dtype=np.float32).reshape(32, 48))
        b = tape.parameter(np.linspace(0.5, -0.5, 48 * 40, dtype=np.float32).reshape(48, 40))
        return (a @ b).tanh()

    network, out = Tape.record(model)
    plan = network.entry([out]).lower()
    one, pool = plan.compile("llvm-cpu", data_tiling=True), plan.compile("llvm-cpu", "local-task", data_tiling=True)
    untiled = plan.compile("llvm-cpu")
    assert set(LARGE_TILE_FLAGS) <= set(one.flags)
    assert not set(SINGLE_THREAD_FLAGS) & set(one.flags)
    assert not set(LARGE_TILE_FLAGS) & set(pool.flags)  # two workers need more workgroups
    largest = _square_product(1024)  # GPT-2's LM head scale: workgroups to spare for every worker
    assert largest_matmul(largest) == LARGE_TILES_FROM
    assert set(LARGE_TILE_FLAGS) <= set(module_flags(largest, target("llvm-cpu"), "host", True, driver="local-task"))
    assert not set(LARGE_TILE_FLAGS) & set(untiled.flags)  # untiled: nothing to size
    assert set(SINGLE_THREAD_FLAGS) <= set(untiled.flags)
    want = network.forward(network.parameters())[out]
    for compiled in (one, pool):
        np.testing.assert_allclose(compiled.forward(network.parameters())[out], want, rtol=2e-6, atol=2e-6)
    (option,) = {flag.split("=")[0] for flag in LARGE_TILE_FLAGS}
    assert option in PROCESS_WIDE_OPTIONS
    with pytest.raises(ValueError, match="option not found"):  # why the tool: the in-process API refuses it
        Session().set_flags(*LARGE_TILE_FLAGS)


def test_one_thread_compiles_undistributed_below_the_largest_product_limit(tmp_path):
    """local-sync modules are one workgroup per dispatch unless a product is large; local-task and exports never."""
    from topos.dialect.iree.compile import largest_matmul, module_flags
    from topos.dialect.iree.targets import SINGLE_THREAD_FLAGS, UNDISTRIBUTED_BELOW, target

    def model(tape):
        a = tape.input(np.linspace(-1.0, 1.0, 32 * 64, dtype=np.float32).reshape(32, 64))
        b = tape.parameter(np.linspace(0.5, -0.5, 64 * 48, dtype=np.float32).reshape(64, 48))
        return (a @ b).tanh().sum()

    network, out = Tape.record(model)
    plan = network.entry([out]).lower()
    one, pool = plan.compile("llvm-cpu", cache=False), plan.compile("llvm-cpu", "local-task", cache=False)
    assert set(SINGLE_THREAD_FLAGS) <= set(one.flags)
    assert not set(SINGLE_THREAD_FLAGS) & set(pool.flags)  # two workers share the workgroups
    want = network.forward(network.parameters())[out]
    for compiled in (one, pool):
        np.testing.assert_allclose(compiled.forward(network.parameters())[out], want, rtol=2e-6, atol=2e-6)
    exported = plan.export(tmp_path / "artifact", "llvm-cpu")  # runs on local-task (check.sh)
    assert not {flag for flag in SINGLE_THREAD_FLAGS if flag in (exported / "flags.txt").read_text()}

    large = _square_product(1024)
    assert largest_matmul(large) == UNDISTRIBUTED_BELOW
    flags = module_flags(large, target("llvm-cpu"), "host", False)
    assert not set(SINGLE_THREAD_FLAGS) & set(flags)  # the workgroups also block its weight for the cache


def _square_product(side: int):
    """The plan of one [side, side] x [side, side] product's sum: side**3 multiply-adds, never compiled."""
    network, out = Tape.record(lambda tape: (tape.input(np.zeros((side, side), np.float32))
                                             @ tape.parameter(np.zeros((side, side), np.float32))).sum())
    return network.entry([out]).lower()


def test_the_tool_path_names_the_users_line_when_iree_refuses():
    from topos.dialect.iree.compile import CompileError, compile_stablehlo
    from topos.dialect.iree.targets import LARGE_TILE_FLAGS, flags_for, target

    text = ('func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n'
            '  %0 = "stablehlo.add"(%a, %a) : (tensor<2xf32>, tensor<2xf32>) -> tensor<3xf32> loc("model.py":7:0)\n'
            '  return %a : tensor<2xf32>\n}\n')
    flags = flags_for(target("llvm-cpu"), False) + LARGE_TILE_FLAGS
    with pytest.raises(CompileError, match=r"model\.py:7: error: .*") as raised:
        compile_stablehlo(text, flags)
    assert "Traceback" not in str(raised.value)


def test_img2col_follows_a_stablehlo_convolution_in_the_text_only():
    """topos spells its convolutions as columns, so no plan of its own gets IREE's img2col; named text does."""
    from topos.dialect.iree.compile import module_flags
    from topos.dialect.iree.targets import IMG2COL_FLAGS, target
    from topos.nn import functional as F

    def model(tape):
        x = tape.input(np.ones((2, 3, 8, 8), np.float32))
        w = tape.parameter(np.full((4, 3, 3, 3), 0.1, np.float32))
        loss = F.conv2d(x, w, padding=1).relu().sum()
        return loss, tape.differentiate(loss, [w])

    network, (loss, adjoints) = Tape.record(model)
    forward, training = network.entry([loss]).lower(), network.entry(adjoints.roots()).lower()
    cpu, vulkan = target("llvm-cpu"), target("vulkan")
    for plan in (forward, training):
        assert "stablehlo.convolution" not in plan.emit_stablehlo()
        assert not set(IMG2COL_FLAGS) & set(module_flags(plan, cpu, "host", None))
    # A rewrite (the bisect seam) that hands IREE a stablehlo.convolution brings img2col with it.
    named = forward.emit_stablehlo(convolution="named")
    assert "stablehlo.convolution" in named
    assert set(IMG2COL_FLAGS) <= set(module_flags(training, cpu, "host", None, text=named))
    assert not set(IMG2COL_FLAGS) & set(module_flags(forward, vulkan, "host", None, text=named))  # llvm-cpu only


def test_an_iree_diagnostic_names_the_node_and_the_recording_line():
    from topos.dialect.iree.compile import CompileError

    def model(tape):
        x = tape.input(np.array([[1.0, 2.0]], np.float32))
        return (x * 2.0).sum()  # the line IREE's complaint must name

    network, loss = Tape.record(model)
    line = model.__code__.co_firstlineno + 2
    plan = network.entry([loss]).lower()
    # An out-of-range reduction axis passes the parser and fails IREE's verifier at the op.
    def broken(text):
        return text.replace("across dimensions = [0]", "across dimensions = [3]")

    with pytest.raises(CompileError) as failure:
        plan.compile("llvm-cpu", cache=False, rewrite=broken)
    message = str(failure.value)
    assert f"%{loss.index} sum" in message
    assert f"test_compile.py:{line}" in message


def _sgd_step():
    """One SGD step of a 128 x 128 weight, compiled: (network, loss, updates, compiled)."""
    def record(tape):
        w = tape.parameter(np.ones((128, 128), np.float32))
        x = tape.input(np.ones((16, 128), np.float32))
        loss = (x @ w).tanh().sum()
        return loss, topos.sgd(tape, tape.differentiate(loss, [w]), 0.1)

    network, (loss, updates) = Tape.record(record)
    return network, loss, updates, network.entry(updates.roots(loss)).lower().compile("llvm-cpu")


def test_device_memory_counts_what_a_resident_table_and_a_step_allocate():
    network, loss, updates, compiled = _sgd_step()
    device_for("local-sync").allocator.trim()  # buffers an earlier test freed would serve these
    before = compiled.device_memory()
    if not before:
        pytest.skip("this IREE runtime was built without allocator statistics")
    state = compiled.resident(network.parameters())
    after_upload = compiled.device_memory()
    assert after_upload["device_bytes_allocated"] - before["device_bytes_allocated"] >= 128 * 128 * 4
    state, run = compiled.step(state, {}, updates)
    float(run[loss])
    after_step = compiled.device_memory()
    assert after_step["device_bytes_allocated"] - after_upload["device_bytes_allocated"] >= 128 * 128 * 4
    assert after_step["device_bytes_peak"] >= after_step["device_bytes_allocated"] - after_step["device_bytes_freed"]


def test_local_devices_keep_freed_buffers_for_reuse():
    """Once a step's buffers are freed, the next steps reuse them: the device allocates nothing new.

    Without the caching allocator every step allocated its results and
    transients afresh (and on a large model page-faulted them in again).
    """
    network, loss, updates, compiled = _sgd_step()
    if not compiled.device_memory():
        pytest.skip("this IREE runtime was built without allocator statistics")
    state = compiled.resident(network.parameters())
    allocated = []
    for _ in range(5):
        state, run = compiled.step(state, {}, updates)
        float(run[loss])
        del run  # the earlier state and run go: their buffers return to the pool
        allocated.append(compiled.device_memory()["device_bytes_allocated"])
    assert allocated[2:] == [allocated[2]] * 3, allocated
    assert compiled._device is device_for("local-sync")  # one device per driver: state steps across plans


def test_out_of_memory_hands_the_kept_buffers_back_and_tries_once_more(monkeypatch):
    import types

    network, _, x, loss, _, compiled = _guarded()
    compiled._load()
    real, device = compiled._main, compiled._device
    trims, failures = [], iter([RuntimeError("RESOURCE_EXHAUSTED; out of memory")])

    def flaky(values):
        for error in failures:  # the first call fails, as an allocation would
            raise error
        return real(values)

    monkeypatch.setattr(compiled, "_main", flaky)
    monkeypatch.setattr(compiled, "_device", types.SimpleNamespace(
        allocator=types.SimpleNamespace(trim=lambda: trims.append(1) or device.allocator.trim())))
    feeds = {x: np.ones((1, 2), np.float32)}
    got = compiled.forward(network.parameters(), feeds)[loss]
    assert trims == [1]
    monkeypatch.setattr(compiled, "_main", real)
    assert got == compiled.forward(network.parameters(), feeds)[loss]


def test_a_module_the_runtime_will_not_load_for_its_binding_count_says_what_to_do():
    from topos.dialect.iree.compiled import _load_hint

    refusal = RuntimeError("Error registering modules: module.c:1106: OUT_OF_RANGE; "
                           "binding count 41 > 32")
    assert "declare fewer of them as results" in _load_hint(refusal) and "iree-binding-count" in _load_hint(refusal)
    assert _load_hint(RuntimeError("INVALID_ARGUMENT; something else")) == ""


def test_a_device_for_a_driver_the_runtime_lacks_is_a_target_error_naming_it():
    with pytest.raises(TargetError,
                       match=r"test_compile\.py:\d+ .*no 'no-such-driver' driver \(available: .*local-sync"):
        device_for("no-such-driver")
