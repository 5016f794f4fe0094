"""The makemore examples run end to end: a few steps of each at small sizes, in-process, on every route.

Each example's ``main(argv)`` trains on the first 1,000 shipped names
(the 80/10/10 split leaves 100 for dev), prints the series' last lines
(the report, the training figure, ``dev loss``, ``samples``), and the
figures are finite and below a uniform guess (log 27) once trained. Every
compiled step lands in one cache folder under the test's tmp directory,
never the user's. The twin benchmark gets a smoke run in a subprocess (it
pins its process to one CPU).
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKEMORE = ROOT / "examples" / "makemore"
UNIFORM = math.log(27)  # the loss of a model that knows nothing
PNG = b"\x89PNG\r\n\x1a\n"
REPORT = re.compile(r"route (iree|iree on vulkan|plan|oracle)(, compile \d+\.\d s)?, \d+\.\d\d ms/step"
                    r"(, first steps within \d+\.\d\d ulps of the oracle)?")


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"makemore_{name}", MAKEMORE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # puts examples/ and examples/makemore/ on sys.path
    return module


EXAMPLES = {name: load_example(name) for name in ("bigram", "mlp", "batchnorm", "wavenet", "transformer")}
import topos  # noqa: E402

from _training import ExampleError, Trainer  # noqa: E402  (examples/ is on sys.path now)
from names import contexts, load  # noqa: E402


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("makemore-cache")


@pytest.fixture(autouse=True)
def _compile_cache(cache, monkeypatch):
    monkeypatch.setenv("TOPOS_CACHE_DIR", str(cache))


@pytest.fixture(scope="module")
def small_names(tmp_path_factory) -> str:
    """The first 1,000 shipped names: every letter of a-z, 800 to train on and 100 for dev."""
    path = tmp_path_factory.mktemp("names") / "names.txt"
    path.write_text("\n".join((MAKEMORE / "names.txt").read_text().split()[:1000]) + "\n")
    return str(path)


def run(name: str, argv: list[str], capsys) -> list[str]:
    EXAMPLES[name].main(argv)
    return capsys.readouterr().out.strip().splitlines()


def figure(line: str, label: str) -> float:
    """The X.XXXX of a ``label: X.XXXX`` line (anything after it in parentheses allowed), finite."""
    match = re.fullmatch(rf"{label}: (\d+\.\d{{4}})( \(.*\))?", line)
    assert match, f"expected '{label}: X.XXXX', got {line!r}"
    value = float(match.group(1))
    assert math.isfinite(value) and value > 0
    return value


def samples(line: str, count: int) -> list[str]:
    assert line.startswith("samples: "), line
    words = line[len("samples: "):].split(" ")
    assert len(words) == count and all(re.fullmatch(r"[a-z]*", w) for w in words), line
    return words


def check_tail(lines: list[str], route: str, count: int = 20) -> tuple[float, float]:
    """The series' last four lines: report, last-500 mean loss, dev loss, samples -> (training, dev)."""
    report, training, dev, drawn = lines[-4:]
    assert REPORT.fullmatch(report) and report.startswith(f"route {route}"), report
    samples(drawn, count)
    return figure(training, "last-500 mean loss"), figure(dev, "dev loss")


@pytest.mark.parametrize("route", ["iree", "oracle"])
def test_mlp_trains_and_prints_the_series_last_lines(route, small_names, capsys):
    lines = run("mlp", ["--steps", "60", "--hidden", "16", "--quiet", "--route", route, "--data", small_names], capsys)
    training, dev = check_tail(lines, route)
    assert training < UNIFORM + 0.2 and dev < UNIFORM


# The transformer's run (about 20 s) is slow-marked: attention on SPIR-V is covered in the default run by
# tests/test_examples_gpt2.py's prefill and decode on lavapipe, and the MLP's run covers training on vulkan.
@pytest.mark.parametrize("name, argv", [
    ("mlp", ["--hidden", "16"]),
    pytest.param("transformer", ["--heads", "1", "--head-size", "8", "--batch", "4"], marks=pytest.mark.slow)])
def test_makemore_trains_on_vulkan_through_lavapipe(name, argv, small_names, capsys, lavapipe):
    """--target vulkan: the embedding's selections narrowed to i32 and its scatter compiled for SPIR-V."""
    lines = run(name, ["--steps", "30", "--quiet", "--samples", "40", "--target", "vulkan", "--data", small_names,
                       *argv], capsys)
    training, dev = check_tail(lines, "iree on vulkan", count=40)  # the first 3 steps checked against the oracle
    assert training < UNIFORM + 0.3 and dev < UNIFORM


def test_an_unknown_target_is_refused_by_the_command_line(capsys):
    with pytest.raises(SystemExit):
        EXAMPLES["mlp"].main(["--target", "tpu"])
    assert "invalid choice: 'tpu'" in capsys.readouterr().err


