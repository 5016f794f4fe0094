"""GPT-2 recorded from the facades: the configs, the modules under Hugging Face's names, and its recordings.

The model is OpenAI's GPT-2 (Radford et al. 2019) as Hugging Face's
``GPT2Model`` spells it: learned token and position embeddings (``wte``,
``wpe``), ``layers`` pre-norm blocks (``h.{i}``: LayerNorm ``ln_1``, causal
self-attention ``attn`` with one fused q/k/v projection ``c_attn`` and an
output projection ``c_proj``, LayerNorm ``ln_2``, an MLP ``mlp.c_fc`` ->
GELU (tanh form) -> ``mlp.c_proj``), a final LayerNorm ``ln_f``, and the
output projection tied to the token table (``logits = x @ wte.weight.T``).
LayerNorm eps is 1e-5.

Names and layouts are Hugging Face's on purpose: every module here is
named as in ``GPT2Model``, and the projections are :class:`Conv1D`
(``weight [in, out]``, ``y = x @ W + b``, the layout OpenAI's checkpoints and
Hugging Face's ``Conv1D`` keep), so a ``model.safetensors`` loads by name
with no transposes; ``hf_gpt2.py`` holds the one table of what differs (a
``transformer.`` prefix, the ``attn.bias`` mask buffers).

Initialization is GPT-2's: N(0, 0.02) for every weight and both
embeddings, zero biases, unit LayerNorm gains, and the two residual
projections (``attn.c_proj``, ``mlp.c_proj``) N(0, 0.02 / sqrt(2 * layers)),
drawn with ``topos.init`` from the recording's generator; ``draw=False``
records zeros instead (cheap: for weights that a file will replace).

Two recordings: :func:`record_training` (a batch of sequences, the mean
next-token cross-entropy and AdamW recorded into the graph) and
:func:`record_generation`, one spec holding a prefill graph and a decode
graph over the same weight slots, for the KV cache (``kv_cache.py``, ``sampling.py``).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace

import numpy as np

import topos.nn.functional as F
from topos import Tape, init, nn, optim

import kv_cache
from kv_cache import Generation

LAYER_NORM_EPS = 1e-5


@dataclass(frozen=True)
class Config:
    """The sizes of one GPT-2: ``Config.preset("124M")`` is the smallest released model."""

    layers: int = 2
    heads: int = 2
    width: int = 64
    context: int = 64  # the longest sequence (rows of wpe)
    vocabulary: int = 256  # bytes, unless a BPE vocabulary is given
    dtype: str = "float32"

    @staticmethod
    def preset(name: str) -> Config:
        """``tiny`` (2 layers, 2 heads, width 64, context 64, bytes) or one of GPT-2's released sizes."""
        from _training import ExampleError

        if name not in PRESETS:
            raise ExampleError(f"unknown GPT-2 config {name!r}; pick one of {', '.join(PRESETS)}")
        return PRESETS[name]

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    def with_(self, **changes) -> Config:
        return replace(self, **changes)

    def check(self) -> None:
        """ExampleError unless every size is a positive int and the width splits evenly into the heads."""
        from _training import ExampleError

        sizes = {"layers": self.layers, "heads": self.heads, "width": self.width, "context": self.context,
                 "vocabulary": self.vocabulary}
        for name, size in sizes.items():
            if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
                raise ExampleError(f"GPT-2 {name} must be a positive int, got {size!r}: every size must be "
                                   f"positive ({self})")
        if self.width % self.heads:
            raise ExampleError(f"width {self.width} is not divisible by {self.heads} heads; pick a width that is "
                               "a multiple of the heads")

    def parameter_count(self) -> int:
        """Trainable scalars, from the shapes alone (124,439,808 for 124M: the tied head adds none)."""
        d, v, t = self.width, self.vocabulary, self.context
        block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
        return v * d + t * d + self.layers * block + 2 * d


_OPENAI = dict(context=1024, vocabulary=50257)
PRESETS = {
    "tiny": Config(),
    "124M": Config(layers=12, heads=12, width=768, **_OPENAI),
    "355M": Config(layers=24, heads=16, width=1024, **_OPENAI),
    "774M": Config(layers=36, heads=20, width=1280, **_OPENAI),
    "1558M": Config(layers=48, heads=25, width=1600, **_OPENAI),
}


def _normal(std: float, draw: bool):
    return init.normal(0.0, std) if draw else init.zeros()


class Conv1D(nn.Module):
    """OpenAI's and Hugging Face's "Conv1D": a linear layer stored ``[in, out]``, ``y = x @ weight + bias``.

    ``nn.Linear`` stores ``[out, in]`` (PyTorch's layout); GPT-2's files store
    the transpose, so this keeps theirs and the weights load by name.
    """

    def __init__(self, in_features: int, out_features: int, std: float, draw: bool, dtype):
        super().__init__()
        g = Tape.current().generator
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(_normal(std, draw)(g, (in_features, out_features), dtype))
        self.bias = nn.Parameter(np.zeros(out_features, dtype))

    def forward(self, x):
        self.check_input(x, self.in_features)
        lead = x.shape[:-1]
        rows = math.prod(lead)
        flat = x if x.ndim == 2 else x.reshape((rows, self.in_features))
        y = flat @ self.weight + self.bias.broadcast_along(0, rows)
        return y if x.ndim == 2 else y.reshape(lead + (self.out_features,))

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}"


