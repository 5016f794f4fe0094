"""The compiled backend can be trusted: no silent wrong result, no dead interpreter, every misuse a ToposError.

* A ``cpu`` LLVM does not know is refused before LLVM sees it (LLVM ends
  the process on some names), and a compile with any CPU but ``host`` or
  ``generic`` runs in a child process, so whatever LLVM does there cannot
  take the caller down. A module built for a CPU this machine lacks is
  tried in a child before it runs here (it would die of SIGILL).
* Device state carries its network: ``step`` refuses the state or the
  Updates of another network, or state on another device.
* What a compiled run hands out is the caller's own copy: writing to it
  (``setflags(write=True)``, ``torch.from_numpy``) cannot reach the device
  buffers that the next step reads.

The checks whose failure would kill the interpreter run in a child of the
test, so a regression fails the test instead of ending pytest.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import topos
from topos import FeedError, SymbolError, Tape, ToposError
from topos.dialect.iree import compile as compile_module
from topos.dialect.iree.cache import CompileCache
from topos.dialect.iree.compile import CompileError
from topos.dialect.iree.compiled import ResidentParameters
from topos.dialect.iree.targets import TargetError

from iree_support import batch_feeds, compile_cache, mlp_step  # noqa: F401  (autouse fixture)

HERE = Path(__file__).resolve().parent
THIS_FILE = Path(__file__).name


def _python(script: str, cache_dir, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run ``script`` in a fresh interpreter that sees this folder and the session's compile cache."""
    prelude = f"import sys\nsys.path.insert(0, {str(HERE)!r})\n"
    env = {**os.environ, "TOPOS_CACHE_DIR": str(cache_dir)}
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=timeout, env=env, check=False)


def _line_of(marker: str) -> int:
    """The line of this file that contains ``marker`` (for errors that must name the caller's line)."""
    for number, line in enumerate(Path(__file__).read_text().splitlines(), 1):
        if marker in line and "_line_of" not in line:
            return number
    raise AssertionError(marker)


# ---- cpu: validated before LLVM, compiled where LLVM cannot kill us ---------------------------------

_CPU_SCRIPT = """
    import json
    import numpy as np
    from topos import Tape, ToposError
    from topos.dialect.iree import compile as compile_module
    from topos.dialect.iree.targets import flags_for, target

    network, out = Tape.record(lambda tape: (tape.input(np.ones((2, 3), np.float32)) * 2.0).sum())
    plan = network.entry([out]).lower()
    results = {}
    for cpu in ("native", "x86_64", "skylak", "cortex-a5x", "", 3):
        try:
            plan.compile("llvm-cpu", cpu=cpu, cache=False)
            results[repr(cpu)] = ["compiled", ""]
        except ToposError as error:
            results[repr(cpu)] = [type(error).__name__, str(error)]
    # What LLVM does with a name it cannot use, run the way compile runs unusual options: in a child.
    flags = flags_for(target("llvm-cpu"), False, "host")
    flags = tuple(f for f in flags if not f.startswith("--iree-llvmcpu-target-cpu=")) + (
        "--iree-llvmcpu-target-cpu=native",)
    try:
        compile_module._compile_in_child(plan.emit_stablehlo(), flags)
        results["child"] = ["compiled", ""]
    except ToposError as error:
        results["child"] = [type(error).__name__, str(error)]
    print("RESULTS" + json.dumps(results))
"""


@pytest.fixture(scope="module")
def cpu_results(compile_cache):  # noqa: F811  (the fixture)
    """Every bad ``cpu`` tried in one child interpreter: {repr(cpu): [error class, message]}."""
    done = _python(_CPU_SCRIPT, compile_cache)
    assert done.returncode == 0, f"the interpreter died (exit {done.returncode}):\n{done.stderr[-3000:]}"
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULTS"))
    return json.loads(line[len("RESULTS"):])


def test_cpu_native_leaves_the_interpreter_alive_with_a_target_error(cpu_results):
    kind, message = cpu_results["'native'"]
    assert kind == "TargetError", message
    assert "'native'" in message and "cpu='host'" in message


