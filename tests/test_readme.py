"""The README's code runs as written: its python blocks, in order, in one namespace."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TOPOS_CACHE_DIR", str(tmp_path))
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 3
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)


def test_readme_first_block_is_the_two_commands():
    first = re.search(r"```[a-z]*\n(.*?)```", README.read_text(), flags=re.S).group(1)
    assert first.strip().splitlines() == ["make demo", "make test"]
