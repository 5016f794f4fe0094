"""The low-level invoke path (``VmContext.invoke``, no ``FunctionInvoker``): iree.runtime's bits, topos's errors.

Every run of a compiled plan pushes its arguments itself and wraps results
only when read (``dialect/iree/calling.py``, ``Invoker``). These tests run the
same module through iree.runtime's ``FunctionInvoker`` on the arguments
topos bound before (``bind_feeds``, one DeviceArray per resident
parameter), the path every run took until the invoke path replaced it,
and require the same bytes: training steps with resident state, bfloat16
and index feeds, a Python float fed step after step, rank-0 results. A
wrong feed still raises the ToposError ``bind_feeds`` raises, naming the
caller's line, before the module runs.
"""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest

import topos
import topos.dialect.iree.compiled as compiled_module
import topos.dialect.iree.results as results_module
import topos.nn.functional as F
from topos import FeedError, SymbolError, Tape, nn, optim
from topos.base.element import convert
from topos.readings.interpret import bind_feeds, source_value

from iree_support import ELEMENT_PARAMETERS, batch_feeds, compile_cache, mlp_step  # noqa: F401  (fixture)


class FunctionInvokerSteps:
    """The previous path: ``FunctionInvoker`` called on ``bind_feeds``'s arrays and the last call's DeviceArrays."""

    def __init__(self, compiled, parameters):
        self.compiled = compiled
        self.function = compiled._load()  # iree.runtime's FunctionInvoker of @main
        self.storage = compiled._storage_arguments()  # the module's transient storage, passed first
        network = compiled.plan.network
        self.arrays = {i: parameters[network.symbol(i)] for i in compiled._parameters}

    def call(self, feeds) -> tuple:
        network = self.compiled.plan.network
        fed = bind_feeds(network, feeds, freeze=False)
        arguments = [self.arrays[i] if is_parameter else source_value(network, i, {}, fed)
                     for i, is_parameter in self.compiled._argument_kinds]
        outputs = self.function(*self.storage, *arguments)
        return outputs if isinstance(outputs, tuple) else (outputs,)

    def step(self, feeds, updates) -> tuple:
        outputs = self.call(feeds)
        for parameter, position in self.compiled._update_positions(updates):
            self.arrays[parameter] = outputs[position]
        return outputs

    def read(self, outputs, symbol) -> np.ndarray:
        return np.array(outputs[self.compiled.results.index(symbol.index)].to_host())

    def parameter(self, symbol) -> np.ndarray:
        array = self.arrays[symbol.index]
        return np.array(array if isinstance(array, np.ndarray) else array.to_host())


def _same_bits(got, want, what=""):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape, want.shape)
    assert got.tobytes() == want.tobytes(), what


@pytest.mark.parametrize("dtype", ELEMENT_PARAMETERS)
def test_training_steps_with_resident_state_match_function_invoker_bitwise(dtype):
    step = mlp_step(dtype)
    compiled = step.entry().lower().compile("llvm-cpu")
    parameters = step.network.parameters()
    state, before = compiled.resident(parameters), FunctionInvokerSteps(compiled, parameters)
    for k in range(4):
        feeds = batch_feeds(step, k, np.dtype(dtype))  # float (or bfloat16) activations and int64 labels
        state, run = compiled.step(state, feeds, step.updates)
        outputs = before.step(feeds, step.updates)
        _same_bits(run[step.loss], before.read(outputs, step.loss), f"loss at step {k}")
        for _, new in step.updates.pairs():
            _same_bits(run[new], before.read(outputs, new), f"{new!r} at step {k}")
    host = state.to_host()
    for symbol in step.network.parameter_symbols():
        _same_bits(host[symbol], before.parameter(symbol), f"{symbol!r} after 4 steps")


