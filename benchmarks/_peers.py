"""The same training steps in JAX (``jax.jit``) and PyTorch (eager): the compiled benchmark's peers.

The mathematics is written once (``_mlp_loss``, ``_gpt_loss``) against a
few operations that each framework spells its own way (``_Ops``), so the
JAX and PyTorch columns run the same formulas as the recording in
``_gpt.py``: same parameters, same feeds, same LayerNorm formula (biased
variance, eps 1e-5), the same additive causal mask, exact (erf) GELU,
log_softmax cross-entropy against one-hot targets, and ``p - lr * g``.
PyTorch's LayerNorm is ``F.layer_norm``, its fused spelling of that same
formula; everything else is the composition written out.

Both peers keep the parameters on their device between steps and take
the batch as host NumPy arrays each step, as ``CompiledPlan.step`` does.
JAX and PyTorch are benchmark-only extras: importing this module imports
neither; each peer imports its framework when it is built.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from _gpt import EPS, Workload, causal_mask


@dataclass
class Peer:
    """One framework's training step: ``step(state) -> (state, loss)`` runs to completion."""

    name: str
    version: str
    start: Callable[[], object]  # -> device-resident state holding the workload's initial parameters
    step: Callable[[object], tuple]  # state -> (next state, loss on the device)
    loss: Callable[[object], float]  # a step's loss as a Python float
    parameters: Callable[[object], dict]  # state -> {name: NumPy array}
    compile_seconds: float | None = None  # jax.jit: lower + compile; None for eager frameworks
    kernels: int | None = None  # jax.jit: kernels in the optimized entry computation
    memory: dict | None = None  # jax.jit: XLA's memory analysis (argument, output, temp, alias bytes)
    lowering: Callable[[object], tuple] | None = None  # jax.jit: state -> (its Lowered step, its arguments)


# ---- the mathematics, once ------------------------------------------------------------------------


class _Ops:
    """What the loss functions need beyond operators: one subclass per framework."""

    def tanh(self, x): ...
    def log_softmax(self, x): ...  # over the last axis
    def softmax(self, x): ...  # over the last axis
    def gelu(self, x): ...  # exact (erf) GELU
    def layer_norm(self, x, gain, bias): ...  # over the last axis, biased variance, EPS
    def permute(self, x, order): ...
    def take_rows(self, table, indices): ...


def _mlp_loss(ops: _Ops, p: dict, f: dict, layers: int):
    h = f["x"]
    for layer in range(layers):
        h = h @ p[f"w{layer}"] + p[f"b{layer}"]
        if layer < layers - 1:
            h = ops.tanh(h)
    return -(ops.log_softmax(h) * f["targets"]).sum() / h.shape[0]


def _gpt_loss(ops: _Ops, p: dict, f: dict, config, mask):
    b, t, d, h = config.batch, config.context, config.width, config.heads
    head = d // h
    if config.embedding == "one-hot":
        embedded = (f["tokens"] @ p["token_embedding"]).reshape(b, t, d)
    else:
        embedded = ops.take_rows(p["token_embedding"], f["tokens"])
    x = (embedded + p["position_embedding"]).reshape(b * t, d)
    for layer in range(config.layers):
        q_ = f"h{layer}."
        a = ops.layer_norm(x, p[q_ + "ln1.gain"], p[q_ + "ln1.bias"])
        qkv = a @ p[q_ + "attn.w_qkv"] + p[q_ + "attn.b_qkv"]
        q = ops.permute(qkv[:, :d].reshape(b, t, h, head), (0, 2, 1, 3))
        k = ops.permute(qkv[:, d:2 * d].reshape(b, t, h, head), (0, 2, 3, 1))
        v = ops.permute(qkv[:, 2 * d:].reshape(b, t, h, head), (0, 2, 1, 3))
        weights = ops.softmax((q @ k) * (1.0 / math.sqrt(head)) + mask)
        y = ops.permute(weights @ v, (0, 2, 1, 3)).reshape(b * t, d)
        x = x + (y @ p[q_ + "attn.w_out"] + p[q_ + "attn.b_out"])
        m = ops.layer_norm(x, p[q_ + "ln2.gain"], p[q_ + "ln2.bias"])
        x = x + (ops.gelu(m @ p[q_ + "mlp.w_in"] + p[q_ + "mlp.b_in"]) @ p[q_ + "mlp.w_out"] + p[q_ + "mlp.b_out"])
    x = ops.layer_norm(x, p["ln_f.gain"], p["ln_f.bias"])
    logits = x @ ops.permute(p["token_embedding"], (1, 0))
    return -(ops.log_softmax(logits) * f["targets"]).sum() / (b * t)


def _loss_function(workload: Workload, ops: _Ops, constant):
    """loss(parameters, feeds) for the workload; ``constant`` turns a NumPy array into a framework array."""
    if workload.kind == "mlp":
        layers = len(workload.config.sizes) - 1
        return lambda p, f: _mlp_loss(ops, p, f, layers)
    mask = constant(causal_mask(workload.config.context))
    return lambda p, f: _gpt_loss(ops, p, f, workload.config, mask)


# ---- JAX ------------------------------------------------------------------------------------------


def _count_kernels(hlo_text: str) -> int:
    """Instructions of the optimized ENTRY computation that run code (fusions, dots, custom calls...)."""
    inert = ("parameter(", "tuple(", "get-tuple-element(", "bitcast(", "constant(", "copy-start(", "copy-done(")
    count, inside = 0, False
    for line in hlo_text.splitlines():
        if line.startswith("ENTRY"):
            inside = True
            continue
        if inside:
            if line.startswith("}"):
                break
            body = line.split("=", 1)[-1]
            if not any(f" {word}" in body or body.lstrip().startswith(word) for word in inert):
                count += 1
    return count


