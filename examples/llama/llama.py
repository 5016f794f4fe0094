"""Llama recorded from the facades: RMSNorm, rotary positions, SwiGLU, grouped-query attention, HF's names.

The model is Meta's Llama (Touvron et al. 2023) as Hugging Face's
``LlamaForCausalLM`` spells it, so a ``model.safetensors`` in that format
loads by name (``hf_llama.py``):

* ``model.embed_tokens`` (an ``nn.Embedding``), then ``layers`` decoder
  layers ``model.layers.{i}``: ``input_layernorm`` (``nn.RmsNorm``),
  ``self_attn`` with ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` (``nn.Linear``
  without bias, PyTorch's ``[out, in]``, which is also Hugging Face's),
  ``post_attention_layernorm``, and ``mlp``: SwiGLU,
  ``down_proj(silu(gate_proj(x)) * up_proj(x))``;
* ``model.norm``, then ``lm_head`` (``nn.Linear``), or with ``tied`` the
  token table itself (``logits = x @ embed_tokens.weight.T``; the file then
  has no ``lm_head.weight``, as Hugging Face saves tied models).

Rotary position embeddings (RoPE) in Hugging Face's layout: each head's
``head_dim`` is two halves, and position p turns the pair (i, i + hd/2) by
the angle ``p * theta ** (-2i / hd)``: ``q * cos + rotate_half(q) * sin``
with ``rotate_half(x) = concat(-x[hd/2:], x[:hd/2])`` (narrow, neg,
concat), the cos and sin tables ``[T, hd]`` recorded as leaves
(float64 angles rounded once to the element type). Meta's original
checkpoints rotate interleaved pairs (2i, 2i + 1) instead; Hugging Face's
conversion permutes the rows of ``q_proj`` and ``k_proj`` so the halves
form hold the same model, and this module reads the converted layout
only.

Grouped-query attention: ``kv_heads`` divides ``heads``; each key/value
head serves ``heads // kv_heads`` query heads (query head h reads kv head
``h // group``), repeated with ``broadcast_along`` and ``reshape`` as
Hugging Face's ``repeat_kv`` does. No biases anywhere.

``record_generation`` records prefill and decode over one set of weights
like the GPT-2 example, the caches holding the rotated keys of the
``kv_heads`` (the repeat happens after the cache, so the cache is
``heads / kv_heads`` times smaller); ``examples/gpt2/sampling.py`` runs it.
"""

from __future__ import annotations

import math
import numbers
import sys
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpt2"))  # kv_cache, sampling, corpus

import numpy as np  # noqa: E402

import topos  # noqa: E402
import topos.nn.functional as F  # noqa: E402
from topos import Tape, init, nn  # noqa: E402

import kv_cache  # noqa: E402
from gpt2 import record_next_token  # noqa: E402
from kv_cache import Generation  # noqa: E402


@dataclass(frozen=True)
class Config:
    """The sizes of one Llama; the defaults are the tiny config the example trains (bytes, 2 layers)."""

    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    width: int = 64
    intermediate: int = 192  # SwiGLU's hidden width: 8/3 of 64, rounded up to a multiple of 64
    context: int = 64
    vocabulary: int = 256
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tied: bool = False
    dtype: str = "float32"

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    def with_(self, **changes) -> Config:
        return replace(self, **changes)

    def check(self) -> None:
        """ExampleError unless the sizes are positive ints, the heads split the width evenly, and so on."""
        from _training import ExampleError

        sizes = {"layers": self.layers, "heads": self.heads, "kv_heads": self.kv_heads, "width": self.width,
                 "intermediate": self.intermediate, "context": self.context, "vocabulary": self.vocabulary}
        for name, size in sizes.items():
            if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
                raise ExampleError(f"Llama {name} must be a positive int, got {size!r}: every size must be "
                                   f"positive ({self})")
        for name, value in {"rope_theta": self.rope_theta, "rms_norm_eps": self.rms_norm_eps}.items():
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:
                raise ExampleError(f"Llama {name} must be a positive finite number, got {value!r}")
        if self.width % self.heads or self.head_dim % 2:
            raise ExampleError(f"width {self.width} must split into {self.heads} heads of an even head_dim; pick "
                               "a width that is an even multiple of the heads")
        if self.heads % self.kv_heads:
            raise ExampleError(f"{self.kv_heads} key/value heads must divide the {self.heads} query heads")


def rotary_tables(config: Config, length: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [length, head_dim] of Hugging Face's default RoPE: angles p * theta^(-2i/hd), halves repeated."""
    hd = config.head_dim
    inverse = 1.0 / config.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)  # [hd / 2]
    angles = np.outer(np.arange(length, dtype=np.float64), inverse)
    both = np.concatenate([angles, angles], axis=1)
    return np.cos(both).astype(config.dtype), np.sin(both).astype(config.dtype)


