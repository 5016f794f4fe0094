"""makemore's MLP and transformer beside their PyTorch and JAX twins: the same loss curves, and the time of a step.

For each of ``examples/makemore/mlp.py`` (SGD) and
``examples/makemore/transformer.py`` (AdamW) this builds

* topos: the example's own recording (``recorder``), its compiled step
  (``plan.compile("llvm-cpu")``, ``compiled.step``) and its oracle step
  (``network.forward`` + ``updates.apply``);
* a PyTorch twin: ``torch.nn`` modules whose ``state_dict`` names are the
  topos names (``C.weight``, ``blocks.0.attn.in_proj_weight``, ...), so the
  initial table loads by name with ``load_state_dict(strict=True)``; the
  optimizer is ``torch.optim.SGD`` / ``torch.optim.AdamW``;
* a JAX twin: the same mathematics written in ``jax.numpy`` over a dict
  keyed by those names, ``jax.value_and_grad`` and the same optimizer
  written in JAX, all under one ``jax.jit`` (parameters donated).

All three start from topos's initial weights, read the same batches (the
example's own index arrays) and follow the example's learning-rate
schedule. The first table is how far the loss curves drift apart over
``--steps`` steps in float32 (relative to PyTorch's loss): they agree at
the first step to rounding and separate slowly as rounding differences
compound. The second is the CPU time of one training step, including
reading the loss as a Python float, measured in interleaved rounds (each
round times a few steps of every column) so a change in machine load lands
on every column alike; each cell is the median per-step process CPU time.
Ratios are each column's time over topos IREE's (above 1: topos is faster).

One process, one core: the process pins itself to one CPU before anything
loads (XLA and OpenMP size their thread pools by the affinity mask), sets
OPENBLAS/OMP/MKL_NUM_THREADS=1 and ``torch.set_num_threads(1)``; IREE's
local-sync driver is single-threaded. Nothing is asserted.

Run: python benchmarks/makemore_twins.py [--steps 300] [--rounds 5] [--models mlp,transformer] [--tiny]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__":  # run as the benchmark: one core; imported (by _zoo.py), the script's setting stands
    import _pinning  # first: it pins before NumPy or JAX load
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # XLA's start-up chatter

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import itertools  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
MAKEMORE = HERE.parent / "examples" / "makemore"
sys.path.insert(0, str(HERE))
from _timing import interleaved, table  # noqa: E402

# The examples' own options at the sizes tests/test_examples_makemore.py trains them (--tiny): the
# same recordings, so the smoke test's compiles come from the cache that test filled.
TINY = {"mlp": ["--hidden", "16"],
        "transformer": ["--heads", "1", "--head-size", "8", "--batch", "4"]}


def _example(name: str):
    """examples/makemore/<name>.py as a module (it puts examples/ and examples/makemore on sys.path itself)."""
    spec = importlib.util.spec_from_file_location(f"makemore_{name}", MAKEMORE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Workload:
    """One example's training: the topos recording, the batches, the schedule, the initial weights by name."""

    name: str
    args: argparse.Namespace
    network: object
    loss: object
    updates: object
    feeds: list  # one dict per step: the example's feeds (index arrays and the rate)
    initial: dict  # name -> float32 array: the trainable parameters topos starts from
    vocabulary: int
    columns: dict = field(default_factory=dict)


def mlp_workload(steps: int, tiny: bool) -> Workload:
    mlp = _example("mlp")
    args = mlp.command_line().parse_args((TINY["mlp"] if tiny else []) + ["--steps", str(steps)])
    from series import windows  # examples/makemore is on sys.path once an example is loaded

    names, (xs, ys), _, picks = windows(args, args.context)  # the example's own batches
    feeds = [{"context": xs[rows], "next": ys[rows], "optim.lr": mlp.learning_rate(args, k)}
             for k, rows in enumerate(picks)]
    network, (loss, updates) = mlp.recorder(names, args, args.batch, "sgd")
    return Workload("mlp", args, network, loss, updates, feeds, _trainable(network), names.vocabulary)


def transformer_workload(steps: int, tiny: bool) -> Workload:
    transformer = _example("transformer")
    args = transformer.command_line().parse_args((TINY["transformer"] if tiny else []) + ["--steps", str(steps)])
    from series import windows

    names, (xs, ys), _, picks = windows(args, args.context)
    targets = transformer.targets(names, xs, ys)
    feeds = [{"context": xs[rows], "next": targets[rows].reshape(-1), "optim.lr": transformer.learning_rate(args, k)}
             for k, rows in enumerate(picks)]
    network, (loss, updates, _, _) = transformer.recorder(names, args)
    return Workload("transformer", args, network, loss, updates, feeds, _trainable(network), names.vocabulary)


