"""Memory of one compiled step: the plan's prediction, IREE's measured peak, and jax.jit's.

For each model of the zoo (``_zoo.py``: the two MLPs, the 2-block GPT,
makemore's MLP and transformer, the MNIST LeNet, GPT-2 124M forward), in
a fresh process of its own (topos keeps one device per driver in a
process, and its allocator's peak counts from the device's creation):

* plan           ``plan.peak()``: the most bytes of computed values the
                 plan holds at once, plus the parameters and inputs it reads
                 (which the plan does not count: they are the caller's)
* IREE measured  ``compiled.device_memory()["device_bytes_peak"]`` after
                 ``resident`` and three ``step`` calls (llvm-cpu, local-sync)
* jax.jit        XLA's ``memory_analysis()`` of the twin's compiled step:
                 arguments + outputs + temporaries - aliased (donated) bytes

Nothing is asserted. A missing jax prints its column as absent, a
backend without XLA's analysis says so, and a model too large for the
machine is skipped with a message (``_zoo.too_large``).

Run: python benchmarks/memory.py [--models mlp-s,gpt,...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _zoo import MODELS, too_large  # noqa: E402

SOURCES = ("parameter", "input")


def measure(key: str) -> dict:
    """Run in the child: one model's three figures, as JSON-able numbers."""
    import numpy as np

    from topos.readings.plan.plan import spec_bytes  # the plan's own byte count (a selection's indices are int64)

    from _zoo import build, jax_step

    model = build(key)
    network = model.network
    plan = network.entry(model.roots).lower()
    compiled = plan.compile("llvm-cpu")
    columns = network.columns
    sources = sum(spec_bytes(columns.specs[n]) for n in plan.schedule if columns.opcodes[n].name in SOURCES)
    state = compiled.resident(model.parameters)
    for k in range(3):
        state, run = compiled.step(state, model.feeds(k), model.updates)
        np.asarray(run[model.read])
    figures = {"name": model.name, "plan": plan.peak()[0] + sources, "plan_values": plan.peak()[0],
               "sources": sources, "iree": compiled.device_memory().get("device_bytes_peak")}
    try:
        import jax  # noqa: F401
    except ImportError:
        figures["jax"] = "absent (jax is not installed: pip install 'topos[bench]')"
        return figures
    stats = jax_step(model).memory
    figures["jax"] = ((stats["argument"] + stats["output"] + stats["temp"] - stats["alias"]) if stats
                      else "not measured (this backend gives no XLA memory analysis)")
    return figures


def _mib(value) -> str:
    return f"{value / 2**20:.2f}" if isinstance(value, (int, float)) else str(value)


def main() -> None:
    from _timing import chosen_models, cpu_model, table

    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--models", default=",".join(MODELS))
    rows = []
    print(f"{cpu_model()}; each model in a process of its own\n")
    for model in chosen_models(options, options.parse_args().models, MODELS):
        skipped = too_large(model)
        if skipped:
            print(skipped)
            continue
        done = subprocess.run([sys.executable, __file__, "--child", model], capture_output=True, text=True)
        if done.returncode != 0:
            rows.append([model, "failed", "", "", done.stderr.strip().splitlines()[-1][:80]])
            continue
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append([figures["name"], _mib(figures["plan"]), f"({_mib(figures['plan_values'])} values)",
                     _mib(figures["iree"]), _mib(figures["jax"])])
    print(table(["model", "plan MiB", "", "IREE measured MiB", "jax.jit MiB"], rows))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(measure(sys.argv[2])))
    else:
        main()
