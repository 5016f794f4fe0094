"""The GPT-2 example: Hugging Face files load by name and match an independent PyTorch GPT-2; the KV cache is exact.

The reference (``torch_gpt2``) is written here from GPT-2's definition,
in float64, over the Hugging Face names and the Conv1D layout; the tiny
checkpoint it reads is written with ``safetensors.torch`` the way
Hugging Face writes one (mask buffers included). The cache test argues
bit-equality on the oracle; the compiled reading is held to the
end-to-end envelope. Everything is tiny: the 124M config is only counted.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "examples" / "gpt2"
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(FOLDER))

import topos  # noqa: E402
from topos import CheckpointError, init  # noqa: E402

import bpe  # noqa: E402
import hf_gpt2  # noqa: E402
import sampling  # noqa: E402
from _training import ExampleError  # noqa: E402
from gpt2 import Config, record_generation  # noqa: E402

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

TINY = Config(layers=2, heads=2, width=32, context=16, vocabulary=64)


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"gpt2_example_{name}", FOLDER / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cache_folder(tmp_path_factory):
    return tmp_path_factory.mktemp("topos-cache")


@pytest.fixture(autouse=True)
def _compile_cache(cache_folder, monkeypatch):
    monkeypatch.setenv("TOPOS_CACHE_DIR", str(cache_folder))  # shared by this file's tests: compiles once


# ---- an independent GPT-2 in PyTorch, and a checkpoint in Hugging Face's format -------------------


def hf_state(config: Config, seed: int = 0) -> dict:
    """Random GPT-2 weights under Hugging Face's names and layouts (Conv1D: [in, out]), float32."""
    g = torch.Generator().manual_seed(seed)
    d = config.width

    def normal(*shape, std=0.1, mean=0.0):
        return (mean + std * torch.randn(*shape, generator=g)).float()

    state = {"wte.weight": normal(config.vocabulary, d, std=0.3), "wpe.weight": normal(config.context, d, std=0.3)}
    for i in range(config.layers):
        p = f"h.{i}."
        for norm in ("ln_1", "ln_2"):
            state[p + norm + ".weight"], state[p + norm + ".bias"] = normal(d, mean=1.0), normal(d)
        for name, (fan_in, fan_out) in {"attn.c_attn": (d, 3 * d), "attn.c_proj": (d, d),
                                        "mlp.c_fc": (d, 4 * d), "mlp.c_proj": (4 * d, d)}.items():
            state[p + name + ".weight"] = normal(fan_in, fan_out, std=1 / math.sqrt(fan_in))
            state[p + name + ".bias"] = normal(fan_out)
        state[p + "attn.bias"] = torch.tril(torch.ones(config.context, config.context)).view(
            1, 1, config.context, config.context)  # the causal-mask buffer old Hugging Face files carry
    state["ln_f.weight"], state["ln_f.bias"] = normal(d, mean=1.0), normal(d)
    return state


def write_hf(path: Path, state: dict, config: Config | None = None, prefix: str = "", head: bool = False) -> Path:
    """``state`` as Hugging Face writes it: names under ``prefix``; with ``head``, the tied lm_head.weight too."""
    tensors = {prefix + n: t.contiguous() for n, t in state.items()}
    if head:
        tensors["lm_head.weight"] = state["wte.weight"].clone()
    safetensors_torch.save_file(tensors, str(path), metadata={"format": "pt"})
    if config is not None:
        path.with_name("config.json").write_text(json.dumps(hf_gpt2.hf_config(config)))
    return path