def _trainable(network) -> dict:
    table = network.parameters()
    return {name: np.array(table[name]) for name in table.names() if table.trainable(name)}


# ---- topos: the compiled step and the oracle step ------------------------------------------------------


def topos_columns(work: Workload) -> None:
    compiled = work.network.entry(work.updates.roots(work.loss)).lower().compile("llvm-cpu")
    device = {"state": compiled.resident(work.network.parameters())}
    host = {"state": work.network.parameters()}

    def iree(feeds):
        device["state"], run = compiled.step(device["state"], feeds, work.updates)
        return float(run[work.loss])

    def oracle(feeds):
        run = work.network.forward(host["state"], feeds)
        host["state"] = work.updates.apply(host["state"], run)
        return float(run[work.loss])

    work.columns["topos IREE"] = iree
    work.columns["topos oracle"] = oracle


# ---- PyTorch ----------------------------------------------------------------------------------------------


def torch_column(work: Workload) -> None:
    import torch

    torch.set_num_threads(1)
    nn, functional = torch.nn, torch.nn.functional
    a = work.args
    if work.name == "mlp":
        class Mlp(nn.Module):
            def __init__(self):
                super().__init__()
                self.C = nn.Embedding(work.vocabulary, a.embedding)
                self.hidden = nn.Linear(a.context * a.embedding, a.hidden)
                self.out = nn.Linear(a.hidden, work.vocabulary)

            def forward(self, tokens):
                return self.out(torch.tanh(self.hidden(self.C(tokens).reshape(tokens.shape[0], -1))))

        model = Mlp()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def loss_of(feeds):
            return functional.cross_entropy(model(torch.from_numpy(feeds["context"])), torch.from_numpy(feeds["next"]))
    else:
        width = a.heads * a.head_size
        mask = torch.from_numpy(np.triu(np.full((a.context, a.context), -1e9, np.float32), k=1))  # topos's mask

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.ln1 = nn.LayerNorm(width)
                self.attn = nn.MultiheadAttention(width, a.heads, batch_first=True)
                self.ln2 = nn.LayerNorm(width)
                self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

            def forward(self, x):
                h = self.ln1(x)
                x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
                return x + self.mlp(self.ln2(x))

        class Transformer(nn.Module):
            def __init__(self):
                super().__init__()
                self.token_embedding = nn.Embedding(work.vocabulary, width)
                self.position_embedding = nn.Embedding(a.context, width)
                self.blocks = nn.ModuleList([Block() for _ in range(a.layers)])
                self.ln_f = nn.LayerNorm(width)
                self.head = nn.Linear(width, work.vocabulary, bias=False)

            def forward(self, tokens):
                x = self.token_embedding(tokens) + self.position_embedding(torch.arange(tokens.shape[1]))
                for block in self.blocks:
                    x = block(x)
                return self.head(self.ln_f(x))

        model = Transformer()
        optimizer = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)

        def loss_of(feeds):
            logits = model(torch.from_numpy(feeds["context"]))
            return functional.cross_entropy(logits.reshape(-1, work.vocabulary), torch.from_numpy(feeds["next"]),
                                            ignore_index=work.vocabulary)

    # The point of the names: topos's initial table loads as it is, strictly, by name.
    model.load_state_dict({name: torch.from_numpy(array.copy()) for name, array in work.initial.items()}, strict=True)

    def step(feeds):
        for group in optimizer.param_groups:
            group["lr"] = feeds["optim.lr"]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(feeds)
        loss.backward()
        optimizer.step()
        return float(loss.item())

    work.columns[f"PyTorch {torch.__version__.split('+')[0]} eager"] = step


# ---- JAX -------------------------------------------------------------------------------------------------


def _batch_and_rate(feeds) -> tuple:
    return {"context": feeds["context"], "next": feeds["next"]}, np.float32(feeds["optim.lr"])


