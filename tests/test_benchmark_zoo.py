"""The benchmark zoo (benchmarks/_zoo.py): its models, memory guard and jax.jit twins, and the tools built on it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import _zoo  # noqa: E402


def test_an_unknown_model_names_the_choices():
    with pytest.raises(KeyError, match="choose from mlp-s, mlp-m, gpt"):
        _zoo.build("resnet")


def test_a_model_too_large_for_the_machine_is_skipped_with_a_message(monkeypatch):
    monkeypatch.setitem(_zoo.NEEDS_GIB, "lenet", 1e9)
    reason = _zoo.too_large("lenet")
    assert reason is not None and reason.startswith("skipped lenet: it needs about") and "GiB is available" in reason
    monkeypatch.setitem(_zoo.NEEDS_GIB, "lenet", 0.0)
    assert _zoo.too_large("lenet") is None


def test_the_lenet_twin_computes_the_oracles_loss_and_step():
    pytest.importorskip("jax")
    model = _zoo.build("lenet")
    oracle = model.network.forward(model.parameters, model.feeds(0))
    twin = _zoo.jax_step(model)
    first = float(twin.step(0))
    assert abs(first - float(oracle[model.read])) <= 1e-5 * abs(float(oracle[model.read]))
    after = model.updates.apply(model.parameters, oracle)  # the oracle's SGD step: the twin's second loss
    second = float(model.network.forward(after, model.feeds(1))[model.read])
    assert abs(float(twin.step(1)) - second) <= 1e-5 * abs(second)
    assert not np.isclose(first, second)  # the twin's state did advance


def test_the_lenet_twin_carries_xlas_memory_analysis():
    pytest.importorskip("jax")
    memory = _zoo.jax_step(_zoo.build("lenet")).memory
    assert memory is not None and memory["argument"] > 0 and memory["output"] > 0


def test_the_memory_benchmark_reports_the_plan_iree_and_jax_for_a_zoo_model():
    pytest.importorskip("iree.runtime")
    import memory

    figures = memory.measure("mlp-s")
    weights = (784 * 128 + 128 + 128 * 10 + 10) * 4
    assert figures["sources"] >= weights and figures["plan"] == figures["plan_values"] + figures["sources"]
    assert isinstance(figures["iree"], int) and figures["iree"] >= weights  # the resident parameters at least
    jax_figure = figures["jax"]
    assert (isinstance(jax_figure, int) and jax_figure >= weights) or jax_figure.startswith("absent")


def test_the_dispatch_profile_feeds_every_input_of_the_artifact(tmp_path):
    import profile_dispatches

    (tmp_path / "check.sh").write_text("exec iree-run-module \\\n  --input=@inputs/00_w.npy \\\n"
                                       "  --input=f32=@inputs/01_optim.lr.bin \\\n  --expected_output=@x.npy\n")
    assert profile_dispatches.input_flags(tmp_path) == [f"--input=@{tmp_path}/inputs/00_w.npy",
                                                        f"--input=f32=@{tmp_path}/inputs/01_optim.lr.bin"]


def test_the_dispatch_profile_serves_a_frozen_artifact_its_parameter_archive(tmp_path):
    import profile_dispatches

    (tmp_path / "check.sh").write_text("exec iree-run-module \\\n  --parameters=topos=parameters.irpa \\\n"
                                       "  --input=@inputs/00_x.npy \\\n  --expected_output=@y.npy\n")
    assert profile_dispatches.input_flags(tmp_path) == [f"--parameters=topos={tmp_path}/parameters.irpa",
                                                        f"--input=@{tmp_path}/inputs/00_x.npy"]


def test_the_matmul_tile_spec_applies_and_keeps_the_product(tmp_path):
    """benchmarks/matmul_tiles.py's tuning spec sets its tiles on the dispatch, and the module still multiplies."""
    pytest.importorskip("iree.runtime")
    from topos import Tape
    from topos.dialect.iree.compile import compile_stablehlo

    import matmul_tiles

    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal((32, 48)).astype(np.float32)
    network, y = Tape.record(lambda t: t.input(x, name="x") @ t.parameter(w, name="w"))
    compiled = network.entry([y]).lower().compile("llvm-cpu", cache=False, data_tiling=False)
    spec = tmp_path / "spec.mlir"
    spec.write_text(matmul_tiles.SPEC.format(dm=32, dn=32, vm=4, vn=16, k=4))
    configured = tmp_path / "configured"
    vmfb = compile_stablehlo(compiled.stablehlo, [*compiled.flags, f"--iree-codegen-tuning-spec-path={spec}",
                                                  f"--iree-hal-dump-executable-configurations-to={configured}"])
    dumped = "".join(p.read_text() for p in configured.glob("*.mlir"))
    assert "vector_common_parallel = [4, 16, 0]" in dumped and "distribution = [32, 32, 0]" in dumped
    import iree.runtime as rt

    config = rt.Config("local-sync")
    context = rt.SystemContext(config=config)
    module = rt.VmModule.copy_buffer(context.instance, vmfb)
    context.add_vm_module(module)
    arguments = compiled._arguments(network.parameters(), None)
    got = np.asarray(context.modules[module.name]["main"](*arguments))
    np.testing.assert_allclose(got, x @ w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("key", ["makemore-mlp", "lenet"])
def test_the_front_ends_benchmark_writes_every_argument_of_jaxs_module(key, tmp_path):
    """jax's @main takes exactly the twin's flattened arguments, in jax's dtypes (int64 feeds become int32)."""
    pytest.importorskip("jax")
    import front_ends

    text, inputs, _ = front_ends.jax_module(_zoo.jax_step(_zoo.build(key)), tmp_path / "jax")
    signature = text[text.index("func.func public @main("):]
    declared = front_ends._ARGUMENT.findall(signature[:signature.index("{\n")])
    assert len(inputs) == len(declared) > 2
    loaded = [np.load(flag.split("@", 1)[1]) for flag in inputs]
    assert all(array.dtype != np.int64 for array in loaded)
    if key == "makemore-mlp":  # the token contexts, int64 in topos, are int32 as jax.jit passes them
        assert any(array.dtype == np.int32 and array.ndim == 2 for array in loaded)


def test_the_front_ends_benchmark_runs_both_texts_and_they_agree():
    """One model through benchmarks/front_ends.py: both StableHLO texts compile, run and read back the same loss."""
    pytest.importorskip("jax")
    pytest.importorskip("iree.runtime")
    import subprocess

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "front_ends.py"
    done = subprocess.run([sys.executable, str(script), "--models", "mlp-s", "--rounds", "1", "--seconds", "0.05",
                           "--compiles", "1"], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    row = next(line for line in done.stdout.splitlines() if line.startswith("| MLP 784-128-10") and "x |" in line)
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert float(cells[1]) > 0 and float(cells[2]) > 0 and float(cells[4]) < 1e-5, row


@pytest.mark.skipif(len(__import__("os").sched_getaffinity(0)) < 2, reason="pinning is invisible on one CPU")
def test_only_a_benchmark_run_as_the_script_pins_the_process():
    """Importing compiled.py once pinned whoever imported it: a GPU run's step doubled, and pytest ran on one core."""
    import subprocess

    root = Path(__file__).resolve().parents[1]

    def cpus_kept(script: str, imports: str, check: str = "") -> None:
        """Import ``imports`` in a fresh Python whose script is ``script``; the process keeps every CPU."""
        program = (f"import os, sys; sys.argv[0] = {script!r}; sys.path.insert(0, 'benchmarks')\n"
                   f"before = os.sched_getaffinity(0)\nimport {imports}\n"
                   f"assert os.sched_getaffinity(0) == before, (before, os.sched_getaffinity(0))\n{check}")
        done = subprocess.run([sys.executable, "-c", program], cwd=root, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]

    # Not a benchmark script (a test, a session): nothing pins, and _pinning describes the process.
    cpus_kept("-c", "compiled, makemore_twins, front_ends, _pinning",
              "assert _pinning.THREADS == 2 and _pinning.PINNED_CPU is None and not _pinning.APPLIED\n")
    # A script that never imports _pinning (gpu_check.py runs unpinned beside jax on the GPU) stays so through
    # the helpers it imports: the zoo, the makemore twins its build() imports, compiled.py's runners.
    cpus_kept(str(root / "benchmarks" / "gpu_check.py"), "_zoo, compiled, makemore_twins")

    def setting(*options: str) -> str:
        return subprocess.run([sys.executable, str(root / "benchmarks" / "_pinning.py"), *options],
                              capture_output=True, text=True, timeout=60, check=True).stdout

    pinned = setting()
    assert pinned.startswith("threads 1, pinned to CPU ") and "," not in pinned.split("CPUs")[1], pinned  # one CPU
    for options in (["--threads", "2"], ["--threads=2"], ["--all-threads"], ["--driver", "local-task"]):
        assert setting(*options).startswith("threads 2, pinned to CPU None, applied True"), options
    assert setting("--driver=local-sync").startswith("threads 1, pinned to CPU ")


def test_versus_jax_without_jax_prints_its_column_absent_with_the_reason(tmp_path):
    """The issue's bad input: a missing peer is a column marked absent and a sentence why, not a traceback."""
    pytest.importorskip("iree.compiler")
    import os
    import subprocess

    blocked = tmp_path / "jax"
    blocked.mkdir()
    (blocked / "__init__.py").write_text('raise ImportError("blocked by the test")\n')
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "versus_jax.py"), "--models", "mlp-s",
                           "--rounds", "1"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert out.startswith("jax.jit column absent: jax is not importable (blocked by the test)"), out[:500]
    row = next(line for line in out.splitlines() if line.startswith("| MLP 784-128-10"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert float(cells[1]) > 0 and cells[2:] == ["absent", "—", "—"], row


def test_the_tiling_threshold_benchmark_times_both_compiles_and_refuses_bad_shapes():
    """benchmarks/tiling_threshold.py's measurement on one tiny width, in process; bad --shapes name the form."""
    pytest.importorskip("iree.runtime")
    import argparse

    import tiling_threshold

    untiled, tiled, _ = tiling_threshold.timed(4, 8, "local-sync", rounds=1)
    assert untiled > 0 and tiled > 0
    assert tiling_threshold.shapes("64x128, 4x8") == [(64, 128), (4, 8)]
    for bad in ("64by128", "64x0", "64x128x3", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="BATCHxWIDTH pairs"):
            tiling_threshold.shapes(bad)
