"""Generation with a KV cache: the prefill and decode entries of one spec, and sampling on the host.

``gpt2.record_generation`` (and ``examples/llama``'s) records both graphs
over one set of weight slots; :class:`Decoder` reads them the way ``--route`` says (the oracle's
exact entries, FAST plans, or two IREE modules for ``--target``, llvm-cpu by default, each compiled
on first use with the weights frozen in: ``compile(frozen=table)`` makes them module globals,
which IREE packs for its matmul microkernels once, when the module loads; a
decode step multiplies one row by every weight, so packing them per call would cost
as much as the products). The caches are plain arrays the host carries from
one decode call to the next: each call takes every layer's keys and values
``[batch, heads, L, head_dim]`` as fed inputs and returns them with the
new token's row written (``kv_cache.write_row``).

Sampling is host-side, from the logits, with ``topos.init.Generator``:
greedy (``temperature=0``), or softmax at a temperature, optionally over
the ``top_k`` largest logits only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from topos import Numerics, init

from _training import ROUTES, ExampleError


@dataclass(frozen=True)
class Sampling:
    """How the next token is drawn: ``temperature=0`` is greedy; ``top_k`` keeps only the k largest logits."""

    temperature: float = 1.0
    top_k: int | None = None

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ExampleError(f"--temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ExampleError(f"--top-k must be a positive number of tokens, got {self.top_k}")


def pick(logits: np.ndarray, sampling: Sampling, generator: init.Generator) -> np.ndarray:
    """One token per row of ``logits`` [batch, vocabulary], as int64 [batch]."""
    logits = np.asarray(logits, dtype=np.float64)
    if sampling.temperature == 0:
        return np.argmax(logits, axis=1).astype(np.int64)  # ties go to the lowest id
    z = logits / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < z.shape[1]:
        kth = np.sort(z, axis=1)[:, -sampling.top_k][:, None]
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    u = np.asarray(generator.uniform((z.shape[0], 1), dtype=np.float64))
    return np.minimum((np.cumsum(p, axis=1) < u).sum(axis=1), z.shape[1] - 1).astype(np.int64)


class Decoder:
    """The prefill and decode entries of a generation spec over one weight table, read one way.

    ``target`` (the iree route only): the IREE target both modules are compiled for.
    """

    def __init__(self, network, generation, table, route: str, target: str = "llvm-cpu"):
        if route not in ROUTES:
            raise ExampleError(f"unknown route {route!r}; pick one of {', '.join(ROUTES)}")
        self.generation, self.route, self.target = generation, route, target
        self.compile_seconds = 0.0
        roots = (generation.prefill_roots(), generation.decode_roots())
        if route == "oracle":
            entries = [network.entry(r, numerics=Numerics.EXACT) for r in roots]
            self._runs = [lambda feeds, e=e: e.interpret(table, feeds) for e in entries]
        elif route == "plan":
            plans = [network.entry(r, numerics=Numerics.FAST).lower() for r in roots]
            self._runs = [lambda feeds, p=p: p.forward(table, feeds) for p in plans]
        else:
            self.compiled: list = [None, None]  # the prefill's and the decode's CompiledPlan, on first use
            self._runs = [lambda feeds, k=k: self._compiled_run(network, roots, table, k, feeds) for k in (0, 1)]

    def _compiled_run(self, network, roots, table, k: int, feeds):
        if self.compiled[k] is None:
            began = time.perf_counter()
            self.compiled[k] = network.entry(roots[k]).lower().compile(self.target, frozen=table)
            self.compile_seconds += time.perf_counter() - began
        return self.compiled[k].forward(feeds=feeds)

    def _caches(self, run, pairs) -> dict:
        names = self.generation.cache_names()
        return {name: run[symbol] for name, symbol in zip(names, (s for pair in pairs for s in pair))}

    def prefill(self, tokens: np.ndarray) -> tuple[np.ndarray, dict]:
        """Logits [batch, L, vocabulary] of ``tokens`` [batch, L] and the caches of every position."""
        run = self._runs[0]({self.generation.tokens: tokens})
        return run[self.generation.prefill_logits], self._caches(run, self.generation.prefill_caches)

    def decode(self, token: np.ndarray, position: int, caches: dict) -> tuple[np.ndarray, dict]:
        """Logits [batch, vocabulary] of ``token`` [batch] at ``position``, and the caches with its row written."""
        g = self.generation
        run = self._runs[1]({g.token: np.asarray(token, np.int64).reshape(-1, 1), g.position: np.array([position]),
                             **caches})
        return run[g.decode_logits][:, 0], self._caches(run, g.decode_caches)


def generate(decoder: Decoder, prompts, count: int, sampling: Sampling, generator: init.Generator,
             recompute: bool = False) -> np.ndarray:
    """``count`` new tokens after ``prompts`` [batch, P] -> int64 [batch, count].

    The prompt runs through the prefill entry (padded to the cache's L
    positions: the causal mask keeps the padding out of every real row),
    then each new token through the decode entry with the caches. With
    ``recompute``, every step instead runs the prefill over the whole
    sequence so far and reads its last row: the cache's reference.
    """
    prompts = np.asarray(prompts, dtype=np.int64)
    if prompts.ndim != 2 or prompts.shape[1] < 1:
        raise ExampleError(f"the prompt must hold at least one token per row, got shape {list(prompts.shape)}")
    batch, length = decoder.generation.batch, decoder.generation.length
    known = prompts.shape[1]
    if prompts.shape[0] != batch:
        raise ExampleError(f"{prompts.shape[0]} prompts for a generation recorded for a batch of {batch}")
    if known + count > length:
        raise ExampleError(
            f"the prompt ({known} tokens) and {count} new tokens need {known + count} positions, but the "
            f"model reads at most {length}; shorten the prompt or ask for at most {max(0, length - known)} tokens"
        )
    sequence = np.zeros((batch, length), dtype=np.int64)
    sequence[:, :known] = prompts
    logits, caches = decoder.prefill(sequence)
    sequence[:, known] = pick(logits[:, known - 1], sampling, generator)
    for position in range(known, known + count - 1):
        if recompute:
            logits = decoder.prefill(sequence)[0][:, position]
        else:
            logits, caches = decoder.decode(sequence[:, position], position, caches)
        sequence[:, position + 1] = pick(logits, sampling, generator)
    return sequence[:, known:known + count]
