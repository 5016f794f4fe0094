"""plan.export and ``topos export``: an artifact IREE runs and checks without topos, written whole or not at all.

``check.sh`` runs here in an empty environment with IREE's native
``iree-run-module`` binary (no Python, so no topos): what a deployment
machine with only IREE's runtime would do.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import topos
from topos import FeedError, Tape
from topos.dialect.iree.export import ExportError
from topos.dialect.iree.targets import TargetError

from iree_support import ELEMENT_PARAMETERS, compile_cache  # noqa: F401  (autouse fixture)

ROOT = Path(__file__).resolve().parents[2]
IREE_BIN = Path(sys.executable).parent
NATIVE_RUN = Path(__import__("iree._runtime_libs", fromlist=["x"]).__file__).parent / "iree-run-module"


def training_step(dtype):
    def record(tape):
        w = tape.parameter(np.array([[0.5, -0.25], [0.75, 1.0]], dtype=dtype), name="w")
        x = tape.input(np.array([[1.0, 2.0]], dtype=dtype), name="x")
        h = (x @ w).tanh()
        loss = (h * h).sum()
        return loss, topos.sgd(tape, tape.differentiate(loss, [w]), 0.1)

    network, (loss, updates) = Tape.record(record)
    return network.entry(updates.roots(loss)).lower()


def run_check(folder: Path) -> subprocess.CompletedProcess:
    """check.sh in an empty environment: the native iree-run-module, nothing of Python or topos."""
    environment = {"PATH": "/usr/bin:/bin", "IREE_RUN_MODULE": str(NATIVE_RUN)}
    return subprocess.run(["sh", str(folder / "check.sh")], env=environment, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("dtype", ELEMENT_PARAMETERS)
def test_the_artifact_runs_and_passes_its_check_without_topos(dtype, tmp_path):
    folder = training_step(dtype).export(tmp_path / "step")
    names = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    suffix = "bin" if dtype == topos.bfloat16 else "npy"
    assert names == ["check.sh", "expected/00_node5_sum.bin", f"expected/01_node19_sub.{suffix}", "flags.txt",
                     f"inputs/00_w.{suffix}", f"inputs/01_x.{suffix}", "manifest.json", "module.located.mlir",
                     "module.stablehlo.mlir", "module.vmfb"]
    done = run_check(folder)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[SUCCESS] all function outputs matched" in done.stdout
    assert os.access(folder / "check.sh", os.X_OK)


def test_check_sh_fails_when_the_module_leaves_the_oracle(tmp_path):
    folder = training_step(np.float32).export(tmp_path / "step")
    expected = folder / "expected" / "01_node19_sub.npy"
    np.save(expected, np.load(expected) + np.float32(1e-3))  # far outside a 16-ulp envelope
    done = run_check(folder)
    assert done.returncode != 0 and "FAILED" in done.stdout + done.stderr


def test_the_manifest_names_every_argument_and_result(tmp_path):
    plan = training_step(ml_dtypes.bfloat16)
    folder = plan.export(tmp_path / "step")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["function"] == "main" and manifest["target"] == "llvm-cpu"
    assert manifest["versions"]["topos"] == topos.__version__
    assert "iree-base-compiler 3.13.0" in manifest["versions"]["iree"]
    assert [(a["name"], a["role"], a["shape"], a["dtype"]) for a in manifest["arguments"]] == [
        ("w", "parameter", [2, 2], "bf16"), ("x", "input", [1, 2], "bf16")]
    results = manifest["results"]
    assert [(r["node"], r["role"], r["shape"]) for r in results] == [(5, "root", []), (19, "root", [2, 2])]
    oracle = plan.network.forward(plan.network.parameters())
    for row in results:
        value = np.asarray(oracle[plan.network.symbol(row["node"])], np.float64)
        bound = 16 * float(ml_dtypes.finfo(ml_dtypes.bfloat16).eps) * np.abs(value).max()
        assert row["envelope_abs"] == pytest.approx(bound)
    raw = np.frombuffer((folder / "expected" / "01_node19_sub.bin").read_bytes(), "<u2").view(ml_dtypes.bfloat16)
    assert np.array_equal(raw.reshape(2, 2), oracle[plan.network.symbol(19)])  # the oracle's bits, raw


def conv_classifier():
    """A forward plan that raises its convolution and pool: spelled as columns, its flags need no img2col."""
    from topos.nn import functional as F

    rng = np.random.default_rng(3)

    def record(tape):
        x = tape.input(rng.standard_normal((2, 3, 8, 8)).astype(np.float32), name="images")
        w = tape.parameter((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), name="w")
        return F.max_pool(F.conv2d(x, w, padding=1).relu(), 2).sum()

    network, out = Tape.record(record)
    return network.entry([out]).lower()


@pytest.mark.parametrize("plan_of", [lambda: training_step(np.float32), conv_classifier],
                         ids=["training step", "conv classifier"])
def test_flags_txt_rebuilds_the_module_byte_for_byte(plan_of, tmp_path):
    folder = plan_of().export(tmp_path / "step")
    rebuild = tmp_path / "rebuild"
    rebuild.mkdir()
    shutil.copy(folder / "module.stablehlo.mlir", rebuild)
    command = shlex.split((folder / "flags.txt").read_text())
    assert command[0] == "iree-compile" and command[-3:] == ["module.stablehlo.mlir", "-o", "module.vmfb"]
    done = subprocess.run([str(IREE_BIN / "iree-compile"), *command[1:]], cwd=rebuild, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (rebuild / "module.vmfb").read_bytes() == (folder / "module.vmfb").read_bytes()
    if plan_of is conv_classifier:
        assert not any(flag.startswith("--iree-preprocessing-pass-pipeline=") for flag in command)
        assert "stablehlo.reduce_window" in (folder / "module.stablehlo.mlir").read_text()
        done = run_check(folder)
        assert done.returncode == 0, done.stdout + done.stderr


def test_no_file_names_a_path_of_this_machine(tmp_path):
    folder = training_step(np.float32).export(tmp_path / "step")
    portable = (folder / "module.stablehlo.mlir").read_text()
    assert "loc(" not in portable and "stablehlo.dot_general" in portable
    located = (folder / "module.located.mlir").read_text()
    assert 'loc("tests/iree/test_export.py":' in located or 'loc("test_export.py":' in located
    assert str(ROOT) not in located and str(tmp_path) not in located
    vmfb = (folder / "module.vmfb").read_bytes()
    assert str(ROOT).encode() not in vmfb and b"test_export.py" not in vmfb


@pytest.mark.parametrize("target, device", [("cuda", "cuda"), ("vulkan-spirv", "vulkan"),
                                            ("metal-spirv", "metal"), ("rocm", "hip")])
def test_every_target_exports_a_module_the_runtime_reads(target, device, tmp_path):
    import iree.runtime as rt

    folder = training_step(np.float32).export(tmp_path / target, target)
    module = rt.VmModule.copy_buffer(rt.VmInstance(), (folder / "module.vmfb").read_bytes())
    assert "main" in module.function_names
    assert f"--device={device}" in (folder / "check.sh").read_text()
    assert "--iree-llvmcpu-target-cpu" not in (folder / "flags.txt").read_text()


def test_the_vulkan_artifact_passes_its_check_where_a_vulkan_device_exists(tmp_path):
    import iree.runtime as rt

    try:
        rt.get_driver("vulkan").create_default_device()
    except Exception as error:  # noqa: BLE001  (no loader or no device: the reason is the skip)
        pytest.skip(f"no Vulkan device here ({error}); CI installs Mesa's lavapipe")
    folder = training_step(np.float32).export(tmp_path / "vulkan", "vulkan-spirv")
    done = run_check(folder)
    assert done.returncode == 0, done.stdout + done.stderr


def gather_plan():
    def record(tape):
        table = tape.parameter(np.arange(15, dtype=np.float32).reshape(5, 3) / 7, name="table")
        rows = tape.input(topos.selection(np.array([4, 0, 2, 2]), 5), name="rows")
        scale = tape.input(np.float32(0.5), name="scale")
        picked = table.gather(rows)
        return rows, (picked.sum() * scale).exp()

    network, (rows, out) = Tape.record(record)
    return network.entry([out, rows]).lower()


def test_indices_and_rank_zero_inputs_travel_too(tmp_path):
    folder = gather_plan().export(tmp_path / "gather", feeds={"scale": np.float32(0.25)})
    manifest = json.loads((folder / "manifest.json").read_text())
    assert [(a["name"], a["shape"]) for a in manifest["arguments"]] == [("table", [5, 3]), ("rows", [4]),
                                                                        ("scale", [])]
    assert "--input=f32=@inputs/02_scale.bin" in (folder / "check.sh").read_text()
    assert [r["dtype"] for r in manifest["results"]] == ["f32", "i64"]
    done = run_check(folder)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_vulkan_artifact_takes_and_returns_its_indices_as_int32(tmp_path):
    folder = gather_plan().export(tmp_path / "vulkan", "vulkan")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert [a["dtype"] for a in manifest["arguments"]] == ["f32", "i32", "f32"]
    assert [r["dtype"] for r in manifest["results"]] == ["f32", "i32"]
    assert np.load(folder / "inputs" / "01_rows.npy").dtype == np.int32
    assert "xi32>" in (folder / "module.stablehlo.mlir").read_text()
    import iree.runtime as rt

    try:
        rt.get_driver("vulkan").create_default_device()
    except Exception as error:  # noqa: BLE001  (no loader or no device: the reason is the skip)
        pytest.skip(f"no Vulkan device here to run check.sh ({error}); CI installs Mesa's lavapipe")
    done = run_check(folder)
    assert done.returncode == 0, done.stdout + done.stderr


# ---- refusals: a clear error and nothing half-written ----------------------------------------


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_an_existing_folder_is_refused_unless_forced(tmp_path):
    plan = training_step(np.float32)
    target = tmp_path / "step"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match="exists and is not empty.*force=True"):
        plan.export(target)
    assert (target / "notes.txt").read_text() == "mine"
    plan.export(target, force=True)
    assert not (target / "notes.txt").exists() and (target / "module.vmfb").exists()
    assert leftovers(tmp_path) == []
    (tmp_path / "file").write_text("")
    with pytest.raises(ExportError, match="is a file"):
        plan.export(tmp_path / "file")
    with pytest.raises(ExportError, match="does not exist; create it first"):
        plan.export(tmp_path / "missing" / "step")


def test_a_switch_that_is_not_a_bool_or_a_folder_that_is_no_path_is_refused_and_nothing_is_touched(tmp_path):
    plan = training_step(np.float32)
    target = tmp_path / "step"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match=r"force='no': pass True or False"):
        plan.export(target, force="no")  # truthy: it used to replace the folder
    with pytest.raises(ExportError, match=r"data_tiling='no': pass True, False or None \(decide by size\)"):
        plan.export(tmp_path / "other", data_tiling="no")
    with pytest.raises(ExportError, match=r"pass its path \(a str or a pathlib\.Path\).*got NoneType None"):
        plan.export(None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step"] and (target / "notes.txt").read_text() == "mine"


def test_a_cpu_for_another_target_is_refused(tmp_path):
    with pytest.raises(ExportError, match="target cuda takes no cpu: drop cpu="):
        training_step(np.float32).export(tmp_path / "step", "cuda", cpu="host")
    assert list(tmp_path.iterdir()) == []


def test_a_target_that_cannot_serve_the_plan_writes_nothing(tmp_path):
    with pytest.raises(TargetError, match="no float64 support"):
        training_step(np.float64).export(tmp_path / "step", "vulkan-spirv")
    with pytest.raises(TargetError, match="unknown target"):
        training_step(np.float32).export(tmp_path / "step", "tpu")
    assert list(tmp_path.iterdir()) == []


def test_a_required_input_must_be_fed_and_nothing_is_written_without_it(tmp_path):
    def record(tape):
        x = tape.input(shape=(2,), dtype=np.float32, name="x")
        return (x * x).sum()

    network, out = Tape.record(record)
    with pytest.raises(FeedError, match="input x .*required and was not fed"):
        network.entry([out]).lower().export(tmp_path / "step")
    assert list(tmp_path.iterdir()) == []


def test_the_current_directory_is_refused_and_left_as_it_was(tmp_path, monkeypatch):
    (tmp_path / "notes.txt").write_text("mine")
    monkeypatch.chdir(tmp_path)
    for name in ("", ".", str(tmp_path)):
        with pytest.raises(ExportError, match="is the current directory, which export cannot replace"):
            training_step(np.float32).export(name, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    for name in ("..", "../..", str(tmp_path)):  # force would have replaced the folder we stand in
        with pytest.raises(ExportError, match="holds the current directory, which export cannot replace"):
            training_step(np.float32).export(name, force=True)
    assert (tmp_path / "notes.txt").read_text() == "mine" and deep.is_dir()


def test_a_folder_that_takes_no_new_folder_is_an_export_error(tmp_path, monkeypatch):
    import tempfile

    def refuse(*_, **__):  # what /proc or a read-only mount answers, even to root
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    with pytest.raises(ExportError, match=r"cannot create files in .* \(Operation not permitted\); choose a writable"):
        training_step(np.float32).export(tmp_path / "step")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_unwritable_folder_is_named(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        with pytest.raises(ExportError, match="permission denied"):
            training_step(np.float32).export(locked / "step")
    finally:
        locked.chmod(0o755)


# ---- the command -----------------------------------------------------------------------------


CASE = '''
import numpy as np
from topos import Tape

def export_case():
    def record(tape):
        w = tape.parameter(np.array([[0.5, -0.25], [0.75, 1.0]], np.float32), name="w")
        x = tape.input(np.array([[1.0, 2.0]], np.float32), name="x")
        return ((x @ w).tanh() ** 2).sum()

    network, loss = Tape.record(record)
    return network.entry([loss]), network.parameters(), {"x": np.array([[3.0, -1.0]], np.float32)}
'''


def topos_command(*arguments, cwd, script: bool = False) -> subprocess.CompletedProcess:
    command = [str(ROOT / "tools" / "topos")] if script else ["-m", "topos.cli"]
    return subprocess.run([sys.executable, *command, *arguments], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_topos_export_writes_the_artifact_and_refuses_to_overwrite(tmp_path):
    (tmp_path / "case.py").write_text(CASE)
    done = topos_command("export", "case.py", "-o", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "exported 9 files to out" in done.stdout and "sh out/check.sh" in done.stdout
    assert run_check(tmp_path / "out").returncode == 0
    x = np.load(tmp_path / "out" / "inputs" / "01_x.npy")
    assert x.tolist() == [[3.0, -1.0]]  # the case's feeds are the test vectors
    again = topos_command("export", "case.py", "-o", "out", cwd=tmp_path)
    assert again.returncode == 2 and "topos export: error: ExportError:" in again.stderr
    assert "Traceback" not in again.stderr
    assert topos_command("export", "case.py", "-o", "out", "--force", cwd=tmp_path).returncode == 0
    missing = topos_command("export", "nowhere.py", "-o", "x", cwd=tmp_path)
    assert missing.returncode == 2 and "no such file: nowhere.py" in missing.stderr
    wrong = topos_command("export", "case.py:bisect_case", "-o", "y", cwd=tmp_path)
    assert wrong.returncode == 2 and "has no function 'bisect_case'" in wrong.stderr


EXITS = CASE + """
def exits():
    import sys

    sys.exit(3)
