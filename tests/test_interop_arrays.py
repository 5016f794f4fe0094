"""Arrays to and from torch and jax: bit-exact round trips, torch feeds, every zero-copy and copy claim by pointer."""

from __future__ import annotations

import gc
import subprocess
import sys

import numpy as np
import pytest

import topos
from topos import FeedError, Tape
from topos.base.errors import ArgumentError

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")

from topos.interop.arrays import (  # noqa: E402  (after the skips: both peers are needed)
    jax_array,
    jax_arrays,
    numpy_array,
    parameters_from,
    torch_tensor,
    torch_tensors,
)
from topos.interop.jax import JaxPrecisionError  # noqa: E402

ELEMENTS = [pytest.param(topos.float32, id="f32"), pytest.param(topos.float64, id="f64"),
            pytest.param(topos.bfloat16, id="bf16")]
TORCH = {topos.float32: torch.float32, topos.float64: torch.float64, topos.bfloat16: torch.bfloat16}


def address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def bits(value) -> np.ndarray:
    """The raw bits of a NumPy array, torch tensor or jax array, for bit-for-bit comparison."""
    if isinstance(value, torch.Tensor):
        value = value.detach().view({2: torch.uint16, 4: torch.uint32, 8: torch.uint64}[value.element_size()])
        return value.numpy().copy()
    array = np.asarray(value)
    return array.view(f"u{array.dtype.itemsize}").copy()


def awkward(dtype, shape=(3, 5)) -> np.ndarray:
    """Values that round differently in every format: thirds, a subnormal, a signed zero, an infinity."""
    values = (np.arange(np.prod(shape), dtype=np.float64) - 7) / 3
    values[0], values[1], values[2] = -0.0, np.inf, 1e-40 if dtype == topos.float32 else 1e-310
    return values.astype(dtype).reshape(shape)


@pytest.fixture
def x64():
    """jax's 64-bit mode on for one test, as it was afterwards."""
    was = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", was)


def _model(dtype, rows=4, columns=8):
    def model(tape):
        w = tape.parameter(awkward(dtype, (columns, columns)), name="w")
        x = tape.input(np.ones((rows, columns), dtype), name="x")
        y = (x @ w).tanh()
        loss = (y * y).sum()
        return w, x, y, loss, topos.sgd(tape, tape.differentiate(loss, [w]), 0.5)

    return Tape.record(model)


@pytest.fixture(scope="module")
def compiled_bf16():
    """A bfloat16 forward and training step, compiled once for the module (no compile cache)."""
    pytest.importorskip("iree.runtime", reason="the IREE runtime (topos[mlir]) is not installed")
    network, (w, x, y, loss, updates) = _model(topos.bfloat16)
    forward = network.entry([y]).lower().compile("llvm-cpu", cache=False)
    step = network.entry(updates.roots(loss)).lower().compile("llvm-cpu", cache=False)
    return network, (w, x, y, loss, updates), forward, step


# ---- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ELEMENTS)
def test_torch_round_trip_is_bit_exact(dtype):
    network, (w, *_rest) = _model(dtype)
    parameters = network.parameters()
    tensors = torch_tensors(parameters)
    assert tensors["w"].dtype == TORCH[dtype] and not tensors["w"].requires_grad
    assert np.array_equal(bits(tensors["w"]), bits(parameters["w"]))
    assert np.array_equal(bits(torch_tensor(parameters["w"])), bits(parameters["w"]))
    back = parameters_from(network, tensors)
    assert np.array_equal(bits(back["w"]), bits(parameters["w"])) and back["w"].dtype == dtype
    assert np.array_equal(bits(numpy_array(tensors["w"])), bits(parameters["w"]))


@pytest.mark.parametrize("dtype", ELEMENTS)
def test_jax_round_trip_is_bit_exact(dtype, x64):
    network, (w, *_rest) = _model(dtype)
    parameters = network.parameters()
    arrays = jax_arrays(parameters)
    assert arrays["w"].dtype == dtype
    assert np.array_equal(bits(arrays["w"]), bits(parameters["w"]))
    assert np.array_equal(bits(jax_array(parameters["w"])), bits(parameters["w"]))
    back = parameters_from(network, arrays)
    assert np.array_equal(bits(back["w"]), bits(parameters["w"])) and back["w"].dtype == dtype
    assert np.array_equal(bits(numpy_array(arrays["w"])), bits(parameters["w"]))