def test_the_common_feeds_of_a_step_skip_bind_feeds(monkeypatch):
    """Arrays of the recorded element type and shape, in-bounds int64 indices: checked without bind_feeds."""
    step = mlp_step(np.float32)
    compiled = step.entry().lower().compile("llvm-cpu")
    state = compiled.resident(step.network.parameters())
    expected = compiled.step(state, batch_feeds(step, 0), step.updates)[1][step.loss]
    monkeypatch.setattr(compiled_module, "bind_feeds", lambda *_, **__: pytest.fail("took bind_feeds"))
    _same_bits(compiled.step(state, batch_feeds(step, 0), step.updates)[1][step.loss], expected)


def _embedding_step(dtype):
    """An embedding MLP fed int indices and a rank-0 learning rate of ``dtype`` (makemore's shape, small)."""

    def record(tape):
        model = nn.Sequential(nn.Embedding(11, 4, dtype=dtype), nn.Flatten(), nn.Linear(12, 11, dtype=dtype))
        tokens = tape.input(shape=(8, 3), extent=11, name="tokens")
        target = tape.input(shape=(8,), extent=11, name="target")
        loss = F.cross_entropy(model(tokens), target)
        return loss, optimizer.record(tape.differentiate(loss, model.parameters()))

    optimizer = optim.SGD(lr=0.5)
    network, (loss, updates) = Tape.record(record)
    return network, loss, updates, optimizer.learning_rate


@pytest.mark.parametrize("dtype", [topos.float32, topos.bfloat16], ids=["f32", "bf16"])
def test_index_feeds_and_a_python_float_rate_match_function_invoker_bitwise(dtype):
    network, loss, updates, rate = _embedding_step(dtype)
    compiled = network.entry(updates.roots(loss)).lower().compile("llvm-cpu")
    rng = np.random.default_rng(3)
    state, before = compiled.resident(network.parameters()), FunctionInvokerSteps(compiled, network.parameters())
    # The same float object twice (the invoke path reuses its device copy), then others; int32 indices
    # go through bind_feeds, which widens them to int64.
    rates, indices = [0.25, 0.25, 0.125, 1e-3, 0.3], [np.int64, np.int64, np.int32, np.int64, np.int64]
    for k, (value, integer) in enumerate(zip(rates, indices)):
        feeds = {"tokens": rng.integers(0, 11, (8, 3)).astype(integer), "target": rng.integers(0, 11, 8),
                 rate: value}
        state, run = compiled.step(state, feeds, updates)
        outputs = before.step({**feeds, rate: convert(value, np.dtype(dtype))}, updates)
        _same_bits(run[loss], before.read(outputs, loss), f"loss at step {k}")
    host = state.to_host()
    for symbol in network.parameter_symbols():
        _same_bits(host[symbol], before.parameter(symbol), f"{symbol!r}")


def test_selection_feeds_skip_the_bounds_scan_and_give_the_bits_of_index_arrays(monkeypatch):
    """A batch of a checked selection (data[rows]) is fed as it is; a wider or misshapen one goes to bind_feeds."""
    network, loss, updates, rate = _embedding_step(topos.float32)
    compiled = network.entry(updates.roots(loss)).lower().compile("llvm-cpu")
    rng = np.random.default_rng(8)
    tokens, targets = rng.integers(0, 11, (40, 3)), rng.integers(0, 11, 40)
    data_tokens, data_targets = topos.selection(tokens, 11), topos.selection(targets, 11)
    arrays = selections = compiled.resident(network.parameters())
    calls = []
    real = compiled_module.bind_feeds
    monkeypatch.setattr(compiled_module, "bind_feeds", lambda *a, **k: calls.append(1) or real(*a, **k))
    for k in range(3):
        rows = rng.integers(0, 40, 8)
        batch = data_tokens[rows]
        assert isinstance(batch, topos.Selection) and batch.extent == 11 and not batch.indices.flags.writeable
        arrays, by_array = compiled.step(arrays, {"tokens": tokens[rows], "target": targets[rows], rate: 0.5}, updates)
        selections, by_selection = compiled.step(
            selections, {"tokens": batch, "target": data_targets[rows], rate: 0.5}, updates)
        _same_bits(by_selection[loss], by_array[loss], f"loss at step {k}")
    assert calls == []
    # Indices into more rows than the table holds are checked as any array is: in bounds, they pass...
    wide = topos.selection(tokens[:8], 12)
    compiled.step(selections, {"tokens": wide, "target": data_targets[:8], rate: 0.5}, updates)
    assert calls == [1]
    # ... and out of bounds, they are the FeedError an int64 array gets.
    with pytest.raises(FeedError, match="selection index 11"):
        compiled.step(selections, {"tokens": topos.selection(np.full((8, 3), 11), 12), "target": data_targets[:8],
                                   rate: 0.5}, updates)
    with pytest.raises(FeedError, match="shape"):
        compiled.step(selections, {"tokens": data_tokens[:7], "target": data_targets[:8], rate: 0.5}, updates)