class Attention(nn.Module):
    """Causal self-attention: ``c_attn`` (q, k, v in one [d, 3d] projection), heads, ``c_proj``."""

    def __init__(self, config: Config, draw: bool):
        super().__init__()
        d, std = config.width, 0.02
        self.heads, self.width = config.heads, d
        self.c_attn = Conv1D(d, 3 * d, std, draw, config.dtype)
        self.c_proj = Conv1D(d, d, std / math.sqrt(2 * config.layers), draw, config.dtype)

    def _heads(self, x):
        """[B, T, d] -> [B, heads, T, head_dim]."""
        b, t, _ = x.shape
        return x.reshape((b, t, self.heads, self.width // self.heads)).permute((0, 2, 1, 3))

    def project(self, x):
        """q, k, v of ``x`` [B, T, d], each [B, heads, T, head_dim]."""
        qkv = self.c_attn(x)
        return tuple(self._heads(qkv.narrow(2, i * self.width, self.width)) for i in range(3))

    def attend(self, q, k, v, mask):
        """softmax(q k^T / sqrt(head_dim) + mask) v, heads merged, through ``c_proj``."""
        y = F.scaled_dot_product_attention(q, k, v, mask)
        b, _, t, _ = y.shape
        return self.c_proj(y.permute((0, 2, 1, 3)).reshape((b, t, self.width)))

    def forward(self, x):
        q, k, v = self.project(x)
        return self.attend(q, k, v, F.causal_mask(x.shape[1], dtype=x.dtype)), (k, v)


class Mlp(nn.Module):
    """``c_fc`` (d -> 4d), GELU in its tanh form, ``c_proj`` (4d -> d)."""

    def __init__(self, config: Config, draw: bool):
        super().__init__()
        d, std = config.width, 0.02
        self.c_fc = Conv1D(d, 4 * d, std, draw, config.dtype)
        self.c_proj = Conv1D(4 * d, d, std / math.sqrt(2 * config.layers), draw, config.dtype)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-norm: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

    def __init__(self, config: Config, draw: bool):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.width, eps=LAYER_NORM_EPS, dtype=config.dtype)
        self.attn = Attention(config, draw)
        self.ln_2 = nn.LayerNorm(config.width, eps=LAYER_NORM_EPS, dtype=config.dtype)
        self.mlp = Mlp(config, draw)

    def forward(self, x, attention=None):
        """The block over ``x``; ``attention(attn, normed) -> (y, cache)`` replaces the causal one (decode)."""
        normed = self.ln_1(x)
        y, cache = self.attn(normed) if attention is None else attention(self.attn, normed)
        x = x + y
        return x + self.mlp(self.ln_2(x)), cache


class Gpt2(nn.Module):
    """GPT-2 under Hugging Face's ``GPT2Model`` names; ``forward`` gives the logits and each layer's (k, v)."""

    def __init__(self, config: Config, draw: bool = True):
        super().__init__()
        config.check()
        self.config = config
        d = config.width
        self.wte = nn.Embedding(config.vocabulary, d, dtype=config.dtype, init=_normal(0.02, draw))
        self.wpe = nn.Embedding(config.context, d, dtype=config.dtype, init=_normal(0.02, draw))
        self.h = nn.ModuleList([Block(config, draw) for _ in range(config.layers)])
        self.ln_f = nn.LayerNorm(d, eps=LAYER_NORM_EPS, dtype=config.dtype)

    def logits(self, x):
        """The tied output projection of the final hidden states: ``ln_f(x) @ wte.weight.T``.

        Spelled ``(wte.weight @ ln_f(x).T).T``: the same products summed in
        the same order (the oracle's bits are equal), but IREE then
        transposes the [rows, vocabulary] result instead of materializing
        the transpose of the [vocabulary, width] table on every call
        (at 124M: 66 instead of 285 ms per decoded token).
        """
        lead = x.shape[:-1]
        rows = math.prod(lead)
        flat = self.ln_f(x).reshape((rows, self.config.width))
        transposed = self.wte.weight @ flat.permute((1, 0))  # [vocabulary, rows]
        return transposed.permute((1, 0)).reshape(lead + (self.config.vocabulary,))

    def forward(self, tokens):
        """Logits [B, T, vocabulary] of tokens [B, T] (a selection), and each layer's (k, v) [B, heads, T, hd]."""
        b, t = tokens.shape
        if t > self.config.context:
            from _training import ExampleError

            raise ExampleError(f"{t} tokens do not fit the context of {self.config.context}; pass at most "
                               f"{self.config.context} tokens or record a model with a longer context")
        positions = self.wpe.weight.narrow(0, 0, t)
        x = self.wte(tokens) + positions.broadcast_to((b, t, self.config.width))
        caches = []
        for block in self.h:
            x, cache = block(x)
            caches.append(cache)
        return self.logits(x), caches

    def decode(self, token, position, caches):
        """One step: logits [B, 1, vocabulary] of token [B, 1] at ``position`` (a selection [1] of extent L).

        ``caches`` holds every layer's previous (keys, values), each
        ``[B, heads, L, head_dim]`` for a cache of L positions (L <= context);
        returns the logits and the caches with this token's k and v written
        at ``position`` (``kv_cache.write_row``), attention seeing positions
        up to it only.
        """
        b, dtype = token.shape[0], self.config.dtype
        length = caches[0][0].shape[2]
        place, mask = kv_cache.one_hot(position, length, dtype), kv_cache.visible(position, length, dtype)
        embedded = self.wpe.weight.narrow(0, 0, length).gather(position)  # [1, d]
        x = self.wte(token) + embedded.broadcast_to((b, 1, self.config.width))
        written = []
        for block, (keys, values) in zip(self.h, caches):
            def attention(attn, normed, keys=keys, values=values):
                q, k, v = attn.project(normed)  # [B, heads, 1, hd]
                keys, values = kv_cache.write_row(keys, k, place), kv_cache.write_row(values, v, place)
                return attn.attend(q, keys, values, mask), (keys, values)

            x, cache = block(x, attention)
            written.append(cache)
        return self.logits(x), written


def decays(name: str) -> bool:
    """AdamW's weight decay policy: matrices and embeddings decay, biases and LayerNorm gains do not."""
    return name.endswith(".weight") and ".ln_" not in name and not name.startswith("ln_")


def record_training(config: Config, batch: int, length: int, learning_rate: float = 1e-3,
                    weight_decay: float = 0.1, seed: int = 0, train: bool = True):
    """A recording over ``batch`` sequences of ``length`` tokens: (network, (model, loss, updates or None)).

    Feeds: ``tokens`` [batch, length] and ``targets`` [batch * length]
    (the next token of every position); with ``train``, AdamW (betas 0.9,
    0.95 as GPT-2's successors train) is recorded into the graph and fed
    ``optim.lr`` per step.
    """

    return record_next_token(Gpt2, decays, config, batch, length, learning_rate, weight_decay, seed, train)


def record_next_token(model_class, decays, config, batch: int, length: int, learning_rate: float,
                      weight_decay: float, seed: int, train: bool):
    """The next-token recording ``record_training`` describes, for any model ``model_class(config)``.

    The model returns ``(logits, caches)``; ``decays(name)`` is AdamW's
    weight-decay policy by parameter name. Shared with ``llama.record_training``.
    """

    def record(tape):
        model = model_class(config)
        tokens = tape.input(shape=(batch, length), extent=config.vocabulary, name="tokens")
        targets = tape.input(shape=(batch * length,), extent=config.vocabulary, name="targets")
        logits, _ = model(tokens)
        loss = F.cross_entropy(logits.reshape((batch * length, config.vocabulary)), targets)
        if not train:
            return model, loss, None
        optimizer = optim.AdamW(lr=learning_rate, betas=(0.9, 0.95), weight_decay=weight_decay, decay=decays)
        return model, loss, optimizer.record(tape.differentiate(loss, model.parameters()))

    return Tape.record(record, seed=seed)


def record_generation(config: Config, batch: int = 1, length: int | None = None, seed: int = 0,
                      draw: bool = True):
    """One spec with both generation graphs over one set of weights: (network, kv_cache.Generation).

    The prefill graph reads ``tokens`` [batch, L] (padded past the
    prompt) and gives every position's logits and each layer's keys and
    values; the decode graph reads one ``token`` [batch, 1], its
    ``position`` (a selection of extent L) and the caches
    ``cache.{i}.keys`` / ``cache.{i}.values`` as fed inputs, and gives the
    logits and the updated caches. Compile them as two entries.
    """
    length = config.context if length is None else length
    if isinstance(length, bool) or not isinstance(length, numbers.Integral) or not 1 <= length <= config.context:
        from _training import ExampleError

        raise ExampleError(f"the cache length {length!r} must be an int in 1..{config.context} (the model's "
                           "context); pass a length in that range")

    def record(tape):
        model = Gpt2(config, draw=draw)
        tokens = tape.input(shape=(batch, length), extent=config.vocabulary, name="tokens")
        logits, prefill_caches = model(tokens)
        token = tape.input(shape=(batch, 1), extent=config.vocabulary, name="token")
        position = tape.input(shape=(1,), extent=length, name="position")
        caches = kv_cache.cache_inputs(tape, config.layers, (batch, config.heads, length, config.head_dim),
                                       config.dtype)
        step_logits, written = model.decode(token, position, caches)
        return Generation(config.layers, batch, length, tokens, logits, tuple(prefill_caches), token, position,
                          caches, step_logits, tuple(written))

    network, generation = Tape.record(record, seed=seed)
    return network, generation
