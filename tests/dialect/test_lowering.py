"""The lowering's structure: every opcode has a rule, the output verifies, and no topos op survives."""

from __future__ import annotations

import re

import pytest
from iree.compiler import ir

import topos
from topos import Tape
from topos.dialect.ir.context import new_context
from topos.dialect.passes.lowering import LOWERINGS, MAP_LOWERINGS, PASS_NAME, LoweringError
from topos.dialect.passes.registry import lookup, run_pipeline
from topos.dialect.pipeline import lower_in_place, lowering_coverage, to_stablehlo

from ._hlo_eval import CASES, ELEMENT_IDS, ELEMENTS, data, emitted
from .graphs import every_opcode


def _lowered(case, dtype) -> str:
    network, root = Tape.record(lambda tape: case.record(tape, dtype))
    return to_stablehlo(emitted(network, [root]))


def test_every_opcode_and_map_function_has_a_lowering_rule():
    coverage = lowering_coverage()
    assert set(coverage) == {o.name for o in topos.OPCODES} | {f"map/{f}" for f in topos.MAP_FUNCTIONS}
    assert [name for name, covered in coverage.items() if not covered] == []
    assert set(LOWERINGS) == {o.name for o in topos.OPCODES}
    assert set(MAP_LOWERINGS) == set(topos.MAP_FUNCTIONS)


def test_cases_exercise_every_opcode_and_map_function():
    opcodes = {case.opcode for case in CASES}
    assert opcodes == {o.name for o in topos.OPCODES}
    functions = {case.name[len("map_"):] for case in CASES if case.opcode == "map"}
    assert functions == set(topos.MAP_FUNCTIONS)


def test_lowering_is_a_registered_pass():
    registered = lookup(PASS_NAME)
    assert registered is not None and not registered.upstream


@pytest.mark.parametrize("dtype", ELEMENTS, ids=ELEMENT_IDS.get)
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_lowered_opcode_verifies_as_plain_stablehlo(case, dtype):
    text = _lowered(case, dtype)
    # A context that refuses unregistered dialects parses it only if no topos op is left.
    context = ir.Context()
    context.allow_unregistered_dialects = False
    with context:
        module = ir.Module.parse(text)
        assert module.operation.verify()
    names = {op.split(" ")[0] for op in re.findall(r"(?:stablehlo|chlo|func)\.\w+", text)}
    assert names, text
    assert '"topos.' not in text


def test_graph_with_every_opcode_lowers_and_verifies():
    network, roots, observes = every_opcode()
    text = to_stablehlo(emitted(network, roots, observes))
    with ir.Context():
        assert ir.Module.parse(text).operation.verify()


def _reductions(text: str) -> list[tuple[str, str, str]]:
    """(operand type, dimensions, result type) of every stablehlo.reduce in ``text``."""
    pattern = (r"stablehlo\.reduce\(.*?across dimensions = \[([0-9, ]*)\] : "
               r"\((tensor<[^>]*>), [^)]*\) -> (tensor<[^>]*>)")
    return [(operand, dims, result) for dims, operand, result in re.findall(pattern, text)]


def test_full_sum_of_a_multi_axis_tensor_reduces_one_dimension_after_a_reshape():
    network, total = Tape.record(lambda tape: tape.input(data(topos.float32, (3, 4, 5), "s")).sum())
    text = to_stablehlo(emitted(network, [total]))
    assert "stablehlo.reshape %arg0 : (tensor<3x4x5xf32>) -> tensor<60xf32>" in text
    assert _reductions(text) == [("tensor<60xf32>", "0", "tensor<f32>")]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_every_reduction_is_over_one_dimension_and_full_ones_are_one_dimensional(case):
    # GPU code generators reject a multi-axis reduction to a scalar (iree-mlir-notes §5).
    for operand, dims, result in _reductions(_lowered(case, topos.float32)):
        assert "," not in dims, (operand, dims)
        if result.endswith("<f32>"):
            assert operand.count("x") == 1, operand


def test_bfloat16_accumulates_in_float32_and_rounds_once():
    network, product = Tape.record(
        lambda tape: tape.input(data(topos.bfloat16, (2, 3), "a")) @ tape.input(data(topos.bfloat16, (3, 4), "b"))
    )
    text = to_stablehlo(emitted(network, [product]))
    assert re.search(r"stablehlo\.dot_general .* -> tensor<2x4xf32>", text), text
    assert len(re.findall(r"stablehlo\.convert .* -> tensor<2x4xbf16>", text)) == 1


