"""Hugging Face Llama checkpoints: the config a file holds, and loading its ``model.safetensors`` by name.

``llama.Llama`` records every weight under ``LlamaForCausalLM``'s name and
layout (``nn.Linear`` is ``[out, in]`` in both), so the table of names is
the identity and the only differences are these:

=================================================  ==========================================================
Hugging Face                                        topos (``llama.Llama``)
=================================================  ==========================================================
``model.embed_tokens.weight`` [vocabulary, d]       the same
``model.layers.{i}.self_attn.{q,k,v,o}_proj.weight``  the same (q/k rows in HF's rotate-half order, see llama.py)
``model.layers.{i}.mlp.{gate,up,down}_proj.weight``   the same
``model.layers.{i}.input_layernorm.weight``         the same; also ``post_attention_layernorm``, ``model.norm``
``lm_head.weight`` [vocabulary, d]                  the same; absent when tied (``tie_word_embeddings``)
``model.layers.{i}.self_attn.rotary_emb.inv_freq``  skipped: older files keep the RoPE frequencies as a buffer
=================================================  ==========================================================

The sizes come from ``config.json`` beside the file (Hugging Face's
names: ``num_hidden_layers``, ``num_attention_heads``,
``num_key_value_heads``, ``hidden_size``, ``intermediate_size``,
``max_position_embeddings``, ``vocab_size``, ``rope_theta``,
``rms_norm_eps``, ``tie_word_embeddings``), or from the file's metadata
(``train.py --save`` stores them there). Shapes alone cannot give the
heads, so a file with neither is refused with that fix.
"""

from __future__ import annotations

import math
from pathlib import Path

from topos import CheckpointError, checkpoint

from llama import Config

IGNORED = ("model.layers.*.self_attn.rotary_emb.inv_freq",)


def hf_config(config: Config) -> dict:
    """The sizes in Hugging Face's ``config.json`` spelling."""
    return {"model_type": "llama", "num_hidden_layers": config.layers, "num_attention_heads": config.heads,
            "num_key_value_heads": config.kv_heads, "hidden_size": config.width,
            "intermediate_size": config.intermediate, "max_position_embeddings": config.context,
            "vocab_size": config.vocabulary, "rope_theta": config.rope_theta, "rms_norm_eps": config.rms_norm_eps,
            "tie_word_embeddings": config.tied, "hidden_act": "silu"}


HF_SIZES = {"num_hidden_layers": "layers", "num_attention_heads": "heads", "hidden_size": "width",
            "intermediate_size": "intermediate", "max_position_embeddings": "context", "vocab_size": "vocabulary"}
HF_NUMBERS = {"rope_theta": ("rope_theta", 10000.0), "rms_norm_eps": ("rms_norm_eps", 1e-6)}


def from_hf_config(hf: dict, where: str = "the config") -> Config:
    """The Config of Hugging Face's ``LlamaConfig`` keys; CheckpointError naming ``where`` and the key if impossible."""
    from _training import ExampleError

    fix = f"it must be a Llama config.json ({', '.join(HF_SIZES)})"
    if not isinstance(hf, dict):
        raise CheckpointError(f"{where} holds a JSON {type(hf).__name__}, not an object of sizes; {fix}")
    if hf.get("rope_scaling"):
        raise CheckpointError(f"{where}: rope_scaling {hf['rope_scaling']} is not implemented here: this example's "
                              "RoPE is the default one (Llama 1 and 2, TinyLlama); Llama 3.1's scaled form would "
                              "change rotary_tables")
    if hf.get("hidden_act", "silu") != "silu" or hf.get("attention_bias") or hf.get("mlp_bias"):
        raise CheckpointError(f"{where} uses biases or an activation other than SiLU; it is not a plain Llama")
    missing = [key for key in HF_SIZES if key not in hf]
    if missing:
        raise CheckpointError(f"{where} lacks {', '.join(missing)}; {fix}")
    sizes = {key: hf[key] for key in HF_SIZES}
    if hf.get("num_key_value_heads") is not None:  # absent or null: one kv head per query head (no grouping)
        sizes["num_key_value_heads"] = hf["num_key_value_heads"]
    for key, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"{where}: {key} is {value!r}, not a positive int; {fix}")
    floats = {}
    for key, (name, default) in HF_NUMBERS.items():
        value = hf.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise CheckpointError(f"{where}: {key} is {value!r}, not a positive finite number; {fix}")
        floats[name] = float(value)
    tied = hf.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise CheckpointError(f"{where}: tie_word_embeddings is {tied!r}, not true or false; {fix}")
    config = Config(**{name: sizes[key] for key, name in HF_SIZES.items()},
                    kv_heads=sizes.get("num_key_value_heads", sizes["num_attention_heads"]), tied=tied, **floats)
    try:
        config.check()
    except ExampleError as error:
        raise CheckpointError(f"{where} is not a possible Llama: {error}") from None
    return config


def config_of(path) -> Config:
    """The Llama config of a file: ``config.json`` beside it, else the ``config`` of its metadata.

    A ``config.json`` that is there but unreadable, incomplete or impossible
    is refused, naming what is wrong, rather than passed over.
    """
    from hf_gpt2 import parse_json, read_json  # examples/gpt2 is on sys.path once llama is imported

    metadata = checkpoint.read_metadata(path)  # a CheckpointError first if the file is missing or damaged
    beside = Path(path).with_name("config.json")
    if beside.is_file():
        return from_hf_config(read_json(beside), str(beside))
    if metadata.get("config"):
        where = f"the config in {path}'s metadata"
        return from_hf_config(parse_json(metadata["config"], where), where)
    raise CheckpointError(f"{path}: no config.json beside it and no config in its metadata; the shapes do not "
                          "say how many heads the width splits into: put the model's config.json beside the file")


def describe(config: Config) -> str:
    return (f"layers={config.layers} heads={config.heads} kv_heads={config.kv_heads} width={config.width} "
            f"intermediate={config.intermediate} vocabulary={config.vocabulary} tied={config.tied}")


def load(path, network, config: Config):
    """The network's parameter table filled by name; CheckpointError names every tensor that does not fit."""
    try:
        return checkpoint.load(path, network, ignore=IGNORED)
    except CheckpointError as error:
        try:
            held = config_of(path)
        except CheckpointError:
            raise error from None
        same = held.with_(dtype=config.dtype, context=config.context) == config.with_(context=config.context)
        hint = "" if same else (f"\n  the file's config.json says {describe(held)}; the model was recorded with "
                                f"{describe(config)}: record it with the file's config")
        raise CheckpointError(f"{error}{hint}") from None