def test_a_rate_array_changed_in_place_between_steps_is_read_afresh():
    network, loss, updates, rate = _embedding_step(topos.float32)
    compiled = network.entry(updates.roots(loss)).lower().compile("llvm-cpu")
    feeds = {"tokens": np.zeros((8, 3), np.int64), "target": np.ones(8, np.int64), rate: np.array(0.5, np.float32)}
    state = compiled.resident(network.parameters())
    moved, _ = compiled.step(state, feeds, updates)
    feeds[rate][...] = 0.0  # the same array object, now a zero rate: no step at all
    still, _ = compiled.step(state, feeds, updates)
    weights = network.parameter_symbols()
    assert any(not np.array_equal(moved.to_host()[w], network.parameters()[w]) for w in weights)
    for w in weights:
        _same_bits(still.to_host()[w], network.parameters()[w], f"{w!r} after a zero-rate step")


def test_a_strided_feed_matches_its_contiguous_copy():
    step = mlp_step(np.float32)
    compiled = step.entry().lower().compile("llvm-cpu")
    state = compiled.resident(step.network.parameters())
    feeds = batch_feeds(step, 0)
    wide = np.repeat(feeds[step.x], 2, axis=1)  # every column twice: [:, ::2] is the batch, not contiguous
    strided = {**feeds, step.x: wide[:, ::2]}
    assert not strided[step.x].flags.c_contiguous
    _same_bits(compiled.step(state, strided, step.updates)[1][step.loss],
               compiled.step(state, feeds, step.updates)[1][step.loss])


def test_rank_0_results_read_as_function_invoker_gives_them():
    def record(tape):
        x = tape.input(np.arange(6, dtype=np.float32).reshape(2, 3), name="x")
        scale = tape.input(np.array(2.0, np.float32), name="scale")
        w = tape.parameter(np.full((3,), 0.5, np.float32))
        total = ((x * w.broadcast_along(0, 2)).sum() * scale).tanh()
        return total, (x * x).sum(), scale

    network, (total, squares, scale) = Tape.record(record)
    compiled = network.entry([total, squares, scale]).lower().compile("llvm-cpu")
    before = FunctionInvokerSteps(compiled, network.parameters())
    for feeds in ({}, {"scale": 0.25}, {"scale": np.array(-1.5, np.float32), "x": np.ones((2, 3), np.float32)}):
        run = compiled.forward(network.parameters(), feeds)
        outputs = before.call({k: convert(v, np.float32) if isinstance(v, float) else v for k, v in feeds.items()})
        for symbol in (total, squares, scale):
            got = run[symbol]
            assert got.shape == () and not got.flags.writeable
            _same_bits(got, before.read(outputs, symbol), f"{symbol!r} with feeds {sorted(feeds)}")


def _line_of(marker: str) -> int:
    lines, start = inspect.getsourcelines(_wrong_feeds)
    return start + next(k for k, line in enumerate(lines) if marker in line)


