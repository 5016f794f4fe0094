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

import json
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


def from_hf_config(hf: dict) -> Config:
    if hf.get("rope_scaling"):
        raise CheckpointError(f"rope_scaling {hf['rope_scaling']} is not implemented here: this example's RoPE "
                              "is the default one (Llama 1 and 2, TinyLlama); Llama 3.1's scaled form would "
                              "change rotary_tables")
    if hf.get("hidden_act", "silu") != "silu" or hf.get("attention_bias") or hf.get("mlp_bias"):
        raise CheckpointError("this config uses biases or an activation other than SiLU; it is not a plain Llama")
    return Config(layers=int(hf["num_hidden_layers"]), heads=int(hf["num_attention_heads"]),
                  kv_heads=int(hf.get("num_key_value_heads") or hf["num_attention_heads"]),
                  width=int(hf["hidden_size"]), intermediate=int(hf["intermediate_size"]),
                  context=int(hf["max_position_embeddings"]), vocabulary=int(hf["vocab_size"]),
                  rope_theta=float(hf.get("rope_theta", 10000.0)), rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
                  tied=bool(hf.get("tie_word_embeddings", False)))


def config_of(path) -> Config:
    """The Llama config of a file: ``config.json`` beside it, else the ``config`` of its metadata."""
    metadata = checkpoint.read_metadata(path)  # a CheckpointError first if the file is missing or damaged
    beside = Path(path).with_name("config.json")
    texts = [beside.read_text(encoding="utf-8")] if beside.is_file() else []
    texts.append(metadata.get("config", ""))
    for text in texts:
        try:
            return from_hf_config(json.loads(text))
        except (ValueError, KeyError, TypeError) as error:
            if isinstance(error, CheckpointError):
                raise
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
