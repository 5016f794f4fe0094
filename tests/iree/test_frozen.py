"""compile(frozen=parameters): the parameters as module globals IREE serves by name, the inputs as the arguments."""

from __future__ import annotations

import json

import numpy as np
import pytest

import topos
from topos import FeedError, SymbolError, Tape
from topos.dialect.iree.cache import CompileCache
from topos.dialect.passes.freeze import freeze_parameters
from topos.dialect.pipeline import stablehlo

from iree_support import ELEMENT_PARAMETERS, compile_cache  # noqa: F401  (fixture)
from test_export import run_check


def _classifier(dtype=np.float32, batch=4, sizes=(6, 8, 3)):
    """Two named layers, a loss and its gradient: results that read every parameter."""
    rng = np.random.default_rng(3)

    def record(tape):
        w1 = tape.parameter(rng.standard_normal(sizes[:2]).astype(dtype), name="fc1.weight")
        b1 = tape.parameter(rng.standard_normal(sizes[1]).astype(dtype), name="fc1.bias")
        w2 = tape.parameter(rng.standard_normal(sizes[1:]).astype(dtype), name="fc2.weight")
        x = tape.input(rng.standard_normal((batch, sizes[0])).astype(dtype), name="x")
        logits = (x @ w1 + b1.broadcast_along(0, batch)).tanh() @ w2
        loss = (logits * logits).sum()
        return x, logits, loss

    network, (x, logits, loss) = Tape.record(record)
    return network, x, logits, loss


def _feeds(x, dtype=np.float32, seed=0):
    return {x: np.random.default_rng(seed).standard_normal((4, 6)).astype(dtype)}


@pytest.mark.parametrize("dtype", ELEMENT_PARAMETERS)
def test_a_frozen_module_takes_only_inputs_and_gives_the_argument_modules_bits(dtype):
    network, x, logits, loss = _classifier(dtype)
    plan = network.entry([logits, loss]).lower()
    table = network.parameters()
    frozen = plan.compile("llvm-cpu", frozen=table)
    plain = plan.compile("llvm-cpu")
    assert frozen.arguments == (x.index,) and len(frozen.frozen) == 3
    for seed in range(3):
        feeds = _feeds(x, dtype, seed)
        got, want = frozen.forward(feeds=feeds), plain.forward(table, feeds)
        for symbol in (logits, loss):
            np.testing.assert_array_equal(got[symbol], want[symbol])


def test_the_frozen_stablehlo_serves_each_parameter_by_name_and_keeps_its_recording_line():
    network, x, logits, _ = _classifier()
    plan = network.entry([logits]).lower()
    text, located, _ = stablehlo(plan, frozen=True)
    for name, shape in (("fc1.weight", "6x8"), ("fc1.bias", "8"), ("fc2.weight", "8x3")):
        assert f'#flow.parameter.named<"topos"::"{name}"> : tensor<{shape}xf32>' in text
    assert "util.global.load immutable" in text
    signature = next(line for line in text.splitlines() if "func.func @main" in line)
    assert signature.count("%arg") == 1 and "tensor<4x6xf32>" in signature
    # Each global keeps the location of the argument it replaced: the parameter's node and this file's line.
    assert 'loc("%0 parameter fc1.weight"' in located and "test_frozen.py\":25" in located
    assert plan.compile("llvm-cpu", frozen=network.parameters()).stablehlo == text


def test_a_name_iree_cannot_print_as_a_key_is_served_under_its_node_number():
    """IREE prints a parameter key unescaped: a name with a quote or a backslash is keyed ``%i`` instead."""

    def record(tape):
        a = tape.parameter(np.full(3, 2.0, np.float32), name='say"hi"')
        b = tape.parameter(np.full(3, 3.0, np.float32), name="back\\slash")
        c = tape.parameter(np.full(3, 5.0, np.float32), name="gewicht.ä")
        return a * b + c

    network, out = Tape.record(record)
    plan = network.entry([out]).lower()
    text, _, _ = stablehlo(plan, frozen=True)
    assert '"topos"::"%0"' in text and '"topos"::"%1"' in text and '"topos"::"gewicht.ä"' in text
    np.testing.assert_array_equal(plan.compile("llvm-cpu", frozen=network.parameters()).forward()[out],
                                  np.full(3, 11.0, np.float32))
    with pytest.raises(ValueError, match="quote or a backslash"):
        freeze_parameters(stablehlo(plan).located, ['say"hi"', "b", "c"])


