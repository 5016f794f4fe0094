"""Rule 3, proven: the oracle's bits are pinned, and NumPy's SIMD paths cannot move them."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from _cpu_features import disable_simd_env
from _digest_graphs import digests

HERE = Path(__file__).parent

# Computed once on the reference machine; any change to a kernel, to refmath
# or to an accumulation order shows up here as a changed digest.
PINNED = {
    "float32": "f52c8bda78bbea7d2da2228bed22ad0435ef0a190a821f42d5501155aa5b33a1",
    "float64": "865283a2896a73d3e8400259c754918d01c6ff6bd8b28c643c44b957b92b6647",
    "bfloat16": "a5682a416d1bd10c6f61054d87e503a939f75007180fb48566e1d3ecfc8af550",
}


def test_oracle_digests_match_the_pinned_values():
    assert digests() == PINNED


def test_oracle_digests_do_not_change_with_numpy_simd_disabled():
    env = disable_simd_env()
    if env is None:
        pytest.skip("this machine reports no dispatchable SIMD features to disable")
    script = HERE / "_digest_graphs.py"
    out = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == digests()
