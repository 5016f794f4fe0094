"""Compiled training steps, measured: topos on IREE against jax.jit, PyTorch eager and topos's own readings.

One SGD training step (forward, backward, update; float32) of three
models from ``_gpt.py`` (MLP 784-128-10 batch 64, MLP 784-1024-1024-10
batch 128, a 2-layer GPT of width 128, context 64), timed five ways in
one process:

* topos IREE   ``plan.compile("llvm-cpu")`` over ``updates.roots(loss)``,
               run by ``compiled.step``: parameters stay on the device
               (local-sync driver), the batch comes from the host
* jax.jit      value_and_grad + SGD under ``jax.jit``, parameters on the
               device (donated), the batch from the host (``_peers.py``)
* PyTorch      eager autograd + in-place SGD (``_peers.py``)
* oracle       ``network.forward`` + ``run.backward`` + SGD in NumPy
               (the README loop; reference kernels, fewer steps)
* FAST plan    a plan over ``adjoints.roots()`` under Numerics.FAST
               (BLAS, native math) + SGD in NumPy

Every column gets one core: the process pins itself to one CPU before
anything loads (XLA and OpenMP size their thread pools by the affinity
mask), sets OPENBLAS/OMP/MKL_NUM_THREADS=1 and
``torch.set_num_threads(1)``; IREE's local-sync driver is single-threaded.
``--all-threads`` skips all of that (IREE stays local-sync).

Columns are measured in interleaved rounds (each round times a few steps
of every column), so a change in machine load lands on every column
alike; each cell is the median over all timed steps after warm-up, on
the wall clock and in process CPU time (all threads; the clock to
compare on a shared machine). Ratios are each column's time over the
topos IREE step's (above 1: we are faster). Compile times: the topos
plan lowered and compiled into an empty cache directory, then compiled
again from that cache, and jax.jit's lower + compile. A diagnostics
table splits the IREE step into the module's own time and what
surrounds it and counts kernels; a what-if table times the module under
extra IREE flags and the GPT without gather/scatter. The benchmark also
checks (and prints) that every column's first step gives the same loss
and parameters within float32 tolerance. It never asserts timings.

Run: python benchmarks/compiled.py [--rounds N] [--models mlp-s,mlp-m,gpt] [--all-threads]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__":  # imported for its runners, the importing script's own setting stands
    import _pinning  # first: its thread setting applies before NumPy, PyTorch or JAX load

import argparse
import platform
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from topos import Numerics
from topos.dialect.iree.targets import DATA_TILING_FLAGS

from _gpt import Workload, gpt, mlp_m, mlp_s, small_gpt
from _peers import available
from _timing import Timing, chosen_models, cpu_model, interleaved, relative_difference, table, versions  # noqa: E402

MODELS = {"mlp-s": mlp_s, "mlp-m": mlp_m, "gpt": small_gpt}
COLUMNS = ("topos IREE", "jax.jit", "PyTorch", "oracle", "FAST plan")


# ---- one step, each way ---------------------------------------------------------------------------


def _sgd(rate: float):
    def rule(p, g):
        return p - g * np.asarray(rate, dtype=p.dtype)

    return rule


class Runner:
    """A column's training loop: ``step()`` advances its own state by one SGD step."""

    def __init__(self, step: Callable[[], None], first: Callable[[], tuple[float, dict]]):
        self.step = step
        self.first = first  # one step from the initial parameters -> (loss, {name: array})


def topos_iree(workload: Workload, compiled) -> Runner:
    state = [compiled.resident(workload.parameters)]

    def step():
        state[0], _ = compiled.step(state[0], workload.feeds, workload.updates)

    def first():
        after, run = compiled.step(compiled.resident(workload.parameters), workload.feeds, workload.updates)
        return float(run[workload.loss]), workload.named_parameters(after.to_host())

    return Runner(step, first)


def topos_oracle(workload: Workload) -> Runner:
    rule = _sgd(workload.learning_rate)

    def advance(parameters):
        run = workload.forward.forward(parameters, workload.feeds)
        gradients = run.backward(workload.loss).parameters(parameters)
        return parameters.step(gradients, rule), run

    return _host_loop(workload, advance)