def memory_analysis(compiled) -> dict | None:
    """XLA's memory analysis of a jax.jit-compiled function (argument, output, temp, alias bytes), or None."""
    try:
        analysis = compiled.memory_analysis()
        return {"argument": analysis.argument_size_in_bytes, "output": analysis.output_size_in_bytes,
                "temp": analysis.temp_size_in_bytes, "alias": analysis.alias_size_in_bytes}
    except Exception:  # noqa: BLE001  (a backend without the analysis: the column says so)
        return None


def jax_peer(workload: Workload) -> Peer:
    """``jax.jit`` of value_and_grad + SGD; parameters donated, so XLA may update them in place."""
    import jax
    import jax.numpy as jnp

    class Ops(_Ops):
        tanh = staticmethod(jnp.tanh)
        gelu = staticmethod(lambda x: jax.nn.gelu(x, approximate=False))
        permute = staticmethod(jnp.transpose)
        take_rows = staticmethod(lambda table, indices: jnp.take(table, indices, axis=0))

        def log_softmax(self, x):
            return jax.nn.log_softmax(x, axis=-1)

        def softmax(self, x):
            return jax.nn.softmax(x, axis=-1)

        def layer_norm(self, x, gain, bias):
            centered = x - x.mean(axis=-1, keepdims=True)
            variance = (centered * centered).mean(axis=-1, keepdims=True)
            return centered / jnp.sqrt(variance + EPS) * gain + bias

    loss_of = _loss_function(workload, Ops(), jnp.asarray)
    rate = workload.learning_rate

    def train(parameters, feeds):
        loss, gradients = jax.value_and_grad(loss_of)(parameters, feeds)
        return {k: parameters[k] - rate * gradients[k] for k in parameters}, loss

    jitted = jax.jit(train, donate_argnums=0)
    feeds = _jax_feeds(workload)

    def start():
        return {k: jax.device_put(v) for k, v in workload.named_parameters().items()}

    began = time.perf_counter()
    compiled = jitted.lower(start(), feeds).compile()
    seconds = time.perf_counter() - began
    try:
        kernels = _count_kernels(compiled.as_text())
    except Exception:  # noqa: BLE001  (the text form is informational only)
        kernels = None
    memory = memory_analysis(compiled)

    def step(state):
        state, loss = jitted(state, feeds)
        jax.block_until_ready(state)
        return state, loss

    return Peer(
        name="jax.jit", version=f"jax {jax.__version__}", start=start, step=step,
        loss=lambda loss: float(loss), parameters=lambda state: {k: np.asarray(v) for k, v in state.items()},
        compile_seconds=seconds, kernels=kernels, memory=memory,
        lowering=lambda state: (jitted.lower(state, feeds), (state, feeds)),
    )


def _jax_feeds(workload: Workload) -> dict:
    feeds = dict(workload.named_feeds)
    if "tokens" in feeds and feeds["tokens"].dtype.kind in "iu":
        feeds["tokens"] = feeds["tokens"].astype(np.int32)  # JAX without x64 indexes with int32
    return feeds


# ---- PyTorch --------------------------------------------------------------------------------------


def torch_peer(workload: Workload) -> Peer:
    """PyTorch eager: autograd.grad, then ``p -= lr * g`` in place under no_grad."""
    import torch
    import torch.nn.functional as F

    d = workload.config.width if workload.kind == "gpt" else None

    class Ops(_Ops):
        tanh = staticmethod(torch.tanh)
        gelu = staticmethod(F.gelu)  # approximate="none": erf
        permute = staticmethod(torch.permute)
        take_rows = staticmethod(lambda table, indices: table[indices])

        def log_softmax(self, x):
            return F.log_softmax(x, dim=-1)

        def softmax(self, x):
            return F.softmax(x, dim=-1)

        def layer_norm(self, x, gain, bias):
            return F.layer_norm(x, (d,), gain, bias, EPS)

    loss_of = _loss_function(workload, Ops(), torch.from_numpy)
    rate = workload.learning_rate

    def start():
        return {k: torch.tensor(v, requires_grad=True) for k, v in workload.named_parameters().items()}

    def step(state):
        feeds = {k: torch.from_numpy(v) for k, v in workload.named_feeds.items()}
        loss = loss_of(state, feeds)
        gradients = torch.autograd.grad(loss, list(state.values()))
        with torch.no_grad():
            for parameter, gradient in zip(state.values(), gradients):
                parameter.sub_(gradient * rate)
        return state, loss

    return Peer(
        name="PyTorch eager", version=f"torch {torch.__version__}", start=start, step=step,
        loss=lambda loss: float(loss.detach()),
        parameters=lambda state: {k: v.detach().numpy().copy() for k, v in state.items()},
    )


PEERS = {"jax": jax_peer, "torch": torch_peer}


def available() -> dict:
    """Peer name -> builder for the frameworks importable here, or the reason it is not."""
    import importlib

    found = {}
    for name, builder in PEERS.items():
        try:
            importlib.import_module(name)
            found[name] = builder
        except Exception as error:  # noqa: BLE001  (ImportError, or a broken install failing its own way)
            found[name] = f"{name} is not importable ({error.__class__.__name__}: {error})"
    return found
