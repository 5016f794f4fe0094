"""Every example refuses a bad option before it trains: one line on stderr, a non-zero exit, no traceback.

Sizes, seeds, rates and output paths are checked as the command line is
parsed (argparse's usage error, exit status 2), so no run is thrown away
at its end for an option that could have been read at its start. What
only the model can refuse (a ToposError from recording, a target this
machine cannot run) is one ``error:`` line and exit status 1 through
``_training.run``. Nothing here trains: each case ends at the parser or
at the first recording.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from topos import ArgumentError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _example(path: str):
    spec = importlib.util.spec_from_file_location(f"options_{path.replace('/', '_')[:-3]}", EXAMPLES / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # each puts its folders (examples/, its own) on sys.path
    return module


SCRIPTS = {path: _example(path) for path in (
    "makemore/bigram.py", "makemore/mlp.py", "makemore/batchnorm.py", "makemore/wavenet.py",
    "makemore/transformer.py", "mnist/train.py", "cifar10/train.py", "gpt2/train.py", "gpt2/generate.py",
    "llama/train.py", "llama/generate.py", "data_parallel.py")}

import _training  # noqa: E402  (examples/ is on sys.path now)

REQUIRED = {"llama/generate.py": ["--weights", "unread.safetensors"]}  # the parser stops before reading it


def _refused(capsys, path: str, argv: list[str]) -> str:
    """The usage error ``path`` prints for ``argv``, which must come from the parser (exit status 2)."""
    script = SCRIPTS[path]
    parse = script.command_line().parse_args if hasattr(script, "command_line") else script.main
    with pytest.raises(SystemExit) as stopped:
        parse(REQUIRED.get(path, []) + argv)
    assert stopped.value.code == 2
    return capsys.readouterr().err


SIZES = [
    ("makemore/bigram.py", "--samples"),
    *(("makemore/mlp.py", option) for option in ("--batch", "--samples", "--hidden", "--embedding", "--context")),
    *(("makemore/batchnorm.py", option) for option in ("--batch", "--hidden", "--embedding", "--context")),
    *(("makemore/wavenet.py", option) for option in ("--batch", "--hidden", "--embedding")),
    *(("makemore/transformer.py", option) for option in ("--heads", "--layers", "--head-size", "--context",
                                                          "--batch")),
    ("mnist/train.py", "--batch"), ("mnist/train.py", "--test-batch"),
    ("cifar10/train.py", "--batch"), ("cifar10/train.py", "--test-batch"), ("cifar10/train.py", "--limit"),
    *(("gpt2/train.py", option) for option in ("--layers", "--heads", "--width", "--context", "--batch",
                                               "--samples", "--top-k")),
    *(("llama/train.py", option) for option in ("--layers", "--heads", "--kv-heads", "--width",
                                                "--intermediate", "--context")),
    *(("gpt2/generate.py", option) for option in ("--tokens", "--samples", "--top-k")),
    ("llama/generate.py", "--tokens"), ("llama/generate.py", "--top-k"),
    ("data_parallel.py", "--hidden"),
]


@pytest.mark.parametrize("path, option", SIZES, ids=[f"{p}{o}" for p, o in SIZES])
@pytest.mark.parametrize("value", ["0", "-2"])
def test_a_size_below_one_is_refused_by_the_parser(path, option, value, capsys):
    error = _refused(capsys, path, [option, value])
    assert f"argument {option}: must be a positive integer, got {value}" in error and "Traceback" not in error


@pytest.mark.parametrize("path", ["makemore/mlp.py", "mnist/train.py", "gpt2/train.py", "gpt2/generate.py",
                                  "llama/generate.py", "data_parallel.py"])
@pytest.mark.parametrize("value", ["-1", str(2**64)])
def test_a_seed_outside_the_generators_range_is_refused_by_the_parser(path, value, capsys):
    error = _refused(capsys, path, ["--seed", value])
    assert f"argument --seed: must be an integer in 0..2**63-1, got {value}" in error


NUMBERS = [
    ("makemore/transformer.py", "--lr", "nan", "must be a finite number, got nan"),
    ("makemore/transformer.py", "--lr", "0", "must be a positive number, got 0"),
    ("gpt2/train.py", "--lr", "inf", "must be a finite number, got inf"),
    ("llama/train.py", "--lr", "-0.001", "must be a positive number, got -0.001"),
    ("makemore/batchnorm.py", "--momentum", "2", "must be a number in 0..1, got 2"),
    ("makemore/wavenet.py", "--momentum", "-1", "must be a number in 0..1, got -1"),
    ("gpt2/train.py", "--temperature", "-0.5", "must be a number >= 0, got -0.5"),
    ("gpt2/generate.py", "--temperature", "nan", "must be a finite number, got nan"),
    ("llama/generate.py", "--temperature", "-1", "must be a number >= 0, got -1"),
    ("makemore/bigram.py", "--smoothing", "inf", "must be a finite number, got inf"),
    ("makemore/mlp.py", "--check", "-1", "must be an integer >= 0, got -1"),
]


@pytest.mark.parametrize("path, option, value, message", NUMBERS, ids=[f"{p}{o}={v}" for p, o, v, _ in NUMBERS])
def test_rates_momenta_and_temperatures_are_refused_by_the_parser(path, option, value, message, capsys):
    error = _refused(capsys, path, [option, value])
    assert f"argument {option}: {message}" in error


def _plot_cases(tmp_path) -> dict:
    (tmp_path / "a-file").write_text("")
    return {
        "p.xyz": "'p.xyz' does not end in .png, .svg or .pdf",
        "noext": "'noext' does not end in .png, .svg or .pdf",
        str(tmp_path / "absent" / "loss.png"): f"the folder {tmp_path / 'absent'} does not exist",
        str(tmp_path / "a-file" / "loss.png"): f"a file stands at {tmp_path / 'a-file'}, where the folder",
        str(tmp_path / "folder.png"): "is a folder; name a file in it",
    }


@pytest.mark.parametrize("path", ["makemore/mlp.py", "cifar10/train.py", "llama/train.py"])
def test_a_plot_path_that_cannot_be_written_is_refused_before_training(path, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    (tmp_path / "folder.png").mkdir()
    for plot, message in _plot_cases(tmp_path).items():
        error = _refused(capsys, path, ["--plot", plot])
        assert "argument --plot: " in error and message in error, (plot, error)


@pytest.mark.parametrize("path", ["gpt2/train.py", "llama/train.py"])
def test_a_save_path_in_a_missing_folder_is_refused_before_training(path, tmp_path, capsys):
    (tmp_path / "a-file").write_text("")
    error = _refused(capsys, path, ["--save", str(tmp_path / "absent" / "tiny.safetensors")])
    assert f"argument --save: the folder {tmp_path / 'absent'} does not exist; create it first" in error
    error = _refused(capsys, path, ["--save", str(tmp_path / "a-file" / "tiny.safetensors")])
    assert f"argument --save: a file stands at {tmp_path / 'a-file'}, where the folder" in error


@pytest.mark.parametrize("suffix, magic", [("png", b"\x89PNG"), ("svg", b"<?xml"), ("pdf", b"%PDF")])
def test_the_plot_replaces_its_file_whole_in_the_format_its_suffix_names(suffix, magic, tmp_path):
    pytest.importorskip("matplotlib")
    target = tmp_path / f"loss.{suffix}"
    target.write_bytes(b"the old plot")
    _training.plot([3.0, 2.0, 1.5, 1.2] * 30, str(target), "a loss curve")
    assert target.read_bytes().startswith(magic)
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]  # no temporary file left beside it


def test_a_plot_format_matplotlib_refuses_is_an_example_error_not_a_value_error(tmp_path):
    pytest.importorskip("matplotlib")
    with pytest.raises(_training.ExampleError, match=r"cannot write the plot to .*loss\.xyz: name a \.png, \.svg"):
        _training.plot([1.0, 0.5], str(tmp_path / "loss.xyz"), "a loss curve")
    with pytest.raises(_training.ExampleError, match=r"cannot write the plot to .*absent.*No such file"):
        _training.plot([1.0, 0.5], str(tmp_path / "absent" / "loss.png"), "a loss curve")
    assert list(tmp_path.iterdir()) == []


def test_run_prints_any_topos_error_as_one_line_and_exit_status_1(capsys):
    def main():
        raise ArgumentError("Embedding: a message from the library, not the example")

    with pytest.raises(SystemExit) as stopped:
        _training.run(main)
    assert stopped.value.code == 1
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.endswith("Embedding: a message from the library, not the example\n")
    assert error.count("\n") == 1


def _script(path: str, *argv: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EXAMPLES / path), *argv], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TOPOS_CACHE_DIR": str(tmp_path / "cache")})


def test_a_model_that_refuses_an_option_at_recording_is_one_line_not_a_traceback(tmp_path):
    names = tmp_path / "names.txt"
    names.write_text("\n".join((EXAMPLES / "makemore" / "names.txt").read_text().split()[:100]) + "\n")
    done = _script("makemore/batchnorm.py", "--batch", "1", "--data", str(names), "--steps", "2", tmp_path=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("error: ") and "train on a batch of 2 or more" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


# ---- the walkthrough and data_parallel, which have no harness parser ---------------------------------


def test_the_walkthrough_refuses_a_file_where_its_drawings_folder_should_be(tmp_path):
    (tmp_path / "a-file").write_text("")
    for folder in (tmp_path / "a-file", tmp_path / "a-file" / "deeper"):
        done = _script("walkthrough.py", "--drawings", str(folder), tmp_path=tmp_path)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert (f"argument --drawings: a file stands at {tmp_path / 'a-file'}, where the folder {folder} should "
                "be; name a folder") in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "cache") == ["a-file"]


def test_a_drawing_the_walkthrough_cannot_write_is_one_line_not_a_traceback(tmp_path):
    (tmp_path / "drawings" / "record.dot").mkdir(parents=True)  # passes the folder check; the first write fails
    done = _script("walkthrough.py", "--drawings", str(tmp_path / "drawings"), tmp_path=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("error: ") and str(tmp_path / "drawings" / "record.dot") in done.stderr
    assert done.stderr.count("\n") == 1


@pytest.mark.parametrize("options, named", [
    (["--devices", "257"], "--devices: must be at most 256 devices"),
    (["--devices", "65536", "--batch", "65536"], "--devices: must be at most 256 devices"),
    (["--timing", "1,512"], "--timing: takes device counts separated by commas (e.g. 1,2,4), each in 1..256"),
])
def test_data_parallel_refuses_more_host_devices_than_xla_serves_before_jax_starts(options, named, capsys):
    assert named in _refused(capsys, "data_parallel.py", options)  # the parser runs before XLA is told a count


def test_data_parallel_without_its_names_file_is_one_line_not_a_traceback(tmp_path):
    done = _script("data_parallel.py", "--data", str(tmp_path / "absent.txt"), "--timing", "", "--steps", "1",
                   tmp_path=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("error: cannot read the names file")