def jax_column(work: Workload) -> None:
    import jax
    import jax.numpy as jnp

    a, vocabulary = work.args, work.vocabulary

    def layer_norm(x, weight, bias):
        mean = x.mean(-1, keepdims=True)
        centered = x - mean
        return centered / jnp.sqrt((centered * centered).mean(-1, keepdims=True) + 1e-5) * weight + bias

    def linear(x, p, name, bias=True):
        y = x @ p[f"{name}.weight"].T
        return y + p[f"{name}.bias"] if bias else y

    def cross_entropy(logits, labels, ignore=None):
        log_p = jax.nn.log_softmax(logits, axis=-1)
        if ignore is None:
            counted, labels = jnp.ones(labels.shape, logits.dtype), labels
        else:
            counted, labels = (labels != ignore).astype(logits.dtype), jnp.where(labels == ignore, 0, labels)
        picked = jnp.take_along_axis(log_p, labels[:, None], axis=1)[:, 0]
        return -(picked * counted).sum() / counted.sum()

    if work.name == "mlp":
        def loss_of(p, feeds):
            tokens = feeds["context"]
            embedded = p["C.weight"][tokens].reshape(tokens.shape[0], -1)
            return cross_entropy(linear(jnp.tanh(linear(embedded, p, "hidden")), p, "out"), feeds["next"])
    else:
        width, heads = a.heads * a.head_size, a.heads
        mask = jnp.asarray(np.triu(np.full((a.context, a.context), -1e9, np.float32), k=1))

        def loss_of(p, feeds):
            tokens = feeds["context"]
            batch, length = tokens.shape
            x = p["token_embedding.weight"][tokens] + p["position_embedding.weight"][:length]
            for layer in range(a.layers):
                q_ = f"blocks.{layer}."
                h = layer_norm(x, p[q_ + "ln1.weight"], p[q_ + "ln1.bias"])
                qkv = h @ p[q_ + "attn.in_proj_weight"].T + p[q_ + "attn.in_proj_bias"]

                def split(part):
                    return part.reshape(batch, length, heads, width // heads).transpose(0, 2, 1, 3)

                q, k, v = (split(qkv[..., i * width:(i + 1) * width]) for i in range(3))
                scores = q @ k.transpose(0, 1, 3, 2) * (1.0 / math.sqrt(width // heads)) + mask
                attended = (jax.nn.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(batch, length, width)
                x = x + linear(attended, p, q_ + "attn.out_proj")
                m = layer_norm(x, p[q_ + "ln2.weight"], p[q_ + "ln2.bias"])
                x = x + linear(jax.nn.gelu(linear(m, p, q_ + "mlp.0"), approximate=False), p, q_ + "mlp.2")
            logits = linear(layer_norm(x, p["ln_f.weight"], p["ln_f.bias"]), p, "head", bias=False)
            return cross_entropy(logits.reshape(-1, vocabulary), feeds["next"], ignore=vocabulary)

    def update(p, g, state, rate):
        """SGD, or AdamW as topos and torch write it (decoupled decay, then bias-corrected moments)."""
        if work.name == "mlp":
            return jax.tree_util.tree_map(lambda w, d: w - rate * d, p, g), state
        beta1, beta2, eps, decay = 0.9, 0.999, 1e-8, 0.01
        m, v, t = state
        t = t + 1.0
        m = jax.tree_util.tree_map(lambda m_, d: beta1 * m_ + (1 - beta1) * d, m, g)
        v = jax.tree_util.tree_map(lambda v_, d: beta2 * v_ + (1 - beta2) * d * d, v, g)
        step_size, correction = rate / (1 - beta1**t), jnp.sqrt(1 - beta2**t)
        p = jax.tree_util.tree_map(
            lambda w, m_, v_: w * (1 - rate * decay) - step_size * m_ / (jnp.sqrt(v_) / correction + eps), p, m, v)
        return p, (m, v, t)

    def train(p, state, feeds, rate):
        loss, g = jax.value_and_grad(loss_of)(p, feeds)
        p, state = update(p, g, state, rate)
        return p, state, loss

    jitted = jax.jit(train, donate_argnums=(0, 1))
    params = {name: jnp.asarray(array) for name, array in work.initial.items()}
    def zeros():
        return {name: jnp.zeros_like(w) for name, w in params.items()}

    held = {"p": params, "state": (zeros(), zeros(), jnp.float32(0.0))}  # AdamW's moments and step count

    def step(feeds):
        held["p"], held["state"], loss = jitted(held["p"], held["state"], *_batch_and_rate(feeds))
        return float(loss)

    # For XLA's memory analysis (benchmarks/memory.py) and front_ends.py: the step lowered for one batch, not run.
    step.lower = lambda feeds: jitted.lower(held["p"], held["state"], *_batch_and_rate(feeds))
    # The arguments of the first step, from the initial weights (front_ends.py runs jax's module on them).
    initial = {name: np.asarray(array) for name, array in work.initial.items()}
    moments = {name: np.zeros_like(array) for name, array in initial.items()}  # read, never written: shared
    step.arguments = lambda feeds: (initial, (moments, moments, np.float32(0.0)), *_batch_and_rate(feeds))
    work.columns[f"jax {jax.__version__}.jit"] = step


# ---- measuring -------------------------------------------------------------------------------------------


def curves(work: Workload, steps: int) -> dict[str, list[float]]:
    """Every column but the oracle runs the same ``steps`` steps from the same weights; their losses."""
    return {label: [step(work.feeds[k]) for k in range(steps)]
            for label, step in work.columns.items() if label != "topos oracle"}


def agreement_rows(work: Workload, losses: dict[str, list[float]]) -> list[list[str]]:
    torch_label = next(label for label in losses if label.startswith("PyTorch"))
    reference = np.asarray(losses[torch_label], np.float64)
    rows = []
    for label, curve in losses.items():
        if label == torch_label:
            continue
        gap = np.abs(np.asarray(curve, np.float64) - reference) / np.abs(reference)
        rows.append([f"{work.name}: {label} vs {torch_label}", f"{gap[0]:.1e}", f"{gap.max():.1e}",
                     str(int(gap.argmax())), f"{curve[-1]:.4f} / {reference[-1]:.4f}"])
    return rows


def timing_row(work: Workload, rounds: int, per_round: int) -> tuple[list[str], dict[str, float]]:
    """Median CPU ms per step of every column, timed in interleaved rounds; the oracle takes 2 steps a round."""
    calls = itertools.count()  # every call takes the next batch
    columns = {label: lambda step=step: step(work.feeds[next(calls) % len(work.feeds)])
               for label, step in work.columns.items()}
    counts = {label: 2 if label == "topos oracle" else per_round for label in work.columns}
    times = interleaved(columns, counts, rounds)
    return list(work.columns), {label: t.cpu * 1000 for label, t in times.items()}


def main(argv=None) -> None:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--steps", type=int, default=300, help="steps of the loss-curve comparison (default 300)")
    options.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (default 5)")
    options.add_argument("--per-round", type=int, default=20, help="steps per column per round (default 20)")
    options.add_argument("--models", default="mlp,transformer")
    options.add_argument("--tiny", action="store_true", help="the smoke test's sizes (a few seconds)")
    args = options.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in ("mlp", "transformer")]
    if unknown:
        options.error(f"unknown model(s) {', '.join(unknown)}; pick from mlp, transformer")

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, pinned to CPU "
          f"{_pinning.PINNED_CPU}, load average {os.getloadavg()[0]:.1f}; Python {platform.python_version()}, "
          f"NumPy {np.__version__}")
    agreement, timings, skipped = [], [], []
    for model in models:
        work = (mlp_workload if model == "mlp" else transformer_workload)(args.steps, args.tiny)
        topos_columns(work)
        torch_column(work)
        try:
            jax_column(work)
        except ImportError as error:  # jax is a benchmark-only extra
            skipped.append(f"jax.jit column skipped: {error}")
        agreement += agreement_rows(work, curves(work, args.steps))
        for step in work.columns.values():  # warm-up: first-call allocations, jit compilation
            step(work.feeds[0])
        labels, medians = timing_row(work, args.rounds, args.per_round)
        timings.append((model, labels, medians))
    for line in skipped:
        print(line)

    print(f"\nLoss curves over {args.steps} steps from the same weights and batches, float32; gap = |loss - "
          "PyTorch's| / PyTorch's:\n")
    print(table(["curves", "gap at step 0", "max gap", "at step", "last loss / PyTorch's"], agreement))
    print(f"\nOne training step, CPU ms (median of {args.rounds} rounds x {args.per_round} steps; the oracle 2 a "
          "round); ratio = the column's time over topos IREE's:\n")
    header = ["model"] + timings[0][1] + [f"{label} / IREE" for label in timings[0][1][1:]]
    rows = []
    for model, labels, medians in timings:
        reference = medians["topos IREE"]
        rows.append([model] + [f"{medians[label]:.3f}" for label in labels]
                    + [f"{medians[label] / reference:.2f}x" for label in labels[1:]])
    print(table(header, rows))


if __name__ == "__main__":
    main()
