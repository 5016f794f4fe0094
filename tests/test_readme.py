"""The README and every guide in docs/ run as written.

Each page's ```python blocks run in order, in one namespace. A block that
needs what a test machine lacks (a GPU, a second machine) is fenced
```python fragment: it is only compiled, so it stays valid Python.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = ["README.md", *sorted(f"docs/{page.name}" for page in (ROOT / "docs").glob("*.md"))]


def _blocks(document: str, info: str = "python") -> list[str]:
    return re.findall(rf"```{info}\n(.*?)```", (ROOT / document).read_text(), flags=re.S)


@pytest.mark.parametrize("document", [page for page in PAGES if _blocks(page)])
def test_python_blocks_run(tmp_path, monkeypatch, capsys, document):
    monkeypatch.setenv("TOPOS_CACHE_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # files the examples write land here
    path = ROOT / document
    namespace: dict = {}
    for block in _blocks(document):
        exec(compile(block, str(path), "exec"), namespace)


def test_the_pages_that_teach_in_code_run_and_fragments_are_valid_python():
    running = [page for page in PAGES if _blocks(page)]
    assert {"README.md", "docs/recording.md", "docs/compiling.md", "docs/reliability.md"} <= set(running)
    fragments = [(page, block) for page in PAGES for block in _blocks(page, "python fragment")]
    assert fragments, "docs/deploy.md's two-machine block is a fragment"
    for page, block in fragments:
        compile(block, page, "exec")


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


def test_every_count_of_opcodes_and_map_functions_in_prose_is_the_vocabularys():
    """ "27 opcodes" is written in guides and docstrings; each one must say what topos.OPCODES holds."""
    import topos

    counts = {"opcodes": {len(topos.OPCODES), sum(not op.is_source for op in topos.OPCODES)},
              "map functions": {len(topos.MAP_FUNCTIONS)}}
    wrong = []
    files = [*ROOT.glob("README.md"), *ROOT.glob("docs/**/*.md"), *ROOT.glob("topos/**/*.py"),
             *ROOT.glob("dialect/**/*.py"), *ROOT.glob("tests/**/*.py")]
    for path in files:
        for number, noun in re.findall(r"\b(\d+) (opcodes|map functions)\b", path.read_text()):
            if int(number) not in counts[noun]:
                wrong.append(f"{path.relative_to(ROOT)}: {number} {noun}")
    assert not wrong, f"counts that are not the vocabulary's ({counts}): {wrong}"
