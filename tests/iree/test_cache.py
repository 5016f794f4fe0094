"""The compile cache: keyed by text, target, flags and IREE versions; hits skip the compiler; bad entries are rebuilt.

An entry is served only when its checksum holds, it carries its own key
(a file renamed to another entry's name is not that entry) and IREE's
runtime can load it. A directory that cannot hold the cache is a
CacheError that names it, before anything compiles.

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

from topos import Tape, ToposError
from topos.dialect.iree import compile as compile_module
from topos.dialect.iree.cache import CacheError, CompileCache, default_directory, key, plan_key
from topos.dialect.iree.compile import CompileError, compiler_version, toolchain_version

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


@pytest.fixture(scope="module")
def walkthrough_module():
    """(cache key, vmfb) of ``_plan()`` for llvm-cpu, compiled once: tests seed their caches with it."""
    plan = _plan()[2]
    compiled = plan.compile("llvm-cpu", cache=False)
    return plan_key(plan, "llvm-cpu", compiled.flags, toolchain_version()), compiled.vmfb


def _seeded(directory: Path, walkthrough_module) -> CompileCache:
    cache = CompileCache(directory)
    cache.store(*walkthrough_module)
    return cache


@pytest.mark.parametrize("damage", ["truncate", "flip-payload-byte", "flip-key-byte", "flip-digest-byte", "empty"])
def test_a_corrupt_entry_is_detected_removed_and_rebuilt(tmp_path, damage, walkthrough_module):
    entry_key, vmfb = walkthrough_module
    cache = _seeded(tmp_path, walkthrough_module)
    network, out, plan = _plan()
    entry = _only_entry(tmp_path)
    data = bytearray(entry.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip-payload-byte":
        data[len(data) // 2] ^= 0x40
    elif damage == "flip-key-byte":
        data[12] ^= 0x01
    elif damage == "flip-digest-byte":
        data[80] ^= 0x01
    else:
        data = bytearray()
    entry.write_bytes(bytes(data))
    assert cache.load(entry_key) is None and not entry.exists()  # detected and removed
    entry.write_bytes(bytes(data))
    rebuilt = plan.compile("llvm-cpu", cache=cache)
    assert not rebuilt.cache_hit and rebuilt.vmfb == vmfb and rebuilt.cache_key == entry_key
    assert cache.load(entry_key) == vmfb  # a valid entry again
    assert rebuilt.forward(network.parameters())[out] == network.forward(network.parameters())[out]


def test_concurrent_processes_compiling_one_module_both_succeed_and_leave_one_valid_entry(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        from test_cache import _plan
        from topos.dialect.iree.cache import CompileCache
        network, out, plan = _plan()
        compiled = plan.compile("llvm-cpu", cache=CompileCache(sys.argv[1]))
        print(float(compiled.forward(network.parameters())[out]), compiled.cache_hit)
    """)
    env = dict(os.environ)
    processes = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in processes]
    for process, (_, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stderr[-2000:]
    values = {stdout.split()[0] for stdout, _ in outputs}
    assert len(values) == 1
    entries = list(tmp_path.iterdir())
    assert len(entries) == 1 and entries[0].suffix == ".vmfb", entries  # no partial files left behind
    _, _, plan = _plan()
    assert CompileCache(tmp_path).load(entries[0].stem) is not None
    assert plan.compile("llvm-cpu", cache=CompileCache(tmp_path)).cache_hit
    assert compiler_version().startswith("iree-base-compiler")


# ---- an entry is its key's, and a module the runtime loads ---------------------------------------


def test_an_entry_carries_its_key_so_a_renamed_file_is_not_served(tmp_path):
    cache = CompileCache(tmp_path)
    first, second = key("a", "llvm-cpu", (), "iree 1"), key("b", "llvm-cpu", (), "iree 1")
    cache.store(first, b"module A")
    cache.store(second, b"module B")
    assert cache.load(first) == b"module A" and cache.load(second) == b"module B"
    swapped = tmp_path / "swap"
    cache.path(first).rename(swapped)
    cache.path(second).rename(cache.path(first))
    swapped.rename(cache.path(second))
    assert cache.load(first) is None and cache.load(second) is None  # valid checksums, wrong names
    assert not list(tmp_path.glob("*.vmfb"))  # both removed, to be rebuilt


def test_a_swapped_entry_never_runs_the_other_plans_module(tmp_path, walkthrough_module):
    entry_key, vmfb = walkthrough_module
    cache = CompileCache(tmp_path)
    network, out, plan = _plan()
    theirs = _plan(3.0)[2].compile("llvm-cpu", cache=cache)
    cache.path(theirs.cache_key).rename(cache.path(entry_key))  # the other plan's module under my name
    again = plan.compile("llvm-cpu", cache=cache)
    assert not again.cache_hit and again.vmfb == vmfb
    assert again.forward(network.parameters())[out] == network.forward(network.parameters())[out]
    assert cache.load(entry_key) == vmfb


def test_a_checksummed_entry_the_runtime_cannot_read_is_evicted_and_rebuilt(tmp_path, walkthrough_module):
    entry_key, vmfb = walkthrough_module
    cache = CompileCache(tmp_path)
    cache.store(entry_key, b"\x08\x00\x00\x00IREE" + bytes(64))  # a valid entry holding no module
    _, _, plan = _plan()
    rebuilt = plan.compile("llvm-cpu", cache=cache)
    assert not rebuilt.cache_hit and rebuilt.vmfb == vmfb
    assert cache.load(entry_key) == vmfb
    assert plan.compile("llvm-cpu", cache=cache).cache_hit


@pytest.fixture(scope="module")
def vulkan_module():
    """The walkthrough plan's module for vulkan: IREE's VM reads it, the local-sync device refuses it."""
    return _plan()[2].compile("vulkan", cache=False).vmfb


def test_a_cached_module_the_device_refuses_is_rebuilt_when_it_first_loads(tmp_path, walkthrough_module,
                                                                           vulkan_module):
    entry_key, vmfb = walkthrough_module
    cache = CompileCache(tmp_path)
    cache.store(entry_key, vulkan_module)  # as if another IREE build had left it
    network, out, plan = _plan()
    stale = plan.compile("llvm-cpu", cache=cache)
    assert stale.cache_hit and stale.vmfb == vulkan_module  # nothing shows until the device loads it
    assert stale.forward(network.parameters())[out] == network.forward(network.parameters())[out]
    assert not stale.cache_hit and stale.vmfb == vmfb and "iree-compile" in stale.timings
    assert cache.load(entry_key) == vmfb


def test_a_module_the_device_refuses_after_a_rebuild_is_a_compile_error_not_a_loop(
        tmp_path, walkthrough_module, vulkan_module, monkeypatch):
    entry_key, _ = walkthrough_module
    cache = CompileCache(tmp_path)
    cache.store(entry_key, vulkan_module)
    network, _, plan = _plan()
    stale = plan.compile("llvm-cpu", cache=cache)
    rebuilds = []
    monkeypatch.setattr(compile_module, "compile_module", lambda *_: rebuilds.append(1) or vulkan_module)
    with pytest.raises(CompileError, match="cannot load the module it just compiled"):
        stale.forward(network.parameters())
    assert len(rebuilds) == 1


# ---- a cache location that cannot work ---------------------------------------------------------


def _tripwire(*_):
    raise AssertionError("compiled before the cache location was checked")


@pytest.mark.parametrize("where", ["a regular file", "under a regular file"])
def test_a_cache_location_that_cannot_hold_files_is_a_cache_error_before_compiling(tmp_path, monkeypatch, where):
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    directory = blocker if where == "a regular file" else blocker / "cache"
    monkeypatch.setattr(compile_module, "compile_stablehlo", _tripwire)
    _, _, plan = _plan()
    for cache in (CompileCache(directory), str(directory)):
        with pytest.raises(CacheError) as failure:
            plan.compile("llvm-cpu", cache=cache)
        message = str(failure.value)
        assert str(directory) in message and "regular file" in message, message
        assert "TOPOS_CACHE_DIR" in message and "cache=False" in message, message
    monkeypatch.setenv("TOPOS_CACHE_DIR", str(directory))
    with pytest.raises(CacheError, match=r"\$TOPOS_CACHE_DIR"):
        plan.compile("llvm-cpu")
    assert issubclass(CacheError, ToposError) and issubclass(CacheError, OSError)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through the permission bits")
def test_an_unwritable_cache_directory_is_a_cache_error(tmp_path, monkeypatch):
    directory = tmp_path / "read-only"
    directory.mkdir()
    directory.chmod(0o500)
    monkeypatch.setattr(compile_module, "compile_stablehlo", _tripwire)
    try:
        with pytest.raises(CacheError, match="does not take new files"):
            _plan()[2].compile("llvm-cpu", cache=CompileCache(directory))
    finally:
        directory.chmod(0o700)


def test_a_cache_argument_that_names_no_cache_is_a_cache_error():
    with pytest.raises(CacheError, match="pass True"):
        _plan()[2].compile("llvm-cpu", cache=3)


def test_a_directory_path_is_a_cache(tmp_path):
    _, _, plan = _plan()
    assert not plan.compile("llvm-cpu", cache=tmp_path).cache_hit
    assert plan.compile("llvm-cpu", cache=str(tmp_path)).cache_hit


# ---- keyed before lowering ------------------------------------------------------------------------


def test_a_hit_is_found_before_any_lowering_runs_and_still_shows_its_stablehlo(tmp_path, monkeypatch):
    cache = CompileCache(tmp_path)
    network, out, plan = _plan()
    first = plan.compile("llvm-cpu", cache=cache)
    text = first.stablehlo
    again = network.entry([out]).lower()
    lowered = []
    import topos.dialect.pipeline as pipeline

    original = pipeline.stablehlo
    monkeypatch.setattr(pipeline, "stablehlo", lambda plan, **options: lowered.append(1) or original(plan, **options))
    hit = again.compile("llvm-cpu", cache=cache)
    assert hit.cache_hit and lowered == [] and hit.vmfb == first.vmfb
    assert set(hit.timings) == {"cache-hit", "total"}
    assert hit.stablehlo == text and lowered == [1]  # recoverable on demand: the plan lowers again
    assert hit.forward(network.parameters())[out] == first.forward(network.parameters())[out]


def test_the_plan_digest_follows_what_is_emitted_not_names_or_sites():
    def record(tape, scale, name):
        x = tape.input(np.linspace(-1.0, 1.0, 6, dtype=np.float32).reshape(2, 3), name=name)
        return (x * scale).tanh().sum()

    def digest(scale=2.0, name="x", observe=False):
        network, out = Tape.record(lambda tape: record(tape, scale, name))
        observed = [network.symbol(2)] if observe else []
        return network.entry([out], observe=observed).lower().digest()

    assert digest() == digest(name="renamed")  # names and recording lines never reach the module's ops
    assert digest() != digest(scale=3.0)  # a leaf's bytes do
    assert digest() != digest(observe=True)  # and so do the declared results


def test_a_change_to_topos_itself_changes_every_key(monkeypatch):
    from topos.dialect.iree import cache as cache_module

    _, _, plan = _plan()
    before = plan_key(plan, "llvm-cpu", (), "iree 1")
    monkeypatch.setattr(cache_module, "code_digest", lambda: "another lowering")
    assert plan_key(plan, "llvm-cpu", (), "iree 1") != before


def test_an_entry_that_is_not_a_regular_file_is_rebuilt_not_read(tmp_path):
    cache = CompileCache(tmp_path)
    network, out, plan = _plan()
    first = plan.compile("llvm-cpu", cache=cache)
    (entry,) = tmp_path.glob("*.vmfb")
    entry.unlink()
    entry.symlink_to("/dev/zero")  # read whole, it would never end
    again = plan.compile("llvm-cpu", cache=cache)
    assert not again.cache_hit and not entry.is_symlink() and entry.stat().st_size > 0
    table = network.parameters()
    np.testing.assert_array_equal(again.forward(table)[out], first.forward(table)[out])


@pytest.mark.parametrize("option, value, match", [
    ("cache", "", "cache='' is an empty path"),
    ("data_tiling", "no", r"data_tiling='no': pass True, False or None"),
    ("transient_storage", 1, r"transient_storage=1: pass True, False or None"),
])
def test_an_option_of_the_wrong_kind_is_refused_before_anything_is_written(tmp_path, monkeypatch, option, value,
                                                                            match):
    monkeypatch.chdir(tmp_path)
    _, _, plan = _plan()
    with pytest.raises(ToposError, match=match):
        plan.compile("llvm-cpu", **{option: value})
    assert list(tmp_path.iterdir()) == []