def test_bigram_neural_loss_reaches_the_counting_loss(small_names, tmp_path, capsys):
    plot = tmp_path / "bigram.png"
    lines = run("bigram", ["--quiet", "--data", small_names, "--plot", str(plot)], capsys)
    report, counting, neural, dev, counting_samples, neural_samples = lines[-6:]
    assert REPORT.fullmatch(report) and report.startswith("route iree"), report
    counted, trained = figure(counting, "counting loss"), figure(neural, "neural loss")
    assert abs(trained - counted) < 1e-3, (counting, neural)  # smoothing as pretend pairs: the same minimum
    assert figure(dev, "dev loss") < UNIFORM
    assert counting_samples.startswith("counting samples: ")
    samples(neural_samples, 20)
    assert plot.read_bytes()[:8] == PNG


def test_bigram_on_the_plan_route(small_names, capsys):
    lines = run("bigram", ["--quiet", "--steps", "5", "--route", "plan", "--data", small_names], capsys)
    assert lines[-6].startswith("route plan")
    figure(lines[-4], "neural loss")


@pytest.mark.parametrize("route", ["iree", "oracle"])
def test_batchnorm_trains_and_reads_dev_with_the_inference_entry(route, small_names, tmp_path, capsys):
    plot = tmp_path / "batchnorm.png"
    lines = run("batchnorm", ["--steps", "60", "--hidden", "16", "--batch", "16", "--quiet", "--route", route,
                              "--data", small_names, "--plot", str(plot)], capsys)
    training, dev = check_tail(lines, route)
    assert training < UNIFORM and dev < UNIFORM
    assert plot.read_bytes()[:8] == PNG


def test_batchnorm_keeps_running_statistics_through_the_compiled_step(small_names):
    module = EXAMPLES["batchnorm"]
    args = module.command_line().parse_args(["--hidden", "16", "--batch", "16", "--data", small_names])  # cached
    names = load(args.data)
    network, (loss, updates, _, _) = module.recorder(names, args)
    trainer = Trainer(network, loss, updates, "iree")
    xs, ys = contexts(names, names.train, args.context)
    trainer.step({"context": xs[:16], "next": ys[:16]})
    table = trainer.table()
    assert table["norm.running_mean"].any() and not (table["norm.running_var"] == 1).all()


def test_wavenet_trains_with_batch_norm_over_batch_and_time(small_names, capsys):
    lines = run("wavenet", ["--steps", "60", "--embedding", "8", "--hidden", "16", "--batch", "8", "--quiet",
                            "--samples", "5", "--data", small_names], capsys)
    training, dev = check_tail(lines, "iree", count=5)
    assert training < UNIFORM + 0.2 and dev < UNIFORM


@pytest.mark.parametrize("route", ["iree", "plan"])
def test_transformer_trains_over_every_position(route, small_names, capsys):
    lines = run("transformer", ["--steps", "60", "--heads", "1", "--head-size", "8", "--batch", "4", "--quiet",
                                "--samples", "40", "--route", route, "--data", small_names], capsys)
    training, dev = check_tail(lines, route, count=40)  # 40 samples: ten batches of the evaluation entry
    assert training < UNIFORM + 0.2 and dev < UNIFORM


def test_transformer_targets_ignore_only_padding():
    module = EXAMPLES["transformer"]
    names = load(None)
    xs, ys = contexts(names, ["ab"], 3)  # ... -> a, ..a -> b, .ab -> .
    assert module.targets(names, xs, ys).tolist() == [[27, 27, 1], [27, 1, 2], [1, 2, 0]]


