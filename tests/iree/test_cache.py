"""The compile cache: keyed by text, target and flags; hits skip the compiler; corrupt entries are rebuilt.

Every test here gives ``compile`` an explicit CompileCache in its own
temporary directory, so what one test stores cannot turn another's
compile into a hit.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from topos import Tape
from topos.dialect.cache import CompileCache, default_directory, key
from topos.dialect.compiled import compiler_version

from iree_support import compile_cache  # noqa: F401  (autouse fixture)

HERE = Path(__file__).resolve().parent


def _plan(scale: float = 2.0):
    def model(tape):
        x = tape.input(np.linspace(-1.0, 1.0, 6, dtype=np.float32).reshape(2, 3))
        return (x * scale).tanh().sum()

    network, out = Tape.record(model)
    return network, out, network.entry([out]).lower()


def test_key_changes_with_the_text_the_target_the_flags_and_the_compiler():
    base = key("module {}", "llvm-cpu", ("--a", "--b"), "iree 1")
    assert base == key("module {}", "llvm-cpu", ("--a", "--b"), "iree 1")
    assert len({
        base,
        key("module { }", "llvm-cpu", ("--a", "--b"), "iree 1"),
        key("module {}", "cuda", ("--a", "--b"), "iree 1"),
        key("module {}", "llvm-cpu", ("--a",), "iree 1"),
        key("module {}", "llvm-cpu", ("--b", "--a"), "iree 1"),
        key("module {}", "llvm-cpu", ("--a", "--b"), "iree 2"),
        key("module {}", "llvm-cpu", ("--a--b",), "iree 1"),  # flags are separated, not concatenated
    }) == 7


def test_a_changed_graph_or_cpu_is_a_new_entry(tmp_path):
    cache = CompileCache(tmp_path)
    _, _, plan = _plan(2.0)
    _, _, other = _plan(3.0)
    first = plan.compile("llvm-cpu", cache=cache)
    assert not other.compile("llvm-cpu", cache=cache).cache_hit  # different StableHLO text
    assert not plan.compile("llvm-cpu", cache=cache, cpu="generic").cache_hit  # different flags
    assert plan.compile("llvm-cpu", cache=cache).cache_hit
    assert len(list(tmp_path.glob("*.vmfb"))) == 3
    assert first.flags != plan.compile("llvm-cpu", cache=cache, cpu="generic").flags


def test_a_hit_skips_the_compiler_and_returns_the_same_module(tmp_path):
    cache = CompileCache(tmp_path)
    network, out, plan = _plan()
    built = plan.compile("llvm-cpu", cache=cache)
    again = plan.compile("llvm-cpu", cache=cache)
    assert not built.cache_hit and "iree-compile" in built.timings
    assert again.cache_hit and "iree-compile" not in again.timings and "cache-hit" in again.timings
    assert again.vmfb == built.vmfb
    assert again.forward(network.parameters())[out] == built.forward(network.parameters())[out]


def test_compile_reports_each_stage(tmp_path):
    compiled = _plan()[2].compile("llvm-cpu", cache=CompileCache(tmp_path))
    assert {"emit", "passes", "iree-compile", "total"} <= set(compiled.timings)
    assert all(seconds >= 0 for seconds in compiled.timings.values())
    assert compiled.timings["total"] >= compiled.timings["iree-compile"]
    for stage in ("emit", "passes", "iree-compile"):
        assert stage in compiled.describe()


def test_cache_off_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("TOPOS_CACHE_DIR", str(tmp_path))
    compiled = _plan()[2].compile("llvm-cpu", cache=False)
    assert not compiled.cache_hit and not list(tmp_path.iterdir())


def test_default_directory_follows_topos_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TOPOS_CACHE_DIR", str(tmp_path / "here"))
    assert default_directory() == tmp_path / "here"
    monkeypatch.delenv("TOPOS_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_directory() == tmp_path / "xdg" / "topos"


def _only_entry(directory: Path) -> Path:
    (entry,) = directory.glob("*.vmfb")
    return entry


@pytest.mark.parametrize("damage", ["truncate", "flip-payload-byte", "flip-digest-byte", "empty"])
def test_a_corrupt_entry_is_detected_removed_and_rebuilt(tmp_path, damage):
    cache = CompileCache(tmp_path)
    network, out, plan = _plan()
    built = plan.compile("llvm-cpu", cache=cache)
    entry = _only_entry(tmp_path)
    data = bytearray(entry.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip-payload-byte":
        data[len(data) // 2] ^= 0x40
    elif damage == "flip-digest-byte":
        data[12] ^= 0x01
    else:
        data = bytearray()
    entry.write_bytes(bytes(data))
    entry_key = entry.stem
    assert cache.load(entry_key) is None and not entry.exists()  # detected and removed
    entry.write_bytes(bytes(data))
    rebuilt = plan.compile("llvm-cpu", cache=cache)
    assert not rebuilt.cache_hit and rebuilt.vmfb == built.vmfb
    assert cache.load(entry_key) == built.vmfb  # a valid entry again
    assert rebuilt.forward(network.parameters())[out] == built.forward(network.parameters())[out]


def test_concurrent_processes_compiling_one_module_both_succeed_and_leave_one_valid_entry(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        from test_cache import _plan
        from topos.dialect.cache import CompileCache
        network, out, plan = _plan()
        compiled = plan.compile("llvm-cpu", cache=CompileCache(sys.argv[1]))
        print(float(compiled.forward(network.parameters())[out]), compiled.cache_hit)
    """)
    env = dict(os.environ)
    processes = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in processes]
    for process, (stdout, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stderr[-2000:]
    values = {stdout.split()[0] for stdout, _ in outputs}
    assert len(values) == 1
    entries = list(tmp_path.iterdir())
    assert len(entries) == 1 and entries[0].suffix == ".vmfb", entries  # no partial files left behind
    _, _, plan = _plan()
    assert CompileCache(tmp_path).load(entries[0].stem) is not None
    assert plan.compile("llvm-cpu", cache=CompileCache(tmp_path)).cache_hit
    assert compiler_version().startswith("iree-base-compiler")