def test_torch_and_jax_exchange_bfloat16_bit_for_bit_through_topos():
    tensor = torch.randn(6, 7).to(torch.bfloat16)
    through = torch_tensor(jax_array(numpy_array(tensor)).__array__())
    assert torch.equal(through.view(torch.uint16), tensor.view(torch.uint16))


def test_float64_into_jax_without_64_bit_mode_is_refused_not_rounded():
    if jax.config.jax_enable_x64:
        pytest.skip("jax's 64-bit mode is on in this process")
    with pytest.raises(JaxPrecisionError, match="jax_enable_x64"):
        jax_array(np.ones(3, np.float64))


@pytest.mark.parametrize("dtype, value, wrapped", [
    pytest.param(np.int64, 2**40, 0, id="int64-big"),
    pytest.param(np.int64, -2**33 + 5, 5, id="int64-negative"),
    pytest.param(np.uint64, 2**33 + 7, 7, id="uint64"),
])
def test_a_64_bit_integer_jax_cannot_hold_without_64_bit_mode_is_refused_not_wrapped(dtype, value, wrapped):
    if jax.config.jax_enable_x64:
        pytest.skip("jax's 64-bit mode is on in this process")
    array = np.array([1, value], dtype)
    with pytest.raises(JaxPrecisionError, match=rf"holds {value} at position \(1,\), outside u?int32's range.*"
                                                rf"wrap that value to {wrapped}.*jax_enable_x64"):
        jax_array(array)
    with pytest.raises(JaxPrecisionError, match="jax_enable_x64"):
        jax_array(dtype(value))  # a NumPy scalar too
    within = jax_array(np.array([7, -3 if dtype == np.int64 else 3], dtype))  # in range: narrowed exactly
    assert within.dtype == {np.int64: np.int32, np.uint64: np.uint32}[dtype] and within.tolist()[0] == 7


def test_a_64_bit_integer_keeps_its_width_in_64_bit_mode(x64):
    array = np.array([2**40, -2**33 + 5], np.int64)
    assert jax_array(array).dtype == np.int64 and jax_array(array).tolist() == array.tolist()


@pytest.mark.parametrize("call, given, hint", [
    pytest.param(lambda v: torch_tensor(v), "Symbol", r"pass a run's result, run\[symbol\]", id="torch_tensor-symbol"),
    pytest.param(lambda v: torch_tensor([1.0, 2.0]), "list", r"torch\.tensor\(x\)", id="torch_tensor-list"),
    pytest.param(lambda v: jax_array(topos.selection([1, 2], 3)), "Selection", r"selection\.indices",
                 id="jax_array-selection"),
    pytest.param(lambda v: numpy_array([1, 2]), "list", "np.asarray", id="numpy_array-list"),
])
def test_what_the_array_functions_do_not_take_is_an_argument_error_saying_what_to_pass(call, given, hint):
    network, (w, x, y, *_rest) = _model(topos.float32)
    with pytest.raises(ArgumentError, match=rf"test_interop_arrays.py:\d+ .*got {given}.*{hint}") as caught:
        call(y)
    assert isinstance(caught.value, TypeError)  # what the built-in check it replaces raised
    with pytest.raises(ArgumentError, match="jax_arrays takes a Parameters table or ResidentParameters.*got int"):
        jax_arrays(5)


def test_a_tensor_on_the_meta_device_is_refused_by_name_and_device():
    network, (w, *_rest) = _model(topos.float32)
    meta = torch.ones(8, 8, device="meta")
    with pytest.raises(ArgumentError, match="numpy_array cannot read a Tensor on torch's meta device.*no numbers.*"
                                            "to_empty"):
        numpy_array(meta)
    with pytest.raises(FeedError, match="slot w: parameters_from cannot read a Tensor on torch's meta device"):
        parameters_from(network, {"w": meta})
    with pytest.raises(FeedError, match="parameter w: the Tensor .* does not convert"):
        network.parameters({"w": meta})
    assert numpy_array(torch.ones(3)).tolist() == [1.0, 1.0, 1.0]  # a tensor with data reads as before