def test_lowering_leaves_the_topos_module_unchanged():
    network, root = Tape.record(lambda tape: tape.input(data(topos.float32, (2, 3), "x")).exp().sum())
    module = emitted(network, [root])
    before = str(module)
    to_stablehlo(module)
    assert str(module) == before


def test_lowered_ops_carry_the_recording_line_as_location():
    network, root = Tape.record(lambda tape: tape.input(data(topos.float32, (2, 3), "x")).tanh())
    line = network.node(root).site.line
    with new_context():
        module = emitted(network, [root])
        lower_in_place(module)
        text = module.operation.get_asm(enable_debug_info=True)
    assert re.search(r"stablehlo\.tanh .* loc\(#loc\d+\)", text), text
    assert '"%1 map"' in text and f":{line}:" in text


def test_pass_annotations_on_topos_ops_are_ignored():
    network, root = Tape.record(lambda tape: -tape.input(data(topos.float32, (2,), "x")))
    module = emitted(network, [root])
    with module.context:
        for op in module.body.operations[0].regions[0].blocks[0].operations:
            op.operation.attributes["topos.live_until"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 7)
    assert "stablehlo.negate" in to_stablehlo(module)


_UNKNOWN = """module @topos {
  func.func @main(%arg0: tensor<2xf32>) -> tensor<2xf32> {
    %0 = "topos.frobnicate"(%arg0) {node = 0 : i64} : (tensor<2xf32>) -> tensor<2xf32> loc("%0 frobnicate"("model.py":12:0))
    return %0 : tensor<2xf32>
  }
}
"""  # noqa: E501  (the location is the line a user would see)


def test_an_op_without_a_rule_fails_at_its_recording_line():
    with new_context():
        module = ir.Module.parse(_UNKNOWN)
        with pytest.raises(LoweringError) as caught:
            run_pipeline(module, [PASS_NAME], verify_each=False)
    assert "topos.frobnicate has no StableHLO lowering" in str(caught.value)
    assert caught.value.diagnostics[0].position() == ("model.py", 12, 0)


def test_an_unknown_map_function_is_reported_not_guessed():
    text = _UNKNOWN.replace('"topos.frobnicate"(%arg0) {node = 0 : i64}',
                            '"topos.map"(%arg0) {function = "gamma", node = 0 : i64}')
    with new_context():
        module = ir.Module.parse(text)
        with pytest.raises(LoweringError, match="unknown function 'gamma'"):
            run_pipeline(module, [PASS_NAME], verify_each=False)


def _gelu_and_its_gradient(tape):
    x = tape.parameter(data(topos.float32, (4, 6), "x"))
    loss = x.gelu().sum()
    return loss, tape.differentiate(loss, [x]).roots()


def test_gelu_backward_rebuilds_the_scaled_input_instead_of_reading_the_forward_copy():
    # Read by the backward too, the forward's x / sqrt 2 would be stored between the two
    # (IREE does not recompute it): one more matmul-epilogue output on the GPT's step.
    network, (loss, gradients) = Tape.record(_gelu_and_its_gradient)
    text = to_stablehlo(emitted(network, [loss, *gradients]))
    constant = {value: name for name, value in re.findall(r"(%\S+) = stablehlo\.constant dense<([^>]+)>", text)}
    (scaled,) = re.findall(rf"(%\S+) = stablehlo\.multiply %arg0, {constant['0.707106769']} ", text)
    assert re.findall(rf"= (\S+) [^\n]*{scaled}\b", text) == ["chlo.erf"], text  # its one reader
    (doubled,) = re.findall(rf"(%\S+) = stablehlo\.multiply %arg0, {constant['1.41421354']} ", text)
    (rebuilt,) = re.findall(rf"(%\S+) = stablehlo\.multiply {doubled}, {constant['5.000000e-01']} ", text)
    assert f"stablehlo.multiply {rebuilt}, {rebuilt} " in text, text


def test_a_scale_whose_double_overflows_is_not_rebuilt():
    network, root = Tape.record(
        lambda tape: (tape.input(data(topos.float32, (3,), "x")) * 3.0e38).erf_derivative())
    text = to_stablehlo(emitted(network, [root]))
    assert "dense<6" not in text and len(re.findall(r"stablehlo\.multiply", text)) == 3, text
