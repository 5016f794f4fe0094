"""Compiled on one machine, run on another: a process with IREE's runtime and no compiler runs cached modules.

Each child process runs through ``without_compiler.py``, which makes
``iree.compiler`` unimportable and hides iree-base-compiler's metadata,
as on a machine where only iree-base-runtime is installed. What must
hold there: ``topos.dialect`` imports, a module that this process
compiled into a cache directory is served from it with the same bits,
and anything that needs the compiler (a miss, lowering, ``stablehlo``)
is a TargetError that says what to do. The cache's keys must come out
the same on both machines: the runtime's release stands for the
compiler's, and topos's source digest does not depend on how topos was
installed. ``benchmarks/gpu_check.py`` runs its two halves this way.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from topos import Tape
from topos.dialect.iree.cache import CompileCache, code_digest, plan_key
from topos.dialect.iree.compile import toolchain_version

from iree_support import compile_cache  # noqa: F401  (autouse fixture)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WITHOUT_COMPILER = HERE / "without_compiler.py"

# The deploy guide's training step, compiled and stepped three times; prints the hit, the loss and w's bytes.
STEP = textwrap.dedent("""
    import sys
    import numpy as np
    import topos
    from topos import Tape

    def plate(tape):
        w = tape.parameter(np.array([[0.5, -0.25], [0.75, 1.0]], np.float32))
        x = tape.input(np.array([[1.0, 2.0]], np.float32))
        h = (x @ w).tanh()
        return w, (h * h).sum()

    def step(tape):
        w, loss = plate(tape)
        return w, loss, topos.sgd(tape, tape.differentiate(loss, [w]), 0.1)

    network, (w, loss, updates) = Tape.record(step)
    compiled = network.entry(updates.roots(loss)).lower().compile("llvm-cpu", cache=sys.argv[1])
    state = compiled.resident(network.parameters())
    for _ in range(3):
        state, run = compiled.step(state, {}, updates)
    print("hit", compiled.cache_hit, float(run[loss]), state.to_host()[w].tobytes().hex())
    print("compiler loaded", any(name.startswith("iree.compiler") for name in sys.modules))
    if len(sys.argv) > 2:
        try:
            compiled.stablehlo
        except topos.ToposError as error:
            print(type(error).__name__ + ":", error)