def torch_gpt2(state: dict, config: Config, tokens: np.ndarray) -> np.ndarray:
    """GPT-2's logits [B, T, vocabulary], float64, straight from the paper's definition and HF's layouts."""
    nn = torch.nn.functional
    s = {n: t.double() for n, t in state.items()}
    d, h = config.width, config.heads
    batch, length = tokens.shape
    ids = torch.from_numpy(np.asarray(tokens, np.int64))

    def norm(x, p):
        return nn.layer_norm(x, (d,), s[p + ".weight"], s[p + ".bias"], eps=1e-5)

    def conv1d(x, p):
        return x @ s[p + ".weight"] + s[p + ".bias"]

    def heads(x):
        return x.view(batch, length, h, d // h).transpose(1, 2)

    future = ~torch.tril(torch.ones(length, length, dtype=torch.bool))
    x = s["wte.weight"][ids] + s["wpe.weight"][:length]
    for i in range(config.layers):
        p = f"h.{i}."
        q, k, v = map(heads, conv1d(norm(x, p + "ln_1"), p + "attn.c_attn").split(d, dim=2))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d // h)
        y = scores.masked_fill(future, -math.inf).softmax(-1) @ v
        x = x + conv1d(y.transpose(1, 2).reshape(batch, length, d), p + "attn.c_proj")
        x = x + conv1d(nn.gelu(conv1d(norm(x, p + "ln_2"), p + "mlp.c_fc"), approximate="tanh"), p + "mlp.c_proj")
    return (norm(x, "ln_f") @ s["wte.weight"].T).numpy()


def _tokens(config: Config, batch: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, config.vocabulary, (batch, config.context))


def _oracle_logits(network, generation, table, tokens) -> np.ndarray:
    decoder = sampling.Decoder(network, generation, table, "oracle")
    return decoder.prefill(tokens)[0]


# ---- loading Hugging Face files -------------------------------------------------------------------


def test_hf_file_loads_by_name_and_matches_the_pytorch_reference(tmp_path):
    state = hf_state(TINY)
    path = write_hf(tmp_path / "model.safetensors", state, TINY)
    assert hf_gpt2.config_of(path) == TINY  # from config.json beside the file
    network, generation = record_generation(TINY, batch=2, draw=False)
    table = hf_gpt2.load(path, network, TINY)
    tokens = _tokens(TINY, 2)
    got = _oracle_logits(network, generation, table, tokens)
    want = torch_gpt2(state, TINY, tokens)
    error = np.abs(got - want).max() / np.abs(want).max()
    assert error < 1e-5, f"float32 logits {error:.2e} (relative to the largest) from the float64 reference"


def test_prefixed_file_with_its_tied_head_loads_the_same_table(tmp_path):
    state = hf_state(TINY)
    plain = hf_gpt2.load(write_hf(tmp_path / "plain.safetensors", state), record_generation(TINY, draw=False)[0],
                         TINY)
    network, _ = record_generation(TINY, draw=False)
    prefixed = write_hf(tmp_path / "lm.safetensors", state, prefix="transformer.", head=True)
    table = hf_gpt2.load(prefixed, network, TINY)
    assert all(np.array_equal(table[name], plain[name]) for name in plain.names())


def test_a_file_of_another_config_names_the_tensors_and_the_fix(tmp_path):
    path = write_hf(tmp_path / "model.safetensors", hf_state(TINY))
    deeper = TINY.with_(layers=3)
    with pytest.raises(CheckpointError) as caught:
        hf_gpt2.load(path, record_generation(deeper, draw=False)[0], deeper)
    message = str(caught.value)
    assert "missing from the file: h.2.ln_1.weight" in message
    assert "layers=2" in message and "--config auto" in message
    wider = TINY.with_(width=48, heads=3)
    with pytest.raises(CheckpointError, match=r"wte.weight: the file holds \[64, 32\] float32, the network needs "
                                              r"\[64, 48\]"):
        hf_gpt2.load(path, record_generation(wider, draw=False)[0], wider)


def test_a_file_missing_a_tensor_names_it(tmp_path):
    state = hf_state(TINY)
    del state["h.1.mlp.c_fc.bias"]
    for prefix in ("", "transformer."):
        path = write_hf(tmp_path / f"{prefix}model.safetensors", state, prefix=prefix)
        with pytest.raises(CheckpointError, match=r"h\.1\.mlp\.c_fc\.bias"):
            hf_gpt2.load(path, record_generation(TINY, draw=False)[0], TINY)


GOOD_HF = {"n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 16, "vocab_size": 64}
BAD_CONFIGS = {
    "not UTF-8": (b"\xff\xfe{}", r"config\.json is not UTF-8 text \(byte 0xff at offset 0\).*put the model's own"),
    "not JSON": (b"{n_layer: 2", r"config\.json is not JSON \(.*put the model's own config\.json there"),
    "a list": (b"[1]", r"config\.json holds a JSON list, not an object of sizes.*n_layer, n_head"),
    "missing keys": (json.dumps({"n_layer": 2, "n_embd": 32}).encode(),
                     r"config\.json lacks n_head, n_positions, vocab_size; it must be a GPT-2 config\.json"),
    "negative layers": (json.dumps({**GOOD_HF, "n_layer": -1}).encode(), r"n_layer is -1, not a positive int"),
    "no heads": (json.dumps({**GOOD_HF, "n_head": 0}).encode(), r"n_head is 0, not a positive int"),
    "a string size": (json.dumps({**GOOD_HF, "n_embd": "32"}).encode(), r"n_embd is '32', not a positive int"),
    "a fractional size": (json.dumps({**GOOD_HF, "n_layer": 1.5}).encode(), r"n_layer is 1\.5, not a positive int"),
    "heads not dividing": (json.dumps({**GOOD_HF, "n_head": 3}).encode(),
                           r"is not a possible GPT-2: width 32 is not divisible by 3 heads"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_a_bad_config_json_is_a_checkpoint_error_naming_it(case, tmp_path):
    path = write_hf(tmp_path / "model.safetensors", hf_state(TINY), TINY)
    assert hf_gpt2.config_of(path) == TINY
    data, message = BAD_CONFIGS[case]
    path.with_name("config.json").write_bytes(data)
    with pytest.raises(CheckpointError, match=message) as caught:
        hf_gpt2.config_of(path)
    assert str(path.with_name("config.json")) in str(caught.value)
    with pytest.raises(CheckpointError, match=r"missing from the file: h\.2\.ln_1\.weight"):  # the tensors' error
        deeper = TINY.with_(layers=3)
        hf_gpt2.load(path, record_generation(deeper, draw=False)[0], deeper)


def test_shapes_that_are_not_a_gpt2_are_a_checkpoint_error(tmp_path):
    state = hf_state(TINY)
    path = write_hf(tmp_path / "model.safetensors", state)
    assert hf_gpt2.config_of(path) == TINY.with_(heads=1)  # no config: width // 64 heads, at least one
    state["wte.weight"] = state["wte.weight"][:, 0].contiguous()
    path = write_hf(tmp_path / "model.safetensors", state)
    with pytest.raises(CheckpointError, match=r"wte\.weight is \[64\] and wpe\.weight is \[16, 32\], but GPT-2's "
                                              r"are \[vocabulary, width\].*put the model's config\.json beside"):
        hf_gpt2.config_of(path)
    path = write_hf(tmp_path / "model.safetensors", {"wte.weight": torch.zeros(64, 129),
                                                     "wpe.weight": torch.zeros(16, 129),
                                                     "h.0.ln_1.weight": torch.ones(129)})
    with pytest.raises(CheckpointError, match=r"no config\.json beside it.*width 129 is not divisible by 2 heads"):
        hf_gpt2.config_of(path)


@pytest.mark.parametrize("text, message", [
    ("[" * 100_000, r"is not a config: its JSON is nested too deeply to read"),
    ('{"n_layer": ' + "9" * 5000 + "}", r"is not a config: it holds a number of over \d+ digits"),
], ids=["nested", "long-number"])
def test_a_config_json_python_cannot_parse_is_a_checkpoint_error_naming_it(text, message, tmp_path):
    path = write_hf(tmp_path / "model.safetensors", hf_state(TINY), TINY)
    path.with_name("config.json").write_text(text)
    with pytest.raises(CheckpointError, match=message + r".*put the model's own config\.json there") as caught:
        hf_gpt2.config_of(path)
    assert str(path.with_name("config.json")) in str(caught.value)


def test_layers_missing_between_the_numbered_ones_are_named_not_recorded(tmp_path):
    state = {n: t for n, t in hf_state(TINY).items() if not n.startswith("h.1.")}
    state["h.20000.ln_1.weight"] = torch.ones(TINY.width)  # a stray tensor: 20,001 layers, had it been believed
    path = write_hf(tmp_path / "model.safetensors", state)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: its tensors name layers up to h\.20000, but "
                                              r"none of h\.1 to h\.19999; GPT-2's layers are numbered from h\.0"):
        hf_gpt2.config_of(path)
    del state["h.20000.ln_1.weight"]
    state["h.3.ln_1.weight"], state["h.5.ln_1.weight"] = torch.ones(TINY.width), torch.ones(TINY.width)
    path = write_hf(tmp_path / "model.safetensors", state)
    with pytest.raises(CheckpointError, match=r"up to h\.5, but none of h\.1 to h\.2, h\.4; GPT-2's"):
        hf_gpt2.config_of(path)


def test_a_file_holding_a_tensor_with_and_without_the_prefix_is_refused(tmp_path):
    state = hf_state(TINY)
    path = write_hf(tmp_path / "model.safetensors", {**state, "transformer.wte.weight": state["wte.weight"] * 2})
    network, _ = record_generation(TINY, draw=False)
    both = (r"model\.safetensors holds both '(transformer\.)?wte\.weight' and '(transformer\.)?wte\.weight', one "
            r"GPT-2 tensor twice \(with and without the 'transformer\.' prefix\)")
    with pytest.raises(CheckpointError, match=both):
        hf_gpt2.load(path, network, TINY)
    with pytest.raises(CheckpointError, match=both):
        hf_gpt2.config_of(path)


@pytest.mark.parametrize("changes, message", [
    ({"heads": 0}, r"GPT-2 heads must be a positive int, got 0"),
    ({"layers": -1}, r"GPT-2 layers must be a positive int, got -1"),
    ({"width": 4, "heads": 3}, r"width 4 is not divisible by 3 heads"),
])
def test_an_impossible_config_is_an_example_error_not_a_division_by_zero(changes, message):
    with pytest.raises(ExampleError, match=message):
        record_generation(TINY.with_(**changes), draw=False)
    with pytest.raises(ExampleError, match=r"the cache length 17 must be an int in 1\.\.16"):
        record_generation(TINY, length=17, draw=False)
    with pytest.raises(ExampleError, match=r"unknown GPT-2 config 'huge'"):
        Config.preset("huge")


def test_the_124M_config_has_gpt2s_parameter_count():
    config = Config.preset("124M")
    assert config.parameter_count() == 124_439_808
    assert (config.layers, config.heads, config.width, config.context, config.vocabulary) == (12, 12, 768, 1024,
                                                                                             50257)
    network, _ = record_generation(TINY, draw=False)
    assert sum(a.size for _, a in network.parameters().items()) == TINY.parameter_count()


# ---- the KV cache ---------------------------------------------------------------------------------


def _step_by_step(decoder, tokens, known: int):
    """Logits of positions known-1 .. L-1: the prefill's row, then the decode entry fed each true token."""
    length = tokens.shape[1]
    padded = np.zeros_like(tokens)
    padded[:, :known] = tokens[:, :known]
    logits, caches = decoder.prefill(padded)
    rows = [logits[:, known - 1]]
    for position in range(known, length):
        logits, caches = decoder.decode(tokens[:, position], position, caches)
        rows.append(logits)
    return rows


def test_decoding_with_the_cache_is_bit_identical_to_recomputing_on_the_oracle():
    """Bit for bit on the oracle: each row of every matmul, norm and softmax depends on its own row only
    (k ascending, a fixed halving tree per extent, the same extents in both graphs: the cache holds L
    positions, the recompute runs L tokens), a cache row is written exactly (x * 1 + 0 * y), and a masked
    position contributes exp(-1e9 - max) = 0 and then 0 * value, adding nothing."""
    network, generation = record_generation(TINY, batch=2, seed=3)
    table = network.parameters()
    decoder = sampling.Decoder(network, generation, table, "oracle")
    tokens = _tokens(TINY, 2, seed=4)
    rows = _step_by_step(decoder, tokens, known=5)
    for position, row in zip(range(4, TINY.context), rows):
        recomputed = np.zeros_like(tokens)
        recomputed[:, :position + 1] = tokens[:, :position + 1]
        assert np.array_equal(row, decoder.prefill(recomputed)[0][:, position]), f"position {position}"


def _within_the_envelope_of_the_oracle(compiled, network, generation, table, tokens, known: int):
    """Every position's logits of ``compiled`` (an iree Decoder) within the end-to-end envelope of the oracle's."""
    from topos.dialect.iree.conformance import END_TO_END_ULPS

    got = _step_by_step(compiled, tokens, known)
    oracle = _step_by_step(sampling.Decoder(network, generation, table, "oracle"), tokens, known)
    bound = END_TO_END_ULPS * float(np.finfo(np.float32).eps)
    for position, (row, want) in enumerate(zip(got, oracle), start=known - 1):
        assert np.abs(row - want).max() <= bound * np.abs(want).max(), f"position {position}"
    return got


def test_compiled_prefill_and_decode_agree_with_the_oracle_within_the_envelope(tmp_path):
    state = hf_state(TINY, seed=5)
    network, generation = record_generation(TINY, batch=2, draw=False)
    table = hf_gpt2.load(write_hf(tmp_path / "model.safetensors", state), network, TINY)
    tokens = _tokens(TINY, 2, seed=6)
    compiled = _within_the_envelope_of_the_oracle(sampling.Decoder(network, generation, table, "iree"), network,
                                                  generation, table, tokens, known=3)
    want = torch_gpt2(state, TINY, tokens)[:, 2:]
    got = np.stack(compiled, axis=1)
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5


def test_prefill_and_decode_on_vulkan_through_lavapipe_agree_with_the_oracle(lavapipe):
    """target vulkan: both entries compiled for SPIR-V with the weights frozen in, the token and its position
    narrowed to i32 at the module's edge, the caches fed back each call."""
    network, generation = record_generation(TINY, batch=2, seed=9)
    table = network.parameters()
    decoder = sampling.Decoder(network, generation, table, "iree", target="vulkan")
    _within_the_envelope_of_the_oracle(decoder, network, generation, table, _tokens(TINY, 2, seed=10), known=3)
    assert [compiled.target.name for compiled in decoder.compiled] == ["vulkan", "vulkan"]


def test_greedy_generation_is_the_same_with_and_without_the_cache():
    network, generation = record_generation(TINY, batch=2, seed=7)
    decoder = sampling.Decoder(network, generation, network.parameters(), "oracle")
    prompt = _tokens(TINY, 2, seed=8)[:, :4]
    greedy = sampling.Sampling(temperature=0.0)
    cached = sampling.generate(decoder, prompt, 8, greedy, init.Generator(0))
    recomputed = sampling.generate(decoder, prompt, 8, greedy, init.Generator(0), recompute=True)
    assert cached.shape == (2, 8) and np.array_equal(cached, recomputed)


def test_sampling_rules():
    logits = np.array([[0.0, 3.0, 1.0, 2.9], [5.0, 0.0, 0.0, 0.0]], np.float32)
    assert sampling.pick(logits, sampling.Sampling(0.0), init.Generator(0)).tolist() == [1, 0]
    top1 = sampling.Sampling(temperature=5.0, top_k=1)
    assert sampling.pick(logits, top1, init.Generator(1)).tolist() == [1, 0]
    top2 = sampling.Sampling(temperature=50.0, top_k=2)
    drawn = np.concatenate([sampling.pick(logits, top2, init.Generator(s))[:1] for s in range(40)])
    assert set(drawn.tolist()) == {1, 3}  # only the two likeliest, both drawn at a high temperature
    again = sampling.pick(logits, sampling.Sampling(1.0), init.Generator(9))
    assert np.array_equal(again, sampling.pick(logits, sampling.Sampling(1.0), init.Generator(9)))
    with pytest.raises(ExampleError, match="temperature"):
        sampling.Sampling(temperature=-1.0)


def test_a_prompt_longer_than_the_context_is_refused():
    network, generation = record_generation(TINY, seed=1)
    decoder = sampling.Decoder(network, generation, network.parameters(), "oracle")
    with pytest.raises(ExampleError, match=r"need 20 positions, but the model reads at most 16"):
        sampling.generate(decoder, np.zeros((1, 12), np.int64), 8, sampling.Sampling(0.0), init.Generator(0))


# ---- the tokenizer --------------------------------------------------------------------------------


def _tiny_bpe(folder: Path) -> Path:
    """A vocab.json and merges.txt in GPT-2's format: the 256 byte symbols, a few merges, <|endoftext|>."""
    symbols = list(bpe.bytes_to_unicode().values())
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("Ġ", "w"), ("o", "r"), ("Ġw", "or"), ("hell", "o")]
    vocab = {s: i for i, s in enumerate(symbols + [a + b for a, b in merges] + ["<|endoftext|>"])}
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges),
                                       encoding="utf-8")
    return folder


