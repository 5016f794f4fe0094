"""Where a compiled step's time goes, dispatch by dispatch: IREE's own profiler over one benchmark model.

The model's step (``_zoo.py``) is exported for this machine's CPU
(``plan.export(..., cpu="host")``, with and without data tiling; built for
``local-task``, it is rebuilt on the flags of topos's ``local-sync`` calls
unless ``--driver local-task``), then
``iree-benchmark-module`` runs the artifact's ``module.vmfb`` on its own
inputs on one pinned CPU (local-sync, IREE's caching allocator as in
topos's own calls; ``--driver local-task``: the module built for
``local-task`` and run there on two workers, unpinned) with
``--device_profiling_mode=host-execution``, and ``iree-profile statistics``
reads the capture back. Printed per variant: the module's median time, the
dispatch time per call split by the kind IREE names each dispatch with
(``matmul``, ``batch_matmul``, ``reduction``, ``transpose``,
``elementwise``, ``encode``: data tiling's packing of an operand into its
tiled layout, ...), and the slowest dispatches (a dispatch may run several times a call:
one per block of the same shape) with their achieved GFLOP/s per run
where IREE's name gives a matmul's shape. ``--frozen`` (a forward-only
model) profiles the module ``compile(frozen=...)`` builds: the parameters
are globals read from the export's ``parameters.irpa`` and packed at load,
so no weight's packing is left in the call. Nothing is asserted.

Run: python benchmarks/profile_dispatches.py [--model gpt] [--calls 20] [--top 8] [--driver local-task] [--frozen]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from topos.dialect.iree.compile import compile_stablehlo, module_flags  # noqa: E402
from topos.dialect.iree.targets import target  # noqa: E402

from _timing import table  # noqa: E402
from _zoo import MODELS, build  # noqa: E402

_UNITS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
_LINE = re.compile(r"host_execute ((?:main_dispatch_\d+|_encoding_\d+)_(\S+))\s+count=(\d+) total=([\d.]+) (\w+)")
_KIND = re.compile(r"(batch_matmul|matmul|matvec_like|reduction|transpose|elementwise|slow_memcpy|scatter|"
                   r"pack|unpack|conv|encode)")
_SHAPE = re.compile(r"(?:batch_)?matmul_((?:\d+x)+\d+)_f")


def tool(name: str) -> str:
    """An IREE tool from this interpreter's environment (iree-base-runtime installs them beside python)."""
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} not found beside {sys.executable} or on PATH: pip install iree-base-runtime")
    return found


def input_flags(folder: Path) -> list[str]:
    """The artifact's inputs as iree-benchmark-module flags, read from its check.sh, with absolute paths.

    An array is spelled ``--input=@inputs/x.npy``; a scalar feed (a learning
    rate) ``--input=f32=@inputs/lr.bin``, its element type before the file; a
    frozen export's parameter archive ``--parameters=topos=parameters.irpa``.
    """
    script = (folder / "check.sh").read_text()
    archives = re.findall(r"--parameters=(\w+)=(\S+)", script)
    found = re.findall(r"--input=((?:\w+=)?)@(\S+)", script)
    return ([f"--parameters={scope}={folder / path}" for scope, path in archives]
            + [f"--input={kind}@{folder / path}" for kind, path in found])


def profile(folder: Path, calls: int, cpu: int,
            driver: str = "local-sync") -> tuple[float, dict[str, tuple[float, float]]]:
    """(median ms per call, dispatch name -> (ms per call, executions per call)) for the artifact in ``folder``.

    One dispatch may run more than once a call (a block's dispatch serves every block of the same shape).
    ``driver`` local-sync runs pinned to ``cpu``; local-task on two workers, unpinned.
    """
    inputs = input_flags(folder)
    capture = folder / "capture.ireeprof"
    placement = ["taskset", "-c", str(cpu)] if driver == "local-sync" else []
    workers = ["--task_topology_max_group_count=2"] if driver == "local-task" else []
    command = [*placement, tool("iree-benchmark-module"), f"--module={folder / 'module.vmfb'}",
               f"--device={driver}", *workers, "--device_allocator=caching", "--function=main", *inputs,
               f"--benchmark_min_time={calls}x", "--device_profiling_mode=host-execution",
               f"--device_profiling_output={capture}"]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    timed = re.search(r"BM_main\S*\s+([\d.]+) (ms|us|s)", done.stdout)
    median = float(timed.group(1)) * _UNITS[timed.group(2)] if timed else float("nan")
    statistics = subprocess.run([tool("iree-profile"), "statistics", str(capture)], capture_output=True,
                                text=True, check=True).stdout
    dispatches = {m.group(1): (float(m.group(4)) * _UNITS[m.group(5)] / calls, int(m.group(3)) / calls)
                  for m in map(_LINE.search, statistics.splitlines()) if m}
    return median, dispatches


