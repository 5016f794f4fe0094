"""topos.checkpoint: parameters and optimizer state by name in safetensors, strict loading, PyTorch interop."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

import topos.nn.functional as F
from topos import CheckpointError, Tape, checkpoint, init, nn, optim

F32, F64, BF16 = np.float32, np.float64, np.dtype(ml_dtypes.bfloat16)


def _mlp(dtype=F32, sizes=(4, 5, 3)):
    def record(tape):
        model = nn.Mlp(list(sizes), dtype=dtype)
        x = tape.input(shape=(2, sizes[0]), dtype=dtype, name="x")
        return model(x)
    return Tape.record(record)


def test_parameters_round_trip_bit_for_bit_in_every_element_type(tmp_path):
    for dtype in (F32, F64, BF16):
        network, _ = _mlp(dtype)
        parameters = network.parameters().map(lambda a: (a * 3).astype(a.dtype))
        path = tmp_path / f"{dtype}.safetensors"
        checkpoint.save(path, parameters, metadata={"step": "7"})
        loaded = checkpoint.load(path, network)
        assert loaded.names() == parameters.names()
        for name in parameters.names():
            assert loaded[name].dtype == dtype and loaded[name].tobytes() == parameters[name].tobytes()
        assert checkpoint.read_metadata(path) == {"step": "7"}
        assert sorted(checkpoint.header(path)) == sorted(parameters.names())


def test_optimizer_state_saves_beside_the_parameters_and_loads_back(tmp_path):
    network, out = _mlp(F64)
    parameters = network.parameters()
    adam = optim.Adam(lr=0.1)
    gradients = parameters.map(np.ones_like)
    parameters, state = adam.step(parameters, gradients)
    path = tmp_path / "run.safetensors"
    checkpoint.save(path, parameters, state)
    loaded, loaded_state = checkpoint.load(path, network, optimizer=adam)
    assert all(loaded[n].tobytes() == parameters[n].tobytes() for n in parameters.names())
    assert all(loaded_state[n].tobytes() == state[n].tobytes() for n in state)
    again, _ = adam.step(loaded, gradients, loaded_state)
    expected, _ = adam.step(parameters, gradients, state)
    assert all(again[n].tobytes() == expected[n].tobytes() for n in expected.names())
    with pytest.raises(CheckpointError, match="in the file but not in the network: optim"):
        checkpoint.load(path, network)  # without the optimizer its entries are unclaimed


def test_a_recorded_optimizers_state_is_part_of_the_table(tmp_path):
    def record(tape):
        model = nn.Linear(3, 2)
        x = tape.input(shape=(4, 3), name="x")
        loss = F.mse_loss(model(x), tape.leaf(np.zeros((4, 2), F32)))
        return optim.AdamW().record(tape.differentiate(loss, model.parameters()))

    network, updates = Tape.record(record)
    path = tmp_path / "table.safetensors"
    checkpoint.save(path, network.parameters())
    assert {"weight", "bias", "optim.step", "optim.exp_avg.weight"} <= set(checkpoint.header(path))
    assert checkpoint.load(path, network).names() == network.parameters().names()


def test_loading_names_every_missing_unexpected_and_mismatched_entry(tmp_path):
    network, _ = _mlp()
    tensors = network.parameters().named()
    del tensors["2.bias"]
    tensors["0.weight"] = np.zeros((5, 5), F32)
    tensors["2.weight"] = tensors["2.weight"].astype(F64)
    tensors["extra"] = np.zeros(2, F32)
    path = tmp_path / "bad.safetensors"
    checkpoint.write(path, tensors)
    with pytest.raises(CheckpointError) as caught:
        checkpoint.load(path, network)
    message = str(caught.value)
    assert str(path) in message
    assert "missing from the file: 2.bias" in message
    assert "in the file but not in the network: extra" in message
    assert "0.weight: the file holds [5, 5] float32, the network needs [5, 4] float32" in message
    assert "2.weight: the file holds [3, 5] float64, the network needs [3, 5] float32" in message


def test_strict_false_and_ignore_load_what_matches(tmp_path):
    network, _ = _mlp()
    tensors = network.parameters().map(lambda a: a + 1).named()
    del tensors["2.bias"]
    tensors["3.num_batches_tracked"] = np.zeros((), np.int64)
    path = tmp_path / "partial.safetensors"
    checkpoint.write(path, tensors)
    loaded = checkpoint.load(path, network, strict=False)
    assert np.array_equal(loaded["0.weight"], tensors["0.weight"])
    assert np.array_equal(loaded["2.bias"], network.parameters()["2.bias"])  # kept its initial
    with pytest.raises(CheckpointError, match="ignore=\\('\\*.num_batches_tracked',\\)"):
        checkpoint.load(path, network)
    with pytest.raises(CheckpointError, match="missing from the file: 2.bias"):
        checkpoint.load(path, network, ignore=("*.num_batches_tracked",))


def test_a_mismatch_is_refused_even_when_not_strict(tmp_path):
    network, _ = _mlp()
    path = tmp_path / "wrong.safetensors"
    checkpoint.write(path, {"0.weight": np.zeros((1, 1), F32)})
    with pytest.raises(CheckpointError, match=r"0.weight: the file holds \[1, 1\]"):
        checkpoint.load(path, network, strict=False)


def test_a_mismatch_when_not_strict_suggests_ignore_not_strict_false(tmp_path):
    network, _ = _mlp()
    path = tmp_path / "wrong.safetensors"
    checkpoint.write(path, {"0.weight": np.zeros((1, 1), F32)})
    with pytest.raises(CheckpointError, match="must match even with strict=False") as caught:
        checkpoint.load(path, network, strict=False)
    assert "pass strict=False" not in str(caught.value)


@pytest.mark.parametrize("call, match", [
    (lambda path, network: checkpoint.save(path, network), r"not the Network: save\(path, network.parameters\(\)\)"),
    (lambda path, network: checkpoint.save(None, network.parameters()), "path is a NoneType"),
    (lambda path, network: checkpoint.save(3, network.parameters()), "path is a int"),
    (lambda path, network: checkpoint.load(None, network), "path is a NoneType"),
    (lambda path, network: checkpoint.load(network, path), r"the path first, then the network: load\(path, network\)"),
    (lambda path, network: checkpoint.load(path, network.parameters()), "the Network, not its Parameters"),
    (lambda path, network: checkpoint.load(path, "model"), "takes a Network second"),
    # a str is a sequence of one-letter patterns: "*" alone would skip every tensor
    (lambda path, network: checkpoint.load(path, network, ignore="*.num_batches_tracked"), "pass a list of names"),
    (lambda path, network: checkpoint.load(path, network, ignore=None), "pass a list of names"),
], ids=["save-network", "save-none", "save-int", "load-none", "load-swapped", "load-parameters", "load-str",
        "ignore-str", "ignore-none"])
def test_misplaced_arguments_are_named(tmp_path, call, match):
    network, _ = _mlp()
    path = tmp_path / "m.safetensors"
    checkpoint.save(path, network.parameters())
    before = path.read_bytes()
    with pytest.raises(CheckpointError, match=match):
        call(path, network)
    assert path.read_bytes() == before


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_a_damaged_file_is_a_checkpoint_error_naming_it(tmp_path, damage):
    network, _ = _mlp()
    path = tmp_path / "damaged.safetensors"
    checkpoint.save(path, network.parameters())
    data = path.read_bytes()
    path.write_bytes({"truncate": data[: len(data) - 5], "garbage": data + b"xx", "empty": b""}[damage])
    with pytest.raises(CheckpointError, match=str(path)):
        checkpoint.load(path, network)


def test_a_failed_save_leaves_the_previous_file_and_no_partial_one(tmp_path, monkeypatch):
    network, _ = _mlp()
    path = tmp_path / "model.safetensors"
    checkpoint.save(path, network.parameters())
    before = path.read_bytes()

    def crash(*_):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(CheckpointError):
        checkpoint.save(path, network.parameters().map(lambda a: a + 1))
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["model.safetensors"]


def test_save_refuses_two_tables_holding_one_name(tmp_path):
    network, _ = _mlp()
    with pytest.raises(CheckpointError, match="both hold '0.weight'"):
        checkpoint.save(tmp_path / "x.safetensors", network.parameters(), network.parameters())
    with pytest.raises(CheckpointError, match="at least one table"):
        checkpoint.save(tmp_path / "x.safetensors")
    with pytest.raises(CheckpointError, match="got int"):
        checkpoint.save(tmp_path / "x.safetensors", 3)
    assert not (tmp_path / "x.safetensors").exists()


def test_the_file_holds_no_pickle_and_reads_with_the_safetensors_package(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    network, _ = _mlp(F64)
    path = tmp_path / "plain.safetensors"
    checkpoint.save(path, network.parameters())
    assert b"\x80\x04" not in path.read_bytes()[:16]
    theirs = safetensors_numpy.load_file(str(path))
    assert all(np.array_equal(theirs[n], network.parameters()[n]) for n in network.parameters().names())


# ---- a PyTorch state_dict loads by name and gives PyTorch's outputs ---------------------------------

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")


class _TorchModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(11, 8)
        self.ln = torch.nn.LayerNorm(8)
        self.attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)
        self.fc = torch.nn.Linear(8, 5)
        self.conv = torch.nn.Conv2d(2, 3, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(3)
        self.rms = torch.nn.RMSNorm(5)


class _Model(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.emb = nn.Embedding(11, 8, dtype=dtype)
        self.ln = nn.LayerNorm(8, dtype=dtype)
        self.attn = nn.MultiHeadAttention(8, 2, dtype=dtype)
        self.fc = nn.Linear(8, 5, dtype=dtype)
        self.conv = nn.Conv2d(2, 3, 3, padding=1, dtype=dtype)
        self.bn = nn.BatchNorm(3, dtype=dtype)
        self.rms = nn.RmsNorm(5, dtype=dtype)


@pytest.mark.parametrize("dtype, tolerance", [(F64, 1e-12), (F32, 2e-5)], ids=["f64", "f32"])
def test_a_pytorch_state_dict_loads_without_a_mapping_and_gives_pytorchs_outputs(tmp_path, dtype, tolerance):
    torch.manual_seed(0)
    theirs = _TorchModel().to(torch.float64 if dtype == F64 else torch.float32)
    with torch.no_grad():
        theirs.bn.running_mean.uniform_(-1, 1)
        theirs.bn.running_var.uniform_(0.5, 2.0)
    theirs.eval()
    path = tmp_path / "torch.safetensors"
    safetensors_torch.save_file(theirs.state_dict(), str(path))
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 11, (2, 4))
    image = rng.standard_normal((2, 2, 5, 5)).astype(dtype)

    def record(tape):
        model = _Model(dtype)
        t = tape.input(shape=(2, 4), extent=11, name="tokens")
        x = tape.input(shape=(2, 2, 5, 5), dtype=dtype, name="image")
        embedded = model.emb(t)
        text = model.rms(model.fc(model.attn(model.ln(embedded), causal=True)))
        picture = model.bn(model.conv(x), training=False)
        return text, picture

    network, (text, picture) = Tape.record(record)
    parameters = checkpoint.load(path, network, ignore=("*.num_batches_tracked",))
    run = network.forward(parameters, {"tokens": tokens, "image": image})
    with torch.no_grad():
        e = theirs.ln(theirs.emb(torch.tensor(tokens)))
        mask = torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=e.dtype)
        expected_text = theirs.rms(theirs.fc(theirs.attn(e, e, e, attn_mask=mask, need_weights=False)[0]))
        expected_picture = theirs.bn(theirs.conv(torch.tensor(image)))
    np.testing.assert_allclose(run[text], expected_text.numpy(), atol=tolerance, rtol=tolerance)
    np.testing.assert_allclose(run[picture], expected_picture.numpy(), atol=tolerance, rtol=tolerance)


def test_bfloat16_written_by_torch_reads_back_exactly(tmp_path):
    weights = torch.randn(3, 4).to(torch.bfloat16)
    path = tmp_path / "bf16.safetensors"
    safetensors_torch.save_file({"weight": weights}, str(path))

    def record(tape):
        return tape.parameter(init.zeros()(tape.generator, (3, 4), BF16), name="weight")

    network, weight = Tape.record(record)
    loaded = checkpoint.load(path, network)
    assert loaded["weight"].dtype == BF16
    assert loaded["weight"].view(np.uint16).tobytes() == weights.view(torch.int16).numpy().tobytes()


# ---- bad input ---------------------------------------------------------------------------------


def test_save_reads_bfloat16_and_requires_grad_torch_tensors_bit_for_bit(tmp_path):
    weights = torch.randn(3, 4).to(torch.bfloat16)
    linear = torch.nn.Linear(2, 2)  # its parameters require grad
    path = tmp_path / "torch.safetensors"
    checkpoint.save(path, {"w": weights}, dict(linear.named_parameters()))
    got = checkpoint.read(path)
    assert got["w"].dtype == BF16 and got["w"].view(np.uint16).tobytes() == weights.view(torch.int16).numpy().tobytes()
    assert got["weight"].tobytes() == linear.weight.detach().numpy().tobytes()
    with pytest.raises(CheckpointError, match=r"torch\.safetensors: tensor 'm' is a Tensor that does not convert to "
                                              r"a NumPy array .*tensors with data on the CPU"):
        checkpoint.save(path, {"m": torch.ones(2, device="meta")})


@pytest.mark.parametrize("keyed", ["symbol", "position"])
def test_save_refuses_a_mapping_not_keyed_by_name_pointing_to_named(tmp_path, keyed):
    network, _ = _mlp()
    parameters = network.parameters()
    tables = {"symbol": dict(parameters.items()), "position": {0: np.zeros(2, F32)}}
    shown = {"symbol": r"Symbol \(%0\)", "position": r"int \(0\)"}[keyed]
    path = tmp_path / "m.safetensors"
    with pytest.raises(CheckpointError, match=rf"m\.safetensors: save\(path, mapping\) takes slots by name, but the "
                                              rf"source is keyed by {shown}; pass table\.named\(\)"):
        checkpoint.save(path, tables[keyed])
    assert not path.exists()


@pytest.mark.parametrize("optimizer, shown", [(optim.Adam, "the class Adam"), ("params", "a Parameters")],
                         ids=["class", "table"])
def test_load_refuses_an_optimizer_that_is_not_an_optimizer_instance(tmp_path, optimizer, shown):
    network, _ = _mlp()
    path = tmp_path / "m.safetensors"
    checkpoint.save(path, network.parameters())
    optimizer = network.parameters() if optimizer == "params" else optimizer
    with pytest.raises(CheckpointError, match=rf"optimizer= takes an optimizer instance, such as "
                                              rf"optim\.Adam\(lr=1e-3\), got {shown}"):
        checkpoint.load(path, network, optimizer=optimizer)


def test_load_checks_the_header_before_reading_and_reads_only_the_wanted_tensors(tmp_path, monkeypatch):
    network, _ = _mlp()
    tensors = network.parameters().named()
    tensors["3.num_batches_tracked"] = np.zeros((), np.int64)
    path = tmp_path / "m.safetensors"
    checkpoint.write(path, tensors)
    asked = []
    read = checkpoint.read

    def spy(path, names=None):
        asked.append(None if names is None else sorted(names))
        return read(path, names)

    monkeypatch.setattr(checkpoint, "read", spy)
    with pytest.raises(CheckpointError, match="in the file but not in the network: 3.num_batches_tracked"):
        checkpoint.load(path, network)
    assert asked == []  # refused from the header alone
    loaded = checkpoint.load(path, network, ignore=["*.num_batches_tracked"])
    assert asked == [sorted(network.parameters().names())]
    assert all(loaded[n].tobytes() == tensors[n].tobytes() for n in loaded.names())
