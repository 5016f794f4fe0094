"""GPT-2 124M on one CPU core: the forward pass and KV-cache decoding, topos IREE against jax.jit and PyTorch eager.

The model is ``examples/gpt2/gpt2.py`` at the 124M config (12 layers, 12
heads, width 768, vocabulary 50257), float32, with GPT-2's random
initialization drawn by ``topos.init`` (``--weights PATH`` loads a Hugging
Face ``model.safetensors`` instead). The same weights feed every column:

* topos IREE, resident  ``plan.compile("llvm-cpu")`` of an entry over the
                        logits; the weights copied to the device once
                        (``compiled.resident``) and each call a
                        ``compiled.step`` that updates nothing
* topos IREE, arguments the same module through ``compiled.forward(table,
                        feeds)``: the 124M weights passed as arguments on
                        every call
* topos IREE, frozen    ``compile("llvm-cpu", frozen=weights)``: the weights
                        are module globals IREE loads by name (and packs for
                        its matmul microkernels once, at load); each call
                        ``compiled.forward(feeds=...)``
* jax.jit               a JAX twin of the same mathematics (written below),
                        the weights on the device, ``jax.jit``
* jax.jit, frozen       the same twin jitted over the tokens alone, the
                        weights closed over (constants of the computation)
* PyTorch eager         a PyTorch twin (written below), ``torch.no_grad``

Decoding: tokens per second of one decode step after another with the KV
cache, from empty caches of ``--length`` positions. topos runs the
example's decode entry (``sampling.Decoder``: the caches are fed inputs
and returned results, copied between host and device every step, the
weights frozen into the module); JAX updates its caches with ``dynamic_update_slice``
under ``jax.jit`` (caches donated, on the device); PyTorch writes its
caches in place and attends over the positions so far (the usual eager
cache, less arithmetic than the fixed-length masked cache the other two
use). Every result is read back to the host (NumPy) in every column.

Compile times: topos's two entries (forward, decode) compiled into an
empty cache directory, then again from it (cache hit); jax.jit's lower +
compile of its two functions. The agreement table compares the logits
of every column with PyTorch's. Timings are medians over interleaved
rounds (wall clock and process CPU time); they are never asserted.

Everything is pinned to one core before anything loads (sched_setaffinity,
OPENBLAS/OMP/MKL_NUM_THREADS=1, ``torch.set_num_threads(1)``; XLA sizes
its pools by the affinity mask; IREE's local-sync driver is single-threaded).

Run: python benchmarks/gpt2.py [--weights model.safetensors] [--length 128] [--decode 32] [--rounds 5]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _pinning import PINNED_CPU  # noqa: E402  (first: its thread setting applies before NumPy, PyTorch or JAX load)

# isort: split
import argparse  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))
sys.path.insert(0, str(HERE.parent / "examples" / "gpt2"))

import topos  # noqa: E402
from topos import Updates  # noqa: E402

import hf_gpt2  # noqa: E402
from _gpt2_twins import jax_twin, torch_twin  # noqa: E402
from _timing import cpu_model, interleaved, table, versions  # noqa: E402
from gpt2 import PRESETS, Config, record_generation  # noqa: E402
from sampling import Decoder  # noqa: E402

NOTHING = Updates(())


# ---- measuring --------------------------------------------------------------------------------------


def timed(fn):
    began = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - began


def _relative(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / np.abs(want).max())


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


# ---- the benchmark ----------------------------------------------------------------------------------


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--config", default="124M", choices=tuple(PRESETS), help="GPT-2 size (default 124M)")
    options.add_argument("--weights", metavar="PATH", help="a Hugging Face GPT-2 model.safetensors (default random)")
    options.add_argument("--length", type=int, default=128, help="tokens of the forward and cache positions (128)")
    options.add_argument("--decode", type=int, default=32, help="decode steps timed per round (default 32)")
    options.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    options.add_argument("--all-threads", action="store_true", help="leave thread counts and CPU affinity alone")
    args = options.parse_args()
    config = hf_gpt2.config_of(args.weights) if args.weights else Config.preset(args.config)
    length = args.length
    if not 1 <= length <= config.context or args.decode > length:
        options.error(f"--length must be in 1..{config.context} and --decode at most --length")

    import torch

    if PINNED_CPU is not None:
        torch.set_num_threads(1)
        torch.set_num_interop_threads(1)
    threads = ("all threads" if PINNED_CPU is None else
               f"pinned to CPU {PINNED_CPU}; OPENBLAS/OMP/MKL_NUM_THREADS=1; torch.set_num_threads(1)")
    print(f"machine: {cpu_model()}, {os.cpu_count()} CPUs, {platform.machine()}; {threads}")
    print(f"versions: {versions()}")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    os.environ["TOPOS_CACHE_DIR"] = tempfile.mkdtemp(prefix="topos-gpt2-bench-")  # first compiles are cold

    # One spec: the example's generation graphs (prefill, decode) over one set of weights; the forward
    # column is an entry over the prefill's logits alone.
    (network, generation), record_seconds = timed(lambda: record_generation(
        config, batch=1, length=length, seed=0, draw=args.weights is None))
    weights = hf_gpt2.load(args.weights, network, config) if args.weights else network.parameters()
    named = weights.named()
    print(f"model: GPT-2 {args.config if not args.weights else args.weights} ({hf_gpt2.describe(config)}), "
          f"{sum(a.size for a in named.values()):,} parameters, float32; "
          f"{'random GPT-2 init by topos.init' if not args.weights else 'loaded'}; recorded in {record_seconds:.1f} s "
          f"({len(network)} nodes)\n")
    tokens = np.array(topos.init.Generator(1).integers((1, length), 0, config.vocabulary))  # writable: torch wraps it

    compile_rows = []
    entry = network.entry([generation.prefill_logits])
    forward, first = timed(lambda: entry.lower().compile("llvm-cpu"))
    _, hit = timed(lambda: network.entry([generation.prefill_logits]).lower().compile("llvm-cpu"))
    compile_rows.append(["topos forward entry", f"{first:.1f}", f"{forward.timings.get('iree-compile', 0):.1f}",
                         f"{hit:.1f}"])
    decoder = Decoder(network, generation, weights, "iree")
    caches0 = {name: np.zeros((1, config.heads, length, config.head_dim), np.float32)
               for name in generation.cache_names()}
    _, decode_first = timed(lambda: decoder.decode(tokens[:, 0], 0, caches0))  # compiles the decode entry
    decode_plan = decoder.compiled[1]
    _, decode_hit = timed(lambda: network.entry(generation.decode_roots()).lower().compile("llvm-cpu",
                                                                                           frozen=weights))
    compile_rows.append(["topos decode entry", f"{decode_first:.1f}",
                         f"{decode_plan.timings.get('iree-compile', 0):.1f}", f"{decode_hit:.1f}"])
    frozen, frozen_first = timed(lambda: network.entry([generation.prefill_logits]).lower().compile(
        "llvm-cpu", frozen=weights))
    _, frozen_hit = timed(lambda: network.entry([generation.prefill_logits]).lower().compile(
        "llvm-cpu", frozen=weights))
    compile_rows.append(["topos forward entry, frozen", f"{frozen_first:.1f}",
                         f"{frozen.timings.get('iree-compile', 0):.1f}", f"{frozen_hit:.1f}"])
    resident = forward.resident(weights)
    logits = generation.prefill_logits

    def topos_resident():
        return forward.step(resident, {generation.tokens: tokens}, NOTHING)[1][logits]

    def topos_arguments():
        return forward.forward(weights, {generation.tokens: tokens})[logits]

    def topos_frozen():
        return frozen.forward(feeds={generation.tokens: tokens})[logits]

    jax_forward, jax_decode, params = jax_twin(config, named, length)
    import jax

    shaped = jax.ShapeDtypeStruct
    cache_shape = (1, config.heads, length, config.head_dim)
    (_, jax_forward_seconds) = timed(lambda: jax_forward.lower(params, tokens).compile())
    empty = [(shaped(cache_shape, np.float32), shaped(cache_shape, np.float32)) for _ in range(config.layers)]
    (_, jax_decode_seconds) = timed(lambda: jax_decode.lower(params, tokens[:, :1], np.int32(0), empty).compile())
    compile_rows.append(["jax.jit forward", f"{jax_forward_seconds:.1f}", "—", "—"])
    compile_rows.append(["jax.jit decode", f"{jax_decode_seconds:.1f}", "—", "—"])
    jax_frozen = jax.jit(lambda t: jax_forward(params, t))  # the weights become constants of the computation
    (_, jax_frozen_seconds) = timed(lambda: jax_frozen.lower(tokens).compile())
    compile_rows.append(["jax.jit forward, frozen", f"{jax_frozen_seconds:.1f}", "—", "—"])
    torch_forward, torch_decode = torch_twin(config, named)

    def jax_logits():
        return np.asarray(jax_forward(params, tokens))

    def jax_frozen_logits():
        return np.asarray(jax_frozen(tokens))

    def torch_logits():
        return torch_forward(tokens)

    reference = torch_logits()
    agreement = {"topos IREE, resident": _relative(topos_resident(), reference),
                 "topos IREE, arguments": _relative(topos_arguments(), reference),
                 "topos IREE, frozen": _relative(topos_frozen(), reference),
                 "jax.jit": _relative(jax_logits(), reference),
                 "jax.jit, frozen": _relative(jax_frozen_logits(), reference)}
    columns = {"topos IREE, resident": topos_resident, "topos IREE, arguments": topos_arguments,
               "topos IREE, frozen": topos_frozen, "jax.jit": jax_logits, "jax.jit, frozen": jax_frozen_logits,
               "PyTorch eager": torch_logits}
    forward_times = interleaved(columns, 1, args.rounds, warmup=1)

    # Decoding: args.decode steps from empty caches, token by token (teacher-forced: the speed of the step).
    def topos_decoding():
        caches = {name: np.zeros(cache_shape, np.float32) for name in generation.cache_names()}
        for position in range(args.decode):
            out, caches = decoder.decode(tokens[:, position], position, caches)
        return out

    def jax_decoding():
        import jax.numpy as jnp

        caches = [(jnp.zeros(cache_shape, jnp.float32), jnp.zeros(cache_shape, jnp.float32))
                  for _ in range(config.layers)]
        for position in range(args.decode):
            out, caches = jax_decode(params, tokens[:, position:position + 1], np.int32(position), caches)
            out = np.asarray(out)
        return out[:, 0]

    def torch_decoding():
        caches = [(torch.zeros(cache_shape), torch.zeros(cache_shape)) for _ in range(config.layers)]
        for position in range(args.decode):
            out = torch_decode(tokens[:, position:position + 1], position, caches)
        return out[:, 0]

    last = args.decode - 1
    decode_reference = reference[:, last]
    agreement_decode = {"topos IREE": _relative(topos_decoding(), decode_reference),
                        "jax.jit": _relative(jax_decoding(), decode_reference),
                        "PyTorch eager": _relative(torch_decoding(), decode_reference)}
    decode_times = interleaved({"topos IREE": topos_decoding, "jax.jit": jax_decoding,
                                "PyTorch eager": torch_decoding}, 1, max(1, args.rounds // 2), warmup=1)

    ours = forward_times["topos IREE, resident"]
    print(f"forward, batch 1, T={length}: median ms per call (wall / process CPU), and the ratio of CPU times to "
          "topos IREE resident (above 1: topos is faster)\n")
    print(table(["column", "wall ms", "CPU ms", "ratio", "logits vs PyTorch"], [
        [name, _ms(t.wall), _ms(t.cpu), f"{t.cpu / ours.cpu:.2f}x", f"{agreement.get(name, 0.0):.1e}"]
        for name, t in forward_times.items()]))
    print(f"\ndecode with the KV cache ({length} positions), {args.decode} steps from empty caches: tokens per "
          "second (wall / process CPU); the last step's logits against PyTorch's full forward\n")
    print(table(["column", "tokens/s (wall)", "tokens/s (CPU)", "ms per token (CPU)", "logits vs PyTorch"], [
        [name, f"{args.decode / t.wall:.1f}", f"{args.decode / t.cpu:.1f}", _ms(t.cpu / args.decode),
         f"{agreement_decode[name]:.1e}"] for name, t in decode_times.items()]))
    print("\ncompile, seconds (topos: lowering + StableHLO + IREE into an empty cache directory; cache hit: the "
          "same entry again; jax.jit: lower + compile)\n")
    print(table(["what", "first compile", "of which iree-compile", "cache hit"], compile_rows))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak resident memory of this process: {peak:,.0f} MB")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
