"""The op classes: one per opcode, typed builders and accessors, and verifiers that use the core's rules."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import topos
from topos.base.errors import ShapeError

ir = pytest.importorskip("iree.compiler.ir")

from iree.compiler.dialects import func  # noqa: E402

from topos.dialect.ir import context, ops  # noqa: E402
from topos.dialect.ir.diagnostics import VerificationError  # noqa: E402
from topos.spec.opcodes import Spec  # noqa: E402


def test_every_opcode_has_an_op_class_with_a_verifier():
    for opcode in topos.OPCODES:
        cls = ops.op_class(opcode.name)
        assert cls.OPERATION_NAME == f"topos.{opcode.name}"
        assert cls.opcode is opcode
        assert callable(cls.verify_op)
        if not opcode.is_source:
            assert len(cls.operand_names) == opcode.arity
            assert tuple(k.name for k in cls.attribute_kinds) == opcode.attribute_names
    assert set(ops.OP_CLASSES) == {o.name for o in topos.OPCODES}


def test_import_topos_does_not_load_mlir():
    import subprocess
    import sys

    code = "import sys, topos; assert not any(m.startswith('iree') for m in sys.modules), 'iree loaded'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.fixture
def builder():
    """A module with func @main(tensor<2x3xf32>, tensor<3x2xf32>), and its entry block as insertion point."""
    ctx = context.new_context()
    with ctx, ir.Location.unknown():
        module = ir.Module.create()
        f32 = ir.F32Type.get()
        types = [ir.RankedTensorType.get([2, 3], f32), ir.RankedTensorType.get([3, 2], f32)]
        with ir.InsertionPoint(module.body):
            function = func.FuncOp("main", ir.FunctionType.get(types, []))
            block = function.add_entry_block()
        with ir.InsertionPoint(block):
            yield module, block


def test_builder_infers_the_result_type_with_the_core_shape_rule(builder):
    module, block = builder
    a = ops.ParameterOp(block.arguments[0], node=0)
    b = ops.ParameterOp(block.arguments[1], node=1)
    product = ops.MatmulOp(a.result, b.result, node=2)
    window = ops.NarrowOp(product.result, node=3, axis=1, start=1, length=1)
    assert str(product.result.type) == "tensor<2x2xf32>"
    assert str(window.result.type) == "tensor<2x1xf32>"
    assert ops.verify_module(module) == []


def test_builder_refuses_what_the_recorder_refuses(builder):
    _module, block = builder
    a = ops.ParameterOp(block.arguments[0], node=0)
    b = ops.ParameterOp(block.arguments[1], node=1)
    with pytest.raises(ShapeError, match=r"shapes \[2, 3\] and \[3, 2\] differ"):
        ops.AddOp(a.result, b.result, node=2)
    with pytest.raises(TypeError, match="takes 2 operands"):
        ops.AddOp(a.result, node=2)
    with pytest.raises(TypeError, match="needs attribute 'axis'"):
        ops.SumAlongOp(a.result, node=2)


def test_accessors_read_attributes_operands_and_node_as_the_core_spells_them(builder):
    _module, block = builder
    a = ops.ParameterOp(block.arguments[0], node=0)
    u = ops.UnfoldOp(a.result, node=4, axis=1, size=2, step=1, dilation=1)
    p = ops.PermuteOp(a.result, node=5, order=(1, 0))
    m = ops.MapOp(a.result, node=6, function="erf")
    view = block.operations[1]  # the bindings hand back the registered class
    assert type(view) is ops.UnfoldOp
    assert (view.node, view.axis, view.size, view.step, view.dilation) == (4, 1, 2, 1, 1)
    assert view.input == a.result
    assert p.order == (1, 0) and m.function == "erf"
    assert u.opcode_attributes() == {"axis": 1, "size": 2, "step": 1, "dilation": 1}
    assert u.spec == Spec((2, 2, 2), np.dtype(np.float32))


def test_leaf_and_selection_accessors(builder):
    module, _block = builder
    values = np.array([[1.5, -0.0], [np.inf, np.nan]], np.float32)
    leaf = ops.LeafOp(values, node=0)
    picks = ops.LeafOp(topos.selection([1, 0, 1], 2), node=1)
    rows = ops.GatherOp(leaf.result, picks.result, node=2)
    assert leaf.value.tobytes() == values.tobytes()
    assert leaf.extent is None and picks.extent == 2
    assert picks.value.tolist() == [1, 0, 1]
    assert picks.spec == Spec((3,), topos.SelectionType(2))
    assert str(rows.result.type) == "tensor<3x2xf32>"
    assert ops.verify_module(module) == []


_FLOAT_DTYPES = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(ml_dtypes.bfloat16)]


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(_FLOAT_DTYPES).flatmap(
        lambda dtype: hnp.arrays(
            np.dtype(f"u{dtype.itemsize}"), hnp.array_shapes(min_dims=0, max_dims=3, max_side=7)
        ).map(lambda bits: bits.view(dtype))
    )
)
def test_leaf_payloads_keep_their_bits_through_the_attribute(array):
    # Arbitrary bit patterns: NaN payloads, signed zeros, subnormals, infinities.
    with context.new_context(), ir.Location.unknown():
        attribute = ops.elements_attribute(array)
        back = ops.elements_array(attribute)
        reparsed = ops.elements_array(ir.Attribute.parse(str(attribute)))
    assert back.dtype == array.dtype and back.shape == array.shape
    assert back.tobytes() == array.tobytes()
    assert reparsed.tobytes() == array.tobytes()


@pytest.mark.parametrize("dtype", _FLOAT_DTYPES, ids=lambda d: d.name)
def test_a_splat_payload_becomes_a_splat_attribute_with_the_bits_of_the_full_array(dtype):
    # -0.0 and a NaN with a payload: the one element's bits travel, not a value equal to them.
    width = 8 * dtype.itemsize
    negative_zero, quiet_nan = 1 << (width - 1), {16: 0x7FC1, 32: 0x7FC00001, 64: 0x7FF8000000000001}[width]
    for bits in (negative_zero, quiet_nan):
        one = np.array(bits, dtype=f"u{dtype.itemsize}").view(dtype)
        full = np.full((300, 7), one)
        assert full.view(f"u{dtype.itemsize}")[0, 0] == bits
        with context.new_context(), ir.Location.unknown():
            attribute = ops.elements_attribute(np.broadcast_to(one, full.shape))
            assert attribute.is_splat and list(attribute.type.shape) == [300, 7]
            assert ops.elements_array(attribute).tobytes() == full.tobytes()
            assert str(attribute) == str(ops.elements_attribute(full))  # MLIR finds the full array uniform too


def test_large_bf16_leaves_print_as_hex_and_read_back_exactly():
    array = (np.arange(300, dtype=np.float32) / 7).astype(ml_dtypes.bfloat16)
    with context.new_context(), ir.Location.unknown():
        attribute = ops.elements_attribute(array)
        assert str(attribute).startswith('dense<"0x')
        assert ops.elements_array(attribute).tobytes() == array.tobytes()


# ---- verification: malformed ops from text --------------------------------------------


def _verify(body: str, arguments: str = "%a: tensor<2x3xf32>, %b: tensor<3x2xf32>"):
    text = f"func.func @main({arguments}) {{\n{body}\n  return\n}}\n"
    with context.new_context():
        module = ir.Module.parse(text)
        return [str(d) for d in ops.verify_module(module)]


_SOURCES = """  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  %1 = "topos.parameter"(%b) {node = 1 : i64} : (tensor<3x2xf32>) -> tensor<3x2xf32>"""


@pytest.mark.parametrize(
    "op, message",
    [
        ('"topos.add"(%0) {node = 2 : i64} : (tensor<2x3xf32>) -> tensor<2x3xf32>',
         "'topos.add' op node 2: expects 2 operands (lhs, rhs), got 1"),
        ('"topos.add"(%0, %1) {node = 2 : i64} : (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<2x3xf32>',
         "'topos.add' op node 2: shapes [2, 3] and [3, 2] differ"),
        ('"topos.sum_along"(%0) {node = 2 : i64, axis = 2 : i64} : (tensor<2x3xf32>) -> tensor<2xf32>',
         "'topos.sum_along' op node 2: axis 2 is out of range for rank 2"),
        ('"topos.sum_along"(%0) {node = 2 : i64, axis = 1.0 : f32} : (tensor<2x3xf32>) -> tensor<2xf32>',
         "attribute 'axis' must be an i64 integer"),
        ('"topos.sum_along"(%0) {node = 2 : i64} : (tensor<2x3xf32>) -> tensor<2xf32>',
         "needs the attribute `axis = <n> : i64`"),
        ('"topos.neg"(%0) {node = 2 : i64, axes = 1 : i64} : (tensor<2x3xf32>) -> tensor<2x3xf32>',
         "has no attribute 'axes'"),
        ('"topos.neg"(%0) : (tensor<2x3xf32>) -> tensor<2x3xf32>',
         "needs the attribute `node = <index> : i64`"),
        ('"topos.neg"(%0) {node = 2 : i64} : (tensor<2x3xf32>) -> tensor<3x2xf32>',
         "result type tensor<3x2xf32> differs from tensor<2x3xf32>"),
        ('"topos.map"(%0) {node = 2 : i64, function = "relu"} : (tensor<2x3xf32>) -> tensor<2x3xf32>',
         "attribute 'function' is \"relu\", expected one of exp"),
        ('"topos.permute"(%0) {node = 2 : i64, order = [1, 0]} : (tensor<2x3xf32>) -> tensor<3x2xf32>',
         "attribute 'order' must be an i64 array"),
        ('"topos.frob"(%0) {node = 2 : i64} : (tensor<2x3xf32>) -> tensor<2x3xf32>',
         "unknown op 'topos.frob'"),
        ('"topos.neg"(%0) {node = 2 : i64} : (tensor<2x3xf32>) -> (tensor<2x3xf32>, tensor<2x3xf32>)',
         "expects 1 result, got 2"),
        ('"topos.leaf"() {node = 2 : i64, value = dense<1.0> : tensor<2xf32>} : () -> tensor<3xf32>',
         "value has type tensor<2xf32> but the result is tensor<3xf32>"),
        ('"topos.leaf"() {node = 2 : i64, value = dense<[0, 5]> : tensor<2xi64>, extent = 3 : i64} '
         ': () -> tensor<2xi64>',
         "selection index 5 at (1,) is outside [0, 3)"),
        ('"topos.leaf"() {node = 2 : i64, value = dense<[0, 1]> : tensor<2xi64>} : () -> tensor<2xi64>',
         "needs the attribute `extent = <n> : i64`"),
        ('"topos.leaf"() {node = 2 : i64, value = dense<[0, 1]> : tensor<2xi32>} : () -> tensor<2xi32>',
         "tensor<2xi32> has element type i32"),
        ('"topos.parameter"(%0) {node = 2 : i64} : (tensor<2x3xf32>) -> tensor<2x3xf32>',
         "the operand must be an argument of the enclosing function"),
        ('"topos.neg"(%0) {node = 0 : i64} : (tensor<2x3xf32>) -> tensor<2x3xf32>',
         "node index 0 is already used by topos.parameter"),
    ],
)
def test_verifier_reports_malformed_ops_with_node_and_location(op, message):
    binding = "%2:2" if "-> (" in op else "%2"
    found = _verify(f"{_SOURCES}\n  {binding} = {op}")
    assert len(found) == 1, found
    assert message in found[0]
    # The diagnostic points at the op: line 4 of the parsed text (the buffer is "-").
    column = len(f"  {binding} = ") + 1
    assert found[0].startswith(f"-:4:{column}: error: ")


def test_verification_error_names_the_users_recording_line():
    def model(tape):
        return tape.input(np.ones((2, 3), np.float32)).sum_along(1)

    network, out = topos.Tape.record(model)
    from topos.dialect.ir.emit import emit_text

    text = emit_text(network, [out]).replace("axis = 1 : i64", "axis = 7 : i64")
    with context.new_context():
        module = ir.Module.parse(text)
        with pytest.raises(VerificationError) as caught:
            for operation in ops.topos_operations(module):
                operation.opview.verify_op()
    line = model.__code__.co_firstlineno + 1
    assert f"{__file__}:{line}:0: error: 'topos.sum_along' op node 1: axis 7 is out of range" in str(caught.value)


def test_gather_of_a_selection_defined_outside_topos_checks_only_types():
    # After partial lowering the selection may come from a block argument:
    # its extent is unknown, so only the table's rows can bound it.
    body = """  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<4x3xf32>) -> tensor<4x3xf32>
  %1 = "topos.gather"(%0, %s) {node = 1 : i64} : (tensor<4x3xf32>, tensor<2xi64>) -> tensor<2x3xf32>"""
    assert _verify(body, "%a: tensor<4x3xf32>, %s: tensor<2xi64>") == []


def test_discardable_topos_annotations_are_accepted():
    body = _SOURCES + (
        '\n  %2 = "topos.neg"(%0) {node = 2 : i64, topos.live_until = 5 : i64, topos.fusion_group = 1 : i64}'
        " : (tensor<2x3xf32>) -> tensor<2x3xf32>"
    )
    assert _verify(body) == []


def test_spec_and_type_conversions_agree():
    with context.new_context():
        for spec in [
            Spec((2, 3), np.dtype(np.float32)),
            Spec((), np.dtype(np.float64)),
            Spec((4,), np.dtype(ml_dtypes.bfloat16)),
            Spec((2, 2), topos.SelectionType(5)),
        ]:
            mlir_type = ops.tensor_type(spec)
            assert str(mlir_type) == ops.type_text(spec)
            extent = getattr(spec.dtype, "extent", None)
            assert ops.spec_of_type(mlir_type, extent) == spec


def test_configured_contexts_load_func_stablehlo_and_chlo_before_any_ir_is_built():
    from iree.compiler.api import Session

    # An IREE session's context loads dialects lazily; unconfigured, a
    # func.func built there silently becomes an unregistered op.
    session_context = Session().context
    for ctx in (context.new_context(), context.configure(session_context)):
        assert context.is_configured(ctx)
        with ctx, ir.Location.unknown():
            module = ir.Module.create()
            with ir.InsertionPoint(module.body):
                function = func.FuncOp("main", ir.FunctionType.get([], []))
            with ir.InsertionPoint(function.add_entry_block()):
                func.ReturnOp([])
            assert ctx.is_registered_operation("func.func")
            assert ctx.is_registered_operation("stablehlo.add") and ctx.is_registered_operation("chlo.erf")
            assert module.operation.verify()
            assert str(module).splitlines()[1] == "  func.func @main() {"