def test_byte_level_bpe_merges_by_rank_and_round_trips(tmp_path):
    tokenizer = bpe.load(_tiny_bpe(tmp_path))
    vocab = json.loads((tmp_path / "vocab.json").read_text(encoding="utf-8"))
    ids = tokenizer.encode("hello world")
    assert [tokenizer.decoder[i] for i in ids] == ["hello", "Ġwor", "l", "d"]
    assert tokenizer.encode("<|endoftext|>hello") == [vocab["<|endoftext|>"], vocab["hello"]]
    for text in ("hello world", "  spaces\n\ttabs  ", "it's we'll 123 4½ snake_case", "naïve café, 😀 ok?",
                 "<|endoftext|>x", ""):
        assert tokenizer.decode(tokenizer.encode(text)) == text
    assert bpe.bytes_to_unicode()[ord(" ")] == "Ġ" and len(set(bpe.bytes_to_unicode().values())) == 256


def test_without_files_the_tokenizer_is_bytes():
    tokenizer = bpe.load()
    assert tokenizer.vocabulary == 256 and tokenizer.encode("añ") == [97, 195, 177]
    assert tokenizer.decode(tokenizer.encode("añ\n")) == "añ\n"


def _symbols() -> dict:
    return {s: i for i, s in enumerate(bpe.bytes_to_unicode().values())}