def _wrong_feeds(compiled, network, state, updates, good, rate, which):
    """Each wrong feed on a line of its own (the error names it)."""
    if which == "index past the table":
        return compiled.step(state, {**good, "tokens": np.full((8, 3), 11)}, updates)  # index past the table
    if which == "negative index":
        return compiled.step(state, {**good, "target": -np.ones(8, np.int64)}, updates)  # negative index
    if which == "float indices":
        return compiled.step(state, {**good, "target": np.ones(8, np.float32)}, updates)  # float indices
    if which == "shape":
        return compiled.step(state, {**good, "tokens": np.zeros((8, 2), np.int64)}, updates)  # shape
    if which == "float for an array":
        return compiled.step(state, {**good, "tokens": 0.5}, updates)  # float for an array
    if which == "element type":
        return compiled.step(state, {**good, rate: np.array(0.5, np.float64)}, updates)  # element type
    if which == "a name no input has":
        return compiled.step(state, {**good, "tokenz": np.zeros((8, 3), np.int64)}, updates)  # a name no input has
    if which == "a parameter":
        return compiled.step(state, {**good, network.parameter_symbols()[0]: 0.5}, updates)  # a parameter
    raise AssertionError(which)


@pytest.mark.parametrize("which, error, message", [
    ("index past the table", FeedError, r"selection index 11 at position \(0, 0\) is outside \[0, 11\)"),
    ("negative index", FeedError, r"selection index -1 at position \(0,\) is outside \[0, 11\)"),
    ("float indices", FeedError, "selection indices must be integers"),
    ("shape", FeedError, r"expects shape \[8, 3\], got \[8, 2\]"),
    ("float for an array", FeedError, "is a selection: .*selection indices must be integers, got float64"),
    ("element type", FeedError, "expects element type f32, got float64"),
    ("a name no input has", SymbolError, "no parameter or input is named 'tokenz'"),
    ("a parameter", FeedError, "not an input"),
])
def test_a_wrong_feed_raises_what_bind_feeds_raises_at_the_callers_line(monkeypatch, which, error, message):
    network, loss, updates, rate = _embedding_step(topos.float32)
    compiled = network.entry(updates.roots(loss)).lower().compile("llvm-cpu")
    state = compiled.resident(network.parameters())
    good = {"tokens": np.zeros((8, 3), np.int64), "target": np.ones(8, np.int64), rate: 0.5}
    compiled.step(state, good, updates)  # loaded, and the common path warm
    monkeypatch.setattr(compiled, "_main", lambda *_: pytest.fail("the wrong feed reached IREE"))
    with pytest.raises(error, match=message) as raised:
        _wrong_feeds(compiled, network, state, updates, good, rate, which)
    assert f"test_invoke_path.py:{_line_of('# ' + which)}" in str(raised.value)
    # The oracle binds feeds with bind_feeds too: the same class and the same words but for the caller's line.
    with pytest.raises(error) as oracle:
        network.forward(network.parameters(), {**good, **_wrong_feed(which, network, rate)})
    assert type(oracle.value) is type(raised.value)
    assert _callers_line.sub("<line>", str(oracle.value)) == _callers_line.sub("<line>", str(raised.value))


_callers_line = re.compile(r"test_invoke_path\.py:\d+ in \w+")


def test_a_zero_float_fed_for_an_array_or_an_index_raises_what_the_oracle_raises():
    """0.0 and -0.0 used to pass the common path's float check for any input: IREE then refused a rank-0
    buffer for an array, and took it as index 0 for a rank-0 selection."""

    def record(tape):
        x = tape.input(np.ones((2, 4), np.float32), name="x")
        row = tape.input(topos.selection(0, 3), name="row")
        return x.sum() + tape.parameter(np.ones((3, 4), np.float32)).gather(row).sum()

    network, out = Tape.record(record)
    compiled = network.entry([out]).lower().compile("llvm-cpu")
    for feeds, message in [({"x": 0.0}, r"expects shape \[2, 4\], got \[\]"), ({"x": -0.0}, r"got \[\]"),
                           ({"row": 0.0}, "selection indices must be integers"),
                           ({"row": -0.0}, "selection indices must be integers")]:
        with pytest.raises(FeedError, match=message) as raised:
            compiled.forward(network.parameters(), feeds)
        with pytest.raises(FeedError) as oracle:
            network.forward(network.parameters(), feeds)
        assert _callers_line.sub("<line>", str(oracle.value)) == _callers_line.sub("<line>", str(raised.value))
    assert compiled.forward(network.parameters(), {"row": np.int64(2)})[out] == 12.0


