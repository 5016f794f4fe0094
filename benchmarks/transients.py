"""Transient storage, measured: each model's module with IREE's own allocation and with caller-provided storage.

A module compiled for ``local-task`` takes a buffer for its transient
values as its first argument (``topos.dialect.iree.compile.with_transient_storage``,
IREE's ``iree.abi.transients``); ``local-sync`` modules allocate their own.
This script is the evidence for that choice. Each model of ``_zoo.py``
is lowered once and its StableHLO compiled twice under topos's flags for
the driver: as it is, and with the storage argument. Both modules are
called on the same device-resident arguments in interleaved rounds (ABBA
order), on
``local-task`` (both cores, the default) or ``--driver local-sync`` (one
pinned core). Printed: median ms per call (wall on local-task, process
CPU on local-sync), the ratio (below 1: storage is faster), whether
the two modules' first results are bitwise the same, and the plan's
``transient_estimate`` beside the bytes IREE reports the module needs,
with what ``compile`` chooses by default. Nothing is asserted.

``--step`` (local-task) times topos's own ``compiled.step`` on resident
state instead of the module alone: the plan compiled with
``transient_storage=False`` and ``True``, stepped in the same ABBA rounds;
"same bits" then compares the first step's read-back value.

Run: python benchmarks/transients.py [--driver local-task|local-sync] [--step] [--rounds N] [--models mlp-s,gpt,...]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if not any(argument.startswith("--driver") for argument in sys.argv):
    sys.argv[1:1] = ["--driver", "local-task"]  # the default, spelled out for _pinning: IREE's workers get every CPU
from _pinning import PINNED_CPU  # noqa: E402  (first: --driver local-sync pins before NumPy loads)

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_variable] = "1"  # on both drivers: IREE's workers are what is measured, not NumPy's

import argparse  # noqa: E402

import iree.runtime as rt  # noqa: E402
import numpy as np  # noqa: E402

from topos.dialect.iree.compile import (  # noqa: E402
    TRANSIENT_SIZE,
    compile_stablehlo,
    transient_estimate,
    uses_transient_storage,
    with_transient_storage,
)
from topos.dialect.iree.targets import DATA_TILING_FLAGS  # noqa: E402

from _timing import chosen_models, cpu_model, table, versions  # noqa: E402
from _zoo import MODELS, PER_ROUND, models_that_fit  # noqa: E402
from compiled import Runner, measure, module_runner  # noqa: E402

VARIANTS = ("IREE's allocation", "transient storage")


def _host(outputs) -> list[np.ndarray]:
    return [np.asarray(o) for o in (outputs if isinstance(outputs, (list, tuple)) else [outputs])]


def _module_runners(model, plan, driver: str) -> tuple[dict, bool, int, list]:
    """(variant -> Runner of the module alone, whether their first results agree bitwise,
    the transient bytes IREE reports, the flags)."""
    compiled = plan.compile("llvm-cpu", driver, cache=False, transient_storage=False)
    text, flags = compiled.stablehlo, list(compiled.flags)  # the StableHLO without the storage argument
    arguments = compiled._arguments(model.parameters, model.feeds(0))
    stored = compile_stablehlo(with_transient_storage(text), flags)
    runners = {"IREE's allocation": module_runner(compile_stablehlo(text, flags), arguments, driver),
               "transient storage": module_runner(stored, arguments, driver)}
    module = rt.VmModule.copy_buffer(rt.VmInstance(), stored)  # held: its function does not keep it alive
    needed = int(module.lookup_function("main").reflection[TRANSIENT_SIZE])
    first = {name: _host(runner.step()) for name, runner in runners.items()}
    return runners, all(a.tobytes() == b.tobytes() for a, b in zip(*first.values())), needed, flags


def _step_runners(model, plan) -> tuple[dict, bool, int, list]:
    """(variant -> Runner of ``compiled.step`` on its own resident state, whether the first steps agree bitwise,
    the transient bytes IREE reports, the flags)."""
    runners, first = {}, []
    for name, storage in zip(VARIANTS, (False, True)):
        compiled = plan.compile("llvm-cpu", "local-task", cache=False, transient_storage=storage)
        state, run = compiled.step(compiled.resident(model.parameters), model.feeds(0), model.updates)
        first.append(np.asarray(run[model.read]).tobytes())
        held = [state]

        def step(compiled=compiled, held=held):
            held[0], _ = compiled.step(held[0], model.feeds(1), model.updates)

        runners[name] = Runner(step, lambda: None)
    needed = int(compiled._load().vm_function.reflection[TRANSIENT_SIZE])  # the last: with storage
    return runners, first[0] == first[1], needed, list(compiled.flags)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--driver", default="local-task", choices=("local-task", "local-sync"))
    parser.add_argument("--step", action="store_true", help="time compiled.step on resident state (local-task)")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds (default 10)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {', '.join(MODELS)}")
    args = parser.parse_args()
    if args.step and args.driver != "local-task":
        parser.error("--step compares compile(transient_storage=...), which only local-task offers")
    where = "both cores" if args.driver == "local-task" else f"pinned to CPU {PINNED_CPU}"
    print(f"machine: {cpu_model()}, {os.cpu_count()} CPUs; IREE {args.driver}, {where}")
    print(f"versions: {versions()}")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n", flush=True)
    rows = []
    for key, model in models_that_fit(chosen_models(parser, args.models, MODELS)):
        plan = model.network.entry(model.roots).lower()
        if args.step:
            runners, same, needed, flags = _step_runners(model, plan)
        else:
            runners, same, needed, flags = _module_runners(model, plan, args.driver)
        estimate = transient_estimate(plan, DATA_TILING_FLAGS[0] in flags, frozen=False)
        chosen = uses_transient_storage(plan, "local-task", flags, False, None)
        timing = measure(runners, dict.fromkeys(runners, PER_ROUND[key]), args.rounds, alternate=True)
        ms = {name: (t.wall if args.driver == "local-task" else t.cpu) * 1e3 for name, t in timing.items()}
        rows.append([model.name, *(f"{ms[name]:.3f}" for name in VARIANTS),
                     f"{ms['transient storage'] / ms[VARIANTS[0]]:.2f}", "yes" if same else "NO",
                     f"{estimate / 2**20:.2f}", f"{needed / 2**20:.2f}", "storage" if chosen else "IREE's"])
        print(f"{key}: done", flush=True)
        del runners
    clock = "wall" if args.driver == "local-task" else "process CPU"
    what = "compiled.step on resident state" if args.step else "module alone, arguments on the device"
    print(f"\n{what}: median {clock} ms per call; ratio = storage / IREE's allocation;")
    print("MiB: the plan's transient_estimate, and the transients IREE reports;"
          " chosen: compile's default on local-task\n")
    print(table(["model", *VARIANTS, "ratio", "same bits", "estimate MiB", "IREE MiB", "chosen"], rows))
    print(f"\nload average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
