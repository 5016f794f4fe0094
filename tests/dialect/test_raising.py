"""topos-raise: elected conv / pool / batch-norm groups become the StableHLO they spell, with the same meaning."""

import numpy as np
import pytest

pytest.importorskip("iree.compiler")

from topos import PlanError, Tape  # noqa: E402
from topos.dialect.ir.context import new_context  # noqa: E402
from topos.dialect.ir.parse import parse_module  # noqa: E402
from topos.dialect.iree.targets import IMG2COL_FLAGS  # noqa: E402
from topos.dialect.passes.registry import PassFailure, load_pass_modules, run_pipeline  # noqa: E402
from topos.nn import functional as F  # noqa: E402

load_pass_modules()
RNG = np.random.default_rng(7)


def _net(observe_interior=False, dtype=np.float32):
    def model(tape):
        x = tape.input(RNG.standard_normal((2, 3, 8, 8)).astype(dtype))
        w = tape.parameter((RNG.standard_normal((4, 3, 3, 3)) * 0.3).astype(dtype))
        b = tape.parameter(RNG.standard_normal((4,)).astype(dtype))
        h = F.conv2d(x, w, b, stride=1, padding=1).relu()
        pooled = F.max_pool(h, 2)
        flat = pooled.reshape((2, 64))
        scale = tape.parameter(np.ones(64, dtype))
        shift = tape.parameter(np.zeros(64, dtype))
        out, mean, variance = F.batch_norm(flat, scale, shift)
        return (out * out).sum(), mean, h

    network, (loss, mean, h) = Tape.record(model)
    observe = [mean]
    if observe_interior:  # declare the convolution's first unfold: a barrier inside its group
        observe.append(next(n.symbol for n in network.nodes() if n.opcode.name == "unfold"))
    return network, loss, mean, network.entry([loss], observe=observe).lower()


def _raised(plan, raise_pass="topos-raise"):
    context = new_context()
    with context:
        module = parse_module(plan.emit_mlir())
        run_pipeline(module, f"topos-fuse,topos-elect,{raise_pass}")
        return module.operation.get_asm(enable_debug_info=False)


# A convolution spelled as columns multiplies the weight by the transposed im2col matrix, contracting
# both first axes; no other product here does.
COLUMNS = "contracting_dims = [0] x [0]"


def test_conv_pool_and_batch_norm_groups_become_stablehlo_and_a_convolution_is_columns_by_default():
    network, loss, mean, plan = _net()
    text = _raised(plan)
    for name in (COLUMNS, "stablehlo.reduce_window", "stablehlo.batch_norm_training"):
        assert text.count(name) == 1, name
    assert "stablehlo.convolution" not in text
    # the im2col matrix [C*kh*kw, B*OH*OW]: nine taps of the padded, channel-major input stacked after the channels
    assert "-> tensor<3x9x2x8x8xf32>" in text and "(tensor<27x4xf32>, tensor<27x128xf32>) -> tensor<4x128xf32>" in text
    assert '"topos.unfold"' not in text  # the im2col chain is gone with the group


def test_the_named_spelling_raises_a_convolution_to_stablehlo_convolution():
    network, loss, mean, plan = _net()
    text = _raised(plan, "topos-raise{convolution=named}")
    assert text.count("stablehlo.convolution") == 1 and COLUMNS not in text
    assert '"topos.unfold"' not in text
    with new_context():
        module = parse_module(plan.emit_mlir())
        with pytest.raises(PassFailure, match="convolution must be one of columns, named; got 'direct'"):
            run_pipeline(module, "topos-fuse,topos-elect,topos-raise{convolution=direct}")


def test_an_observed_interior_blocks_the_raise_of_its_group():
    network, loss, mean, plan = _net(observe_interior=True)
    for spelling in ("columns", "named"):
        text = _raised(plan, f"topos-raise{{convolution={spelling}}}")
        assert "stablehlo.convolution" not in text and COLUMNS not in text
        assert "stablehlo.reduce_window" in text  # the other groups are unaffected