def _host_loop(workload: Workload, advance) -> Runner:
    """A runner whose step is ``advance(parameters) -> (next parameters, run)`` on the host."""
    state = [workload.parameters]

    def step():
        state[0], _ = advance(state[0])

    def first():
        after, run = advance(workload.parameters)
        return float(run[workload.loss]), workload.named_parameters(after)

    return Runner(step, first)


def topos_fast_plan(workload: Workload) -> Runner:
    plan = workload.trained.entry(workload.adjoints.roots(), numerics=Numerics.FAST).lower()
    rule = _sgd(workload.learning_rate)

    def advance(parameters):
        run = plan.forward(parameters, workload.feeds)
        return parameters.step(run.recorded_gradients(workload.adjoints, parameters), rule), run

    return _host_loop(workload, advance)


def peer_runner(peer) -> Runner:
    state = [peer.start()]

    def step():
        state[0], _ = peer.step(state[0])

    def first():
        after, loss = peer.step(peer.start())
        return peer.loss(loss), peer.parameters(after)

    return Runner(step, first)


# ---- compiling --------------------------------------------------------------------------------------


def compile_topos(workload: Workload):
    """(compiled plan, first-compile seconds, cache-hit seconds, its stage timings)."""
    with tempfile.TemporaryDirectory(prefix="topos-bench-cache-") as directory:
        cache = topos_cache(directory)
        began = time.perf_counter()
        plan = workload.trained.entry(workload.updates.roots(workload.loss)).lower()
        compiled = plan.compile("llvm-cpu", cache=cache)
        first = time.perf_counter() - began
        began = time.perf_counter()
        again = workload.trained.entry(workload.updates.roots(workload.loss)).lower().compile("llvm-cpu", cache=cache)
        hit = time.perf_counter() - began
    if compiled.cache_hit or not again.cache_hit:
        raise RuntimeError("the compile-cache measurement did not see one miss then one hit")
    return compiled, first, hit, compiled.timings


def topos_cache(directory):
    from topos.dialect.iree.cache import CompileCache

    return CompileCache(directory)


def iree_dispatches(compiled) -> int | None:
    """Dispatch sites in the compiled module (``stream.cmd.dispatch`` after IREE's stream phase)."""
    try:
        from iree.compiler import compile_str

        text = compile_str(compiled.stablehlo, extra_args=[*compiled.flags, "--compile-to=stream"])
        return (text.decode() if isinstance(text, bytes) else text).count("stream.cmd.dispatch")
    except Exception:  # noqa: BLE001  (a count for the diagnostics table, never a reason to stop)
        return None


# ---- measuring --------------------------------------------------------------------------------------


def measure(runners: dict[str, Runner], steps: dict[str, int], rounds: int, warmup: int = 2,
            alternate: bool = False) -> dict[str, Timing]:
    """name -> Timing of each runner's step (``_timing.interleaved``)."""
    return interleaved({name: runner.step for name, runner in runners.items()}, steps, rounds, warmup, alternate)


def module_runners(compiled, workload: Workload) -> dict[str, Runner]:
    """The compiled module called directly (no topos Python): batch from the host, and already on the device."""
    import iree.runtime as rt

    function = compiled._load()
    state = compiled.resident(workload.parameters)
    storage = compiled._storage_arguments()  # the module's transient storage, passed first
    host = [*storage, *compiled._arguments(None, workload.feeds, resident=state)]
    device = [a if not isinstance(a, np.ndarray) else rt.asdevicearray(compiled._device, a) for a in host]
    # Diagnostic runners are timed only; their ``first`` is never called.
    return {"module, host batch": Runner(lambda: function(*host), lambda: None),
            "module, device batch": Runner(lambda: function(*device), lambda: None)}


WHAT_IF_FLAGS = DATA_TILING_FLAGS  # what the step would run like tiled, whatever its size


def standalone_module(stablehlo: str, flags, arguments) -> Runner:
    """StableHLO compiled with ``flags`` into its own local-sync context, called on device copies of ``arguments``."""
    from topos.dialect.iree.compile import compile_stablehlo

    return module_runner(compile_stablehlo(stablehlo, flags), arguments)