def test_an_unknown_cpu_is_refused_before_llvm_with_the_names_it_accepts(cpu_results):
    from topos.dialect.iree.targets import llvm_cpus

    architecture, names = llvm_cpus()
    for cpu in ("'x86_64'", "'skylak'", "'cortex-a5x'", "''", "3"):
        kind, message = cpu_results[cpu]
        assert kind == "TargetError", (cpu, message)
    for cpu in ("'x86_64'", "'skylak'", "'cortex-a5x'"):
        message = cpu_results[cpu][1]
        assert f"for {architecture}" in message and "host" in message and "generic" in message, message
        assert all(name in message for name in names), "the message lists every name LLVM accepts"
    if architecture == "x86_64":
        assert "did you mean 'skylake'" in cpu_results["'skylak'"][1]
        assert "did you mean 'x86-64'" in cpu_results["'x86_64'"][1]


def test_a_compile_that_ends_its_process_becomes_a_compile_error(cpu_results):
    kind, message = cpu_results["child"]
    assert kind == "CompileError", message
    assert "child process" in message and "LLVM ERROR" in message, message
    assert "--iree-llvmcpu-target-cpu=native" in message


@functools.cache
def _baseline_cpu() -> str | None:
    """A CPU name other than host/generic whose code runs on every machine of this architecture."""
    from topos.dialect.iree.targets import llvm_cpus

    architecture, names = llvm_cpus()
    cpu = {"x86_64": "x86-64", "aarch64": "cortex-a53"}.get(architecture)
    return cpu if cpu in names else None


def test_a_named_cpu_compiles_in_a_child_process_and_runs(monkeypatch, tmp_path):
    cpu = _baseline_cpu()
    if cpu is None:
        pytest.skip("no baseline CPU name known for this architecture")

    def tripwire(*_):
        raise AssertionError("a compile with a named cpu ran in this process")

    monkeypatch.setattr(compile_module, "compile_stablehlo", tripwire)
    network, out = Tape.record(lambda tape: (tape.input(np.ones((2, 3), np.float32)) * 2.0).sum())
    store = CompileCache(tmp_path)
    built = network.entry([out]).lower().compile("llvm-cpu", cpu=cpu, cache=store)
    assert f"--iree-llvmcpu-target-cpu={cpu}" in built.flags and not built.cache_hit
    assert float(built.forward(network.parameters())[out]) == 12.0
    again = network.entry([out]).lower().compile("llvm-cpu", cpu=cpu, cache=store)
    assert again.cache_hit and again.vmfb == built.vmfb


def _host_has(flag: str) -> bool:
    try:
        return f" {flag}" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return True  # unknown: do not assume the host lacks it


@pytest.mark.parametrize("frozen", [False, True], ids=["arguments", "frozen"])
def test_a_module_for_a_cpu_this_machine_lacks_is_refused_instead_of_killing_the_process(compile_cache,  # noqa: F811
                                                                                          frozen):
    """x86-64-v4 code uses AVX-512; on a machine without it the first dispatch dies of SIGILL.

    A frozen module's trial serves its globals (zeros of each one's size) as the parameters would be.
    """
    from topos.dialect.iree.targets import llvm_cpus

    if llvm_cpus()[0] != "x86_64" or _host_has("avx512f"):
        pytest.skip("needs an x86-64 machine without AVX-512")
    done = _python(f"""
        from iree_support import mlp_step
        from topos.dialect.iree.targets import TargetError
        step = mlp_step(batch=64, sizes=(64, 256, 16))
        table = step.network.parameters()
        compiled = step.entry().lower().compile("llvm-cpu", cpu="x86-64-v4", cache=False,
                                                frozen=table if {frozen} else None)
        try:
            compiled.forward(None if {frozen} else table)
        except TargetError as error:
            print("TargetError:", error)
        print("alive")
    """, compile_cache)
    assert done.returncode == 0, f"the interpreter died (exit {done.returncode}):\n{done.stderr[-3000:]}"
    assert "alive" in done.stdout
    assert "TargetError:" in done.stdout and "SIGILL" in done.stdout and "cpu='host'" in done.stdout, done.stdout


