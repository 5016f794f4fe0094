"""Packaging: every package folder ships, and `import topos` stays pure NumPy."""

import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set()
    for init in (ROOT / "topos").rglob("__init__.py"):
        found.add(".".join(init.parent.relative_to(ROOT).parts))
    for init in (ROOT / "dialect").rglob("__init__.py"):
        found.add(".".join(("topos", "dialect", *init.parent.relative_to(ROOT / "dialect").parts)))
    assert found == listed


def test_import_topos_loads_no_mlir_or_iree():
    code = ("import sys, topos, topos.nn; "
            "print(sorted(m for m in sys.modules if m.startswith(('iree', 'topos.dialect', 'jax'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
