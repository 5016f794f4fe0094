"""Shared by the benchmark scripts: the timers, a Markdown table printer, and what machine and versions ran."""

from __future__ import annotations

import gc
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np


def median_seconds(fn, repeats: int) -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` calls, after one warm-up call."""
    fn()  # first-call imports, caches, allocations
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@dataclass(frozen=True)
class Timing:
    wall: float  # median seconds per call on the clock
    cpu: float  # median CPU seconds per call, all threads of this process
    steps: int  # timed calls behind the medians


def interleaved(columns: dict[str, Callable[[], object]], per_round: int | dict[str, int], rounds: int,
                warmup: int = 0, alternate: bool = False) -> dict[str, Timing]:
    """name -> Timing of one call of each column, timed in interleaved rounds.

    Each round calls every column ``per_round`` times (a count, or name -> count)
    before moving on, so a machine that slows down mid-run slows every column
    alike; the garbage collector runs between rounds, never inside one. First
    come ``warmup`` calls of each column (one for a column called once a round:
    those are the slow ones). ``alternate``: every other round runs the columns
    in reverse order (ABBA), so that a column's place in the round (caches, a
    worker thread still awake) does not favour it.
    """
    counts = per_round if isinstance(per_round, dict) else dict.fromkeys(columns, per_round)
    for name, call in columns.items():
        for _ in range(warmup if counts[name] > 1 else min(warmup, 1)):
            call()
    wall: dict[str, list[float]] = {name: [] for name in columns}
    cpu: dict[str, list[float]] = {name: [] for name in columns}
    order = list(columns.items())
    for r in range(rounds):
        gc.collect()
        gc.disable()
        try:
            for name, call in (order[::-1] if alternate and r % 2 else order):
                for _ in range(counts[name]):
                    began, began_cpu = time.perf_counter(), time.process_time()
                    call()
                    cpu[name].append(time.process_time() - began_cpu)
                    wall[name].append(time.perf_counter() - began)
        finally:
            gc.enable()
    return {name: Timing(statistics.median(wall[name]), statistics.median(cpu[name]), len(wall[name]))
            for name in columns}


def relative_difference(got, want) -> float:
    """max |got - want| / max |want|: how far ``got`` is from ``want``, on the scale of ``want``."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-30))


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table with right-aligned numeric columns."""
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]

    def line(cells) -> str:
        return "| " + " | ".join(
            str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ) + " |"

    rule = "|" + "|".join("-" * (w + 1) + ("-" if i == 0 else ":") for i, w in enumerate(widths)) + "|"
    return "\n".join([line(header), rule] + [line(r) for r in rows])


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    import topos

    parts = [f"Python {platform.python_version()}", f"NumPy {np.__version__}", f"topos {topos.__version__}",
             f"iree-base-compiler {version('iree-base-compiler')}", f"iree-base-runtime {version('iree-base-runtime')}"]
    for name in ("jax", "jaxlib", "torch"):
        try:
            parts.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            parts.append(f"{name} not installed")
    return ", ".join(parts)


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def print_preamble(setting: str) -> None:
    """A benchmark's first lines: the machine, its thread setting, the versions and the load average."""
    print(f"machine: {cpu_model()}, {os.cpu_count()} CPUs; {setting}")
    print(f"versions: {versions()}")
    print(f"load average at start: {load_average()}\n", flush=True)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def chosen_models(parser, text: str, models) -> list[str]:
    """The comma-separated ``--models`` subset, in the order given; an unknown name is the parser's error."""
    chosen = [m.strip() for m in text.split(",") if m.strip()]
    unknown = set(chosen) - set(models)
    if unknown:
        parser.error(f"unknown model(s) {sorted(unknown)}; choose from {', '.join(models)}")
    return chosen
