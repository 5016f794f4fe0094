"""The thread setting of a benchmark, applied once per process before NumPy or JAX load.

Import it first: NumPy's BLAS and XLA size their thread pools when they
load (XLA by the affinity mask). Run as a script in ``benchmarks/``, a
benchmark is pinned to its lowest CPU with OPENBLAS/OMP/MKL_NUM_THREADS=1
by default; ``--threads 2``, ``--all-threads`` (the older spelling of
``compiled.py`` and ``gpt2.py``) or ``--driver local-task`` (IREE's
workers, ``transients.py``) leaves both alone. The script's command
line decides, once per process, so a benchmark another imports for its
helpers (``host_overhead.py`` under ``transfers.py --threads 2``) shares
the script's setting. A module that scripts import without importing
this first (``makemore_twins.py`` through ``_zoo.py``, which
``gpu_check.py`` uses; ``compiled.py``'s runners) imports it only when
run itself, so it never pins a script that chose not to be pinned.

Imported anywhere else (by a test, an example, a Python session) it
changes nothing and describes the process as it is: ``PINNED_CPU`` is
its CPU if it has only one. ``THREADS == 1`` exactly when ``PINNED_CPU``
is a CPU. ``python benchmarks/_pinning.py [--threads 2]`` prints the
setting.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
APPLIED = bool(sys.argv and sys.argv[0]) and Path(sys.argv[0]).resolve().parent == _HERE


def _option(name: str) -> str | None:
    """The value the command line gives ``name`` (``--name value`` or ``--name=value``), read before argparse runs."""
    for k, argument in enumerate(sys.argv[1:], 1):
        if argument == name:
            return sys.argv[k + 1] if k + 1 < len(sys.argv) else None
        if argument.startswith(name + "="):
            return argument.split("=", 1)[1]
    return None


_TWO = _option("--threads") == "2" or "--all-threads" in sys.argv or _option("--driver") == "local-task"
PINNED_CPU: int | None = None
if not APPLIED:
    _cpus = os.sched_getaffinity(0)
    PINNED_CPU = min(_cpus) if len(_cpus) == 1 else None
elif not _TWO:
    PINNED_CPU = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {PINNED_CPU})
    for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_variable] = "1"
THREADS = 1 if PINNED_CPU is not None else 2
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # XLA's start-up chatter

if __name__ == "__main__":
    print(f"threads {THREADS}, pinned to CPU {PINNED_CPU}, applied {APPLIED}, CPUs {sorted(os.sched_getaffinity(0))}")
