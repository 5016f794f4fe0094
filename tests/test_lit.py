"""Run the lit suite (lit_tests/) from pytest, so `make test` covers the tools too."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIT = shutil.which("lit", path=os.path.dirname(sys.executable)) or shutil.which("lit")


@pytest.mark.skipif(LIT is None, reason="lit is not installed (pip install lit filecheck, or the [dev] extra)")
def test_lit_suite_passes():
    # lit's own interpreter must be this one: lit.cfg.py takes tools from it.
    result = subprocess.run(
        [sys.executable, LIT, "-q", os.path.join(ROOT, "lit_tests")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