def module_runner(vmfb: bytes, arguments, driver: str = "local-sync") -> Runner:
    """A compiled module in its own context on ``driver``, called on device copies of ``arguments``.

    The context runs on topos's own device for the driver (``device_for``:
    IREE's caching allocator), so a module's transient buffers are reused
    from call to call as in ``compiled.step``; on a fresh allocator each call
    would fault them in again, which weighs most on data-tiled modules
    (their packed copies). A module that takes transient storage
    (``with_transient_storage``) gets one buffer of the size it reports, first.
    """
    import iree.runtime as rt

    from topos.dialect.iree.compile import TRANSIENT_SIZE
    from topos.dialect.iree.devices import device_for

    config = rt.Config(device=device_for(driver))
    context = rt.SystemContext(config=config)
    module = rt.VmModule.copy_buffer(context.instance, vmfb)
    context.add_vm_module(module)
    function = context.modules[module.name]["main"]
    size = function.vm_function.reflection.get(TRANSIENT_SIZE)
    storage = [] if size is None else [np.empty(int(size), np.uint8)]
    on_device = [rt.asdevicearray(config.device, np.asarray(a)) for a in [*storage, *arguments]]
    return Runner(lambda: function(*on_device), lambda: None)


def what_if_runners(compiled, workload: Workload) -> dict[str, Runner]:
    """Diagnostics: the same step under other IREE flags, and the GPT without its gather/scatter."""
    arguments = compiled._arguments(workload.parameters, workload.feeds)
    runners = {"what-if flags": standalone_module(compiled.stablehlo, [*compiled.flags, *WHAT_IF_FLAGS], arguments)}
    if workload.kind == "gpt" and workload.config.embedding == "gather":
        variant = gpt(replace(workload.config, embedding="one-hot"))
        plan = variant.trained.entry(variant.updates.roots(variant.loss)).lower()
        other = plan.compile("llvm-cpu", cache=False)
        runners["what-if one-hot"] = standalone_module(
            other.stablehlo, other.flags, other._arguments(variant.parameters, variant.feeds))
    return runners


def agreement(results: dict[str, tuple[float, dict]], reference: str = "oracle") -> dict[str, tuple[float, float]]:
    """Per column: (|loss - oracle loss| / |oracle loss|, worst scale-relative difference of the update)."""
    loss0, after0 = results[reference]
    out = {}
    for name, (loss, after) in results.items():
        worst = max((relative_difference(after[key], want) for key, want in after0.items()), default=0.0)
        out[name] = (abs(loss - loss0) / abs(loss0), worst)
    return out


# ---- printing ---------------------------------------------------------------------------------------


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.3f}" if seconds < 0.01 else f"{seconds * 1e3:.2f}"


def _s(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds:.2f}"


def _cell(seconds: float, ours: float, is_ours: bool) -> str:
    return _ms(seconds) if is_ours else f"{_ms(seconds)} ({seconds / ours:.2f}x)"


