"""Emission and parsing: spec -> topos IR -> spec is lossless, and the IR follows the contract."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import topos

ir = pytest.importorskip("iree.compiler.ir")

from topos.dialect import emit_module, emit_text, parse_spec  # noqa: E402
from topos.dialect.ir import context  # noqa: E402
from topos.dialect.ir.diagnostics import DialectError, VerificationError, site_of  # noqa: E402
from topos.dialect.ir.emit import ancestors  # noqa: E402
from topos.dialect.ir.ops import topos_operations  # noqa: E402
from topos.dialect.ir.parse import parse_module  # noqa: E402

from . import graphs  # noqa: E402

GRAPHS = sorted(graphs.GRAPHS)


@pytest.fixture(scope="module", params=GRAPHS)
def recorded(request):
    network, roots, observes = graphs.GRAPHS[request.param]()
    return network, roots, observes, emit_text(network, roots, observes)


def test_graphs_emit_every_node(recorded):
    network, roots, observes, _ = recorded
    # The shared graphs are whole networks: every node feeds a root or an observe.
    assert ancestors(network, roots + observes) == list(range(len(network)))


def test_emit_parse_gives_an_identical_describe(recorded):
    network, roots, observes, text = recorded
    parsed, parsed_roots, parsed_observes = parse_spec(text)
    assert parsed.describe() == network.describe()
    assert [s.index for s in parsed_roots] == [s.index for s in roots]
    assert [s.index for s in parsed_observes] == [s.index for s in observes]


def test_emit_parse_emit_gives_identical_text(recorded):
    _network, _roots, _observes, text = recorded
    assert emit_text(*parse_spec(text)) == text


def test_leaf_payloads_come_back_bit_exact(recorded):
    network, _roots, _observes, text = recorded
    parsed, _, _ = parse_spec(text)
    for node, again in zip(network.nodes(), parsed.nodes()):
        if node.opcode.name == "leaf":
            original, back = network.payload(node.symbol), parsed.payload(again.symbol)
            assert back.dtype == original.dtype and back.shape == original.shape
            assert back.tobytes() == original.tobytes(), node
            assert again.dtype == node.dtype  # selections keep their extent


def test_sites_come_back_from_locations(recorded):
    network, _roots, _observes, text = recorded
    parsed, _, _ = parse_spec(text)
    for node, again in zip(network.nodes(), parsed.nodes()):
        assert (again.site.file, again.site.line) == (node.site.file, node.site.line)
    assert {n.site.file for n in network.nodes()} == {graphs.__file__}


def test_every_op_carries_its_node_index_name_and_recording_line(recorded):
    network, roots, observes, _ = recorded
    module = emit_module(network, roots, observes)
    found = topos_operations(module)
    assert [op.attributes["node"].value for op in found] == list(range(len(network)))
    for op, node in zip(found, network.nodes()):
        assert op.name == f"topos.{node.opcode.name}"
        location = op.location
        assert location.name_str == f"%{node.index} {node.opcode.name}"
        site = site_of(location)
        assert (site.file, site.line) == (node.site.file, node.site.line)


def test_emitted_modules_pass_mlir_and_topos_verification(recorded):
    from topos.dialect import verify_module

    network, roots, observes, _ = recorded
    module = emit_module(network, roots, observes)
    assert module.operation.verify()
    with module.context:
        assert verify_module(module) == []


def test_signature_is_parameters_then_inputs_and_results_roots_then_observes():
    network, roots, observes = graphs.mlp()
    module = emit_module(network, roots, observes)
    function = module.body.operations[0]
    sources = [op for op in topos_operations(module) if op.name in ("topos.parameter", "topos.input")]
    parameters = [op for op in sources if op.name == "topos.parameter"]
    inputs = [op for op in sources if op.name == "topos.input"]
    assert [op.operands[0].arg_number for op in parameters + inputs] == list(range(len(sources)))
    assert [op.attributes["node"].value for op in parameters] == [s.index for s in network.parameter_symbols()]
    text = str(function).splitlines()[0]
    results = text[text.index("-> (") :]
    assert results.count("tensor<") == len(roots) + len(observes)
    assert results.count("{topos.observe}") == len(observes)
    assert results.rstrip(" {").endswith("{topos.observe})")


def test_walkthrough_text_follows_the_contract():
    network, roots, observes = graphs.walkthrough()
    text = emit_text(network, roots, observes, debug_info=False)
    assert text.startswith(
        "module @topos {\n  func.func @main(%arg0: tensor<2x2xf32>, %arg1: tensor<1x2xf32>) -> tensor<f32> {")
    lines = [line.strip() for line in text.splitlines()]
    assert '%0 = "topos.parameter"(%arg0) {node = 0 : i64} : (tensor<2x2xf32>) -> tensor<2x2xf32>' in lines
    assert '%3 = "topos.map"(%2) {function = "tanh", node = 3 : i64} : (tensor<1x2xf32>) -> tensor<1x2xf32>' in lines
    assert (
        '%4 = "topos.leaf"() {node = 4 : i64, value = dense<2.000000e+00> : tensor<1x2xf32>} : () -> tensor<1x2xf32>'
        in lines
    )
    assert "return %6 : tensor<f32>" in lines


def test_a_subset_emits_only_the_ancestor_closure_in_recording_order():
    network, _roots, observes = graphs.mlp()
    logits = observes[0]
    closure = ancestors(network, [logits])
    parsed, parsed_roots, _ = parse_spec(emit_text(network, [logits]))
    assert [n.opcode.name for n in parsed.nodes()] == [network.nodes()[i].opcode.name for i in closure]
    assert len(parsed) < len(network)
    assert parsed_roots[0].index == len(parsed) - 1


def test_parsed_network_runs_like_the_original():
    network, roots, observes = graphs.walkthrough()
    parsed, parsed_roots, _ = parse_spec(emit_text(network, roots, observes))
    feeds = np.array([[0.25, -1.5]], np.float32)
    # Parameters come back as zeros (IR carries no initial values), so compare at zero.
    again = parsed.forward(parsed.parameters(), {parsed.input_symbols()[0]: feeds})
    zero = network.parameters().map(lambda p: p * 0)
    original = network.forward(zero, {network.input_symbols()[0]: feeds})
    assert original[roots[0]].tobytes() == again[parsed_roots[0]].tobytes()


def test_emit_in_a_callers_context_configures_it():
    ctx = ir.Context()
    network, roots, observes = graphs.walkthrough()
    module = emit_module(network, roots, observes, context=ctx)
    assert module.context is ctx
    assert context.is_configured(ctx)


def test_lowering_searches_for_no_dialect_module_per_op(monkeypatch):
    """The bindings import a dialect's Python module on every OpView wrap until one imports: configure gives one."""
    import importlib._bootstrap as bootstrap

    network, roots, observes = graphs.walkthrough()
    plan = network.entry(list(roots)).lower()
    plan.emit_stablehlo()  # every module the lowering imports is loaded now
    searched = []
    find_and_load = bootstrap._find_and_load

    def spy(name, *args):
        if name not in sys.modules:
            searched.append(name)
        return find_and_load(name, *args)

    monkeypatch.setattr(bootstrap, "_find_and_load", spy)
    text = plan.emit_stablehlo()
    assert "stablehlo." in text and searched == []
    for name in ("stablehlo", "chlo"):
        assert sys.modules[f"iree.compiler.dialects.{name}"].__doc__.startswith("no Python module ships")


