"""Memory of one compiled training step: the plan's prediction, IREE's measured peak, and jax.jit's.

For each model of benchmarks/compiled.py (MLP 784-128-10, MLP
784-1024-1024-10, the 2-block GPT; SGD, float32), in a fresh process of
its own (IREE keeps one device per driver in a process, and its
allocator's peak counts from the device's creation):

* plan           ``plan.peak()``: the most bytes of computed values the
                 plan holds at once, plus the parameters and inputs it reads
                 (which the plan does not count: they are the caller's)
* IREE measured  ``compiled.device_memory()["device_bytes_peak"]`` after
                 ``resident`` and three ``step`` calls (llvm-cpu, local-sync)
* jax.jit        XLA's ``memory_analysis()`` of the compiled step:
                 arguments + outputs + temporaries - aliased (donated) bytes

Nothing is asserted. A missing jax prints its column as absent.

Run: python benchmarks/memory.py [--models mlp-s,mlp-m,gpt]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

MODELS = ("mlp-s", "mlp-m", "gpt")


def measure(model: str) -> dict:
    """Run in the child: one model's three figures, as JSON-able numbers."""
    import numpy as np
    from _gpt import mlp_m, mlp_s, small_gpt

    workload = {"mlp-s": mlp_s, "mlp-m": mlp_m, "gpt": small_gpt}[model]()
    network = workload.trained
    plan = network.entry(workload.updates.roots(workload.loss)).lower()
    compiled = plan.compile("llvm-cpu")
    sources = sum(int(np.asarray(a).nbytes) for a in workload.named_parameters().values())
    sources += sum(int(np.asarray(getattr(a, "indices", a)).nbytes) for a in workload.feeds.values())
    state = compiled.resident(workload.parameters)
    for _ in range(3):
        state, run = compiled.step(state, workload.feeds, workload.updates)
        float(run[workload.loss])
    figures = {"name": workload.name, "plan": plan.peak()[0] + sources, "plan_values": plan.peak()[0],
               "sources": sources, "iree": compiled.device_memory().get("device_bytes_peak")}
    try:
        from _peers import jax_peer
    except ImportError as error:
        figures["jax"] = f"absent ({error})"
        return figures
    try:
        import jax  # noqa: F401
    except ImportError:
        figures["jax"] = "absent (jax is not installed: pip install 'topos[bench]')"
        return figures
    peer = jax_peer(workload)
    stats = peer.memory
    figures["jax"] = (stats["argument"] + stats["output"] + stats["temp"] - stats["alias"]) if stats else None
    return figures


def _mib(value) -> str:
    return f"{value / 2**20:.2f}" if isinstance(value, (int, float)) else str(value)


def main() -> None:
    from _timing import table

    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--models", default=",".join(MODELS))
    chosen = options.parse_args().models.split(",")
    rows = []
    for model in chosen:
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
