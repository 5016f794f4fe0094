"""The Llama example: Hugging Face files load by name and match an independent PyTorch Llama; GQA, RoPE, SwiGLU.

``torch_llama`` is written here from Llama's definition as Hugging Face
implements it (rotate-half RoPE over each head's two halves, ``repeat_kv``
for grouped-query attention, RMSNorm, SwiGLU), in float64 over the same
names; the tiny checkpoint is written with ``safetensors.torch`` and a
``config.json`` beside it, as ``save_pretrained`` does.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "examples" / "llama"
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "examples" / "gpt2"))
sys.path.insert(0, str(FOLDER))

from topos import CheckpointError  # noqa: E402

import hf_llama  # noqa: E402
import sampling  # noqa: E402
from _training import ExampleError  # noqa: E402
from llama import Config, record_generation, rotary_tables  # noqa: E402

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

TINY = Config(layers=2, heads=4, kv_heads=2, width=32, intermediate=48, context=16, vocabulary=64)


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"llama_example_{name}", FOLDER / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cache_folder(tmp_path_factory):
    return tmp_path_factory.mktemp("topos-cache")


@pytest.fixture(autouse=True)
def _compile_cache(cache_folder, monkeypatch):
    monkeypatch.setenv("TOPOS_CACHE_DIR", str(cache_folder))


def hf_state(config: Config, seed: int = 0) -> dict:
    """Random Llama weights under LlamaForCausalLM's names ([out, in] projections), float32."""
    g = torch.Generator().manual_seed(seed)
    d, hd = config.width, config.head_dim

    def normal(*shape, std=None, mean=0.0):
        std = 1 / math.sqrt(shape[-1]) if std is None else std
        return (mean + std * torch.randn(*shape, generator=g)).float()

    state = {"model.embed_tokens.weight": normal(config.vocabulary, d, std=1.0)}
    for i in range(config.layers):
        p = f"model.layers.{i}."
        state.update({
            p + "input_layernorm.weight": normal(d, std=0.1, mean=1.0),
            p + "self_attn.q_proj.weight": normal(config.heads * hd, d),
            p + "self_attn.k_proj.weight": normal(config.kv_heads * hd, d),
            p + "self_attn.v_proj.weight": normal(config.kv_heads * hd, d),
            p + "self_attn.o_proj.weight": normal(d, config.heads * hd),
            p + "post_attention_layernorm.weight": normal(d, std=0.1, mean=1.0),
            p + "mlp.gate_proj.weight": normal(config.intermediate, d),
            p + "mlp.up_proj.weight": normal(config.intermediate, d),
            p + "mlp.down_proj.weight": normal(d, config.intermediate),
        })
    state["model.norm.weight"] = normal(d, std=0.1, mean=1.0)
    if not config.tied:
        state["lm_head.weight"] = normal(config.vocabulary, d)
    return state


def write_hf(folder: Path, state: dict, config: Config, extra: dict | None = None) -> Path:
    path = folder / "model.safetensors"
    safetensors_torch.save_file({**state, **(extra or {})}, str(path), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(hf_llama.hf_config(config)))
    return path