# ---- device state carries its network --------------------------------------------------------------


@functools.cache
def _trainer():
    step = mlp_step()
    compiled = step.entry().lower().compile("llvm-cpu")
    return step, compiled


@functools.cache
def _other_trainer():
    """The same model recorded again: another network whose compiled plan is the same module."""
    step = mlp_step()
    return step, step.entry().lower().compile("llvm-cpu")


@pytest.fixture
def guarded(monkeypatch):
    """The trainer with its IREE call replaced by a tripwire: refusals must come before the device runs."""
    step, compiled = _trainer()
    compiled._load()  # its call made: every run, forward or step, calls compiled._main
    monkeypatch.setattr(compiled, "_main", lambda *_: pytest.fail("reached IREE"))
    return step, compiled


def test_step_refuses_device_state_of_another_network(guarded):
    step, compiled = guarded
    other, other_compiled = _other_trainer()
    foreign = other_compiled.resident(other.network.parameters())
    with pytest.raises(SymbolError) as failure:
        compiled.step(foreign, batch_feeds(step, 0), step.updates)  # LINE-FOREIGN-STATE
    message = str(failure.value)
    assert "another network" in message and "resident(" in message, message
    assert f"{THIS_FILE}:{_line_of('LINE-FOREIGN-STATE')}" in message, message


def test_step_refuses_updates_of_another_network(guarded):
    step, compiled = guarded
    other, _ = _other_trainer()
    state = compiled.resident(step.network.parameters())
    with pytest.raises(SymbolError) as failure:
        compiled.step(state, batch_feeds(step, 0), other.updates)  # LINE-FOREIGN-UPDATES
    message = str(failure.value)
    assert "another network" in message and "Updates" in message, message
    assert f"{THIS_FILE}:{_line_of('LINE-FOREIGN-UPDATES')}" in message, message


def test_step_refuses_what_is_not_device_state(guarded):
    step, compiled = guarded
    with pytest.raises(FeedError, match=r"ResidentParameters.*resident\(parameters\)"):
        compiled.step(step.network.parameters(), batch_feeds(step, 0), step.updates)
    with pytest.raises(FeedError, match="Updates"):
        compiled.step(compiled.resident(step.network.parameters()), batch_feeds(step, 0), {})


def test_step_refuses_state_on_another_device(guarded):
    step, compiled = guarded
    on_task = step.entry().lower().compile("llvm-cpu", "local-task")
    state = on_task.resident(step.network.parameters())
    with pytest.raises(FeedError, match="local-task.*local-sync"):
        compiled.step(state, batch_feeds(step, 0), step.updates)


def test_state_moves_between_compiled_plans_of_one_network_on_one_device():
    """Compiling the same network again (a notebook cell run twice) keeps the state usable."""
    step, compiled = _trainer()
    again = step.entry().lower().compile("llvm-cpu")
    state = compiled.resident(step.network.parameters())
    state, _ = compiled.step(state, batch_feeds(step, 0), step.updates)
    state, second = again.step(state, batch_feeds(step, 1), step.updates)
    assert isinstance(state, ResidentParameters) and np.isfinite(second[step.loss])


def test_forward_refuses_a_parameter_table_of_another_network(guarded):
    _, compiled = guarded
    other, _ = _other_trainer()
    with pytest.raises(SymbolError, match="another network"):
        compiled.forward(other.network.parameters())


# ---- feeds by name, and errors that name the line --------------------------------------------------


def _named_step():
    def model(tape):
        x = tape.input(shape=(4, 3), name="x")
        w = tape.parameter(np.full((3, 2), 0.5, np.float32), name="w")
        loss = ((x @ w).tanh() ** 2.0).sum()
        return x, w, loss, topos.sgd(tape, tape.differentiate(loss, [w]), 0.1)

    return Tape.record(model)


