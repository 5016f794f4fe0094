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
import sys
from pathlib import Path

import numpy as np

from topos import CheckpointError, FeedError, checkpoint

from gpt2 import Config

PREFIX = "transformer."  # GPT2LMHeadModel's files; GPT2Model's (and the hub's gpt2) have none
IGNORED = ("h.*.attn.bias", "h.*.attn.masked_bias", "lm_head.weight")
_LAYER = re.compile(r"^h\.(\d+)\.")


def _names(path) -> dict:
    """name (prefix stripped) -> (shape, dtype) of every tensor of the file."""
    stored = checkpoint.header(path)
    return {name: (tuple(stored[held].shape), np.dtype(stored[held].dtype))
            for name, held in _unprefixed(path, stored).items()}


def _unprefixed(path, names) -> dict[str, str]:
    """name without ``transformer.`` -> the name in the file; a tensor held both with and without it is refused.

    Stripping the prefix would make the two one name, and whichever came
    last would win without a word.
    """
    found: dict[str, str] = {}
    for held in names:
        name = held.removeprefix(PREFIX)
        if name in found:
            raise CheckpointError(f"{path} holds both {found[name]!r} and {held!r}, one GPT-2 tensor twice (with "
                                  f"and without the {PREFIX!r} prefix); keep one of them, as save_pretrained writes "
                                  "a file")
        found[name] = held
    return found


def config_of(path) -> Config:
    """The GPT-2 config a file holds: ``config.json`` beside it, else its metadata's ``config``, else its shapes.

    Shapes give layers, width, context and vocabulary but not the heads
    (they split the width without changing a shape): those are taken as
    ``width // 64``, true of every released GPT-2 (124M to 1558M). A
    ``config.json`` (or a metadata config) that is there but unreadable,
    incomplete or impossible is refused, naming what is wrong, rather than
    passed over for a guess.
    """
    names = _names(path)  # a CheckpointError first if the file is missing or damaged
    beside = Path(path).with_name("config.json")
    if beside.is_file():
        return from_hf_config(read_json(beside), f"{beside}")
    stored = checkpoint.read_metadata(path).get("config")
    if stored:
        return from_hf_config(parse_json(stored, f"the config in {path}'s metadata"),
                              f"the config in {path}'s metadata")
    return _from_shapes(path, names)


