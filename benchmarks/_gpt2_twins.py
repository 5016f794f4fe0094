"""GPT-2's forward and KV-cache decode step in JAX and PyTorch: the twins benchmarks/gpt2.py and _zoo.py time.

Both read the weights by the example's names (``h.0.attn.c_attn.weight``,
...; ``examples/gpt2/gpt2.py``) from a dict of arrays, and write the same
mathematics as the example: pre-norm blocks, Conv1D's ``x @ w + b``
layout, tanh GELU, the additive causal mask, the tied head.
"""

from __future__ import annotations

import math

import numpy as np

MASKED = -1e9  # the additive mask value of topos.nn.functional.causal_mask, in every twin


# ---- the twins: the same mathematics in JAX and PyTorch -------------------------------------------


def jax_twin(config, named: dict, length: int):
    """(forward(params, tokens) -> logits, decode(params, token, position, caches) -> (logits, caches), params)."""
    import jax
    import jax.numpy as jnp

    d, h, hd = config.width, config.heads, config.head_dim
    params = {name: jax.device_put(array) for name, array in named.items()}

    def norm(x, p, name):
        mean = x.mean(-1, keepdims=True)
        centered = x - mean
        return centered / jnp.sqrt((centered * centered).mean(-1, keepdims=True) + 1e-5) * p[name + ".weight"] \
            + p[name + ".bias"]

    def conv1d(x, p, name):
        return x @ p[name + ".weight"] + p[name + ".bias"]

    def heads(x):
        b, t, _ = x.shape
        return x.reshape(b, t, h, hd).transpose(0, 2, 1, 3)

    def block(x, p, i, attend):
        pre = f"h.{i}."
        q, k, v = map(heads, jnp.split(conv1d(norm(x, p, pre + "ln_1"), p, pre + "attn.c_attn"), 3, axis=-1))
        y, cache = attend(q, k, v)
        b, _, t, _ = y.shape
        x = x + conv1d(y.transpose(0, 2, 1, 3).reshape(b, t, d), p, pre + "attn.c_proj")
        m = jax.nn.gelu(conv1d(norm(x, p, pre + "ln_2"), p, pre + "mlp.c_fc"), approximate=True)
        return x + conv1d(m, p, pre + "mlp.c_proj"), cache

    def softmax_attend(q, k, v, mask):
        scores = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(hd)) + mask
        return jax.nn.softmax(scores, axis=-1) @ v

    def logits(x, p):
        return norm(x, p, "ln_f") @ p["wte.weight"].T

    def forward(p, tokens):
        t = tokens.shape[1]
        mask = jnp.where(jnp.arange(t)[None, :] <= jnp.arange(t)[:, None], 0.0, MASKED).astype(jnp.float32)
        x = p["wte.weight"][tokens] + p["wpe.weight"][:t]
        for i in range(config.layers):
            x, _ = block(x, p, i, lambda q, k, v: (softmax_attend(q, k, v, mask), None))
        return logits(x, p)

    def decode(p, token, position, caches):
        mask = jnp.where(jnp.arange(length) <= position, 0.0, MASKED).astype(jnp.float32)
        x = p["wte.weight"][token] + jax.lax.dynamic_slice_in_dim(p["wpe.weight"], position, 1)[None]
        written = []
        for i in range(config.layers):
            def attend(q, k, v, i=i):
                keys = jax.lax.dynamic_update_slice(caches[i][0], k, (0, 0, position, 0))
                values = jax.lax.dynamic_update_slice(caches[i][1], v, (0, 0, position, 0))
                return softmax_attend(q, keys, values, mask), (keys, values)

            x, cache = block(x, p, i, attend)
            written.append(cache)
        return logits(x, p), written

    return jax.jit(forward), jax.jit(decode, donate_argnums=(3,)), params


def torch_twin(config, named: dict):
    """(forward(tokens) -> logits, decode(token, position, caches) -> logits), eager, over ``named``'s weights."""
    import torch

    nn = torch.nn.functional
    d, h, hd = config.width, config.heads, config.head_dim
    p = {name: torch.from_numpy(np.array(array)) for name, array in named.items()}

    def norm(x, name):
        return nn.layer_norm(x, (d,), p[name + ".weight"], p[name + ".bias"], eps=1e-5)

    def conv1d(x, name):
        return torch.addmm(p[name + ".bias"], x.reshape(-1, x.shape[-1]), p[name + ".weight"]).reshape(
            *x.shape[:-1], -1)

    def heads(x):
        b, t, _ = x.shape
        return x.view(b, t, h, hd).transpose(1, 2)

    def block(x, i, attend):
        pre = f"h.{i}."
        q, k, v = map(heads, conv1d(norm(x, pre + "ln_1"), pre + "attn.c_attn").split(d, dim=2))
        y = attend(q, k, v)
        b, _, t, _ = y.shape
        x = x + conv1d(y.transpose(1, 2).reshape(b, t, d), pre + "attn.c_proj")
        return x + conv1d(nn.gelu(conv1d(norm(x, pre + "ln_2"), pre + "mlp.c_fc"), approximate="tanh"),
                          pre + "mlp.c_proj")

    def logits(x):
        return norm(x, "ln_f") @ p["wte.weight"].T

    @torch.no_grad()
    def forward(tokens):
        ids = torch.from_numpy(tokens)
        t = ids.shape[1]
        mask = torch.full((t, t), MASKED).triu(1)
        x = p["wte.weight"][ids] + p["wpe.weight"][:t]
        for i in range(config.layers):
            x = block(x, i, lambda q, k, v: ((q @ k.transpose(-1, -2)) / math.sqrt(hd) + mask).softmax(-1) @ v)
        return logits(x).numpy()

    @torch.no_grad()
    def decode(token, position, caches):
        x = p["wte.weight"][torch.from_numpy(token)] + p["wpe.weight"][position]
        for i in range(config.layers):
            def attend(q, k, v, i=i):
                keys, values = caches[i]
                keys[:, :, position] = k[:, :, 0]
                values[:, :, position] = v[:, :, 0]
                seen_k, seen_v = keys[:, :, :position + 1], values[:, :, :position + 1]
                return ((q @ seen_k.transpose(-1, -2)) / math.sqrt(hd)).softmax(-1) @ seen_v

            x = block(x, i, attend)
        return logits(x).numpy()

    return forward, decode
