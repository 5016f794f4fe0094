"""The thread setting of a benchmark that offers ``--threads 1|2``, applied before NumPy or JAX load.

Import it first: NumPy's BLAS and XLA size their thread pools when they
load (XLA by the affinity mask). ``--threads 1`` (the default) pins the
process to its lowest CPU and sets OPENBLAS/OMP/MKL_NUM_THREADS=1;
``--threads 2`` leaves both alone. ``PINNED_CPU`` is None on two threads;
``STARTING_CPUS`` are the process's CPUs before anything pinned it, for a
script whose imports pin it (``benchmarks/compiled.py`` does) to restore.
"""

from __future__ import annotations

import os
import sys

THREADS = 2 if "--threads" in sys.argv and sys.argv[sys.argv.index("--threads") + 1:][:1] == ["2"] else 1
STARTING_CPUS = frozenset(os.sched_getaffinity(0))  # the process's CPUs before any benchmark module pinned it
PINNED_CPU: int | None = None
if THREADS == 1:
    PINNED_CPU = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {PINNED_CPU})
    for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_variable] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # XLA's start-up chatter