def _from_shapes(path, names: dict) -> Config:
    """The sizes the tensors' shapes give, with ``width // 64`` heads; refused unless they make a GPT-2."""
    from _training import ExampleError

    fix = "put the model's config.json beside the file"
    if "wte.weight" not in names or "wpe.weight" not in names:
        raise CheckpointError(
            f"{path}: no wte.weight / wpe.weight tensors, so this is not a GPT-2 checkpoint in Hugging Face's "
            "format (model.safetensors of GPT2Model or GPT2LMHeadModel)"
        )
    (wte, _), (wpe, _) = names["wte.weight"], names["wpe.weight"]
    if len(wte) != 2 or len(wpe) != 2 or wte[1] != wpe[1]:
        raise CheckpointError(
            f"{path}: wte.weight is {list(wte)} and wpe.weight is {list(wpe)}, but GPT-2's are [vocabulary, width] "
            f"and [context, width] with one width; this is not a GPT-2 checkpoint, or {fix} if it is"
        )
    (vocabulary, width), context = wte, wpe[0]
    numbers = sorted({int(m.group(1)) for n in names if (m := _LAYER.match(n))})
    gaps = [f"h.{low + 1}" if low + 2 == high else f"h.{low + 1} to h.{high - 1}"
            for low, high in zip([-1, *numbers], numbers) if high > low + 1]
    if gaps:  # else one stray h.20000 would make a model of 20,001 layers, most of them missing
        raise CheckpointError(f"{path}: its tensors name layers up to h.{numbers[-1]}, but none of "
                              f"{', '.join(gaps[:5])}{', ...' if len(gaps) > 5 else ''}; GPT-2's layers are numbered "
                              "from h.0 with none missing: the file is damaged, or not a GPT-2 checkpoint")
    layers = len(numbers)
    config = Config(layers=layers, heads=max(1, width // 64), width=width, context=context, vocabulary=vocabulary)
    try:
        config.check()
    except ExampleError as error:
        raise CheckpointError(f"{path} has no config.json beside it, and the sizes its shapes give "
                              f"(heads taken as width // 64) are not a GPT-2: {error}; {fix}") from None
    return config


def read_json(path: Path) -> object:
    """The JSON value of the file ``path``; CheckpointError naming it if unreadable, not UTF-8 or not JSON."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise CheckpointError(f"cannot read {path}: {error}") from None
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark is harmless
    except UnicodeDecodeError as error:
        raise CheckpointError(f"{path} is not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start}); "
                              "it must be the model's JSON config: put the model's own config.json there") from None
    return parse_json(text, str(path))


def parse_json(text: str, where: str) -> object:
    """The JSON value of ``text`` (a config read from ``where``); CheckpointError naming ``where`` if it is not JSON."""
    fix = "it must be the model's config as Hugging Face writes it: put the model's own config.json there"
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{where} is not JSON ({error}); {fix}") from None
    except RecursionError:
        raise CheckpointError(f"{where} is not a config: its JSON is nested too deeply to read; {fix}") from None
    except ValueError:  # Python refuses to convert an integer of over sys.get_int_max_str_digits() digits
        raise CheckpointError(f"{where} is not a config: it holds a number of over {sys.get_int_max_str_digits()} "
                              f"digits, which no size needs; {fix}") from None


def hf_config(config: Config) -> dict:
    """The sizes in Hugging Face's ``config.json`` spelling (what ``train.py --save`` stores in the metadata)."""
    return {"model_type": "gpt2", "n_layer": config.layers, "n_head": config.heads, "n_embd": config.width,
            "n_positions": config.context, "vocab_size": config.vocabulary}


HF_SIZES = {"n_layer": "layers", "n_head": "heads", "n_embd": "width", "n_positions": "context",
            "vocab_size": "vocabulary"}


def from_hf_config(hf: dict, where: str = "the config") -> Config:
    """The Config of Hugging Face's ``GPT2Config`` keys; CheckpointError naming ``where`` and the key if impossible."""
    from _training import ExampleError

    fix = "it must be a GPT-2 config.json (n_layer, n_head, n_embd, n_positions, vocab_size)"
    if not isinstance(hf, dict):
        raise CheckpointError(f"{where} holds a JSON {type(hf).__name__}, not an object of sizes; {fix}")
    hf = dict(hf)
    if "n_positions" not in hf and "n_ctx" in hf:
        hf["n_positions"] = hf["n_ctx"]  # older GPT-2 configs name the context n_ctx
    missing = [key for key in HF_SIZES if key not in hf]
    if missing:
        raise CheckpointError(f"{where} lacks {', '.join(missing)}; {fix}")
    for key in HF_SIZES:
        value = hf[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"{where}: {key} is {value!r}, not a positive int; {fix}")
    config = Config(**{name: hf[key] for key, name in HF_SIZES.items()})
    try:
        config.check()
    except ExampleError as error:
        raise CheckpointError(f"{where} is not a possible GPT-2: {error}") from None
    return config


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
            table = _load_prefixed(path, network, stored)
    except (CheckpointError, FeedError) as error:
        try:
            held = config_of(path)
        except CheckpointError:  # no sizes to compare (a broken config.json): the tensors' error says enough
            raise error from None
        hint = "" if held.with_(dtype=config.dtype) == config else (
            f"\n  the file holds a GPT-2 with {describe(held)}, the model was recorded with {describe(config)}: "
            "record it with the file's sizes (the examples' --config auto does)")
        raise CheckpointError(f"{error}{hint}") from None
    if "lm_head.weight" in stored or PREFIX + "lm_head.weight" in stored:
        _check_tied(path, table, stored)
    return table


def _load_prefixed(path, network, stored):
    """``checkpoint.load``'s checks for a file whose names carry ``transformer.``; topos.checkpoint cannot rename."""
    held = _unprefixed(path, stored)
    kept = {n: h for n, h in held.items() if not any(fnmatch.fnmatchcase(n, p) for p in IGNORED)}
    wanted = {network.name(symbol) for symbol in network.parameter_symbols()}
    unexpected = sorted(set(kept) - wanted)
    if unexpected:
        raise CheckpointError(f"{path} does not fit this network:\n  in the file but not in the network: "
                              + ", ".join(held[n] for n in unexpected))
    tensors = checkpoint.read(path, list(kept.values()))
    # FeedError names each missing or mis-shaped slot
    return network.parameters({n: tensors[h] for n, h in kept.items()})


def _check_tied(path, table, stored) -> None:
    """A file with its own lm_head.weight: GPT-2 ties it to wte.weight, so it must be the same tensor."""
    name = "lm_head.weight" if "lm_head.weight" in stored else PREFIX + "lm_head.weight"
    head = checkpoint.read(path, [name])[name]
    if not np.array_equal(head, table["wte.weight"]):
        raise CheckpointError(
            f"{path}: lm_head.weight differs from wte.weight, but GPT-2 ties its output projection to the "
            "token table; this file is not a GPT-2 (or was fine-tuned untied) and cannot load here"
        )