def _wrong_feed(which, network, rate) -> dict:
    return {
        "index past the table": {"tokens": np.full((8, 3), 11)},
        "negative index": {"target": -np.ones(8, np.int64)},
        "float indices": {"target": np.ones(8, np.float32)},
        "shape": {"tokens": np.zeros((8, 2), np.int64)},
        "float for an array": {"tokens": 0.5},
        "element type": {rate: np.array(0.5, np.float64)},
        "a name no input has": {"tokenz": np.zeros((8, 3), np.int64)},
        "a parameter": {network.parameter_symbols()[0]: 0.5},
    }[which]


def test_an_updated_parameter_is_the_runs_own_result_and_a_kept_one_holds_only_its_buffer():
    step = mlp_step(np.float32)
    compiled = step.entry().lower().compile("llvm-cpu")
    pairs = step.updates.pairs()
    first, rest = topos.Updates(pairs[:1]), pairs[1:]
    state = compiled.resident(step.network.parameters())
    state, _ = compiled.step(state, batch_feeds(step, 0), step.updates)  # every parameter from this run
    state, run = compiled.step(state, batch_feeds(step, 1), first)  # only the first
    parameter, new = pairs[0]
    assert state.device(parameter) is run.device(new)
    for kept, _ in rest:  # not the first step's whole result list, which holds its every buffer
        results, _ = state._sources[kept.index]
        assert len(results) == 1


def test_a_state_whose_every_parameter_a_step_updated_reads_the_same_through_every_door():
    """The short form a step makes (its results and where each parameter is) serves reads, other plans, to_host."""
    step = mlp_step(np.float32)
    compiled = step.entry().lower().compile("llvm-cpu")
    state = compiled.resident(step.network.parameters())
    for k in range(2):
        state, run = compiled.step(state, batch_feeds(step, k), step.updates)
    assert state._held is run._outputs  # nothing copied into a table per step
    for parameter, new in step.updates.pairs():
        assert state.device(parameter) is run.device(new)
    host = state.to_host()
    other = step.network.entry([step.loss]).lower().compile("llvm-cpu")  # a plan of its own argument order
    feeds = batch_feeds(step, 2)
    _same_bits(other.forward(state, feeds)[step.loss], other.forward(host, feeds)[step.loss], "another plan")
    _, later = compiled.step(state, feeds, step.updates)
    _, again = compiled.step(compiled.resident(host), feeds, step.updates)
    _same_bits(later[step.loss], again[step.loss], "a step from the short form and from the table")


@pytest.mark.parametrize("frozen", [False, True], ids=["stepped", "frozen"])
def test_a_dropped_plan_leaves_no_reference_cycle_holding_its_module(frozen):
    """A dropped plan, its invoker and IREE's context are freed at once, not when the cycle collector runs.

    Two cycles did hold them: iree.runtime's SystemContext and its bound
    modules (a frozen module's copy of its weights lived on with them), and
    the invoker's call if it were kept on the invoker it reads.
    """
    import gc

    import iree.runtime as rt

    step = mlp_step(np.float32)
    parameters = step.network.parameters()

    def used():
        if frozen:
            compiled = step.network.entry([step.loss]).lower().compile("llvm-cpu", frozen=parameters)
            compiled.forward(feeds=batch_feeds(step, 0))[step.loss]
        else:
            compiled = step.entry().lower().compile("llvm-cpu")
            compiled.step(compiled.resident(parameters), batch_feeds(step, 0), step.updates)[1][step.loss]

    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds unreachable stays in gc.garbage to be looked at
    try:
        used()
        gc.collect()
        kinds = {getattr(thing, "__qualname__", "") if callable(thing) and type(thing).__name__ == "function"
                 else type(thing).__name__ for thing in gc.garbage}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    ours = {"CompiledPlan", "Invoker", "Invoker.calling.<locals>.call", "ResidentParameters", "CompiledRun",
            "Results", rt.VmContext.__name__, "SystemContext", "BoundModule", "FunctionInvoker"}
    assert not kinds & ours, sorted(kinds & ours)