def test_emit_needs_something_to_export():
    network, _roots, _observes = graphs.walkthrough()
    with pytest.raises(topos.SymbolError, match="at least one root or observe to export; pass the symbols"):
        emit_module(network, ())


def test_emit_takes_a_network_first():
    _network, roots, _observes = graphs.walkthrough()
    for given, kind in ((None, "None"), ("network", "a str")):
        with pytest.raises(topos.ArgumentError, match=f"emit_module takes the sealed Network first .*, not {kind}$"):
            emit_module(given, roots)


@pytest.mark.parametrize("given, kind", [
    (b"module {}", r"bytes; decode them first: data\.decode\('utf-8'\)"), (None, "None"), (3, "an int"),
], ids=["bytes", "none", "int"])
def test_parse_takes_text_or_a_module_and_names_what_it_got(given, kind):
    spec = rf"parse_spec takes topos IR text \(a str\) or a module .*, not {kind}$"
    with pytest.raises(topos.ArgumentError, match=spec):
        parse_spec(given)
    with pytest.raises(topos.ArgumentError, match=rf"parse_module takes topos IR text \(a str\), not {kind}$"):
        parse_module(given)


def test_emit_refuses_symbols_of_another_network():
    network, _roots, _ = graphs.walkthrough()
    _other, other_roots, _ = graphs.walkthrough()
    with pytest.raises(topos.SymbolError):
        emit_module(network, other_roots)


def test_parse_reports_syntax_errors_with_a_location():
    with pytest.raises(DialectError) as caught:
        parse_module("func.func @main() {\n  %0 = \"topos.neg\"( : () -> ()\n}", source_name="model.mlir")
    assert str(caught.value).startswith("model.mlir:2:")


def test_parse_refuses_ir_that_is_not_topos():
    text = """func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  %1 = stablehlo.add %0, %0 : tensor<2xf32>
  return %1 : tensor<2xf32>
}"""
    with pytest.raises(DialectError, match="'stablehlo.add' is not a topos op"):
        parse_spec(text)


def test_parse_refuses_ir_that_fails_verification():
    network, roots, observes = graphs.walkthrough()
    text = emit_text(network, roots, observes).replace('function = "tanh"', 'function = "relu"')
    with pytest.raises(VerificationError, match="'topos.map' op node 3"):
        parse_spec(text)


def test_parse_accepts_implicit_modules_and_names_the_source():
    text = """func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  return %0 : tensor<2xf32>
}
func.func @other() { return }"""
    module = parse_module(text, source_name="two.mlir")
    assert module.operation.name == "builtin.module"
    assert len(module.body.operations) == 2
    operation = topos_operations(module)[0]
    site = site_of(operation.location)
    assert (site.file, site.line) == ("two.mlir", 2)
    network, _roots, _ = parse_spec(module)
    assert network.describe().splitlines()[0].split() == ["0", "parameter", "()", "[2]", "f32"]


@pytest.mark.slow
def test_a_five_thousand_node_chain_round_trips():
    network, roots, observes = graphs.chain(5000)
    text = emit_text(network, roots, observes)
    parsed, parsed_roots, _ = parse_spec(text)
    assert parsed.describe() == network.describe()
    assert emit_text(parsed, parsed_roots) == text


def test_parse_refuses_operands_that_are_not_nodes():
    text = """func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = "topos.neg"(%a) {node = 0 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  return %0 : tensor<2xf32>
}"""
    earlier = "'topos.neg' op node 0: operand #0 is not the result of an earlier topos op"
    with pytest.raises(DialectError, match=earlier):
        parse_spec(text)
