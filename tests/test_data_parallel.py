"""examples/data_parallel.py at tiny sizes: the makemore MLP step sharded over two XLA host devices.

The example runs in a child process, because the number of host devices
is fixed when jax starts (``--xla_force_host_platform_device_count``).
It grades the sharded step node by node against the oracle (before and
after training), compares it with the single-device run, and times both.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")
pytest.importorskip("iree.compiler")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "data_parallel.py"


def test_the_sharded_step_is_graded_within_its_envelopes_and_tracks_the_single_device_run():
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--devices", "2", "--steps", "3", "--batch", "16", "--hidden", "16",
         "--timing", "1,2", "--timing-steps", "2", "--timing-rounds", "1"],
        capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    out = done.stdout
    assert re.search(r"on cpu: 2 devices", out), out
    graded = re.findall(r"graded against the oracle, (\d+) nodes, (\d+) outside their envelopes", out)
    assert len(graded) == 2 and all(int(nodes) > 30 and int(bad) == 0 for nodes, bad in graded), out
    partition = re.search(r"with (\d+) all-reduces?; every parameter is replicated on devices \[0, 1\]", out)
    assert partition and int(partition.group(1)) >= 1, out
    drift = re.search(r"max relative difference of the parameters \S+ \(([\d.]+) eps", out)
    assert drift and float(drift.group(1)) <= 16 * 3, out
    rows = re.findall(r"^\s+(\d)\s+([\d.]+)\s+([\d.]+)x$", out, re.MULTILINE)
    assert [r[0] for r in rows] == ["1", "2"], out


def test_a_batch_that_does_not_split_is_refused_before_jax_starts():
    done = subprocess.run([sys.executable, str(EXAMPLE), "--devices", "3", "--batch", "16", "--timing", ""],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0 and "does not split over 3 devices" in done.stderr


@pytest.mark.parametrize("options, named", [
    (["--devices", "0"], "--devices: must be a positive integer, got 0"),
    (["--timing", "1,two"], "--timing: takes device counts separated by commas"),
    (["--batch", "-4"], "--batch: must be a positive integer, got -4"),
])
def test_counts_that_are_not_positive_integers_are_named_by_their_option(options, named):
    done = subprocess.run([sys.executable, str(EXAMPLE), *options], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 2 and named in done.stderr and "Traceback" not in done.stderr, done.stderr