BAD_VOCABULARIES = {
    "a list": ([1], r"vocab\.json holds a JSON list, not an object of symbol -> id"),
    "a string id": ({**_symbols(), "ab": "256"}, r"vocab\.json: 'ab' has the id '256', not a non-negative int"),
    "a negative id": ({**_symbols(), "ab": -1}, r"vocab\.json: 'ab' has the id -1, not a non-negative int"),
    "a shared id": ({**_symbols(), "a": _symbols()["b"]}, r"vocab\.json: 'b' and 'a' share the id 98"),
    "a missing byte": ({s: i for s, i in _symbols().items() if s != "a"},
                       r"vocab\.json lacks the symbol of byte 97 \('a'\)"),
}


@pytest.mark.parametrize("case", sorted(BAD_VOCABULARIES))
def test_a_bad_vocab_json_is_an_example_error_naming_the_entry(case, tmp_path):
    vocab, message = BAD_VOCABULARIES[case]
    _tiny_bpe(tmp_path)
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (tmp_path / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    with pytest.raises(ExampleError, match=message) as caught:
        bpe.load(tmp_path)
    assert str(tmp_path / "vocab.json") in str(caught.value) and "GPT-2's" in str(caught.value)


def test_a_vocab_json_nested_too_deeply_is_an_example_error_naming_it(tmp_path):
    _tiny_bpe(tmp_path)
    (tmp_path / "vocab.json").write_text("[" * 100_000, encoding="utf-8")
    with pytest.raises(ExampleError, match=r"cannot read the tokenizer from .*vocab\.json: its JSON is nested too "
                                           r"deeply to be a vocabulary; pass the folder holding GPT-2's"):
        bpe.load(tmp_path)


def test_merges_that_vocab_json_cannot_spell_are_refused_at_load(tmp_path):
    _tiny_bpe(tmp_path)
    (tmp_path / "merges.txt").write_text("#version: 0.2\nh e\nx y\n", encoding="utf-8")
    with pytest.raises(ExampleError, match=r"merges\.txt: merge 1 \('x' 'y'\) makes 'xy', which .*vocab\.json lacks; "
                                           r"vocab\.json and merges\.txt must come from the same tokenizer"):
        bpe.load(tmp_path)
    (tmp_path / "merges.txt").write_text("#version: 0.2\nh e l\n", encoding="utf-8")
    with pytest.raises(ExampleError, match=r"merges\.txt, line 2: 'h e l' is not two symbols separated by a space"):
        bpe.load(tmp_path)


@pytest.mark.parametrize("ids", [[99999], [-1], ["a"], [1.5]], ids=["past-the-end", "negative", "string", "float"])
def test_decoding_an_id_outside_the_vocabulary_is_an_example_error(ids, tmp_path):
    tokenizer = bpe.load(_tiny_bpe(tmp_path))
    last = tokenizer.vocabulary - 1
    with pytest.raises(ExampleError, match=rf"token id .* is not in the vocabulary; pass ids of 0\.\.{last} \(ints\)"):
        tokenizer.decode([104] + ids)
    with pytest.raises(ExampleError, match=r"token id .* is not in the vocabulary; pass ids of 0\.\.255"):
        bpe.Bytes().decode([104] + ids if ids != [99999] else [104, 256])
    assert tokenizer.decode(np.array([104, 105])) == "hi" and bpe.Bytes().decode(np.array([104, 105])) == "hi"


def test_pre_tokenizer_splits_like_gpt2():
    import re

    pieces = re.compile(bpe.PATTERN).findall("Hello, world! It's 2024...  ok")
    assert pieces == ["Hello", ",", " world", "!", " It", "'s", " 2024", "...", " ", " ok"]


# ---- the scripts ----------------------------------------------------------------------------------


SMALL_TRAINING = ["--steps", "10", "--check", "1", "--batch", "4", "--context", "16", "--width", "32",
                  "--samples", "2", "--quiet"]


def _printed(capsys) -> list[str]:
    return capsys.readouterr().out.strip().split("\n")  # not splitlines: a sample may hold any byte


def test_training_example_trains_samples_and_saves_hf_weights(tmp_path, capsys):
    """The FAST plan route (no IREE compile: the default suite stays quick); the IREE route is the slow test."""
    saved = tmp_path / "tiny.safetensors"
    _script("train").main(SMALL_TRAINING + ["--route", "plan", "--save", str(saved)])
    lines = _printed(capsys)
    assert lines[-4].startswith("route plan") and "ulps of the oracle" in lines[-4]
    last = float(lines[-3].removeprefix("last-500 mean loss: "))
    assert math.isfinite(last) and last < math.log(256)  # below a uniform guess over bytes
    assert lines[-2].startswith("validation loss: ") and lines[-1].startswith("sample:")
    assert hf_gpt2.config_of(saved) == Config(layers=2, heads=2, width=32, context=16)  # from its metadata
    texts = _script("generate").main(["--weights", str(saved), "--route", "oracle", "--tokens", "6",
                                      "--prompt", "an", "--temperature", "0"])
    assert len(texts) == 1 and texts[0].startswith("an")


@pytest.mark.slow
def test_training_example_on_its_default_route_iree(capsys):
    _script("train").main(SMALL_TRAINING)
    lines = _printed(capsys)
    assert lines[-4].startswith("route iree, compile") and "ulps of the oracle" in lines[-4]
    assert float(lines[-3].removeprefix("last-500 mean loss: ")) < math.log(256)


def test_generate_with_a_bpe_tokenizer_and_hf_weights(tmp_path, capsys):
    _tiny_bpe(tmp_path)
    config = TINY.with_(vocabulary=264)  # 256 bytes, 7 merges, <|endoftext|>
    write_hf(tmp_path / "model.safetensors", hf_state(config), config)
    texts = _script("generate").main(["--weights", str(tmp_path / "model.safetensors"), "--tokenizer",
                                      str(tmp_path), "--prompt", "hello world", "--tokens", "5", "--route",
                                      "oracle", "--top-k", "5", "--temperature", "0.8", "--samples", "2"])
    assert len(texts) == 2 and all(t.startswith("hello world") for t in texts)


def test_script_errors_are_messages(tmp_path, capsys):
    generate = _script("generate")
    with pytest.raises(ExampleError, match=r"need 70 positions, but the model's context is 64"):
        generate.main(["--prompt", "x" * 30, "--tokens", "40", "--route", "oracle"])
    with pytest.raises(CheckpointError, match="no such file"):
        generate.main(["--weights", str(tmp_path / "absent.safetensors")])
    with pytest.raises(SystemExit):
        generate.main(["--no-such-option"])
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        generate.main(["--target", "tpu"])
    assert "invalid choice: 'tpu'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _script("train").main(["--route", "gpu"])
    assert "invalid choice: 'gpu'" in capsys.readouterr().err
    with pytest.raises(ExampleError, match="divisible"):
        _script("train").main(["--width", "30", "--heads", "4"])


def test_command_line_errors_print_without_a_traceback(tmp_path):
    done = subprocess.run([sys.executable, str(FOLDER / "generate.py"), "--weights", str(tmp_path / "none")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr.startswith("error: ") and "Traceback" not in done.stderr
    assert topos is not None


def test_a_model_past_the_byte_vocabulary_without_a_tokenizer_is_refused_before_generating(tmp_path, monkeypatch):
    """Bytes cannot spell its ids past 255: generating in full and then failing to decode would waste the run."""
    generate = _script("generate")
    monkeypatch.setattr(generate, "record_generation", lambda *a, **k: pytest.fail("recorded before refusing"))
    with pytest.raises(ExampleError, match=r"^the model has 50257 tokens but no --tokenizer was given \(bytes: 256\); "
                                           r"pass --tokenizer FOLDER$"):
        generate.main(["--config", "124M", "--route", "oracle"])
    config = TINY.with_(vocabulary=300)
    weights = write_hf(tmp_path / "model.safetensors", hf_state(config), config)
    with pytest.raises(ExampleError, match=r"the model has 300 tokens but no --tokenizer was given"):
        generate.main(["--weights", str(weights), "--route", "oracle"])


def test_a_text_file_saved_with_a_byte_order_mark_trains_on_its_text_only(tmp_path):
    from corpus import encoded, read_text

    path = tmp_path / "text.txt"
    path.write_text("hello\nworld\n", encoding="utf-8-sig")
    assert path.read_bytes().startswith(b"\xef\xbb\xbf")
    assert read_text(str(path), seed=0) == "hello\nworld\n"
    assert bytes(encoded(str(path), seed=0).astype(np.uint8)) == b"hello\nworld\n"