def kind(name: str) -> str:
    found = _KIND.search(name.split("_", 3)[-1])
    return found.group(1) if found else "other"


def gflops(name: str, ms: float) -> str:
    shape = _SHAPE.search(name)
    if not shape or ms <= 0:
        return ""
    extents = [int(e) for e in shape.group(1).split("x")]
    multiply_adds = 1
    for extent in extents:
        multiply_adds *= extent
    return f"{2 * multiply_adds / (ms * 1e-3) / 1e9:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt", choices=MODELS)
    parser.add_argument("--calls", type=int, default=20, help="profiled calls (default 20)")
    parser.add_argument("--top", type=int, default=8, help="slowest dispatches listed (default 8)")
    parser.add_argument("--cpu", type=int, default=min(os.sched_getaffinity(0)), help="the CPU to pin to")
    parser.add_argument("--driver", default="local-sync", choices=("local-sync", "local-task"),
                        help="local-sync (one pinned CPU, the default) or local-task (two workers)")
    parser.add_argument("--frozen", action="store_true",
                        help="the parameters as module globals read from the export's parameters.irpa "
                             "(a forward-only model: GPT-2's), as compile(frozen=...) builds it")
    args = parser.parse_args()
    model = build(args.model)
    if args.frozen and model.updates.pairs():
        raise SystemExit(f"--frozen: {args.model} is a training step (it updates its parameters); "
                         "choose a forward-only model: gpt2-124m-forward")
    plan = model.network.entry(model.roots).lower()
    where = f"pinned to CPU {args.cpu}" if args.driver == "local-sync" else "on two local-task workers"
    print(f"{model.name}: {len(plan.schedule)} nodes; iree-benchmark-module {where}, {args.calls} profiled calls\n")
    with tempfile.TemporaryDirectory(prefix="topos-profile-") as scratch:
        for tiled in (False, True):
            folder = Path(scratch) / ("tiled" if tiled else "untiled")
            plan.export(folder, "llvm-cpu", parameters=model.parameters, feeds=model.feeds(0), cpu="host",
                        data_tiling=tiled, frozen=args.frozen)
            if args.driver == "local-sync":  # the export is already built for local-task, its check.sh's device
                flags = module_flags(plan, target("llvm-cpu"), "host", tiled, driver="local-sync",
                                     frozen=args.frozen)
                (folder / "module.vmfb").write_bytes(
                    compile_stablehlo((folder / "module.stablehlo.mlir").read_text(), flags))
            median, dispatches = profile(folder, args.calls, args.cpu, args.driver)
            total = sum(ms for ms, _ in dispatches.values())
            kinds: collections.Counter = collections.Counter()
            for name, (ms, _) in dispatches.items():
                kinds[kind(name)] += ms
            print(f"{'with' if tiled else 'without'} data tiling: module {median:.2f} ms per call, "
                  f"{len(dispatches)} dispatches, {total:.2f} ms of dispatch time per call\n")
            print(table(["kind", "ms per call", "share"],
                        [[k, f"{ms:.2f}", f"{100 * ms / total:.1f}%"] for k, ms in kinds.most_common()]))
            slowest = sorted(dispatches.items(), key=lambda item: -item[1][0])[:args.top]
            print()
            print(table(["slowest dispatches", "ms per call", "runs per call", "ms per run", "GFLOP/s"],
                        [[name, f"{ms:.2f}", f"{runs:g}", f"{ms / runs:.2f}", gflops(name, ms / runs)]
                         for name, (ms, runs) in slowest]))
            print()


if __name__ == "__main__":
    main()
