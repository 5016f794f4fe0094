"""The KV cache as plain graph: fed caches, one row written by scatter and masks, and a generation spec's symbols.

There is no cache opcode. A decode graph takes every layer's previous
keys and values as fed inputs, each ``[batch, heads, L, head_dim]`` for a
cache of L positions, and the current position as a selection of extent
L. :func:`one_hot` scatters a one into L zeros at that position;
:func:`write_row` keeps every other row of the cache and places the new
token's row there; :func:`visible` gathers the position's row of the
causal mask, so attention sees positions ``<= position`` only. The model
modules (``gpt2.py``, ``examples/llama/llama.py``) record with these, and
``sampling.Decoder`` carries the caches between calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import topos.nn.functional as F
from topos import detach

KINDS = ("keys", "values")


def one_hot(position, length: int, dtype):
    """[L]: 1 at ``position`` (a selection [1] of extent L), 0 elsewhere: a one scattered into L zeros."""
    return position.tape.leaf(np.ones((1,), dtype)).scatter(position, length)


def visible(position, length: int, dtype):
    """[1, L]: the causal mask's row of ``position``: 0 up to it, ``F.causal_mask``'s -1e9 after."""
    return position.tape.leaf(F.causal_mask(length, dtype=dtype)).gather(position)


def write_row(cache, row, place):
    """``cache`` [B, H, L, hd] with ``row`` [B, H, 1, hd] written where ``place`` (a one-hot [L]) is 1.

    ``cache * (1 - place) + row * place``, and every element is exact:
    ``x * 1 = x``, ``x * 0 = 0`` and ``y + 0 = y`` for finite values, so the
    kept rows keep their bits and the written row holds the new bits, as if
    the row had been stored there.
    """
    length = cache.shape[2]
    column = place.reshape((length, 1))
    keep = (1.0 - column).broadcast_to(cache.shape)
    return cache * keep + row.broadcast_to(cache.shape) * column.broadcast_to(cache.shape)


def cache_inputs(tape, layers: int, shape, dtype) -> tuple:
    """Per layer, the fed (keys, values) inputs ``cache.{i}.keys`` / ``cache.{i}.values`` of ``shape``."""
    return tuple(tuple(tape.input(shape=shape, dtype=dtype, name=f"cache.{i}.{kind}") for kind in KINDS)
                 for i in range(layers))


@dataclass(frozen=True)
class Generation:
    """The symbols of one generation spec: its prefill graph and its decode graph share the weights."""

    layers: int
    batch: int
    length: int  # L: the prefill's tokens and the cache's positions
    tokens: object  # input [batch, L]
    prefill_logits: object  # [batch, L, vocabulary]
    prefill_caches: tuple  # per layer (keys, values)
    token: object  # input [batch, 1]
    position: object  # input selection [1] of extent L
    caches: tuple  # per layer (keys input, values input)
    decode_logits: object  # [batch, 1, vocabulary]
    decode_caches: tuple  # per layer (keys, values) with the token's row written

    def prefill_roots(self) -> list:
        return [self.prefill_logits] + [s for pair in self.prefill_caches for s in pair]

    def decode_roots(self) -> list:
        return [self.decode_logits] + [s for pair in self.decode_caches for s in pair]

    def cache_names(self) -> list[str]:
        return [f"cache.{i}.{kind}" for i in range(self.layers) for kind in KINDS]

    def detach(self) -> Generation:
        """The same with every Value replaced by its Symbol (``Tape.record`` calls this)."""
        return Generation(**{name: detach(getattr(self, name)) for name in self.__dataclass_fields__})