def rotate_half(x):
    """``concat(-x2, x1)`` of the two halves of the last axis (Hugging Face's ``rotate_half``)."""
    half = x.shape[-1] // 2
    axis = x.ndim - 1
    return topos.concat([-x.narrow(axis, half, half), x.narrow(axis, 0, half)], axis)


def rotate(x, cos, sin):
    """RoPE on ``x`` [B, H, T, hd] with tables ``cos``, ``sin`` [T, hd]: ``x * cos + rotate_half(x) * sin``."""
    return x * cos.broadcast_to(x.shape) + rotate_half(x) * sin.broadcast_to(x.shape)


def _linear(fan_in: int, fan_out: int, config: Config, draw: bool):
    initial = init.normal(0.0, 0.02) if draw else init.zeros()  # Hugging Face's initializer_range
    return nn.Linear(fan_in, fan_out, bias=False, init=initial, dtype=config.dtype)


class Attention(nn.Module):
    """Grouped-query causal self-attention with RoPE: ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``."""

    def __init__(self, config: Config, draw: bool):
        super().__init__()
        self.config = config
        hd = config.head_dim
        self.q_proj = _linear(config.width, config.heads * hd, config, draw)
        self.k_proj = _linear(config.width, config.kv_heads * hd, config, draw)
        self.v_proj = _linear(config.width, config.kv_heads * hd, config, draw)
        self.o_proj = _linear(config.heads * hd, config.width, config, draw)

    def _heads(self, x, count: int):
        b, t, _ = x.shape
        return x.reshape((b, t, count, self.config.head_dim)).permute((0, 2, 1, 3))

    def project(self, x, cos, sin):
        """Rotated q [B, heads, T, hd], rotated k and v [B, kv_heads, T, hd]."""
        c = self.config
        q = rotate(self._heads(self.q_proj(x), c.heads), cos, sin)
        k = rotate(self._heads(self.k_proj(x), c.kv_heads), cos, sin)
        return q, k, self._heads(self.v_proj(x), c.kv_heads)

    def repeat(self, x):
        """[B, kv_heads, T, hd] -> [B, heads, T, hd]: kv head j serves query heads j*group .. j*group + group-1."""
        b, kv, t, hd = x.shape
        group = self.config.heads // kv
        return x if group == 1 else x.broadcast_along(2, group).reshape((b, kv * group, t, hd))

    def attend(self, q, k, v, mask):
        y = F.scaled_dot_product_attention(q, self.repeat(k), self.repeat(v), mask)
        b, _, t, _ = y.shape
        return self.o_proj(y.permute((0, 2, 1, 3)).reshape((b, t, self.config.width)))

    def forward(self, x, cos, sin):
        q, k, v = self.project(x, cos, sin)
        return self.attend(q, k, v, F.causal_mask(x.shape[1], dtype=x.dtype)), (k, v)


class Mlp(nn.Module):
    """SwiGLU: ``down_proj(silu(gate_proj(x)) * up_proj(x))``."""

    def __init__(self, config: Config, draw: bool):
        super().__init__()
        self.gate_proj = _linear(config.width, config.intermediate, config, draw)
        self.up_proj = _linear(config.width, config.intermediate, config, draw)
        self.down_proj = _linear(config.intermediate, config.width, config, draw)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm: ``x + self_attn(input_layernorm(x))``, then ``x + mlp(post_attention_layernorm(x))``."""

    def __init__(self, config: Config, draw: bool):
        super().__init__()
        self.input_layernorm = nn.RmsNorm(config.width, eps=config.rms_norm_eps, dtype=config.dtype)
        self.self_attn = Attention(config, draw)
        self.post_attention_layernorm = nn.RmsNorm(config.width, eps=config.rms_norm_eps, dtype=config.dtype)
        self.mlp = Mlp(config, draw)

    def forward(self, x, attention):
        """``attention(self_attn, normed) -> (y, cache)`` picks the reading: causal over x, or over a cache."""
        y, cache = attention(self.self_attn, self.input_layernorm(x))
        x = x + y
        return x + self.mlp(self.post_attention_layernorm(x)), cache


class LlamaModel(nn.Module):
    """``embed_tokens``, ``layers``, ``norm``: Hugging Face's ``LlamaModel``."""

    def __init__(self, config: Config, draw: bool):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocabulary, config.width, dtype=config.dtype,
                                         init=init.normal(0.0, 0.02) if draw else init.zeros())
        self.layers = nn.ModuleList([DecoderLayer(config, draw) for _ in range(config.layers)])
        self.norm = nn.RmsNorm(config.width, eps=config.rms_norm_eps, dtype=config.dtype)


