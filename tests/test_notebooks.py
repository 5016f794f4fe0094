"""The notebooks of docs/notebooks/ run top to bottom in a fresh kernel, and are committed stripped.

Each notebook runs with nbclient in a python3 kernel of this very interpreter: the test
writes that kernelspec into a temporary JUPYTER_PATH, so a user's own "python3" kernel
cannot shadow it, and a hidden first cell checks the kernel's sys.prefix. The kernel
works in a temporary folder with its own compile cache, so nothing lands in docs/ or in
the user's cache. A failure names the notebook and the cell; each notebook's execution
time is printed (``pytest -s`` shows it).

Committed notebooks carry no outputs, no execution counts and minimal metadata;
``python tests/test_notebooks.py --strip`` puts them in that form.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "docs" / "notebooks").glob("*.ipynb"))
MISSING = "the notebook tests need nbclient and ipykernel: pip install nbclient ipykernel"
METADATA = {
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
}
# The hidden first cell: the kernel must be this interpreter, not whatever "python3" a user has.
KERNEL_CHECK = (
    "import sys\n"
    f"assert sys.prefix == {sys.prefix!r}, "
    f"f'the kernel runs {{sys.executable}}, not the interpreter of the tests ({sys.executable})'"
)


def stripped(notebook: dict) -> dict:
    """The notebook as it is committed: no outputs, no execution counts, no cell metadata, minimal metadata."""
    clean = copy.deepcopy(notebook)
    clean["metadata"] = copy.deepcopy(METADATA)
    for cell in clean["cells"]:
        cell["metadata"] = {}
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    return clean


@pytest.fixture(scope="module")
def kernel_folder(tmp_path_factory):
    """A working folder for the kernels, with this interpreter's kernelspec and a compile cache of their own."""
    spec = tmp_path_factory.mktemp("jupyter") / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3", "language": "python",
    }))
    folder = tmp_path_factory.mktemp("notebooks")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JUPYTER_PATH", str(spec.parents[1]))  # searched before the user's and the system's
        patch.setenv("JUPYTER_RUNTIME_DIR", str(folder / "runtime"))
        patch.setenv("IPYTHONDIR", str(folder / "ipython"))
        patch.setenv("TOPOS_CACHE_DIR", str(folder / "cache"))
        yield folder


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path, kernel_folder, record_property):
    nbclient = pytest.importorskip("nbclient", reason=MISSING)
    pytest.importorskip("ipykernel", reason=MISSING)
    import nbformat  # nbclient depends on it

    notebook = nbformat.read(path, as_version=4)  # a copy in memory: the file is never written
    notebook.cells.insert(0, nbformat.v4.new_code_cell(KERNEL_CHECK))
    client = nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(kernel_folder)}})
    began = time.perf_counter()
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError:
        pytest.fail(_failure(path.name, notebook.cells), pytrace=False)
    except Exception as error:  # a timeout or a dead kernel: nbclient's message names the cell
        pytest.fail(f"{path.name}: {type(error).__name__}: {error}", pytrace=False)
    seconds = time.perf_counter() - began
    record_property("seconds", round(seconds, 2))
    print(f"{path.name}: {seconds:.1f} s")


def _failure(name: str, cells) -> str:
    """Which cell of the committed notebook failed (the hidden check is cell -1), its source and its error."""
    for index, cell in enumerate(cells):
        errors = [o for o in cell.get("outputs", ()) if o.output_type == "error"]
        if errors:
            if index == 0:
                return f"{name}: {errors[0].ename}: {errors[0].evalue}"
            number = sum(c.cell_type == "code" for c in cells[1:index + 1])
            return (f"{name}, cell {index - 1} (code cell {number}) failed:\n{cell.source}\n\n"
                    f"{errors[0].ename}: {errors[0].evalue}")
    return f"{name}: a cell failed without an error output"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_notebook_is_stripped(path):
    notebook = json.loads(path.read_text(encoding="utf-8"))
    clean = stripped(notebook)
    wrong = ["the notebook metadata"] if notebook["metadata"] != clean["metadata"] else []
    wrong += [f"cell {k}" for k, (cell, want) in enumerate(zip(notebook["cells"], clean["cells"])) if cell != want]
    assert not wrong, (f"{path.name} is not stripped ({', '.join(wrong)}): outputs, execution counts or metadata; "
                       "run python tests/test_notebooks.py --strip")


def test_examples_guide_lists_every_notebook():
    assert len(NOTEBOOKS) >= 5
    guide = (ROOT / "docs" / "examples.md").read_text(encoding="utf-8")
    for path in NOTEBOOKS:
        assert f"notebooks/{path.name}" in guide, f"docs/examples.md does not list {path.name}"


if __name__ == "__main__":  # python tests/test_notebooks.py --strip
    if sys.argv[1:] != ["--strip"]:
        raise SystemExit("usage: python tests/test_notebooks.py --strip  (strips every notebook in docs/notebooks/)")
    import nbformat

    for path in NOTEBOOKS:
        nbformat.write(nbformat.from_dict(stripped(nbformat.read(path, as_version=4))), path)
        print(f"stripped {path.relative_to(ROOT)}")
