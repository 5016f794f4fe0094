"""The README and the guides run as written (README, facades, recording).

Each one's python blocks run in order, in one namespace.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


@pytest.mark.parametrize("document", ["README.md", "docs/facades.md", "docs/recording.md"])
def test_python_blocks_run(tmp_path, monkeypatch, capsys, document):
    monkeypatch.setenv("TOPOS_CACHE_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # files the examples write land here
    path = ROOT / document
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)
    assert len(blocks) >= 3
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(path), "exec"), namespace)


def test_readme_first_block_is_the_two_commands():
    first = re.search(r"```[a-z]*\n(.*?)```", README.read_text(), flags=re.S).group(1)
    assert first.strip().splitlines() == ["make demo", "make test"]


def test_every_example_the_readme_lists_exists_and_has_its_row_in_docs_examples():
    scripts = re.findall(r"^\.venv/bin/python (examples/\S+\.py)", README.read_text(), flags=re.M)
    assert len(scripts) >= 9
    guide = (ROOT / "docs" / "examples.md").read_text()
    for script in scripts:
        assert (ROOT / script).is_file(), script
        assert f"python {script}" in guide, f"{script} has no command in docs/examples.md"