_HELD_AT_EXIT = """
import sys
import numpy as np
import topos
from topos import Tape

def step(tape):
    w = tape.parameter(np.array([[0.5, -0.25], [0.75, 1.0]], np.float32))
    x = tape.input(np.array([[1.0, 2.0]], np.float32))
    loss = ((x @ w).tanh() ** 2).sum()
    return w, loss, topos.sgd(tape, tape.differentiate(loss, [w]), 0.1)

network, (w, loss, updates) = Tape.record(step)
compiled = network.entry(updates.roots(loss)).lower().compile("llvm-cpu", cache=False)
state = compiled.resident(network.parameters())
for _ in range(3):
    state, run = compiled.step(state, {}, updates)
print(float(run[loss]))
kept = run.device(loss), state.device(w)
if sys.argv[1] == "arrays":  # only the DeviceArrays outlive the plan, its state and its run
    del compiled, state, run
"""


@pytest.mark.parametrize("held", ["everything", "arrays"])
def test_results_held_as_the_interpreter_exits_leave_it_cleanly(tmp_path, held):
    """A call's results are freed before the VmContext that made them, even in the interpreter's last collection.

    The other way round IREE crashed the process on its way out (make demo
    did, with a step's state and run at module level): every Results and
    every DeviceArray made of one holds its context.
    """
    import subprocess
    import sys

    script = tmp_path / "held.py"
    script.write_text(_HELD_AT_EXIT)
    done = subprocess.run([sys.executable, str(script), held], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "leaked" not in done.stderr, done.stderr[-2000:]  # nanobind's report of an instance still held


def test_a_result_read_in_later_runs_is_copied_straight_from_its_mapped_buffer(monkeypatch):
    """The first read of a result learns its element type and shape; later runs' reads map the buffer directly."""
    step = mlp_step(np.float32)
    compiled = step.entry().lower().compile("llvm-cpu")
    parameters = step.network.parameters()
    state, before = compiled.resident(parameters), FunctionInvokerSteps(compiled, parameters)
    feeds = batch_feeds(step, 0)
    state, run = compiled.step(state, feeds, step.updates)
    before.step(feeds, step.updates)
    new = step.updates.pairs()[0][1]
    run[step.loss], run[new]  # the first reads: through a DeviceArray, as before
    assert len(compiled._mapped_reads) == 2
    monkeypatch.setattr(results_module, "_host_view", lambda *_: pytest.fail("read through a DeviceArray"))
    for k in range(1, 3):
        feeds = batch_feeds(step, k)
        state, run = compiled.step(state, feeds, step.updates)
        outputs = before.step(feeds, step.updates)
        loss, updated = run[step.loss], run[new]
        _same_bits(loss, before.read(outputs, step.loss), f"loss at step {k}")
        _same_bits(updated, before.read(outputs, new), f"{new!r} at step {k}")
        assert not loss.flags.writeable and not updated.flags.writeable
        kept = updated.copy()
        compiled.step(state, feeds, step.updates)  # another call, whose buffers may reuse freed ones
        _same_bits(updated, kept, "a read array is the caller's own copy")
        updated.setflags(write=True)  # read-only is advice (topos.base.copies): writing it changes nothing of ours
        updated[...] = 7.0
        _same_bits(run[new], before.read(outputs, new), f"{new!r} read again at step {k}")


def test_modules_carry_no_abi_reflection_so_results_need_no_dtype_override():
    """FunctionInvoker overrides result dtypes only from ``iree.abi`` reflection; the invoke path assumes none."""
    step = mlp_step(topos.bfloat16)
    compiled = step.entry().lower().compile("llvm-cpu")
    assert "iree.abi" not in compiled._load().vm_function.reflection
    run = compiled.step(compiled.resident(step.network.parameters()), batch_feeds(step, 0, np.dtype(topos.bfloat16)),
                        step.updates)[1]
    assert run[step.loss].dtype == np.dtype(topos.bfloat16)
