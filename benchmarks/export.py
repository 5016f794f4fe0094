"""plan.export measured: artifact sizes per target, export time, and how long check.sh takes.

Two training steps (the walkthrough's graph, and makemore's MLP step,
examples/makemore/mlp.py with SGD at batch 64), exported for every target;
``check.sh`` is run (with IREE's native iree-run-module, no Python) where
the target's device is on this machine. Nothing is asserted.

Run: python benchmarks/export.py
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import numpy as np  # noqa: E402

import topos  # noqa: E402

from _timing import table  # noqa: E402
from drawing import makemore_mlp, walkthrough  # noqa: E402

TARGETS = {"llvm-cpu": "local-task", "cuda": "cuda", "vulkan-spirv": "vulkan", "metal-spirv": "metal",
           "rocm": "hip"}


def runnable(device: str) -> bool:
    import iree.runtime as rt

    try:
        rt.get_driver(device).create_default_device()
    except Exception:  # noqa: BLE001  (no such driver or device here)
        return False
    return True


def main() -> None:
    runtime = Path(importlib.util.find_spec("iree._runtime_libs").origin).parent / "iree-run-module"
    rows = []
    for name, build in (("walkthrough step", walkthrough), ("makemore MLP step", makemore_mlp)):
        network, loss, _, updates = build()
        plan = network.entry(updates.roots(loss)).lower()
        rng = np.random.default_rng(0)
        feeds = {node.name: topos.selection(rng.integers(0, node.dtype.extent, node.shape), node.dtype.extent)
                 for node in network.nodes() if node.opcode.name == "input" and node.role == "required"}
        for target, device in TARGETS.items():
            with tempfile.TemporaryDirectory() as scratch:
                started = time.perf_counter()
                try:
                    folder = plan.export(Path(scratch) / "out", target, feeds=feeds)
                except topos.ToposError as error:  # IREE refuses this model for this target
                    reason = str(error).splitlines()[1].strip()[:90] if "\n" in str(error) else str(error)[:90]
                    rows.append([name, target, "refused", "", "", reason])
                    continue
                exported = time.perf_counter() - started
                vmfb = (folder / "module.vmfb").stat().st_size
                total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
                check = "absent (no device)"
                if runnable(device):
                    started = time.perf_counter()
                    done = subprocess.run(["sh", str(folder / "check.sh")], capture_output=True,
                                          env={"PATH": "/usr/bin:/bin", "IREE_RUN_MODULE": str(runtime)})
                    check = f"{(time.perf_counter() - started) * 1000:.0f} ms" + ("" if done.returncode == 0
                                                                                  else " FAILED")
                rows.append([name, target, f"{vmfb / 1024:.1f}", f"{total / 1024:.1f}", f"{exported:.2f}", check])
    print(table(["model", "target", "module.vmfb KiB", "artifact KiB", "export s", "check.sh"], rows))


if __name__ == "__main__":
    main()