def test_step_takes_feeds_by_input_name():
    network, (x, _, loss, updates) = _named_step()
    compiled = network.entry(updates.roots(loss)).lower().compile("llvm-cpu")
    batch = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3)
    by_symbol = compiled.step(compiled.resident(network.parameters()), {x: batch}, updates)
    by_name = compiled.step(compiled.resident(network.parameters()), {"x": batch}, updates)
    assert by_name[1][loss].tobytes() == by_symbol[1][loss].tobytes()
    assert by_name[0].to_host()["w"].tobytes() == by_symbol[0].to_host()["w"].tobytes()
    oracle = network.forward(network.parameters(), {"x": batch})
    assert np.allclose(by_name[1][loss], oracle[loss], rtol=1e-5)


def test_a_run_time_feed_error_names_the_input_and_its_line_as_the_core_does():
    network, (x, _, loss, updates) = _named_step()
    compiled = network.entry(updates.roots(loss)).lower().compile("llvm-cpu")
    state = compiled.resident(network.parameters())
    with pytest.raises(FeedError) as core:
        network.forward(network.parameters(), {})
    with pytest.raises(FeedError) as ours:
        compiled.step(state, {}, updates)
    recorded = f"{THIS_FILE}:{network.node(x).site.line}"
    for error in (core.value, ours.value):
        assert "required" in str(error) and "x" in str(error) and recorded in str(error), str(error)
    with pytest.raises(SymbolError, match="no parameter or input is named 'y'"):
        compiled.step(state, {"y": np.zeros((4, 3), np.float32)}, updates)


# ---- nothing handed out aliases the device -----------------------------------------------------------


def _stepped():
    """A fresh state after one step, the run of that step and a copy of the state's values."""
    step, compiled = _trainer()
    state, run = compiled.step(compiled.resident(step.network.parameters()), batch_feeds(step, 0), step.updates)
    return step, compiled, state, run


def _values(state) -> dict:
    return {name: np.array(array) for name, array in state.to_host().named().items()}


def _unchanged(before: dict, state) -> bool:
    after = _values(state)
    return all(before[name].tobytes() == after[name].tobytes() for name in before)


def test_writing_a_run_result_with_setflags_does_not_change_the_device_state():
    step, compiled, state, run = _stepped()
    before = _values(state)
    for _, new in step.updates.pairs():  # each next value is the next step's input buffer
        array = run[new]
        assert not array.flags.writeable
        array.setflags(write=True)
        array[...] = 1.0e6
    assert _unchanged(before, state)
    _, again = compiled.step(state, batch_feeds(step, 1), step.updates)
    reference = compiled.step(compiled.resident(state.to_host()), batch_feeds(step, 1), step.updates)[1]
    assert again[step.loss].tobytes() == reference[step.loss].tobytes()


def test_writing_a_run_result_through_torch_does_not_change_the_device_state():
    torch = pytest.importorskip("torch")
    step, _, state, run = _stepped()
    before = _values(state)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that the array is read-only, then writes anyway
        for _, new in step.updates.pairs():
            torch.from_numpy(run[new]).mul_(10.0)
    assert _unchanged(before, state)


def test_writing_what_to_host_returned_does_not_change_the_device_state():
    torch = pytest.importorskip("torch")
    step, _, state, _ = _stepped()
    before = _values(state)
    table = state.to_host()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for symbol in step.network.parameter_symbols():
            array = table[symbol]
            assert not array.flags.writeable
            torch.from_numpy(array).mul_(10.0)
            array.setflags(write=True)
            array[...] = -3.0
    assert _unchanged(before, state)


def test_a_result_that_is_an_argument_does_not_alias_the_state():
    """An observed parameter comes back as the very buffer the state holds."""
    def model(tape):
        w = tape.parameter(np.arange(4, dtype=np.float32))
        return w, (w * w).sum()

    network, (w, total) = Tape.record(model)
    compiled = network.entry([total], observe=[w]).lower().compile("llvm-cpu")
    state = compiled.resident(network.parameters())
    state, run = compiled.step(state, {}, topos.Updates(()))
    first = run[w]
    first.setflags(write=True)
    first[...] = 55.0
    assert run[w].tolist() == [0.0, 1.0, 2.0, 3.0]  # each read is the caller's own copy
    assert state.to_host()[w].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_every_misuse_here_is_a_topos_error():
    for kind in (TargetError, CompileError, FeedError, SymbolError):
        assert issubclass(kind, ToposError)