def torch_llama(state: dict, config: Config, tokens: np.ndarray) -> np.ndarray:
    """Llama's logits [B, T, vocabulary], float64, as Hugging Face's modeling_llama computes them."""
    s = {n: t.double() for n, t in state.items()}
    batch, length = tokens.shape
    h, kv, hd = config.heads, config.kv_heads, config.head_dim
    inverse = 1.0 / (config.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    angles = torch.outer(torch.arange(length, dtype=torch.float64), inverse)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()

    def rms(x, name):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + config.rms_norm_eps) * s[name]

    def rope(x):
        half = torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], -1)
        return x * cos + half * sin

    def heads(x, count):
        return x.view(batch, length, count, hd).transpose(1, 2)

    future = ~torch.tril(torch.ones(length, length, dtype=torch.bool))
    x = s["model.embed_tokens.weight"][torch.from_numpy(np.asarray(tokens, np.int64))]
    for i in range(config.layers):
        p = f"model.layers.{i}."
        y = rms(x, p + "input_layernorm.weight")
        q = rope(heads(y @ s[p + "self_attn.q_proj.weight"].T, h))
        k = rope(heads(y @ s[p + "self_attn.k_proj.weight"].T, kv)).repeat_interleave(h // kv, dim=1)
        v = heads(y @ s[p + "self_attn.v_proj.weight"].T, kv).repeat_interleave(h // kv, dim=1)
        scores = (q @ k.transpose(-1, -2) / math.sqrt(hd)).masked_fill(future, -math.inf)
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, length, h * hd)
        x = x + y @ s[p + "self_attn.o_proj.weight"].T
        y = rms(x, p + "post_attention_layernorm.weight")
        gate = torch.nn.functional.silu(y @ s[p + "mlp.gate_proj.weight"].T)
        x = x + (gate * (y @ s[p + "mlp.up_proj.weight"].T)) @ s[p + "mlp.down_proj.weight"].T
    head = s.get("lm_head.weight", s["model.embed_tokens.weight"])
    return (rms(x, "model.norm.weight") @ head.T).numpy()


def _tokens(config: Config, batch: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, config.vocabulary, (batch, config.context))


def _logits(network, generation, table, tokens, route="oracle") -> np.ndarray:
    return sampling.Decoder(network, generation, table, route).prefill(tokens)[0]


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_hf_file_loads_by_name_and_matches_the_pytorch_reference(tmp_path, tied):
    config = TINY.with_(tied=tied)
    state = hf_state(config)
    path = write_hf(tmp_path, state, config)
    assert hf_llama.config_of(path) == config
    network, generation = record_generation(config, batch=2, draw=False)
    table = hf_llama.load(path, network, config)
    tokens = _tokens(config, 2)
    want = torch_llama(state, config, tokens)
    got = _logits(network, generation, table, tokens)
    error = np.abs(got - want).max() / np.abs(want).max()
    assert error < 1e-5, f"float32 logits {error:.2e} (relative to the largest) from the float64 reference"


def test_compiled_prefill_matches_the_pytorch_reference(tmp_path):
    state = hf_state(TINY, seed=2)
    network, generation = record_generation(TINY, batch=2, draw=False)
    table = hf_llama.load(write_hf(tmp_path, state, TINY), network, TINY)
    tokens = _tokens(TINY, 2, seed=3)
    want = torch_llama(state, TINY, tokens)
    got = _logits(network, generation, table, tokens, route="iree")
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5


def test_rotary_tables_are_hugging_faces_halves():
    cos, sin = rotary_tables(TINY, 5)
    half = TINY.head_dim // 2
    assert cos.shape == (5, TINY.head_dim) and np.array_equal(cos[:, :half], cos[:, half:])
    assert np.array_equal(cos[0], np.ones(TINY.head_dim, np.float32)) and np.allclose(sin[1, 0], math.sin(1.0))


def test_files_that_do_not_fit_name_the_tensors(tmp_path):
    state = hf_state(TINY)
    path = write_hf(tmp_path, state, TINY, extra={"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(4)})
    assert hf_llama.load(path, record_generation(TINY, draw=False)[0], TINY) is not None  # the buffer is skipped
    tied = TINY.with_(tied=True)
    with pytest.raises(CheckpointError) as caught:
        hf_llama.load(path, record_generation(tied, draw=False)[0], tied)
    assert "in the file but not in the network: lm_head.weight" in str(caught.value)
    assert "tied=False" in str(caught.value)
    del state["model.layers.1.mlp.up_proj.weight"]
    broken = write_hf(tmp_path, state, TINY)
    with pytest.raises(CheckpointError, match=r"missing from the file: model\.layers\.1\.mlp\.up_proj\.weight"):
        hf_llama.load(broken, record_generation(TINY, draw=False)[0], TINY)
    (tmp_path / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json"):
        hf_llama.config_of(broken)


def _hf(**changes) -> bytes:
    return json.dumps({**hf_llama.hf_config(TINY), **changes}).encode()


BAD_CONFIGS = {
    "not UTF-8": (b"\xff{}", r"config\.json is not UTF-8 text \(byte 0xff at offset 0\).*put the model's own"),
    "not JSON": (b"{layers", r"config\.json is not JSON \(.*put the model's own config\.json there"),
    "a list": (b"[1]", r"config\.json holds a JSON list, not an object of sizes; it must be a Llama config\.json"),
    "missing keys": (json.dumps({"hidden_size": 32, "num_hidden_layers": 2}).encode(),
                     r"config\.json lacks num_attention_heads, intermediate_size, max_position_embeddings, "
                     r"vocab_size; it must be a Llama config\.json"),
    "no heads": (_hf(num_attention_heads=0), r"num_attention_heads is 0, not a positive int"),
    "no kv heads": (_hf(num_key_value_heads=0), r"num_key_value_heads is 0, not a positive int"),
    "kv heads not dividing": (_hf(num_key_value_heads=3), r"not a possible Llama: 3 key/value heads must divide the "
                                                          r"4 query heads"),
    "heads not dividing": (_hf(num_attention_heads=3, num_key_value_heads=1),
                           r"not a possible Llama: width 32 must split into 3 heads of an even head_dim"),
    "odd head_dim": (_hf(hidden_size=36), r"width 36 must split into 4 heads of an even head_dim"),
    "a string size": (_hf(hidden_size="32"), r"hidden_size is '32', not a positive int"),
    "a negative theta": (_hf(rope_theta=-1), r"rope_theta is -1, not a positive finite number"),
    "a string tie": (_hf(tie_word_embeddings="false"), r"tie_word_embeddings is 'false', not true or false"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_a_bad_config_json_is_a_checkpoint_error_naming_it(case, tmp_path):
    path = write_hf(tmp_path, hf_state(TINY), TINY)
    assert hf_llama.config_of(path) == TINY
    data, message = BAD_CONFIGS[case]
    path.with_name("config.json").write_bytes(data)
    with pytest.raises(CheckpointError, match=message) as caught:
        hf_llama.config_of(path)
    assert str(path.with_name("config.json")) in str(caught.value)


@pytest.mark.parametrize("text, message", [
    ("[" * 100_000, r"is not a config: its JSON is nested too deeply to read"),
    ('{"num_hidden_layers": ' + "9" * 5000 + "}", r"is not a config: it holds a number of over \d+ digits"),
], ids=["nested", "long-number"])
def test_a_config_json_python_cannot_parse_is_a_checkpoint_error_naming_it(text, message, tmp_path):
    path = write_hf(tmp_path, hf_state(TINY), TINY)
    path.with_name("config.json").write_text(text)
    with pytest.raises(CheckpointError, match=message) as caught:
        hf_llama.config_of(path)
    assert str(path.with_name("config.json")) in str(caught.value)


def test_a_config_without_kv_heads_has_one_per_query_head(tmp_path):
    path = write_hf(tmp_path, hf_state(TINY), TINY)
    for absent in ({"num_key_value_heads": None}, {}):
        hf = {k: v for k, v in hf_llama.hf_config(TINY).items() if k != "num_key_value_heads"} | absent
        path.with_name("config.json").write_text(json.dumps(hf))
        assert hf_llama.config_of(path).kv_heads == TINY.heads


@pytest.mark.parametrize("changes, message", [
    ({"kv_heads": 0}, r"Llama kv_heads must be a positive int, got 0"),
    ({"heads": 3, "kv_heads": 1}, r"width 32 must split into 3 heads of an even head_dim"),
    ({"kv_heads": 3}, r"3 key/value heads must divide the 4 query heads"),
    ({"rms_norm_eps": 0.0}, r"Llama rms_norm_eps must be a positive finite number, got 0\.0"),
])
def test_an_impossible_config_is_an_example_error_not_a_division_by_zero(changes, message):
    with pytest.raises(ExampleError, match=message):
        record_generation(TINY.with_(**changes), draw=False)


def test_decoding_with_the_cache_is_bit_identical_to_recomputing_on_the_oracle():
    """As for GPT-2 (tests/test_examples_gpt2.py); here the cached keys are rotated at their own position
    (one gathered row of the cos/sin tables), and the repeat of the kv heads comes after the cache."""
    network, generation = record_generation(TINY, batch=2, seed=4)
    decoder = sampling.Decoder(network, generation, network.parameters(), "oracle")
    tokens = _tokens(TINY, 2, seed=5)
    known = 6
    padded = np.where(np.arange(TINY.context) < known, tokens, 0)
    logits, caches = decoder.prefill(padded)
    assert caches["cache.0.keys"].shape == (2, TINY.kv_heads, TINY.context, TINY.head_dim)
    for position in range(known, TINY.context):
        step, caches = decoder.decode(tokens[:, position], position, caches)
        recomputed = decoder.prefill(np.where(np.arange(TINY.context) <= position, tokens, 0))[0][:, position]
        assert np.array_equal(step, recomputed), f"position {position}"


def test_training_example_trains_samples_and_round_trips_its_weights(tmp_path, capsys):
    saved = tmp_path / "tiny.safetensors"
    _script("train").main(["--steps", "8", "--check", "1", "--batch", "2", "--context", "16", "--width", "32",
                           "--intermediate", "48", "--samples", "2", "--quiet", "--route", "plan", "--tied",
                           "--save", str(saved)])
    lines = capsys.readouterr().out.strip().split("\n")
    assert lines[-4].startswith("route plan") and "ulps of the oracle" in lines[-4]
    assert math.isfinite(float(lines[-3].removeprefix("last-500 mean loss: ")))
    assert lines[-2].startswith("validation loss: ") and lines[-1].startswith("sample:")
    assert hf_llama.config_of(saved) == Config(width=32, intermediate=48, context=16, tied=True)
    drawn = _script("generate").main(["--weights", str(saved), "--route", "oracle", "--tokens", "5", "--ids", "10,97"])
    assert len(drawn) == 5 and all(0 <= i < 256 for i in drawn)


@pytest.mark.slow
def test_training_example_on_its_default_route_iree(capsys):
    _script("train").main(["--steps", "30", "--check", "2", "--batch", "4", "--context", "16", "--width", "32",
                           "--intermediate", "48", "--samples", "2", "--quiet"])
    lines = capsys.readouterr().out.strip().split("\n")
    assert lines[-4].startswith("route iree, compile") and "ulps of the oracle" in lines[-4]
    assert float(lines[-3].removeprefix("last-500 mean loss: ")) < math.log(256)


def test_script_errors_are_messages(tmp_path, capsys):
    with pytest.raises(ExampleError, match="key/value heads must divide"):
        _script("train").main(["--heads", "4", "--kv-heads", "3"])
    with pytest.raises(SystemExit):
        _script("train").main(["--kv_heads", "2"])
    assert "unrecognized arguments" in capsys.readouterr().err
    state = hf_state(TINY)
    path = write_hf(tmp_path, state, TINY)
    generate = _script("generate")
    with pytest.raises(ExampleError, match="need 17 positions, but the model's context is 16"):
        generate.main(["--weights", str(path), "--ids", "1,2", "--tokens", "15", "--route", "oracle"])
    with pytest.raises(ExampleError, match="comma-separated"):
        generate.main(["--weights", str(path), "--ids", "1;2"])


@pytest.mark.parametrize("prompt", [["--prompt", "an"], []], ids=["given", "default-newline"])
def test_a_text_prompt_for_a_model_not_of_256_bytes_is_refused_before_recording(prompt, tmp_path, monkeypatch):
    """Its bytes would be ids of the model's own tokens, and the new ids printed as bytes would be noise."""
    path = write_hf(tmp_path, hf_state(TINY), TINY)  # 64 tokens
    generate = _script("generate")
    monkeypatch.setattr(generate, "record_generation", lambda *a, **k: pytest.fail("recorded before refusing"))
    with pytest.raises(ExampleError, match=r"the model has 64 tokens, not the 256 bytes --prompt is read as; "
                                           r"pass the prompt as token ids: --ids"):
        generate.main(["--weights", str(path), *prompt])
    with pytest.raises(ExampleError, match=r"--ids must be comma-separated integers, got ''"):
        generate.main(["--weights", str(path), "--ids", ""])
