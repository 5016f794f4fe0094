"""Backend interrogation: which backends this machine has, and which one served each node of a run.

``topos.backends()`` lists every backend with its status here:

* ``oracle``: the reference kernels (``topos/base/reference.py``, ``refmath``),
  always available; what ``network.forward`` and EXACT plans run;
* ``numpy-fast``: the FAST posture's kernels (BLAS matmul, NumPy's native
  math and sums), each with its declared envelope;
* ``numpy-fused``: the NumPy executors of the fusion catalog's patterns
  (a group run as one kernel);
* one ``iree:<target>`` per IREE target: ``available`` (compiles and runs
  here), ``compiled-only`` (compiles here, but this machine has no device
  for its driver: the reason says why), ``run-only`` (IREE's runtime and
  a device but no compiler: it runs modules compiled elsewhere, from a
  compile cache) or ``missing`` (the ``[mlir]`` extra is not installed,
  or only the runtime is and the driver has no device).

A *dispatch tally* (``topos.readings.plan.tally``) says, per scheduled
node, which backend and which kernel served it: ``plan.tally()`` for a NumPy plan (the reference
kernel, a fast kernel, or the fused group that claimed it), and
``compiled.tally()`` for an IREE module (the dispatch whose region holds
the node's ops, read off the locations IREE keeps through its flow
phase; a node no dispatch computes, such as a reshape IREE folds into
its neighbours' indexing, is served by ``iree:<target>`` as ``(no
dispatch)``).
"""

from __future__ import annotations

from dataclasses import dataclass

from topos.readings.plan.numerics import FAST_KERNELS
from topos.readings.plan.patterns import CATALOG
from topos.readings.plan.tally import Dispatch


@dataclass(frozen=True)
class Backend:
    """One backend and its status on this machine."""

    name: str
    status: str  # "available", "compiled-only", "run-only" or "missing"
    detail: str  # what it is, or why it is not available

    def __str__(self) -> str:
        return f"{self.name:<18} {self.status:<14} {self.detail}"


def backends() -> tuple[Backend, ...]:
    """Every backend topos knows, with its status here (cheap: lists devices, creates none)."""
    import numpy as np

    found = [
        Backend("oracle", "available", "reference kernels: the bits every other backend is graded against"),
        Backend("numpy-fast", "available", f"NumPy {np.__version__}: {len(FAST_KERNELS)} fast kernels "
                                           f"({', '.join(sorted(FAST_KERNELS)[:4])}, ...) within envelopes"),
        Backend("numpy-fused", "available", "fusion executors: " + ", ".join(
            p.kind for p in CATALOG if p.executes)),
    ]
    return tuple(found) + _iree_backends()


def _iree_backends() -> tuple[Backend, ...]:
    try:
        import iree.runtime as rt

        from topos.dialect.ir.bindings import compiler_missing
        from topos.dialect.iree.targets import TARGETS
    except ImportError as error:
        return (Backend("iree", "missing", f"the [mlir] extra is not installed ({error}): "
                                           "pip install 'topos[mlir]'"),)
    drivers = set(rt.query_available_drivers())
    missing = compiler_missing()
    found = []
    for target in TARGETS.values():
        status, detail = _driver_status(rt, drivers, target.driver)
        if missing is not None and status == "available":  # only the runtime: modules compiled elsewhere run
            status, detail = "run-only", (f"{detail}; no compiler here ({missing}): it runs modules compiled "
                                          "elsewhere, from a compile cache (docs/deploy.md)")
        elif missing is not None:
            status, detail = "missing", f"{detail}; no compiler here either ({missing}): pip install iree-base-compiler"
        found.append(Backend(f"iree:{target.name}", status, detail))
    return tuple(found)


def _driver_status(rt, drivers: set, driver: str) -> tuple[str, str]:
    if driver not in drivers:
        return "compiled-only", f"driver {driver!r} is not in this IREE runtime build"
    try:
        devices = rt.get_driver(driver).query_available_devices()
    except Exception as error:  # noqa: BLE001  (the driver's own reason: a missing libcuda, say)
        return "compiled-only", f"driver {driver!r}: {_first_line(error)}"
    if not devices:
        return "compiled-only", f"driver {driver!r} finds no device"
    names = ", ".join(d.get("name") or d.get("path") or str(d.get("device_id")) for d in devices)
    return "available", f"driver {driver!r}: {names}"


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return text.split(";", 1)[-1].strip() if ";" in text else text


def describe_tally(tally) -> str:
    """The tally one line per node, then the count per backend."""
    lines = [str(d) for d in tally]
    counts: dict[str, int] = {}
    for d in tally:
        counts[d.backend] = counts.get(d.backend, 0) + 1
    lines.append("served: " + ", ".join(f"{b} {c}" for b, c in counts.items()))
    return "\n".join(lines)


__all__ = ["Backend", "Dispatch", "backends", "describe_tally"]