BAD_FILES = {
    "a digit": ("anna\nb0b\nemma\n", "line 2: 'b0b' is not a lowercase name"),
    "capitals": ("Anna\n", "line 1: 'Anna' is not a lowercase name"),
    "nothing": ("\n\n", "holds no names"),
    "too few names": ("anna\nemma\n", "holds only 2 names"),
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_malformed_names_file_is_an_example_error(name, case, tmp_path):
    text, message = BAD_FILES[case]
    path = tmp_path / "names.txt"
    path.write_text(text)
    with pytest.raises(ExampleError, match=re.escape(message)) as caught:
        EXAMPLES[name].main(["--data", str(path), "--quiet"])
    assert isinstance(caught.value, topos.ToposError) and str(path) in str(caught.value)


def test_a_missing_names_file_is_an_example_error(tmp_path):
    with pytest.raises(ExampleError, match="cannot read the names file .*pass --data FILE"):
        EXAMPLES["mlp"].main(["--data", str(tmp_path / "absent.txt")])


def test_a_names_file_saved_with_a_byte_order_mark_reads_as_its_names(tmp_path):
    path = tmp_path / "names.txt"
    path.write_text("emma\nanna\nbob\ncarl\ndora\nfred\ngus\nhal\nida\njo\n", encoding="utf-8-sig")
    assert path.read_bytes().startswith(b"\xef\xbb\xbf")  # as Notepad saves UTF-8
    names = load(path)
    assert "emma" in names.train + names.dev + names.test and "\ufeff" not in names.characters


def _ten_names(tmp_path) -> object:
    path = tmp_path / "names.txt"
    path.write_text("anna\nbob\ncarl\ndora\nemma\nfred\ngus\nhal\nida\njo\n")
    return load(path)


@pytest.mark.parametrize("context", [0, -2, 2.5, True], ids=["zero", "negative", "float", "bool"])
def test_a_context_length_below_one_is_an_example_error(context, tmp_path):
    names = _ten_names(tmp_path)
    with pytest.raises(ExampleError, match=rf"context length must be a positive number of characters, got "
                                           rf"{re.escape(repr(context))}.*N >= 1"):
        contexts(names, names.train, context)
    xs, ys = contexts(names, ["bob"], 2)
    assert xs.shape == (4, 2) and ys.tolist() == [names.index(c) for c in "bob"] + [0]


def test_words_outside_the_vocabulary_are_an_example_error(tmp_path):
    names = _ten_names(tmp_path)
    with pytest.raises(ExampleError, match=r"'Bob' is not a name over the vocabulary's letters"):
        contexts(names, ["Bob"], 3)
    with pytest.raises(ExampleError, match=r"got the string 'bob'; wrap one name in a list"):
        contexts(names, "bob", 3)
    with pytest.raises(ExampleError, match=r"'z' is not a character of the vocabulary"):
        names.index("z")


@pytest.mark.parametrize("index", [-1, 99, 1.0], ids=["negative", "past-the-end", "float"])
def test_decoding_an_index_outside_the_vocabulary_is_an_example_error(index, tmp_path):
    names = _ten_names(tmp_path)
    assert names.decode([names.index("b"), names.index("o"), names.index("b"), 0]) == "bob"
    with pytest.raises(ExampleError, match=rf"index {re.escape(repr(index))} is not a character of the vocabulary; "
                                           rf"indices run 0\.\.{names.vocabulary - 1}"):
        names.decode([1, index])


def test_the_command_line_prints_the_error_not_a_traceback(tmp_path):
    done = subprocess.run([sys.executable, str(MAKEMORE / "bigram.py"), "--data", str(tmp_path / "absent.txt")],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TOPOS_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 1
    assert done.stderr.startswith("error: cannot read the names file") and "Traceback" not in done.stderr


def test_a_target_without_its_driver_is_one_line_not_a_traceback(tmp_path):
    # The Linux runtime wheel has no metal driver: the module compiles, and running it is refused.
    done = subprocess.run([sys.executable, str(MAKEMORE / "bigram.py"), "--target", "metal", "--steps", "2",
                           "--quiet"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TOPOS_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 1
    assert done.stderr.startswith("error: ") and "'metal' driver" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow  # torch and jax load and train too: about half a minute of the default run
def test_twin_benchmark_runs_and_its_curves_agree(cache):
    # --tiny is the sizes the tests above train mlp and transformer at: their compiles are in the cache.
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "makemore_twins.py"), "--tiny", "--steps", "5",
                           "--rounds", "1", "--per-round", "2"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TOPOS_CACHE_DIR": str(cache)})
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    skipped = "jax.jit column skipped" in out  # jax is optional: the benchmark says why it is missing
    gaps = [float(g) for g in re.findall(r"\| +(\d\.\de[-+]\d\d) \| +\d+ \|", out)]  # max gap, at step
    assert len(gaps) == (2 if skipped else 4), out
    assert all(gap < 1e-4 for gap in gaps), out
    for column in ("topos IREE", "topos oracle", "PyTorch") + (() if skipped else ("jax",)):
        assert column in out.split("One training step")[1], out


# ---- the full runs of docs/examples.md (slow: minutes each) -------------------------------------

FULL_RUNS = {  # the dev loss docs/examples.md quotes for each default run on the shipped names
    "mlp": ([], 2.3136),
    "mlp-adam": (["--optimizer", "adam"], 2.2510),
    "batchnorm": ([], 2.2297),
    "wavenet": ([], 2.0477),
    "transformer": ([], 2.2665),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(FULL_RUNS))
def test_the_default_run_reaches_the_documented_dev_loss(case, capsys):
    options, documented = FULL_RUNS[case]
    lines = run(case.split("-")[0], ["--quiet", *options], capsys)
    _, dev = check_tail(lines, "iree")
    assert dev < documented + 0.02, f"{case}: dev {dev:.4f}, docs/examples.md says {documented}"