def test_changing_the_array_a_table_was_made_from_does_not_reach_a_frozen_module():
    network, x, logits, _ = _classifier()
    mine = np.ones((6, 8), np.float32)
    table = network.parameters().with_payloads({"fc1.weight": mine})
    frozen = network.entry([logits]).lower().compile("llvm-cpu", frozen=table)
    feeds = _feeds(x)
    before = frozen.forward(feeds=feeds)[logits].copy()
    mine[...] = 0.0
    np.testing.assert_array_equal(frozen.forward(feeds=feeds)[logits], before)
    unfrozen = network.entry([logits]).lower().compile("llvm-cpu")
    np.testing.assert_array_equal(before, unfrozen.forward(table, feeds)[logits])  # the table's values, not zeros


def test_a_cache_hit_serves_the_values_given_to_this_compile(tmp_path):
    network, x, logits, _ = _classifier()
    plan = network.entry([logits]).lower()
    cache = CompileCache(tmp_path)
    table = network.parameters()
    doubled = table * 2.0
    first = plan.compile("llvm-cpu", cache=cache, frozen=table)
    again = plan.compile("llvm-cpu", cache=cache, frozen=doubled)
    assert not first.cache_hit and again.cache_hit and again.vmfb == first.vmfb
    feeds = _feeds(x)
    np.testing.assert_array_equal(again.forward(feeds=feeds)[logits],
                                  plan.compile("llvm-cpu", cache=cache).forward(doubled, feeds)[logits])
    assert again.stablehlo == first.stablehlo  # lowered and frozen again when asked for
    # Frozen and argument modules are different modules: different entries.
    argument_module = plan.compile("llvm-cpu", cache=cache)
    assert argument_module.cache_key != first.cache_key


def test_a_data_tiled_frozen_module_matches_the_argument_module():
    """With data tiling IREE packs a global's weight at load; the products must not change."""

    def record(tape):
        x = tape.input(np.zeros((128, 256), np.float32), name="x")
        w = tape.parameter(np.random.default_rng(1).standard_normal((256, 1024)).astype(np.float32), name="w")
        return x, (x @ w).tanh()

    network, (x, y) = Tape.record(record)
    plan = network.entry([y]).lower()
    frozen = plan.compile("llvm-cpu", data_tiling=True, frozen=network.parameters())
    plain = plan.compile("llvm-cpu", data_tiling=True)
    assert "--iree-opt-data-tiling" in frozen.flags
    feeds = {x: np.random.default_rng(2).standard_normal((128, 256)).astype(np.float32)}
    np.testing.assert_array_equal(frozen.forward(feeds=feeds)[y], plain.forward(network.parameters(), feeds)[y])


def test_a_frozen_module_refuses_parameters_and_training_with_what_to_do():
    network, x, logits, loss = _classifier()
    table = network.parameters()
    frozen = network.entry([logits]).lower().compile("llvm-cpu", frozen=table)
    with pytest.raises(FeedError, match=r"test_frozen.py:\d+.*frozen parameters.*forward\(feeds=\.\.\.\)"):
        frozen.forward(table, _feeds(x))
    with pytest.raises(FeedError, match=r"test_frozen.py:\d+.*resident.*compile without frozen= to train"):
        frozen.resident(table)
    with pytest.raises(FeedError, match="frozen parameters, which no step can change"):
        frozen.step(None, _feeds(x), topos.Updates(()))
    with pytest.raises(FeedError, match=r"input %\d+ \(x\)|x"):
        frozen.forward(feeds={x: np.zeros((2, 6), np.float32)})  # a wrong feed is still checked


def test_a_wrong_table_for_frozen_is_refused_before_iree(monkeypatch):
    network, _, logits, _ = _classifier()
    other, *_ = _classifier()
    import topos.dialect.iree.compile as compile_module
    import topos.dialect.iree.compiled as compiled

    for module in (compile_module, compiled):  # where it lives, and where compile_plan looks it up
        monkeypatch.setattr(module, "compile_module", lambda *a: pytest.fail("IREE was reached"))
    plan = network.entry([logits]).lower()
    with pytest.raises(SymbolError, match="another network family"):
        plan.compile("llvm-cpu", cache=False, frozen=other.parameters())
    with pytest.raises(FeedError, match="expected a Parameters table"):
        plan.compile("llvm-cpu", cache=False, frozen={"fc1.weight": np.zeros((6, 8))})