def test_raise_without_election_names_the_missing_passes():
    network, loss, mean, plan = _net()
    with new_context():
        module = parse_module(plan.emit_mlir())
        with pytest.raises(PassFailure, match="topos-fuse,topos-elect"):
            run_pipeline(module, "topos-raise")


@pytest.mark.parametrize("spelling", ["columns", "named"])
def test_raised_module_compiled_by_iree_matches_the_oracle(spelling, tmp_path, monkeypatch):
    monkeypatch.setenv("TOPOS_CACHE_DIR", str(tmp_path))
    network, loss, mean, plan = _net()
    if spelling == "columns":  # what compile emits
        assert COLUMNS in plan.emit_stablehlo() and "stablehlo.convolution" not in plan.emit_stablehlo()
        compiled = plan.compile("llvm-cpu")
        assert not set(IMG2COL_FLAGS) & set(compiled.flags)
    else:  # the named spelling through compile's rewrite seam: IREE rewrites the convolution as im2col + matmul
        named = plan.emit_stablehlo(convolution="named")
        compiled = plan.compile("llvm-cpu", rewrite=lambda text, named=named: named)
        assert set(IMG2COL_FLAGS) <= set(compiled.flags)
    parameters = network.parameters()
    run, oracle = compiled.forward(parameters), network.forward(parameters)
    np.testing.assert_allclose(run[loss], oracle[loss], rtol=1e-4)
    np.testing.assert_allclose(run[mean], oracle[mean], rtol=1e-4, atol=1e-5)


def test_a_group_reading_a_raised_group_raises_too_and_matches_the_oracle(tmp_path, monkeypatch):
    """conv -> relu -> pool -> conv -> relu -> pool: the second conv reads the first pool's raised result."""
    monkeypatch.setenv("TOPOS_CACHE_DIR", str(tmp_path))

    def model(tape):
        x = tape.input(RNG.standard_normal((2, 1, 8, 8)).astype(np.float32))
        w1 = tape.parameter((RNG.standard_normal((4, 1, 3, 3)) * 0.3).astype(np.float32))
        w2 = tape.parameter((RNG.standard_normal((6, 4, 3, 3)) * 0.3).astype(np.float32))
        h = F.max_pool(F.conv2d(x, w1, padding=1).relu(), 2)
        return F.max_pool(F.conv2d(h, w2, padding=1).relu(), 2).sum()

    network, out = Tape.record(model)
    plan = network.entry([out]).lower()
    text = _raised(plan)
    assert text.count(COLUMNS) == 2 and text.count("stablehlo.reduce_window") == 2
    compiled = plan.compile("llvm-cpu")
    parameters = network.parameters()
    np.testing.assert_allclose(compiled.forward(parameters)[out], network.forward(parameters)[out], rtol=1e-5)


def test_emit_stablehlo_raises_the_kinds_it_is_given_and_names_an_unknown_one():
    network, loss, mean, plan = _net()
    assert plan.emit_stablehlo(kinds=["max_pool"]).count(COLUMNS) == 0
    assert plan.emit_stablehlo(kinds="convolution,max_pool").count(COLUMNS) == 1
    assert plan.emit_stablehlo(kinds="convolution", convolution="named").count("stablehlo.convolution") == 1
    with pytest.raises(PlanError, match=r"convolution=\.\.\.\) is 'conv'; choose \"columns\" or \"named\""):
        plan.emit_stablehlo(convolution="conv")
    with pytest.raises(PlanError, match=r"test_raising\.py:\d+ .*kinds=\.\.\.\) names 'conv', which is no fusion "
                       r"kind; choose among .*convolution_weight_gradient"):
        plan.emit_stablehlo(kinds=["conv"])
    with pytest.raises(PlanError, match="names 7"):
        plan.emit_stablehlo(kinds=[7])
    assert plan.emit_stablehlo(kinds=[]).count(COLUMNS) == 0  # no kinds: nothing raised