@pytest.mark.parametrize("swap, tensors, match", [
    (False, "model.safetensors", r"takes a mapping of slot name -> tensor second, got str; for a file, use "
                                 r"topos\.checkpoint\.load\(path, network\)"),
    (False, None, r"takes a mapping of slot name -> tensor second, got NoneType; pass a state_dict-like mapping"),
    (True, None, r"takes the Network first, got Parameters; the network comes first: "
                 r"parameters_from\(network, state_dict\)"),
], ids=["path", "none", "swapped"])
def test_parameters_from_names_the_argument_it_cannot_take(swap, tensors, match):
    network, _ = _model(topos.float32)
    state = {"w": torch.zeros(8, 8)}
    with pytest.raises(ArgumentError, match=match):
        parameters_from(network.parameters(), state) if swap else parameters_from(network, tensors)


# ---- feeds -------------------------------------------------------------------------------------


def test_torch_bfloat16_feed_gives_the_ml_dtypes_feeds_bits_through_the_oracle():
    network, (w, x, y, loss, _) = _model(topos.bfloat16)
    parameters = network.parameters()
    fed = torch.randn(4, 8).to(torch.bfloat16).requires_grad_(True)  # detached on the way in
    same = fed.detach().view(torch.uint16).numpy().view(topos.bfloat16)
    want = network.forward(parameters, {x: same})[y]
    plan = network.entry([y]).lower()
    for run in (network.forward(parameters, {x: fed}), network.entry([y]).interpret(parameters, {"x": fed}),
                plan.forward(parameters, {x: fed})):
        assert run[y].dtype == topos.bfloat16 and np.array_equal(bits(run[y]), bits(want))


def test_torch_bfloat16_feed_gives_the_ml_dtypes_feeds_bits_through_a_compiled_plan(compiled_bf16):
    network, (w, x, y, loss, updates), forward, step = compiled_bf16
    parameters = network.parameters()
    fed = torch.randn(4, 8).to(torch.bfloat16)
    same = fed.view(torch.uint16).numpy().view(topos.bfloat16)
    by_tensor, by_array = forward.forward(parameters, {x: fed}), forward.forward(parameters, {x: same})
    assert np.array_equal(bits(by_tensor[y]), bits(by_array[y]))
    by_torch, run_torch = step.step(step.resident(parameters), {"x": fed}, updates)
    by_numpy, run_numpy = step.step(step.resident(parameters), {"x": same}, updates)
    assert np.array_equal(bits(run_torch[loss]), bits(run_numpy[loss]))
    assert np.array_equal(bits(by_torch.to_host()["w"]), bits(by_numpy.to_host()["w"]))


def test_jax_arrays_and_transposed_torch_tensors_are_fed_as_they_are():
    network, (w, x, y, *_rest) = _model(topos.float32)
    parameters = network.parameters()
    array = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    want = network.forward(parameters, {x: array})[y]
    assert np.array_equal(network.forward(parameters, {x: jax.numpy.asarray(array)})[y], want)
    transposed = torch.from_numpy(array.T.copy()).T  # a strided view
    assert np.array_equal(network.forward(parameters, {x: transposed})[y], want)


def test_torch_and_jax_integer_arrays_feed_a_selection():
    def model(tape):
        table = tape.parameter(np.arange(12, dtype=np.float32).reshape(4, 3), name="table")
        picks = tape.input(topos.selection([0, 0], 4), name="picks")
        return picks, table.gather(picks)

    network, (picks, rows) = Tape.record(model)
    want = network.forward(network.parameters(), {picks: np.array([3, 1])})[rows]
    for fed in (torch.tensor([3, 1]), jax.numpy.array([3, 1])):
        assert np.array_equal(network.forward(network.parameters(), {picks: fed})[rows], want)
    with pytest.raises(FeedError, match=r"\(picks\).*outside \[0, 4\)"):
        network.forward(network.parameters(), {picks: torch.tensor([4, 1])})


