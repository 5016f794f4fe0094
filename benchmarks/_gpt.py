"""The compiled benchmark's models, recorded with topos's public API: two MLPs and a small GPT.

Each builder returns a :class:`Workload`: one SGD training step
(forward, recorded reverse mode, in-graph SGD update) in every form the
benchmark times, plus the same parameters and feeds by name, so that
``_peers.py`` can write the same mathematics in JAX and PyTorch.

* ``forward``  the forward graph only: the oracle reads it with
  ``network.forward`` + ``run.backward(loss)``.
* ``trained``  the same network reopened, with ``tape.differentiate``'s
  gradients and ``topos.sgd``'s updates appended: the FAST plan runs it
  over ``adjoints.roots()``; the IREE backend compiles it over
  ``updates.roots(loss)`` into one function.

The GPT is GPT-2's shape, scaled down: learned token and position
embeddings (the token table picked by ``gather`` with a fed selection,
and tied to the output projection), pre-norm blocks with
``topos.nn.functional.layer_norm``, causal self-attention by
``scaled_dot_product_attention`` with its mask a recorded leaf (0 on and
below the diagonal, -1e9 above, ``causal_mask``) added to the scores, an
exact-GELU MLP of width 4 x d, a final LayerNorm, and mean
``cross_entropy`` against one-hot targets. Weights keep the ``x @ w``
layout ``[in, out]`` the JAX and PyTorch peers in ``_peers.py`` share.
Everything is float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

import topos
import topos.nn.functional as F
from topos import Tape

LEARNING_RATE = 0.1
EPS = 1e-5  # LayerNorm's variance floor


@dataclass(frozen=True)
class Workload:
    """One training step of one model, as every column of the benchmark needs it."""

    name: str
    kind: str  # "mlp" or "gpt": which peer function computes the same loss
    config: object  # MlpConfig or GptConfig
    forward: object  # Network: the forward graph only
    trained: object  # Network: forward + recorded gradients + in-graph SGD
    loss: object  # Symbol (valid in both networks)
    adjoints: object  # Adjoints over ``trained`` (detached)
    updates: object  # Updates over ``trained`` (detached)
    parameters: object  # Parameters: serves both networks
    weights: dict  # parameter name -> Symbol (insertion order is recording order)
    feeds: dict  # input Symbol -> array
    named_feeds: dict  # input name -> array (tokens as int64 indices for the GPT)
    inputs: dict  # input name -> Symbol
    learning_rate: float = LEARNING_RATE

    def named_parameters(self, parameters=None) -> dict:
        """Parameter arrays by name (from ``parameters``, default the initial table)."""
        table = self.parameters if parameters is None else parameters
        return {name: table[symbol] for name, symbol in self.weights.items()}

    def volume(self) -> int:
        """Number of trainable scalars."""
        return sum(int(np.prod(self.parameters[s].shape)) for s in self.weights.values())


def _finish(name, kind, config, build, learning_rate=LEARNING_RATE) -> Workload:
    """Record ``build`` (-> loss, weights by name, inputs by name as (Value, array)), then train it."""
    forward, (loss, weights, inputs) = Tape.record(build)
    tape = forward.reopen()
    adjoints = tape.differentiate(tape.resolve(loss), [tape.resolve(w) for w in weights.values()])
    updates = topos.sgd(tape, adjoints, learning_rate)
    trained = tape.seal()
    return Workload(
        name=name, kind=kind, config=config, forward=forward, trained=trained, loss=loss,
        adjoints=adjoints.detach(), updates=updates.detach(), parameters=forward.parameters(),
        weights=weights, feeds={symbol: array for symbol, array in inputs.values()},
        named_feeds={key: array for key, (_, array) in inputs.items()},
        inputs={key: symbol for key, (symbol, _) in inputs.items()}, learning_rate=learning_rate,
    )


def _one_hot(labels: np.ndarray, classes: int) -> np.ndarray:
    return np.eye(classes, dtype=np.float32)[labels]


# ---- MLPs -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MlpConfig:
    sizes: tuple = (784, 128, 10)  # features, hidden..., classes
    batch: int = 64


def mlp(config: MlpConfig = MlpConfig(), seed: int = 0) -> Workload:
    """A tanh MLP, ``x @ w + b`` per layer, log_softmax cross-entropy against one-hot targets."""
    rng = np.random.default_rng(seed)
    sizes, batch = config.sizes, config.batch
    images = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    labels = _one_hot(rng.integers(0, sizes[-1], batch), sizes[-1])
    initial = {}
    for layer, (fan_in, fan_out) in enumerate(pairwise(sizes)):
        initial[f"w{layer}"] = (rng.standard_normal((fan_in, fan_out)) / math.sqrt(fan_in)).astype(np.float32)
        initial[f"b{layer}"] = np.zeros(fan_out, np.float32)

    def build(tape):
        x = tape.input(images)
        targets = tape.input(labels)
        weights = {name: tape.parameter(array) for name, array in initial.items()}
        h = x
        layers = len(sizes) - 1
        for layer in range(layers):
            h = h @ weights[f"w{layer}"] + weights[f"b{layer}"].broadcast_along(0, batch)
            if layer < layers - 1:
                h = h.tanh()
        loss = F.cross_entropy(h, targets)
        return loss, weights, {"x": (x, images), "targets": (targets, labels)}

    name = f"MLP {'-'.join(map(str, sizes))}, batch {batch}"
    return _finish(name, "mlp", config, build)


# ---- the small GPT --------------------------------------------------------------------------------


@dataclass(frozen=True)
class GptConfig:
    layers: int = 2
    width: int = 128
    heads: int = 4
    context: int = 64
    vocabulary: int = 65
    batch: int = 8
    # "gather": the token table picked by a fed selection (its gradient is a scatter);
    # "one-hot": a fed one-hot [batch * context, vocabulary] matrix times the table, the
    # same numbers without gather/scatter (a diagnostic for the compiled benchmark).
    embedding: str = "gather"


def causal_mask(context: int) -> np.ndarray:
    """0 where a position may attend (itself and earlier), -1e9 above the diagonal (float32)."""
    return np.array(F.causal_mask(context))  # writable: the PyTorch peer wraps it


def gpt_initial(config: GptConfig, rng: np.random.Generator) -> dict:
    """GPT-2's initialization: N(0, 0.02) matrices and embeddings, zero biases, unit LayerNorm gains."""
    d, v, t = config.width, config.vocabulary, config.context

    def normal(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    initial = {"token_embedding": normal(v, d), "position_embedding": normal(t, d)}
    for layer in range(config.layers):
        p = f"h{layer}."
        initial.update({
            p + "ln1.gain": np.ones(d, np.float32), p + "ln1.bias": np.zeros(d, np.float32),
            p + "attn.w_qkv": normal(d, 3 * d), p + "attn.b_qkv": np.zeros(3 * d, np.float32),
            p + "attn.w_out": normal(d, d), p + "attn.b_out": np.zeros(d, np.float32),
            p + "ln2.gain": np.ones(d, np.float32), p + "ln2.bias": np.zeros(d, np.float32),
            p + "mlp.w_in": normal(d, 4 * d), p + "mlp.b_in": np.zeros(4 * d, np.float32),
            p + "mlp.w_out": normal(4 * d, d), p + "mlp.b_out": np.zeros(d, np.float32),
        })
    initial.update({"ln_f.gain": np.ones(d, np.float32), "ln_f.bias": np.zeros(d, np.float32)})
    return initial


def _rows(vector, rows: int):
    """A [d] vector repeated over ``rows`` rows -> [rows, d]."""
    return vector.broadcast_along(0, rows)


def _linear(x, w, b):
    return x @ w + _rows(b, x.shape[0])


def _attention(x, w, p: str, mask, config: GptConfig):
    """Causal multi-head self-attention of [batch * context, d] rows."""
    b, t, d, h = config.batch, config.context, config.width, config.heads
    head = d // h
    qkv = _linear(x, w[p + "attn.w_qkv"], w[p + "attn.b_qkv"])  # [b*t, 3d]

    def heads(k: int, order):
        return qkv.narrow(1, k * d, d).reshape((b, t, h, head)).permute(order)

    q, k, v = (heads(i, (0, 2, 1, 3)) for i in range(3))  # [b, h, t, head]
    y = F.scaled_dot_product_attention(q, k, v, mask).permute((0, 2, 1, 3)).reshape((b * t, d))
    return _linear(y, w[p + "attn.w_out"], w[p + "attn.b_out"])


def gpt(config: GptConfig = GptConfig(), seed: int = 0) -> Workload:
    """A small GPT: tied token embedding, learned positions, pre-norm blocks, exact GELU."""
    if config.width % config.heads:
        raise ValueError(f"width {config.width} is not divisible by {config.heads} heads")
    if config.embedding not in ("gather", "one-hot"):
        raise ValueError(f"embedding {config.embedding!r} is neither 'gather' nor 'one-hot'")
    rng = np.random.default_rng(seed)
    b, t, v = config.batch, config.context, config.vocabulary
    initial = gpt_initial(config, rng)
    stream = rng.integers(0, v, (b, t + 1))
    tokens, labels = stream[:, :-1], _one_hot(stream[:, 1:].reshape(-1), v)

    one_hot = config.embedding == "one-hot"
    fed_tokens = _one_hot(tokens.reshape(-1), v) if one_hot else tokens

    def build(tape):
        token_input = tape.input(fed_tokens if one_hot else topos.selection(tokens, v))
        targets = tape.input(labels)
        w = {name: tape.parameter(array) for name, array in initial.items()}
        mask = tape.leaf(causal_mask(t)).broadcast_along(0, config.heads).broadcast_along(0, b)
        if one_hot:
            embedded = (token_input @ w["token_embedding"]).reshape((b, t, config.width))
        else:
            embedded = w["token_embedding"].gather(token_input)  # [b, t, d]
        positions = w["position_embedding"].broadcast_along(0, b)
        x = (embedded + positions).reshape((b * t, config.width))
        for layer in range(config.layers):
            p = f"h{layer}."
            x = x + _attention(F.layer_norm(x, w[p + "ln1.gain"], w[p + "ln1.bias"], EPS), w, p, mask, config)
            normed = F.layer_norm(x, w[p + "ln2.gain"], w[p + "ln2.bias"], EPS)
            hidden = _linear(normed, w[p + "mlp.w_in"], w[p + "mlp.b_in"])
            x = x + _linear(hidden.gelu(), w[p + "mlp.w_out"], w[p + "mlp.b_out"])
        x = F.layer_norm(x, w["ln_f.gain"], w["ln_f.bias"], EPS)
        logits = x @ w["token_embedding"].permute((1, 0))  # tied: [b*t, d] @ [d, v]
        loss = F.cross_entropy(logits, targets)
        return loss, w, {"tokens": (token_input, fed_tokens), "targets": (targets, labels)}

    name = (f"GPT {config.layers}x{config.width}, {config.heads} heads, context {t}, "
            f"vocab {v}, batch {b}" + (", one-hot embedding" if one_hot else ""))
    return _finish(name, "gpt", config, build)


def mlp_s() -> Workload:
    return mlp(MlpConfig((784, 128, 10), 64))


def mlp_m() -> Workload:
    return mlp(MlpConfig((784, 1024, 1024, 10), 128))


def small_gpt() -> Workload:
    return gpt(GptConfig())


__all__ = ["GptConfig", "MlpConfig", "Workload", "causal_mask", "gpt", "mlp", "mlp_m", "mlp_s", "small_gpt"]