STEPS_PER_ROUND = {  # the oracle is slow on the larger models, so it runs fewer steps
    "mlp-s": {"topos IREE": 20, "jax.jit": 20, "PyTorch": 20, "oracle": 2, "FAST plan": 10},
    "mlp-m": {"topos IREE": 3, "jax.jit": 3, "PyTorch": 3, "oracle": 1, "FAST plan": 2},
    "gpt": {"topos IREE": 3, "jax.jit": 3, "PyTorch": 3, "oracle": 1, "FAST plan": 2},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds (default 10)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {', '.join(MODELS)}")
    parser.add_argument("--all-threads", action="store_true", help="leave thread counts and CPU affinity alone")
    args = parser.parse_args()
    chosen = chosen_models(parser, args.models, MODELS)

    peers = available()
    pinned = _pinning.PINNED_CPU
    threads = ("all threads (no affinity or thread settings)" if pinned is None else
               f"pinned to CPU {pinned}; OPENBLAS/OMP/MKL_NUM_THREADS=1; torch.set_num_threads(1)")
    if not isinstance(peers.get("torch"), str) and pinned is not None:
        import torch

        torch.set_num_threads(1)
        torch.set_num_interop_threads(1)
    print(f"machine: {cpu_model()}, {os.cpu_count()} CPUs, {platform.machine()}; {threads}")
    print(f"versions: {versions()}")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for name, builder in peers.items():
        if isinstance(builder, str):
            print(f"skipped {name}: {builder}")
    print()

    wall_rows, cpu_rows, compile_rows, diagnostic_rows, what_if_rows, check_rows, counts = [], [], [], [], [], [], []
    for key in chosen:
        workload = MODELS[key]()
        compiled, first, hit, stages = compile_topos(workload)
        runners = {"topos IREE": topos_iree(workload, compiled)}
        jax_compile, jax_kernels = None, None
        if not isinstance(peers.get("jax"), str):
            peer = peers["jax"](workload)
            jax_compile, jax_kernels = peer.compile_seconds, peer.kernels
            runners["jax.jit"] = peer_runner(peer)
        if not isinstance(peers.get("torch"), str):
            runners["PyTorch"] = peer_runner(peers["torch"](workload))
        runners["oracle"] = topos_oracle(workload)
        runners["FAST plan"] = topos_fast_plan(workload)
        checks = agreement({name: runner.first() for name, runner in runners.items()})

        steps = dict(STEPS_PER_ROUND[key])
        modules = {**module_runners(compiled, workload), **what_if_runners(compiled, workload)}
        steps.update({name: steps["topos IREE"] for name in modules})
        timing = measure({**runners, **modules}, steps, args.rounds)
        wall, cpu = timing["topos IREE"].wall, timing["topos IREE"].cpu
        wall_rows.append([workload.name] + [_cell(timing[c].wall, wall, c == "topos IREE") if c in timing else "—"
                                            for c in COLUMNS])
        cpu_rows.append([workload.name] + [_cell(timing[c].cpu, cpu, c == "topos IREE") if c in timing else "—"
                                           for c in COLUMNS])
        counts.append(f"{workload.name}: " + ", ".join(f"{c} {timing[c].steps}" for c in COLUMNS if c in timing))
        compile_rows.append([workload.name, _s(first), _s(stages.get("iree-compile")), _s(hit), _s(jax_compile)])
        dispatches = iree_dispatches(compiled)
        host, device = timing["module, host batch"], timing["module, device batch"]
        diagnostic_rows.append([
            workload.name, f"{workload.volume():,}", str(len(workload.trained)), str(len(compiled.plan.schedule)),
            "—" if dispatches is None else str(dispatches), "—" if jax_kernels is None else str(jax_kernels),
            _ms(cpu), _ms(host.cpu), _ms(device.cpu), _ms(cpu - host.cpu)])
        what_if_rows.append([
            workload.name, _ms(device.cpu), _cell(timing["what-if flags"].cpu, device.cpu, False),
            _cell(timing["what-if one-hot"].cpu, device.cpu, False) if "what-if one-hot" in timing else "—"])
        check_rows.append([workload.name] + [f"{checks[c][0]:.1e} / {checks[c][1]:.1e}" if c in checks else "—"
                                             for c in COLUMNS])
        del runners, modules, compiled  # release device buffers before the next model

    print("training step (forward + backward + SGD update, float32): median wall-clock ms per step, "
          "and in parentheses the ratio to topos IREE (above 1: topos IREE is faster)\n")
    print(table(["model"] + list(COLUMNS), wall_rows))
    print("\nthe same steps, median CPU ms per step (all threads of this process: "
          "insensitive to other processes taking the core)\n")
    print(table(["model"] + list(COLUMNS), cpu_rows))
    print("\ncompile, seconds (topos: plan lowering + StableHLO + IREE, into an empty cache directory; "
          "cache hit: the same again from that cache)\n")
    print(table(["model", "topos first compile", "of which iree-compile", "topos cache hit", "jax.jit lower+compile"],
                compile_rows))
    print("\ndiagnostics: where the topos IREE step goes (CPU ms; 'module' calls the IREE function directly)\n")
    print(table(["model", "parameters", "spec nodes", "plan nodes", "IREE dispatches", "XLA kernels",
                 "topos step", "module, host batch", "module, device batch", "step minus module"], diagnostic_rows))
    print("\nwhat if (CPU ms of the module alone, batch on the device; in parentheses the ratio to 'as compiled'): "
          f"IREE flags {' '.join(WHAT_IF_FLAGS)} added; the GPT with a one-hot matmul embedding "
          "instead of gather, so its gradient needs no scatter\n")
    print(table(["model", "as compiled", "+ data tiling, ukernels", "one-hot embedding"], what_if_rows))
    print("\nagreement after one step from the same parameters, against the oracle: "
          "relative loss difference / worst scale-relative parameter difference\n")
    print(table(["model"] + list(COLUMNS), check_rows))
    print("\ntimed steps per cell: " + "; ".join(counts))
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
