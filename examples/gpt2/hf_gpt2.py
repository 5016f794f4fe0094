"""Hugging Face GPT-2 checkpoints: the one table of names, the config a file holds, and loading it by name.

``gpt2.Gpt2`` records its weights under Hugging Face's own names and
layouts, so the table of differences is short; this is all of it:

=========================================  ===========================  ==========================================
Hugging Face ``model.safetensors``          topos (``gpt2.Gpt2``)        note
=========================================  ===========================  ==========================================
``wte.weight`` [vocabulary, d]              ``wte.weight``               also the output projection (tied)
``wpe.weight`` [context, d]                 ``wpe.weight``
``h.{i}.ln_1.weight``, ``.bias`` [d]        the same
``h.{i}.attn.c_attn.weight`` [d, 3d]        the same                     Conv1D layout ``[in, out]``: ``x @ W``
``h.{i}.attn.c_attn.bias`` [3d]             the same                     q, then k, then v
``h.{i}.attn.c_proj.weight`` [d, d], bias   the same                     Conv1D
``h.{i}.ln_2.weight``, ``.bias``            the same
``h.{i}.mlp.c_fc.weight`` [d, 4d], bias     the same                     Conv1D
``h.{i}.mlp.c_proj.weight`` [4d, d], bias   the same                     Conv1D
``ln_f.weight``, ``.bias``                  the same
``transformer.`` + any name above           the name without it          ``GPT2LMHeadModel.save_pretrained``
``h.{i}.attn.bias``, ``.masked_bias``       (skipped)                    causal-mask buffers, not weights
``lm_head.weight``                          (skipped if equal to wte)    the tied head, saved by some writers
=========================================  ===========================  ==========================================

The choice: the topos modules use GPT-2's names and a Conv1D-style
linear (``gpt2.Conv1D``, weight ``[in, out]``) rather than ``nn.Linear``
(``[out, in]``) plus a transposing table, so a file loads through
``topos.checkpoint.load(path, network, ignore=IGNORED)`` with no copy and
no renaming, and the checkpoint module's own errors (missing, unexpected
and mis-shaped tensors, each named) reach the user; they are re-raised
with the file's own sizes and the option that fits it.
"""

from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path

import numpy as np

from topos import CheckpointError, FeedError, checkpoint

from gpt2 import Config

PREFIX = "transformer."  # GPT2LMHeadModel's files; GPT2Model's (and the hub's gpt2) have none
IGNORED = ("h.*.attn.bias", "h.*.attn.masked_bias", "lm_head.weight")
_LAYER = re.compile(r"^h\.(\d+)\.")


def _names(path) -> dict:
    """name (prefix stripped) -> (shape, dtype) of every tensor of the file."""
    found = {}
    for name, entry in checkpoint.header(path).items():
        found[name.removeprefix(PREFIX)] = (tuple(entry.shape), np.dtype(entry.dtype))
    return found


def config_of(path) -> Config:
    """The GPT-2 config a file holds: ``config.json`` beside it, else its metadata's ``config``, else its shapes.

    Shapes give layers, width, context and vocabulary but not the heads
    (they split the width without changing a shape): those are taken as
    ``width // 64``, true of every released GPT-2 (124M to 1558M).
    """
    names = _names(path)  # a CheckpointError first if the file is missing or damaged
    beside = Path(path).with_name("config.json")
    texts = [beside.read_text(encoding="utf-8")] if beside.is_file() else []
    texts.append(checkpoint.read_metadata(path).get("config", ""))
    for text in texts:
        try:
            return from_hf_config(json.loads(text))
        except (ValueError, KeyError, TypeError):
            continue  # unreadable or absent: try the next source, then the shapes
    if "wte.weight" not in names or "wpe.weight" not in names:
        raise CheckpointError(
            f"{path}: no wte.weight / wpe.weight tensors, so this is not a GPT-2 checkpoint in Hugging Face's "
            "format (model.safetensors of GPT2Model or GPT2LMHeadModel)"
        )
    vocabulary, width = names["wte.weight"][0]
    layers = 1 + max((int(m.group(1)) for n in names if (m := _LAYER.match(n))), default=-1)
    return Config(layers=layers, heads=max(1, width // 64), width=width, context=names["wpe.weight"][0][0],
                  vocabulary=vocabulary)


def hf_config(config: Config) -> dict:
    """The sizes in Hugging Face's ``config.json`` spelling (what ``train.py --save`` stores in the metadata)."""
    return {"model_type": "gpt2", "n_layer": config.layers, "n_head": config.heads, "n_embd": config.width,
            "n_positions": config.context, "vocab_size": config.vocabulary}


def from_hf_config(hf: dict) -> Config:
    return Config(layers=int(hf["n_layer"]), heads=int(hf["n_head"]), width=int(hf["n_embd"]),
                  context=int(hf["n_positions"]), vocabulary=int(hf["vocab_size"]))


def describe(config: Config) -> str:
    return (f"layers={config.layers} heads={config.heads} width={config.width} context={config.context} "
            f"vocabulary={config.vocabulary}")


def load(path, network, config: Config):
    """The network's parameter table filled by name from a Hugging Face GPT-2 file (see the table above).

    Raises CheckpointError naming every missing, unexpected or mis-shaped
    tensor, with the sizes the file holds when they differ from ``config``.
    """
    try:
        stored = checkpoint.header(path)
        if not any(n.startswith(PREFIX) for n in stored):
            table = checkpoint.load(path, network, ignore=IGNORED)
        else:
            table = _load_prefixed(path, network)
    except (CheckpointError, FeedError) as error:
        held = config_of(path)
        hint = "" if held.with_(dtype=config.dtype) == config else (
            f"\n  the file holds a GPT-2 with {describe(held)}, the model was recorded with {describe(config)}: "
            "record it with the file's sizes (the examples' --config auto does)")
        raise CheckpointError(f"{error}{hint}") from None
    if "lm_head.weight" in stored or PREFIX + "lm_head.weight" in stored:
        _check_tied(path, table)
    return table


def _load_prefixed(path, network):
    """``checkpoint.load``'s checks for a file whose names carry ``transformer.``; topos.checkpoint cannot rename."""
    tensors = {n.removeprefix(PREFIX): a for n, a in checkpoint.read(path).items()}
    kept = {n: a for n, a in tensors.items() if not any(fnmatch.fnmatchcase(n, p) for p in IGNORED)}
    wanted = {network.name(symbol) for symbol in network.parameter_symbols()}
    unexpected = sorted(set(kept) - wanted)
    if unexpected:
        raise CheckpointError(f"{path} does not fit this network:\n  in the file but not in the network: "
                              + ", ".join(PREFIX + n for n in unexpected))
    return network.parameters(kept)  # FeedError names each missing or mis-shaped slot


def _check_tied(path, table) -> None:
    """A file with its own lm_head.weight: GPT-2 ties it to wte.weight, so it must be the same tensor."""
    tensors = checkpoint.read(path)
    head = tensors.get("lm_head.weight", tensors.get(PREFIX + "lm_head.weight"))
    if head is not None and not np.array_equal(head, table["wte.weight"]):
        raise CheckpointError(
            f"{path}: lm_head.weight differs from wte.weight, but GPT-2 ties its output projection to the "
            "token table; this file is not a GPT-2 (or was fine-tuned untied) and cannot load here"
        )
