"""Shared helpers for the core's tests: element types, tolerances, seeded data, line numbers, lavapipe.

Tolerances are stated in units of each element type's machine epsilon
(the gap between 1 and the next number), so one table of "how many
roundings may this take" serves float64, float32 and bfloat16 alike.
"""

from __future__ import annotations

import inspect
import os
import re
import zlib
from pathlib import Path

import numpy as np
import pytest

import topos

ELEMENTS = (topos.float64, topos.float32, topos.bfloat16)
ELEMENT_IDS = ("f64", "f32", "bf16")

EPSILON = {
    topos.float64: 2.0**-52,
    topos.float32: 2.0**-23,
    topos.bfloat16: 2.0**-7,
}


@pytest.fixture(params=ELEMENTS, ids=ELEMENT_IDS)
def element(request):
    """Each element type in turn."""
    return request.param


LAVAPIPE_ICD = Path("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json")


@pytest.fixture
def lavapipe(monkeypatch):
    """Vulkan on the CPU: VK_ICD_FILENAMES pointing at Mesa's lavapipe (unless the caller chose a Vulkan
    ICD already); skipped where lavapipe is not installed."""
    if not os.environ.get("VK_ICD_FILENAMES"):
        if not LAVAPIPE_ICD.exists():
            pytest.skip(f"Mesa lavapipe is not installed ({LAVAPIPE_ICD} is missing; "
                        "apt-get install mesa-vulkan-drivers libvulkan1)")
        monkeypatch.setenv("VK_ICD_FILENAMES", str(LAVAPIPE_ICD))


def generator(*key) -> np.random.Generator:
    """A random generator seeded by a readable key, so every test draws the same data on every run."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def assert_close(got, want, dtype, epsilons: float, scale=None, what: str = "") -> None:
    """Assert |got - want| <= epsilons * eps(dtype) * scale elementwise (scale defaults to |want|).

    ``want`` is a float64 (or better) reference computed independently of
    topos. ``scale`` is the magnitude the error bound is proportional to,
    for example sum(|terms|) for a sum, where cancellation makes |want|
    the wrong yardstick.
    """
    got64 = np.asarray(got).astype(np.float64)
    want64 = np.asarray(want, dtype=np.float64)
    assert got64.shape == want64.shape, f"{what}: shape {got64.shape} != {want64.shape}"
    magnitude = np.abs(want64) if scale is None else np.asarray(scale, dtype=np.float64)
    bound = epsilons * EPSILON[np.dtype(dtype)] * magnitude
    error = np.abs(got64 - want64)
    same_special = (np.isnan(got64) & np.isnan(want64)) | (got64 == want64)
    bad = ~same_special & ~(error <= bound)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.size} elements off; first at {where}: "
            f"got {got64[where]!r}, want {want64[where]!r}, error {error[where]:.3g} > "
            f"bound {bound[where]:.3g} ({epsilons} eps of {np.dtype(dtype).name})"
        )


def line_here() -> int:
    """The caller's current line number, to check that errors point at the user's line."""
    return inspect.currentframe().f_back.f_lineno


# One describe line: index, opcode, (operands), attributes (optional), [shape], dtype.
DESCRIBE_LINE = re.compile(
    r"^\s*(?P<index>\d+)  (?P<opcode>[a-z_]+)\s+\((?P<operands>[\d, ]*)\)\s+"
    r"(?:(?P<attributes>\S.*?)\s+)?\[(?P<shape>[\d, ]*)\] (?P<dtype>f32|f64|bf16|index<\d+>)$"
)


def described_opcodes(network, start: int = 0) -> list[str]:
    """The opcode column of ``network.describe()`` from node ``start`` on, attributes appended."""
    rows = []
    for line in network.describe().splitlines()[start:-1]:
        match = DESCRIBE_LINE.match(line)
        assert match, f"unparseable describe line: {line!r}"
        rows.append(" ".join(filter(None, (match["opcode"], match["attributes"]))))
    return rows


# The longest files of the default run (pytest --durations, 2026-12-01), started first: under
# `-n auto --dist loadfile` a file runs whole on one worker, and these sort late by path
# (tests/test_* after tests/dialect and tests/iree), so one of them left for last kept a single
# worker busy for minutes while the other sat idle.
LONGEST_FIRST = ("test_lit.py", "test_fuzz_stack.py", "test_examples_makemore.py", "test_benchmark_models.py",
                 "test_conformance.py", "test_opt_fuzz.py", "test_raise_training.py", "test_invoke_path.py",
                 "test_examples_vision.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its order