""")


def _script(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "script.py"
    path.write_text(text)
    return path


def _run(arguments, without_compiler: bool, env=None, cwd=None) -> str:
    command = [sys.executable, *([str(WITHOUT_COMPILER)] if without_compiler else []), *map(str, arguments)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=cwd, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_importing_the_dialect_loads_no_mlir_until_a_name_is_used(tmp_path):
    script = _script(tmp_path, textwrap.dedent("""
        import sys
        import topos.dialect
        import topos.dialect.iree.compiled, topos.dialect.iree.cache, topos.dialect.iree.targets
        import topos.dialect.passes.freeze
        print("after import", "iree.compiler" in sys.modules)
        topos.dialect.emit_text
        print("after emit_text", "iree.compiler" in sys.modules)
    """))
    assert _run([script], without_compiler=False).split("\n")[:2] == ["after import False", "after emit_text True"]


def test_a_cache_filled_here_serves_a_process_without_the_compiler_with_the_same_bits(tmp_path):
    script, cache = _script(tmp_path, STEP), tmp_path / "cache"
    here = _run([script, cache], without_compiler=False).splitlines()
    there = _run([script, cache, "show"], without_compiler=True).splitlines()
    assert here[0].startswith("hit False ") and there[0] == here[0].replace("hit False", "hit True")
    assert there[1] == "compiler loaded False"
    # A hit's StableHLO is lowered again on demand, which takes the compiler.
    assert there[2].startswith("TargetError: ") and "needs IREE's compiler" in there[2], there


def test_without_the_compiler_a_miss_is_a_target_error_naming_the_cache_and_the_fix(tmp_path):
    script = _script(tmp_path, STEP.replace(
        'compiled = network', 'try:\n    compiled = network').replace(
        'cache=sys.argv[1])\n', 'cache=sys.argv[1])\nexcept topos.ToposError as error:\n'
        '    print(type(error).__name__ + ":", error); sys.exit(0)\n'))
    said = _run([script, tmp_path / "empty"], without_compiler=True)
    assert said.startswith("TargetError: "), said
    for part in ("script.py:", "compiling this plan needs IREE's compiler", "pip install iree-base-compiler",
                 str(tmp_path / "empty"), "docs/deploy.md"):
        assert part in said, (part, said)


def test_without_the_compiler_lowering_is_a_target_error(tmp_path):
    script = _script(tmp_path, textwrap.dedent("""
        import numpy as np
        import topos
        from topos import Tape
        network, out = Tape.record(lambda tape: (tape.input(np.ones(3, np.float32)) * 2.0).sum())
        plan = network.entry([out]).lower()
        for show in (plan.emit_stablehlo, plan.emit_mlir):
            try:
                show()
            except topos.ToposError as error:
                print(type(error).__name__ + ":", error)
    """))
    said = _run([script], without_compiler=True).splitlines()
    assert said[0].startswith("TargetError: ") and "lowering a plan to StableHLO needs IREE's compiler" in said[0]
    assert said[1].startswith("TargetError: ") and "emitting a plan as MLIR needs IREE's compiler" in said[1]


def test_without_the_compiler_backends_say_which_targets_run_what_was_compiled_elsewhere(tmp_path):
    script = _script(tmp_path, "import topos\nfor b in topos.backends():\n    print(b.name, b.status, b.detail)\n")
    rows = {line.split()[0]: line for line in _run([script], without_compiler=True).splitlines()}
    assert rows["iree:llvm-cpu"].split()[1] == "run-only", rows  # local-sync always has its device
    assert "no compiler here" in rows["iree:llvm-cpu"] and "compile cache" in rows["iree:llvm-cpu"]
    for name, row in rows.items():
        if name.startswith("iree:"):  # a target runs cached modules where its driver has a device, else nothing
            status = row.split()[1]
            assert (status, "compile cache" in row, "pip install" in row) in {
                ("run-only", True, False), ("missing", False, True)}, row


def test_without_the_compiler_the_key_takes_the_runtime_release_for_the_compiler(tmp_path):
    from importlib.metadata import version

    if version("iree-base-compiler") != version("iree-base-runtime"):
        pytest.skip("this environment pairs a compiler and a runtime of different releases")
    script = _script(tmp_path, "from topos.dialect.iree.compile import toolchain_version\nprint(toolchain_version())\n")
    assert _run([script], without_compiler=True).strip() == toolchain_version()


def test_the_source_digest_of_an_installed_layout_equals_this_checkout(tmp_path):
    # An installed wheel nests the dialect inside the package (topos/dialect/); this checkout keeps
    # it beside (dialect/, mapped in by the editable install). Both must key the cache alike.
    site = tmp_path / "site"
    shutil.copytree(ROOT / "topos", site / "topos", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "dialect", site / "topos" / "dialect", ignore=shutil.ignore_patterns("__pycache__"))
    script = _script(tmp_path, "import topos.dialect.iree.cache as c\nprint(c.__file__)\nprint(c.code_digest())\n")
    env = dict(os.environ, PYTHONPATH=str(site))
    where, digest = _run([script], without_compiler=False, env=env, cwd=tmp_path).split()
    assert Path(where).is_relative_to(site)
    assert digest == code_digest()


def test_a_module_for_the_host_cpu_is_keyed_on_what_this_cpu_executes(monkeypatch):
    from topos.dialect.iree import cache as cache_module

    network, out = Tape.record(lambda tape: (tape.input(np.ones(3, np.float32)) * 2.0).sum())
    plan = network.entry([out]).lower()
    host, generic = ("--iree-llvmcpu-target-cpu=host",), ("--iree-llvmcpu-target-cpu=generic",)
    keys = plan_key(plan, "llvm-cpu", host, "iree 1"), plan_key(plan, "llvm-cpu", generic, "iree 1")
    monkeypatch.setattr(cache_module, "host_isa", lambda: "x86_64 sse sse2")  # a machine without AVX
    assert plan_key(plan, "llvm-cpu", host, "iree 1") != keys[0]
    assert plan_key(plan, "llvm-cpu", generic, "iree 1") == keys[1]  # a generic module runs on either


def test_gpu_check_prepares_here_and_runs_from_the_cache_without_the_compiler(tmp_path):
    # The llvm-cpu stand-in for the CUDA run: one conformance family and one model, both halves.
    check, cache = ROOT / "benchmarks" / "gpu_check.py", tmp_path / "gpu-cache"
    subset = ["--target", "llvm-cpu", "--families", "elementwise", "--dtypes", "f32", "--models", "mlp-s"]
    prepared = _run([check, *subset, "--prepare", cache], without_compiler=False)
    assert "conformance elementwise f32" in prepared and len(list(cache.glob("*.vmfb"))) == 2, prepared
    ran = _run([check, *subset, "--cache", cache, "--steps", "3"], without_compiler=True)
    assert "(no compiler here)" in ran and "all nodes conform" in ran, ran
    row = next(line for line in ran.splitlines() if line.startswith("| mlp-s "))
    assert "(cached)" in row, ran
    try:
        import jax  # noqa: F401
    except ImportError:
        assert "jax.jit column: absent" in ran, ran
    else:
        assert "agreement" in ran and "e-0" in row, ran  # the jax twin ran and agreed to some digits
    assert len(CompileCache(cache).directory.glob("*.vmfb").__next__().read_bytes()) > 1000
    # gpu_run.sh's second command: the transfer costs, from the same cache.
    transfers = ROOT / "benchmarks" / "transfers.py"
    priced = _run([transfers, "--target", "llvm-cpu", "--cache", cache, "--models", "mlp-s,lenet", "--calls", "5",
                   "--threads", "2"], without_compiler=True)
    assert "| step: compiled.step, the loss read" in priced and "| loss out, staged" in priced, priced
    # --threads 2 leaves it unpinned, its imports too (as gpu_run.sh runs it).
    assert "unpinned (" in priced or len(os.sched_getaffinity(0)) == 1, priced
    assert "lenet: skipped:" in priced, priced  # not prepared, and no compiler to make it: said, not raised