@pytest.mark.parametrize("fed, message", [
    (lambda: torch.ones(4, 8, dtype=torch.float64), r"input %\d+ \(x\).*expects element type f32, got float64; "
                                                    r"convert with \.to\(torch\.float32\)"),
    (lambda: torch.ones(4, 7), r"input %\d+ \(x\).*expects shape \[4, 8\], got \[4, 7\]"),
    (lambda: jax.numpy.ones((4, 8), jax.numpy.bfloat16), r"input %\d+ \(x\).*expects element type f32, got bfloat16"),
    (lambda: torch.ones(4, 8, dtype=torch.complex64), r"input %\d+ \(x\).*expects element type f32, got complex64"),
], ids=["torch-dtype", "torch-shape", "jax-dtype", "torch-complex"])
def test_a_wrong_torch_or_jax_feed_is_a_feed_error_naming_the_input(fed, message):
    network, (w, x, y, *_rest) = _model(topos.float32)
    with pytest.raises(FeedError, match=message):
        network.forward(network.parameters(), {x: fed()})


def test_a_torch_tensor_numpy_cannot_hold_is_a_feed_error_naming_the_input():
    network, (w, x, y, *_rest) = _model(topos.float32)
    with pytest.raises(FeedError, match=r"input %\d+ \(x\).*the fed Tensor does not convert to a NumPy array"):
        network.forward(network.parameters(), {x: torch.ones(4, 8, dtype=torch.float8_e4m3fn)})


def test_a_fed_tensor_written_after_the_run_leaves_the_run_unchanged():
    network, (w, x, y, *_rest) = _model(topos.float32)
    fed = torch.ones(4, 8)
    run = network.forward(network.parameters(), {x: fed})
    before = run[y]
    fed.mul_(3)  # the run copied its feed: the tensor is the caller's
    assert np.array_equal(run[y], before)