class Llama(nn.Module):
    """Hugging Face's ``LlamaForCausalLM``: ``model.*`` and ``lm_head`` (absent when ``config.tied``)."""

    def __init__(self, config: Config, draw: bool = True):
        super().__init__()
        config.check()
        self.config = config
        self.model = LlamaModel(config, draw)
        self.lm_head = None if config.tied else _linear(config.width, config.vocabulary, config, draw)
        self._tables = {}

    def tables(self, tape, length: int):
        """The cos and sin leaves [length, head_dim], recorded once per length."""
        if length not in self._tables:
            self._tables[length] = tuple(tape.leaf(t) for t in rotary_tables(self.config, length))
        return self._tables[length]

    def logits(self, x):
        normed = self.model.norm(x)
        if self.lm_head is not None:
            return self.lm_head(normed)
        b, t, d = normed.shape
        table = self.model.embed_tokens.weight  # (table @ x.T).T: as gpt2.Gpt2.logits, no transposed table
        return (table @ normed.reshape((b * t, d)).permute((1, 0))).permute((1, 0)).reshape(
            (b, t, self.config.vocabulary))

    def forward(self, tokens):
        """Logits [B, T, vocabulary] of tokens [B, T] (a selection) and each layer's rotated (k, v)."""
        b, t = tokens.shape
        if t > self.config.context:
            from _training import ExampleError

            raise ExampleError(f"{t} tokens do not fit the context of {self.config.context}; pass at most "
                               f"{self.config.context} tokens or record a model with a longer context")
        cos, sin = self.tables(tokens.tape, t)
        x = self.model.embed_tokens(tokens)
        caches = []
        for layer in self.model.layers:
            x, cache = layer(x, lambda attn, normed: attn(normed, cos, sin))
            caches.append(cache)
        return self.logits(x), caches

    def decode(self, token, position, caches):
        """One token [B, 1] at ``position`` (a selection [1] of extent L) over caches [B, kv_heads, L, hd]."""
        dtype, length = self.config.dtype, caches[0][0].shape[2]
        place, mask = kv_cache.one_hot(position, length, dtype), kv_cache.visible(position, length, dtype)
        cos, sin = (table.gather(position) for table in self.tables(token.tape, length))  # [1, hd]
        x = self.model.embed_tokens(token)
        written = []
        for layer, (keys, values) in zip(self.model.layers, caches):
            def attention(attn, normed, keys=keys, values=values):
                q, k, v = attn.project(normed, cos, sin)
                keys, values = kv_cache.write_row(keys, k, place), kv_cache.write_row(values, v, place)
                return attn.attend(q, keys, values, mask), (keys, values)

            x, cache = layer(x, attention)
            written.append(cache)
        return self.logits(x), written


def decays(name: str) -> bool:
    """AdamW's weight decay policy: the projections and embeddings decay, the RMSNorm gains do not."""
    return not name.endswith("layernorm.weight") and name != "model.norm.weight"


def record_training(config: Config, batch: int, length: int, learning_rate: float = 1e-3,
                    weight_decay: float = 0.1, seed: int = 0, train: bool = True):
    """Like ``gpt2.record_training``: (network, (model, loss, AdamW updates or None)); feeds tokens, targets."""
    return record_next_token(Llama, decays, config, batch, length, learning_rate, weight_decay, seed, train)


def record_generation(config: Config, batch: int = 1, length: int | None = None, seed: int = 0,
                      draw: bool = True):
    """Prefill and decode over one set of weights, as ``gpt2.record_generation``: (network, Generation)."""
    length = config.context if length is None else length
    if isinstance(length, bool) or not isinstance(length, numbers.Integral) or not 1 <= length <= config.context:
        from _training import ExampleError

        raise ExampleError(f"the cache length {length!r} must be an int in 1..{config.context} (the model's "
                           "context); pass a length in that range")

    def record(tape):
        model = Llama(config, draw=draw)
        tokens = tape.input(shape=(batch, length), extent=config.vocabulary, name="tokens")
        logits, prefill_caches = model(tokens)
        token = tape.input(shape=(batch, 1), extent=config.vocabulary, name="token")
        position = tape.input(shape=(1,), extent=length, name="position")
        caches = kv_cache.cache_inputs(tape, config.layers, (batch, config.kv_heads, length, config.head_dim),
                                       config.dtype)
        step_logits, written = model.decode(token, position, caches)
        return Generation(config.layers, batch, length, tokens, logits, tuple(prefill_caches), token, position,
                          caches, step_logits, tuple(written))

    return Tape.record(record, seed=seed)