"""


@pytest.mark.parametrize("arguments, message", [
    ((":export_case", "-o", "out"), "':export_case': nothing before the colon; write FILE.py:FUNCTION"),
    (("case.py:exits", "-o", "out"), "case.py called sys.exit(3) while exits() ran; exits() returns (entry, "
                                     "parameters, feeds) and does not exit\n  at "),
    (("case.py", "-o", "out", "--target", "cuda", "--cpu", "host"), "--cpu applies to llvm-cpu only; drop it for cuda"),
    (("case.py", "-o", "out", "--target", "vulkan-spirv", "--cpu", "generic"),
     "--cpu applies to llvm-cpu only; drop it for vulkan-spirv"),
    (("case.py", "-o", "out", "--target", "nowhere"), "TargetError: unknown target 'nowhere'; choose one of"),
], ids=["no-file", "case-exits", "cpu-for-cuda", "cpu-for-vulkan", "unknown-target"])
def test_topos_export_refuses_user_mistakes_in_one_message_and_writes_nothing(tmp_path, arguments, message):
    (tmp_path / "case.py").write_text(EXITS)
    done = topos_command("export", *arguments, cwd=tmp_path, script=True)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith(f"topos export: error: {message}"), done.stderr
    assert "Traceback" not in done.stderr and "in <module>:" not in done.stderr
    assert done.stdout == "" and not (tmp_path / "out").exists()


def test_topos_export_names_no_place_outside_the_case_file(tmp_path):
    # A topos error names the innermost line outside topos; once the case has returned, that was the script's.
    (tmp_path / "case.py").write_text(CASE)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "kept.txt").write_text("mine")
    done = topos_command("export", "case.py", "-o", "out", cwd=tmp_path, script=True)
    assert done.returncode == 2
    assert done.stderr == ("topos export: error: ExportError: out exists and is not empty; choose a new folder, "
                           "or pass force=True (topos export --force) to replace it\n")


def test_topos_export_speaks_of_its_own_cpu_default(tmp_path):
    from topos.dialect.iree.targets import llvm_cpus

    if llvm_cpus() is None:
        pytest.skip("this IREE does not list its LLVM CPUs, so no cpu is refused before compiling")
    (tmp_path / "case.py").write_text(CASE)
    done = topos_command("export", "case.py", "-o", "out", "--cpu", "pentium9000", cwd=tmp_path)
    assert done.returncode == 2
    assert "TargetError: unknown cpu 'pentium9000'" in done.stderr
    assert "Use --cpu generic (any " in done.stderr and "machine, export's default) or --cpu host (this " in done.stderr
    assert "cpu='host'" not in done.stderr


@pytest.mark.parametrize("output", ["..", "../..", "."])
def test_topos_export_refuses_a_folder_that_holds_the_current_directory(tmp_path, output):
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    (deep / "case.py").write_text(CASE)
    done = topos_command("export", "case.py", "-o", output, "--force", cwd=deep)
    assert done.returncode == 2, (done.stdout, done.stderr)
    relation = "is" if output == "." else "contains"
    assert done.stderr.startswith(f"topos export: error: -o {output} {relation} the current directory "
                                  f"({deep.resolve()}), which export cannot replace; name a new folder, such as "
                                  "-o artifact"), done.stderr
    assert sorted(p.name for p in deep.iterdir()) == ["case.py"] and (deep / "case.py").read_text() == CASE