def test_frozen_takes_a_table_in_export_as_in_compile_and_true_only_in_export(tmp_path, monkeypatch):
    network, x, logits, _ = _classifier()
    plan = network.entry([logits]).lower()
    trained = network.parameters() * 3.0
    folder = plan.export(tmp_path / "by-table", frozen=trained, feeds=_feeds(x))
    expected = np.load(next((folder / "expected").iterdir()))
    oracle = network.entry([logits], numerics=topos.Numerics.EXACT).interpret(trained, _feeds(x))
    np.testing.assert_array_equal(expected, oracle[logits])  # the trained table's, not the recorded one's
    with pytest.raises(topos.ToposError, match="two tables"):
        plan.export(tmp_path / "two", frozen=trained, parameters=network.parameters(), feeds=_feeds(x))
    with pytest.raises(topos.ToposError, match="pass True, False or the Parameters table"):
        plan.export(tmp_path / "odd", frozen="yes", feeds=_feeds(x))
    import topos.dialect.iree.compile as compile_module
    import topos.dialect.iree.compiled as compiled

    for module in (compile_module, compiled):  # where it lives, and where compile_plan looks it up
        monkeypatch.setattr(module, "compile_module", lambda *a: pytest.fail("IREE was reached"))
    with pytest.raises(FeedError, match=r"compile\(frozen=True\): frozen takes the Parameters table"):
        plan.compile("llvm-cpu", cache=False, frozen=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["by-table"]


def test_a_frozen_export_runs_with_its_parameter_archive_and_no_topos(tmp_path):
    network, x, logits, loss = _classifier()
    table = network.parameters()
    folder = network.entry([logits, loss]).lower().export(tmp_path / "frozen", frozen=True, parameters=table,
                                                          feeds=_feeds(x))
    names = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert "parameters.irpa" in names and [n for n in names if n.startswith("inputs/")] == ["inputs/00_x.npy"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert [p["key"] for p in manifest["frozen"]["parameters"]] == ["fc1.weight", "fc1.bias", "fc2.weight"]
    assert manifest["frozen"]["scope"] == "topos" and [a["name"] for a in manifest["arguments"]] == ["x"]
    assert "--parameters=topos=parameters.irpa" in (folder / "check.sh").read_text()
    done = run_check(folder)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[SUCCESS] all function outputs matched" in done.stdout
    # The archive holds the values: another table's archive makes the same module miss the oracle.
    from topos.dialect.iree.export import _write_archive

    doubled = table * 2.0
    _write_archive(folder / "parameters.irpa", {n: np.asarray(doubled[n]) for n in table.names()})
    assert run_check(folder).returncode != 0


def test_topos_export_frozen_writes_the_archive_instead_of_parameter_inputs(tmp_path):
    from test_export import CASE, topos_command

    (tmp_path / "case.py").write_text(CASE)
    done = topos_command("export", "case.py", "-o", "out", "--frozen", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "parameters.irpa" in done.stdout and "inputs/00_x.npy" in done.stdout and "00_w" not in done.stdout
    assert run_check(tmp_path / "out").returncode == 0


@pytest.mark.parametrize("target", ["cuda", "vulkan", "metal", "rocm"])
def test_every_target_compiles_a_frozen_module_and_vulkan_runs_it_where_it_can(target):
    import iree.runtime as rt

    network, x, logits, _ = _classifier()
    table = network.parameters()
    plan = network.entry([logits]).lower()
    frozen = plan.compile(target, cache=False, frozen=table)
    assert "main" in rt.VmModule.copy_buffer(rt.VmInstance(), frozen.vmfb).function_names
    if target != "vulkan":
        return  # no device of theirs here: compiled and read by the runtime is what can be checked
    try:
        rt.get_driver("vulkan").create_default_device()
    except Exception as error:  # noqa: BLE001  (no loader or no device: compiled is what can be checked)
        pytest.skip(f"compiled; no Vulkan device here to run it ({error}); CI installs Mesa's lavapipe")
    feeds = _feeds(x)
    want = plan.compile("vulkan", cache=False).forward(table, feeds)[logits]
    np.testing.assert_array_equal(frozen.forward(feeds=feeds)[logits], want)


def test_the_tally_says_a_frozen_parameter_is_a_module_global():
    network, x, logits, _ = _classifier()
    frozen = network.entry([logits]).lower().compile("llvm-cpu", frozen=network.parameters())
    kinds = {d.node: d.kernel for d in frozen.tally() if d.backend == "source"}
    assert all("frozen module global" in kinds[i] for i in frozen.frozen) and "argument" in kinds[x.index]


def test_a_frozen_module_names_its_frozen_parameters_without_handing_out_their_arrays():
    network, x, logits, _ = _classifier()
    frozen = network.entry([logits]).lower().compile("llvm-cpu", frozen=network.parameters())
    assert frozen.frozen == tuple(s.index for s in network.parameter_symbols())
    assert network.entry([logits]).lower().compile("llvm-cpu").frozen is None