def test_importing_topos_and_feeding_numpy_imports_neither_torch_nor_jax():
    code = ("import sys, numpy as np, topos\n"
            "from topos import Tape\n"
            "net, x = Tape.record(lambda t: t.input(np.ones(2, np.float32), name='x'))\n"
            "net.forward(net.parameters(), {'x': np.zeros(2, np.float32)})\n"
            "print('torch' in sys.modules, 'jax' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]


# ---- what is shared and what is copied, by pointer ---------------------------------------------


def test_numpy_array_is_a_read_only_view_of_a_cpu_tensor_or_jax_array():
    for tensor in (torch.randn(5, 6), torch.randn(5, 6).to(torch.bfloat16)):
        view = numpy_array(tensor)
        assert address(view) == tensor.data_ptr() and not view.flags.writeable
    array = jax.numpy.arange(12.0).reshape(3, 4)
    view = numpy_array(array)
    assert address(view) == array.unsafe_buffer_pointer() and not view.flags.writeable


def test_torch_tensor_of_a_payload_is_a_copy_and_writing_it_changes_nothing_topos_holds():
    network, (w, x, y, *_rest) = _model(topos.float32)
    parameters = network.parameters()
    run = network.forward(parameters, {x: np.ones((4, 8), np.float32)})
    payload = run[y]
    tensor = torch_tensor(payload)
    assert tensor.data_ptr() != address(payload)
    tensor.add_(1)
    assert np.array_equal(payload, run[y]) and not np.array_equal(tensor.numpy(), payload)
    for tensor in torch_tensors(parameters).values():
        tensor.mul_(0)
    assert np.array_equal(parameters["w"], network.parameters()["w"])


def test_jax_array_shares_a_read_only_aligned_payload_and_copies_a_writable_array():
    storage = np.empty(4096 + 16, np.float32)  # carve a 64-byte aligned and a misaligned window
    start = (-address(storage) % 64) // 4
    aligned = storage[start:start + 4096]
    aligned[:] = np.arange(4096)
    aligned.flags.writeable = False
    assert jax_array(aligned).unsafe_buffer_pointer() == address(aligned)  # jax.device_put aliases it
    assert jax_array(aligned, copy=True).unsafe_buffer_pointer() != address(aligned)
    writable = np.arange(4096, dtype=np.float32)
    shared = jax_array(writable)
    assert shared.unsafe_buffer_pointer() != address(writable)
    writable[0] = 99  # a later write to the caller's array cannot reach the immutable jax array
    assert float(shared[0]) == 0.0


def test_torch_tensor_of_a_device_array_is_one_copy_and_writing_it_leaves_device_state(compiled_bf16):
    network, (w, x, y, loss, updates), forward, step = compiled_bf16
    state = step.resident(network.parameters())
    device = state.device("w")
    tensor = torch_tensor(device)
    assert tensor.dtype == torch.bfloat16 and tensor.data_ptr() != address(device.to_host())
    before = state.to_host()["w"]
    tensor.add_(1)
    for tensor in torch_tensors(state).values():
        tensor.mul_(0)
    assert np.array_equal(bits(state.to_host()["w"]), bits(before))


def test_jax_array_of_a_device_array_shares_its_buffer_and_keeps_it_alive(compiled_bf16):
    network, (w, x, y, loss, updates), forward, step = compiled_bf16
    parameters = network.parameters()
    run = forward.forward(parameters, {x: np.ones((4, 8), topos.bfloat16)})
    shared = jax_array(run.device(y))
    assert shared.dtype == topos.bfloat16
    assert shared.unsafe_buffer_pointer() == address(run.device(y).to_host())
    state = step.resident(parameters)
    arrays = jax_arrays(state)
    assert arrays["w"].unsafe_buffer_pointer() == address(state.device("w").to_host())
    copied = jax_arrays(state, copy=True)["w"]
    assert copied.unsafe_buffer_pointer() != address(state.device("w").to_host())
    want_y, want_w = run[y], state.to_host()["w"]
    del run, state
    gc.collect()
    for _ in range(5):  # new results reuse freed buffers; the shared ones must not be freed
        forward.forward(parameters, {x: np.full((4, 8), 3, topos.bfloat16)})
        step.step(step.resident(parameters), {x: np.full((4, 8), 2, topos.bfloat16)}, updates)
    assert np.array_equal(bits(shared), bits(want_y)) and np.array_equal(bits(arrays["w"]), bits(want_w))


def test_jax_computing_on_shared_device_state_never_writes_it(compiled_bf16):
    network, (w, x, y, loss, updates), forward, step = compiled_bf16
    state = step.resident(network.parameters())
    before = state.to_host()["w"]
    shared = jax_array(state.device("w"))
    shared.at[0, 0].set(7)  # functional update: a new array
    donated = jax.jit(lambda a: a * 2, donate_argnums=0)(shared)
    donated.block_until_ready()
    assert np.array_equal(bits(state.to_host()["w"]), bits(before))
    state, _ = step.step(state, {x: np.ones((4, 8), topos.bfloat16)}, updates)  # the state still steps
    with pytest.raises(ValueError, match="WRITEABLE"):  # nor can NumPy be talked into writing it
        numpy_array(jax_array(state.device("w"))).flags.writeable = True


def test_parameter_tables_take_torch_tensors_by_name_and_in_their_algebra():
    def record(tape):
        w = tape.parameter(np.ones(3, topos.bfloat16), name="w")
        return (w * w).sum()

    network, _ = Tape.record(record)
    values = torch.tensor([1.0, 2.5, -3.0], dtype=torch.bfloat16, requires_grad=True)
    table = network.parameters({"w": values})
    assert table["w"].dtype == topos.bfloat16
    assert np.array_equal(table["w"].view(np.uint16), values.detach().view(torch.uint16).numpy())
    doubled = table.map(lambda a: torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16) * 2)
    assert doubled["w"].astype(np.float32).tolist() == [2.0, 5.0, -6.0]
