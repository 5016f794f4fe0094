"""The misuse catalogue: each way a user can hold topos wrong ends in a ToposError that says so.

Every row is a mistake a user can type, the ToposError subclass it must
raise, and what the message must name: the symbol or the shapes involved
and the fix. Every message must also start with the user's own line, the
call that failed (``test_misuse.py:<line>``, a line inside the row's
function), run-time errors included. A row's function records its own
small graph, so rows are independent.
"""

from __future__ import annotations

import copy
import inspect
import pickle
import re

import ml_dtypes
import numpy as np
import pytest

import topos
import topos.nn.functional as F
from topos import (
    ArgumentError,
    CheckpointError,
    DifferentiationError,
    FeedError,
    Numerics,
    PlanError,
    RecordingError,
    SealedError,
    ShapeError,
    SymbolError,
    Tape,
    checkpoint,
    nn,
    optim,
    selection,
)

F32, F64, BF16 = np.float32, np.float64, np.dtype(ml_dtypes.bfloat16)
CASES = []


def case(error, *words):
    """Register the decorated function as a row: it must raise ``error`` with every regex of ``words``."""
    def register(fn):
        CASES.append(pytest.param(fn, error, words, id=fn.__name__))
        return fn
    return register


def record(fn):
    return Tape.record(fn)


def v(tape, shape=(2, 3), dtype=F32, fill=1.0):
    return tape.input(np.full(shape, fill, dtype))


def _small():
    def build(tape):
        w = tape.parameter(np.ones((3, 2), F32), name="w")
        x = tape.input(np.ones((4, 3), F32), name="x")
        loss = (x @ w).sum()
        return w, x, loss
    return Tape.record(build)


# ---- elementwise -----------------------------------------------------------------------------------

for _op in ("add", "sub", "mul", "div", "pow", "maximum", "step"):
    def _shape_mismatch(op=_op):
        record(lambda t: getattr(v(t), op)(v(t, (3, 2))))
    _shape_mismatch.__name__ = f"elementwise_{_op}_shapes_differ"
    case(ShapeError, _op, r"\[2, 3\].*\[3, 2\]", "broadcast")(_shape_mismatch)


@case(ShapeError, "element types f32 and f64 differ", "same element type")
def elementwise_dtypes_differ():
    record(lambda t: v(t) + v(t, dtype=F64))


@case(ShapeError, "array of element type float64 beside a float32", r"astype")
def numpy_array_of_another_dtype_beside_a_value():
    record(lambda t: v(t) + np.ones((2, 3)))


@case(ShapeError, "selection", "gather or scatter")
def arithmetic_on_a_selection():
    record(lambda t: t.leaf(selection([0, 1], 3)) + 1.0)


@case(ShapeError, "comparisons of Values are not recorded", r"step")
def comparing_a_value_to_a_number():
    record(lambda t: v(t) == 0)


@case(ShapeError, "comparisons", r"x\.step\(t\)")
def ordering_values():
    record(lambda t: v(t) < v(t))


@case(ShapeError, "map", "function")
def unknown_map_function():
    record(lambda t: v(t).map("softsign"))


@case(ShapeError, r"the number 1e\+300 beside a \[3\] f32 Value does not fit f32", r"largest 3\.40282e\+38",
      "scale it, or record the Value in float64")
def a_number_too_large_for_f32_beside_a_value():
    record(lambda t: v(t, (3,)) * 1e300)


@case(ShapeError, r"the number 1e\+39 beside a \[2, 3\] f32 Value does not fit f32", "scale it")
def an_int_too_large_for_f32_beside_a_value():
    record(lambda t: v(t) + 10**39)


@case(ShapeError, r"the number 1e\+400 beside a \[2, 3\] f64 Value does not fit f64", "scale it")
def an_int_past_float64_beside_a_value():
    record(lambda t: v(t, dtype=F64) * 10**400)


@case(ShapeError, r"the number 1e\+400 beside a \[2, 3\] f32 Value does not fit f32")
def an_int_past_float64_as_an_exponent():
    record(lambda t: v(t) ** 10**400)


@case(ShapeError, r"add: a list beside a \[3\] f32 Value", r"np\.asarray\(values, dtype=x\.dtype\)", r"tape\.leaf")
def adding_a_list_to_a_value():
    record(lambda t: v(t, (3,)) + [1.0, 2.0, 3.0])


@case(ShapeError, r"add: a list beside", r"np\.asarray")
def adding_a_value_to_a_list():
    record(lambda t: [1.0, 2.0, 3.0] + v(t, (3,)))


@case(ShapeError, r"step: a list beside a \[2, 3\] f32 Value", r"np\.asarray")
def a_step_threshold_given_as_a_list():
    record(lambda t: v(t).step([0.5, 0.5, 0.5]))


@case(ShapeError, "the bool True beside", r"1\.0 or 0\.0")
def adding_a_bool_to_a_value():
    record(lambda t: v(t) + True)


@case(ShapeError, "the complex number 1j beside", "complex numbers are not supported")
def adding_a_complex_number_to_a_value():
    record(lambda t: v(t) + 1j)


@case(ShapeError, r"mul: a str beside|the str '2' beside", r"float\(text\)")
def multiplying_a_value_by_a_string():
    record(lambda t: v(t) * "2")


@case(ShapeError, r"add: a torch\.Tensor beside a \[3\] f32 Value", r"topos\.interop\.numpy_array\(tensor\)")
def adding_a_torch_tensor_to_a_value():
    torch = pytest.importorskip("torch")
    record(lambda t: v(t, (3,)) + torch.ones(3))


@case(ShapeError, r"add: a torch\.Tensor beside", "record it as an input")
def adding_a_value_to_a_torch_tensor():
    torch = pytest.importorskip("torch")
    record(lambda t: torch.ones(3) + v(t, (3,)))


# ---- linear algebra, reductions, shapes ------------------------------------------------------------

@case(ShapeError, "matmul", r"\[2, 3\].*\[2, 3\]")
def matmul_inner_extents_differ():
    record(lambda t: v(t) @ v(t))


@case(ShapeError, "matmul", r"\[2, 2, 3\]")
def matmul_batch_axes_differ():
    record(lambda t: v(t, (2, 2, 3)) @ v(t, (3, 3, 4)))


@case(ShapeError, "sum_along", "axis 2 is out of range for rank 2", r"0\.\.1")
def sum_along_an_axis_past_the_rank():
    record(lambda t: v(t).sum_along(2))


@case(ShapeError, "sum_along", "integer")
def sum_along_a_float_axis():
    record(lambda t: v(t).sum_along(1.0))


@case(ShapeError, "broadcast", "single-element operand", "broadcast_to")
def broadcast_of_a_tensor():
    record(lambda t: v(t).broadcast((4, 2, 3)))


@case(ShapeError, "broadcast_along", "extent must be an integer >= 1")
def broadcast_along_zero_copies():
    record(lambda t: v(t).broadcast_along(0, 0))


@case(ShapeError, r"broadcast_along: the result's shape \[9223372036854775808, 2, 3\] f32", r"about 2\*\*67 bytes",
      r"2\*\*63 - 1")
def broadcast_along_to_more_bytes_than_any_array_holds():
    record(lambda t: v(t).broadcast_along(0, 2**63))


@case(ShapeError, r"pad: the result's shape \[2, 18446744073709551616\] f32", "more than any array can")
def padding_to_more_bytes_than_any_array_holds():
    record(lambda t: v(t).pad(1, 0, 2**64))


@case(ShapeError, r"broadcast: the result's shape \[2147483648, 2147483648\] f32", "record a smaller shape")
def broadcasting_a_number_to_more_bytes_than_any_array_holds():
    record(lambda t: v(t).sum().broadcast((2**31, 2**31)))


@case(ShapeError, "broadcast_to", r"\[2, 3\] cannot broadcast to \[3, 3\]", "trailing axes")
def broadcast_to_an_incompatible_shape():
    record(lambda t: v(t).broadcast_to((3, 3)))


@case(ShapeError, "cannot reshape", r"6 elements.*7 elements", "same number of elements")
def reshape_to_another_volume():
    record(lambda t: v(t).reshape((7,)))


@case(ShapeError, "cannot infer the -1", "at most one -1")
def reshape_with_two_holes():
    record(lambda t: v(t).reshape((-1, -1)))


@case(ShapeError, "permute", "not a permutation", "exactly once")
def permute_with_a_repeated_axis():
    record(lambda t: v(t).permute((0, 0)))


@case(ShapeError, "permute", "integer axes")
def permute_with_float_axes():
    record(lambda t: v(t).permute((1.7, 0.2)))


@case(ShapeError, "narrow", r"\[2, 3\]")
def narrow_past_the_end():
    record(lambda t: v(t).narrow(1, 2, 2))


@case(ShapeError, "pad", r"\[2, 3\]")
def pad_to_less_than_the_operand():
    record(lambda t: v(t).pad(1, 0, 2))


@case(ShapeError, "unfold", r"\[2, 3\]")
def unfold_a_window_larger_than_the_axis():
    record(lambda t: v(t).unfold(1, 4))


@case(ShapeError, "fold", r"\[2, 2, 2\]", "extent 9")
def fold_with_an_inconsistent_extent():
    record(lambda t: v(t, (2, 2, 2)).fold(1, 2, 1, 1, 9))


@case(ShapeError, "squeeze", "not a size-1 axis", "sum_along or narrow")
def squeeze_an_axis_of_extent_three():
    record(lambda t: v(t).squeeze(1))


@case(ShapeError, "unsqueeze", "out of range")
def unsqueeze_past_the_rank():
    record(lambda t: v(t).unsqueeze(5))


@case(ShapeError, "concat", r"\[2, 3\] and \[3, 3\] differ outside axis 1")
def concat_of_misaligned_tensors():
    record(lambda t: topos.concat([v(t), v(t, (3, 3))], 1))


@case(ShapeError, "log_softmax", "axis 3")
def log_softmax_along_a_missing_axis():
    record(lambda t: v(t).log_softmax(3))


@case(ShapeError, "logsumexp", "axis")
def logsumexp_along_a_negative_axis():
    record(lambda t: v(t).logsumexp(-1))


@case(ShapeError, "narrow", "length must be an integer >= 1, got 0")
def narrow_to_nothing():
    record(lambda t: v(t).narrow(1, 0, 0))


@case(ShapeError, r"\bsoftmax: axis -1 is out of range for shape \[2, 3\]", r"0\.\.1", "negative axes")
def softmax_along_a_negative_axis():
    record(lambda t: v(t).softmax(-1))


@case(ShapeError, r"\bsoftmax: axis 2 is out of range", r"topos axes are 0\.\.1")
def softmax_along_a_missing_axis():
    record(lambda t: v(t).softmax(2))


@case(ShapeError, r"broadcast_to: the target shape \[-1, 3\]", "int >= 1", "spell the extent out")
def broadcast_to_a_negative_extent():
    record(lambda t: v(t, (1, 3)).broadcast_to((-1, 3)))


@case(ShapeError, r"reshape: shape \[-2, -3\]", "positive ints, with at most one -1")
def reshape_to_negative_extents():
    record(lambda t: v(t).reshape((-2, -3)))


@case(ShapeError, r"reshape: shape \[2\.0, 3\.0\]", "positive ints")
def reshape_to_float_extents():
    record(lambda t: v(t).reshape((2.0, 3.0)))


@case(ShapeError, "concat: no operands", "pass at least one Value")
def concat_of_nothing():
    record(lambda t: topos.concat([], 0))


@case(ShapeError, "stack: no operands", "pass at least one Value")
def stack_of_nothing():
    record(lambda t: topos.stack([], 0))


@case(ShapeError, "concat: operand 1 is a numpy.ndarray", r"tape\.leaf\(array\)")
def concat_of_a_numpy_array():
    record(lambda t: topos.concat([v(t), np.ones((2, 3), F32)], 0))


@case(ShapeError, "stack: operand 1 is a float", r"tape\.leaf")
def stack_of_a_number():
    record(lambda t: topos.stack([v(t), 1.0], 0))


@case(ShapeError, "concat: takes a list of Values", r"topos\.concat\(\[a, b\], axis\)")
def concat_of_values_not_in_a_list():
    record(lambda t: topos.concat(v(t), 0))


@case(ShapeError, r"concat: element types differ: operand 0 is \[2, 3\] f64, operand 1 is \[2, 3\] f32", "one dtype")
def concat_of_two_element_types():
    record(lambda t: topos.concat([v(t, dtype=F64), v(t)], 0))


@case(ShapeError, r"stack: shapes \[2, 3\] and \[3, 2\] differ \(operands 0 and 1\)", "equal-shaped")
def stack_of_two_shapes():
    record(lambda t: topos.stack([v(t), v(t, (3, 2))], 0))


@case(ShapeError, r"stack: axis 5 is out of range for operands of shape \[2, 3\]", r"0\.\.2")
def stack_along_a_missing_axis():
    record(lambda t: topos.stack([v(t), v(t)], 5))


# ---- indexing ---------------------------------------------------------------------------------------

@case(ShapeError, "gather", "rows but the selection indexes 5", "extent must equal")
def gather_with_a_selection_of_another_extent():
    record(lambda t: v(t, (4, 2)).gather(t.leaf(selection([1], 5))))


@case(ShapeError, "gather", "selection operand has element type f32", "topos.selection")
def gather_with_float_indices():
    record(lambda t: v(t, (4, 2)).gather(v(t, (2,))))


@case(ShapeError, "cannot be indexed", "gather", "narrow")
def indexing_a_value_with_brackets():
    record(lambda t: v(t)[0])


@case(ShapeError, "must be integers, got float64", "np.round")
def selection_of_floats():
    selection(np.array([0.0, 1.5]), 3)


@case(ShapeError, "booleans", "flatnonzero")
def selection_of_a_boolean_mask():
    selection(np.array([True, False, True]), 3)


@case(ShapeError, "index -1 at position", r"\[0, 3\)", "filter or clip")
def selection_with_a_negative_index():
    selection([0, -1], 3)


@case(ShapeError, "extent must be a positive integer")
def selection_of_extent_zero():
    selection([0], 0)


@case(ShapeError, "a selection needs at least one index", "never empty")
def a_selection_of_no_indices():
    selection([], extent=4)


# ---- sources ----------------------------------------------------------------------------------------

@case(ShapeError, "empty tensors", r"\[0\]")
def an_empty_leaf():
    record(lambda t: t.leaf(np.zeros(0, F32)))


@case(ShapeError, "element type int32 is not supported", "topos.selection")
def an_integer_parameter():
    record(lambda t: t.parameter(np.zeros(3, np.int32)))


@case(ShapeError, "payload is a Value", "arrays or numbers")
def a_value_as_a_payload():
    record(lambda t: t.parameter(v(t)))


@case(ShapeError, r"parameter: the payload \[\[1\.0, 2\.0\], \[3\.0\]\] is ragged", "same length")
def a_ragged_parameter():
    record(lambda t: t.parameter([[1.0, 2.0], [3.0]]))


@case(ShapeError, "give a default, or shape=")
def an_input_with_neither_default_nor_shape():
    record(lambda t: t.input())


@case(ShapeError, r"parameter: a selection \(index<2>, shape \[2\]\) cannot be a parameter",
      r"tape\.input\(selection\)", r"tape\.leaf\(selection\)")
def a_selection_as_a_parameter():
    record(lambda t: t.parameter(selection([0, 1], extent=2)))


for _extent in (2.7, True, "3", float("nan")):
    def _declared_extent(extent=_extent):
        record(lambda t: t.input(shape=(3,), extent=extent))
    _declared_extent.__name__ = f"an_input_declared_with_extent_{_extent!r}"
    case(ShapeError, "selection extent must be a positive integer", re.escape(f"got {_extent!r}"))(_declared_extent)


@case(ShapeError, r"input: dtype='foo' is not an element type", "float32, float64 or ml_dtypes.bfloat16")
def an_input_declared_with_an_unknown_dtype():
    record(lambda t: t.input(shape=(3,), dtype="foo"))


@case(ShapeError, r"input: shape \[4294967296, 4294967296\] f32 would hold about 2\*\*66 bytes",
      "more than any array can")
def an_input_declared_larger_than_any_array():
    record(lambda t: t.input(shape=(2**32, 2**32)))


@case(ArgumentError, "tape.parameter: trainable must be True or False, got 'no'")
def a_parameter_with_trainable_no():
    record(lambda t: t.parameter(np.ones(2), trainable="no"))


@case(ArgumentError, "tape.input: required must be True or False, got 'no'")
def an_input_with_required_no():
    record(lambda t: t.input(np.ones(2), required="no"))


@case(SymbolError, "not a valid name", "blocks.0.attn")
def a_name_with_a_space():
    record(lambda t: t.parameter(np.ones(2), name="my weight"))


@case(SymbolError, "named 'w'", "unique", "parent Module")
def two_parameters_with_one_name():
    Tape.record(lambda t: (t.parameter(np.ones(2), name="w"), t.parameter(np.ones(2), name="w")))


@case(SymbolError, "only parameters and inputs take names")
def naming_a_computed_node():
    record(lambda t: t.name(v(t) + 1.0, "sum"))


# ---- sealing and reopening --------------------------------------------------------------------------

@case(SealedError, "sealed", "reopen")
def recording_on_a_sealed_tape():
    tape = Tape()
    tape.seal()
    tape.leaf(1.0)


@case(SealedError, "sealed tape", "tape.resolve")
def using_a_value_of_the_sealed_tape_on_the_reopened_one():
    holder = {}
    network, _ = record(lambda t: holder.setdefault("x", v(t)))
    tape = network.reopen()
    tape.resolve(holder["x"].symbol) + holder["x"]


@case(SealedError, "already reopened", "continue from the network")
def reopening_twice():
    network, _ = _small()
    network.reopen()
    network.reopen()


@case(SealedError, "not copyable", "Share it by reference")
def copying_a_network():
    copy.deepcopy(_small()[0])


@case(SealedError, "not copyable")
def pickling_a_network():
    pickle.dumps(_small()[0])


@case(SealedError, "immutable", "reopen")
def assigning_to_a_network():
    _small()[0].extra = 1


@case(SealedError, "cannot change", "part of that spec")
def renaming_a_node_of_the_reopened_network():
    network, (w, *_rest) = _small()
    network.reopen().name(w, "renamed")


@case(SymbolError, "another tape", "cannot be mixed")
def mixing_values_of_two_tapes():
    outer = Tape()
    record(lambda t: v(t) + v(outer))


# ---- symbols and runs -------------------------------------------------------------------------------

@case(SymbolError, "belongs to another tape", r"%\d")
def a_symbol_of_another_network():
    network, (w, x, loss) = _small()
    other, (ow, ox, oloss) = _small()
    network.forward(network.parameters())[oloss]


@case(SymbolError, "recorded after this network was sealed", "newer network")
def a_symbol_newer_than_the_network():
    network, (w, x, loss) = _small()
    tape = network.reopen()
    newer = (tape.resolve(loss) * 2.0).symbol
    network.forward(network.parameters())[newer]


@case(SymbolError, "is a str, not a Symbol|no parameter or input is named")
def reading_a_run_by_a_string():
    network, _ = _small()
    network.forward(network.parameters())["x"]


@case(SymbolError, "not declared by this run's entry", "declare it")
def reading_an_undeclared_node_of_an_entry_run():
    network, (w, x, loss) = _small()
    network.entry([loss]).interpret(network.parameters())[x]


@case(SymbolError, "no slot is named 'b'", "the slots are: w")
def reading_an_unknown_slot_by_name():
    network, _ = _small()
    network.parameters()["b"]


@case(SymbolError, "not a parameter slot")
def reading_an_input_from_a_parameter_table():
    network, (w, x, loss) = _small()
    network.parameters()[x]


@case(SymbolError, "no parameter or input is named 'y'", "the names are: w, x")
def looking_up_an_unknown_name():
    _small()[0].named("y")


@case(SymbolError, "Symbols are not pickled", r"network\.named\(name\)", "topos.checkpoint")
def pickling_a_symbol():
    network, (w, x, loss) = _small()
    pickle.dumps({"loss": loss})


# ---- feeds -------------------------------------------------------------------------------------------

@case(FeedError, r"input %1 \(x\)", r"recorded at .*test_misuse\.py", r"expects shape \[4, 3\], got \[3, 3\]")
def feeding_the_wrong_shape():
    network, _ = _small()
    network.forward(network.parameters(), {"x": np.ones((3, 3), F32)})


@case(FeedError, "expects element type f32, got float64", r"astype")
def feeding_the_wrong_element_type():
    network, _ = _small()
    network.forward(network.parameters(), {"x": np.ones((4, 3))})


@case(FeedError, "expects element type f32, got float64", r"float\(x\)")
def feeding_a_numpy_number_to_a_rate_input():
    network, out = record(lambda t: t.input(np.float32(0.1), name="lr") * 2.0)
    network.forward(network.parameters(), {"lr": np.float64(0.05)})


@case(FeedError, "is a parameter, not an input", "only inputs can be fed")
def feeding_a_parameter():
    network, (w, x, loss) = _small()
    network.forward(network.parameters(), {w: np.ones((3, 2), F32)})


@case(FeedError, "does not convert")
def feeding_a_ragged_list():
    network, (w, x, loss) = _small()
    network.forward(network.parameters(), {x: [[1.0, 2.0], [3.0]]})


@case(FeedError, "does not convert")
def feeding_a_string():
    network, (w, x, loss) = _small()
    network.forward(network.parameters(), {x: "ones"})


@case(FeedError, r"input x \(%\d, recorded at .*\) is required", r"\[2, 3\] f32")
def leaving_a_required_input_unfed():
    network, out = record(lambda t: t.input(shape=(2, 3), name="x").sum())
    network.forward(network.parameters())


@case(FeedError, "selection", "must be integers, got float64")
def feeding_float_indices():
    network, _ = record(lambda t: v(t, (4, 2)).gather(t.input(selection([0], 4), name="rows")).sum())
    network.forward(network.parameters(), {"rows": np.array([1.0])})


@case(FeedError, "selection", r"index 7 .*outside \[0, 4\)")
def feeding_indices_out_of_range():
    network, _ = record(lambda t: v(t, (4, 2)).gather(t.input(selection([0], 4), name="rows")).sum())
    network.forward(network.parameters(), {"rows": np.array([7])})


@case(SymbolError, "no parameter or input is named 'z'")
def feeding_an_unknown_name():
    network, _ = _small()
    network.forward(network.parameters(), {"z": 1.0})


# ---- parameter tables --------------------------------------------------------------------------------

@case(SymbolError, "belong to another network family")
def running_with_another_networks_table():
    network, _ = _small()
    other, _ = _small()
    network.forward(other.parameters())


@case(FeedError, "expected a Parameters table", "network.parameters")
def running_with_a_dict_of_arrays():
    network, _ = _small()
    network.forward({"w": np.ones((3, 2), F32)})


@case(FeedError, r"parameter w: the update has shape \[2, 2\], the slot holds \[3, 2\]")
def an_update_of_the_wrong_shape():
    network, _ = _small()
    network.parameters().with_payloads({"w": np.ones((2, 2), F32)})


@case(SymbolError, "do not hold the same parameter slots", "same network")
def zipping_tables_of_two_networks():
    network, _ = _small()
    other, _ = _small()
    network.parameters().zip(other.parameters(), lambda a, b: a + b)


@case(FeedError, "missing from the source: w", "strict=False")
def moving_weights_from_a_table_without_them():
    network, _ = _small()
    network.parameters({"v": np.ones(2)})


@case(FeedError, r"w: the source holds \[2, 2\] float32, this network records \[3, 2\] float32")
def moving_weights_of_the_wrong_shape():
    network, _ = _small()
    network.parameters({"w": np.ones((2, 2), F32)})


# ---- differentiation ---------------------------------------------------------------------------------

@case(DifferentiationError, r"rank-0 loss", r"\[2, 3\]", r"\.sum\(\)", "tape.vjp")
def differentiating_a_tensor():
    def build(t):
        w = t.parameter(np.ones((2, 3), F32))
        t.differentiate(w * 2.0, [w])
    record(build)


@case(DifferentiationError, "is a leaf node", "parameters or inputs")
def differentiating_with_respect_to_a_leaf():
    def build(t):
        c = t.leaf(np.ones(2, F32))
        t.differentiate(c.sum(), [c])
    record(build)


@case(DifferentiationError, "is a selection", "leave it out of wrt")
def differentiating_with_respect_to_indices():
    def build(t):
        rows = t.input(selection([0], 2))
        t.differentiate(t.parameter(np.ones((2, 2), F32)).gather(rows).sum(), [rows])
    record(build)


@case(DifferentiationError, "is state", "leave it out of wrt")
def differentiating_with_respect_to_state():
    def build(t):
        s = t.parameter(np.ones(2, F32), trainable=False, name="s")
        t.differentiate(s.sum(), [s])
    record(build)


@case(DifferentiationError, r"seed has shape \[3\]", r"target \[2, 3\]")
def a_vjp_seed_of_the_wrong_shape():
    def build(t):
        w = t.parameter(np.ones((2, 3), F32))
        t.vjp(w * 2.0, np.ones(3, F32), [w])
    record(build)


@case(DifferentiationError, r"the target %\d+ is a selection \(\[2\] index<2>", "no derivative")
def a_vjp_of_a_selection():
    def build(t):
        t.vjp(t.input(selection([0, 1], 2)), [1, 1], [t.parameter(np.ones(2, F32))])
    record(build)


@case(DifferentiationError, "backward needs a rank-0 target", r"\.sum\(\)")
def backward_from_a_tensor():
    network, (w, x, loss) = _small()
    run = network.forward(network.parameters())
    run.backward(w)


@case(SymbolError, "was not computed by this run")
def backward_from_a_node_the_entry_did_not_run():
    def build(t):
        w = t.parameter(np.ones(2, F32))
        return w, w.sum(), (w * 3.0).sum()
    network, (w, a, b) = record(build)
    network.entry([a]).interpret(network.parameters()).backward(b)


@case(SymbolError, "is not among this adjoint's wrt")
def reading_an_adjoint_of_something_not_differentiated():
    def build(t):
        w, u = t.parameter(np.ones(2, F32)), t.parameter(np.ones(2, F32))
        adjoints = t.differentiate((w * u).sum(), [w])
        adjoints[u]
    record(build)


# ---- plans -------------------------------------------------------------------------------------------

@case(SymbolError, "belongs to another tape")
def an_entry_over_a_symbol_of_another_network():
    network, _ = _small()
    other, (ow, ox, oloss) = _small()
    network.entry([oloss])


@case(SymbolError, "belong to another network family")
def a_plan_run_with_another_networks_table():
    network, (w, x, loss) = _small()
    other, _ = _small()
    network.entry([loss], numerics=Numerics.EXACT).lower().forward(other.parameters())


@case(SymbolError, "not declared by this run's entry", "declare it")
def reading_a_plan_run_outside_its_declaration():
    network, (w, x, loss) = _small()
    network.entry([loss]).lower().forward(network.parameters())[x]


@case(PlanError, "kinds=...\\) names 'conv', which is no fusion kind", "choose among .*convolution,")
def raising_a_fusion_kind_that_does_not_exist():
    pytest.importorskip("iree.compiler")
    network, (w, x, loss) = _small()
    network.entry([loss]).lower().emit_stablehlo(kinds=["conv"])


@case(PlanError, r"uncounted= takes node indices or Symbols", r"got int 5", r"\[5\]")
def a_working_peak_of_one_node_not_in_a_list():
    network, (w, x, loss) = _small()
    network.entry([loss]).lower().working_peak(5)


@case(PlanError, r"emit_stablehlo\(kinds=...\) is int 5", "comma-separated str")
def raising_fusion_kinds_given_as_a_number():
    pytest.importorskip("iree.compiler")
    network, (w, x, loss) = _small()
    network.entry([loss]).lower().emit_stablehlo(kinds=5)


@case(ArgumentError, "emit_mlir: debug_info must be True or False, got 'no'")
def emitting_mlir_with_debug_info_no():
    network, (w, x, loss) = _small()
    network.entry([loss]).lower().emit_mlir(debug_info="no")


@case(ArgumentError, "emit_text: debug_info must be True or False, got 'no'")
def emitting_text_with_debug_info_no():
    pytest.importorskip("iree.compiler")
    from topos.dialect.ir.emit import emit_text

    network, (w, x, loss) = _small()
    emit_text(network, [loss], debug_info="no")


@case(ArgumentError, r"emit_mlir\(entry=...\) takes an Entry of this network", r"network\.entry\(\[loss\]\)", "int 5")
def emitting_mlir_of_an_entry_that_is_a_number():
    network, _ = _small()
    network.emit_mlir(entry=5)


# ---- facades -----------------------------------------------------------------------------------------

@case(RecordingError, "Linear is built during a recording", "Tape.record")
def a_module_outside_a_recording():
    nn.Linear(3, 4)


@case(RecordingError, "no recording is in progress", "Tape.record")
def asking_for_the_recording_outside_one():
    Tape.current()


@case(RecordingError, r"Linear\(3, 4", "(?i)record the model again", r"network\.parameters")
def a_module_called_in_another_recording():
    holder = {}
    record(lambda t: holder.setdefault("layer", nn.Linear(3, 4)))
    record(lambda t: holder["layer"](v(t, (2, 3))))


@case(ShapeError, r"0 \(Linear\(5, 4", "expects 5 features", r"\[2, 6\] has 6", "build the module with 6")
def a_layer_fed_the_wrong_feature_size():
    record(lambda t: nn.Mlp([5, 4, 3])(v(t, (2, 6))))


@case(ShapeError, r"LayerNorm\(4", "float32 parameters but the input", "dtype=float64")
def a_layer_fed_the_wrong_element_type():
    record(lambda t: nn.LayerNorm(4)(v(t, (2, 4), F64)))


@case(ShapeError, r"Embedding\(5, 2\)", "takes a selection", "extent=5")
def an_embedding_fed_floats():
    record(lambda t: nn.Embedding(5, 2)(v(t, (3,))))


@case(ShapeError, "has 5 rows but the selection indexes 6", "extent=5")
def an_embedding_fed_indices_of_another_extent():
    record(lambda t: nn.Embedding(5, 2)(t.input(selection([1], 6))))


@case(ShapeError, r"Conv2d\(3, 4", "rank 4", r"\[3, 5, 5\]")
def a_convolution_fed_an_unbatched_image():
    record(lambda t: nn.Conv2d(3, 4, 3)(v(t, (3, 5, 5))))


@case(ShapeError, "cross_entropy", r"\[2, 3, 4\] must be \[rows, classes\]", "reshape")
def cross_entropy_over_rank_three_logits():
    record(lambda t: F.cross_entropy(v(t, (2, 3, 4)), t.leaf(selection([0], 4))))


@case(ShapeError, "labels index 5 values but the logits have 4 classes", "extent=classes")
def cross_entropy_with_labels_of_another_extent():
    record(lambda t: F.cross_entropy(v(t, (3, 4)), t.leaf(selection([0, 1, 2], 5))))


@case(ShapeError, r"mse_loss: prediction \[2, 3\] and target \[3, 2\] differ")
def mse_of_misaligned_tensors():
    record(lambda t: F.mse_loss(v(t), v(t, (3, 2))))


@case(ShapeError, "scaled_dot_product_attention", "must agree on the last axis")
def attention_with_mismatched_heads():
    record(lambda t: F.scaled_dot_product_attention(v(t, (2, 3, 4)), v(t, (2, 3, 5)), v(t, (2, 3, 5))))


@case(RecordingError, "more than once", "inference reading")
def batch_norm_trained_twice_in_one_recording():
    def build(t):
        bn = nn.BatchNorm(3)
        x = v(t, (4, 3))
        bn(x), bn(x)
        bn.state_updates()
    record(build)


@case(SymbolError, "another network", "run.backward")
def an_optimizer_stepped_with_another_networks_gradients():
    network, (w, x, loss) = _small()
    other, (ow, ox, oloss) = _small()
    gradients = other.forward(other.parameters()).backward(oloss)
    optim.Adam().step(network.parameters(), gradients)


@case(SymbolError, "made for other parameters", "optimizer.init")
def an_optimizer_state_of_other_parameters():
    network, _ = _small()
    other, _ = record(lambda t: t.parameter(np.ones(2, F32), name="q"))
    table = network.parameters()
    optim.Adam().step(table, table.map(np.zeros_like), optim.Adam().init(other.parameters()))


@case(DifferentiationError, "not a trainable parameter", "model.parameters")
def an_optimizer_recorded_over_an_input():
    def build(t):
        x = t.input(np.ones(2, F32))
        optim.SGD(lr=0.1).record(t.differentiate((x * x).sum(), [x]))
    record(build)


@case(DifferentiationError, "updated twice")
def two_updates_of_one_slot():
    def build(t):
        w = t.parameter(np.ones(2, F32), name="w")
        adjoints = t.differentiate((w * w).sum(), [w])
        topos.sgd(t, adjoints, 0.1) + topos.sgd(t, adjoints, 0.2)
    record(build)


# ---- arguments of layers, optimizers and initializers ------------------------------------------------

@case(ArgumentError, r"Linear: in_features must be an int >= 1, got 0")
def a_linear_layer_of_no_inputs():
    record(lambda t: nn.Linear(0, 3))


@case(ArgumentError, r"Linear: in_features must be an int >= 1, got '3'")
def a_linear_layer_sized_by_a_string():
    record(lambda t: nn.Linear("3", 2))


@case(ArgumentError, r"Conv2d: kernel_size must be an int or 2 ints \(height, width\)", r"\(3,\)")
def a_convolution_with_a_one_axis_kernel():
    record(lambda t: nn.Conv2d(1, 2, (3,)))


@case(ArgumentError, r"MultiHeadAttention: num_heads must be an int >= 1, got 0")
def attention_with_no_heads():
    record(lambda t: nn.MultiHeadAttention(8, 0))


@case(ArgumentError, r"Mlp: sizes must be a list of ints", r"\[784, 128, 10\]")
def an_mlp_given_one_size():
    record(lambda t: nn.Mlp(4))


@case(ArgumentError, r"LayerNorm: eps must be >= 0 \(a finite number\), got -1.0")
def a_layer_norm_with_a_negative_eps():
    record(lambda t: nn.LayerNorm(4, eps=-1.0))


@case(ArgumentError, r"BatchNorm: momentum must be in \[0, 1\]", "got nan")
def a_batch_norm_with_a_nan_momentum():
    record(lambda t: nn.BatchNorm(3, momentum=float("nan")))


@case(ShapeError, r"BatchNorm\(3", "more than one value per channel", r"\[1, 3\]", "training=False")
def a_batch_norm_trained_on_a_batch_of_one():
    record(lambda t: nn.BatchNorm(3)(v(t, (1, 3))))


@case(ArgumentError, "training= takes True or False", "got str 'False'")
def a_batch_norm_told_its_reading_in_a_string():
    record(lambda t: nn.BatchNorm(3)(v(t, (4, 3)), training="False"))


@case(ArgumentError, r"Linear.weight: init returned float64 \[2, 3\], expected float32 \[2, 3\]")
def an_init_that_returns_float64():
    record(lambda t: nn.Linear(3, 2, init=lambda g, shape, dtype: np.zeros(shape, np.float64)))


@case(ShapeError, r"Flatten\(\) takes an input of rank 2 or more", r"got \[5\]")
def flattening_a_vector():
    record(lambda t: nn.Flatten()(v(t, (5,))))


@case(ArgumentError, r"ModuleList is indexed by int positions, got str '0'", r"use \[0\]")
def indexing_a_module_list_by_a_string():
    record(lambda t: nn.ModuleList([nn.Linear(2, 2)])["0"])


@case(ArgumentError, r"Sequential\(\)\.eval\(\) would set a mode", r"with nn\.inference\(\)", "training=False")
def switching_a_model_to_evaluation_as_in_pytorch():
    record(lambda t: nn.Sequential(nn.Linear(2, 2), nn.BatchNorm(2)).eval())


@case(ArgumentError, r"Linear\(.*\.train\(\) would set a mode", r"with nn\.inference\(\)")
def switching_a_layer_to_training_as_in_pytorch():
    record(lambda t: nn.Linear(2, 2).train())


@case(ArgumentError, r"dropout_feeds: pass a topos.init.Generator")
def dropout_feeds_from_a_seed():
    record(lambda t: nn.Dropout(0.1).dropout_feeds(0))


@case(DifferentiationError, r"wrt is a method", r"Linear.parameters\(\) \(call it\)")
def differentiating_with_respect_to_an_uncalled_method():
    def build(t):
        layer = nn.Linear(2, 1)
        t.differentiate(layer(v(t, (1, 2))).sum(), layer.parameters)
    record(build)


@case(DifferentiationError, r"wrt is the module Linear itself", r"parameters\(\)")
def differentiating_with_respect_to_a_module():
    def build(t):
        layer = nn.Linear(2, 1)
        t.differentiate(layer(v(t, (1, 2))).sum(), layer)
    record(build)


@case(ShapeError, r"input: shape= must be a tuple of ints, each at least 1, got \(-1, 3\)")
def an_input_of_negative_shape():
    record(lambda t: t.input(shape=(-1, 3), name="x"))


@case(ArgumentError, r"SGD: the learning rate lr must be positive and finite", "got float inf")
def an_infinite_learning_rate():
    optim.SGD(lr=float("inf"))


@case(ArgumentError, r"Adam: betas must be a pair \(beta1, beta2\)", r"betas=\(")
def adam_given_betas_as_the_second_positional_argument():
    optim.Adam(0.01, 0.9)


@case(ArgumentError, r"SGD.step: the learning rate lr must be positive and finite", "got float nan")
def a_step_with_a_nan_learning_rate():
    network, (w, x, loss) = _small()
    table = network.parameters()
    optim.SGD(lr=0.1).step(table, table.map(np.zeros_like), lr=float("nan"))


@case(FeedError, "another element type", r"optim.exp_avg.w: float64, the parameters need float32")
def an_optimizer_state_of_float64_moments_for_float32_parameters():
    network, _ = _small()
    table = network.parameters()
    adam = optim.Adam()
    state = optim.OptimizerState({n: a.astype(F64) for n, a in adam.init(table).named().items()})
    adam.step(table, table.map(np.zeros_like), state)


@case(SymbolError, "already holds optimizer state", r"prefix='optim2'")
def two_optimizers_recorded_under_one_prefix():
    def build(t):
        w = t.parameter(np.ones(2, F32), name="w")
        u = t.parameter(np.ones(2, F32), name="u")
        loss = (w * u).sum()
        optim.Adam().record(t.differentiate(loss, [w]))
        optim.Adam().record(t.differentiate(loss, [u]))
    record(build)


@case(ArgumentError, "takes a topos.init.Generator first", "the generator comes first")
def an_initializer_called_with_its_arguments_swapped():
    topos.init.normal()((2, 3), topos.init.Generator(0))


@case(ArgumentError, "zip takes the tables first and the function last", "no function")
def zipping_tables_without_a_function():
    network, _ = _small()
    network.parameters().zip()


@case(ArgumentError, r"Parameters \* takes a number", "got str 'a'")
def scaling_a_table_by_a_string():
    network, _ = _small()
    network.parameters() * "a"


@case(ShapeError, r"conv2d: the kernel 5 x 5 \(weight \[2, 1, 5, 5\]\) is larger than the image 3 x 3",
      "smaller kernel, pad the input")
def a_kernel_larger_than_the_image():
    record(lambda t: nn.Conv2d(1, 2, 5)(t.input(shape=(1, 1, 3, 3), name="x")))


@case(ShapeError, r"max_pool: the window 8 x 8 is larger than the image 4 x 4")
def a_pooling_window_larger_than_the_image():
    record(lambda t: nn.MaxPool2d(8)(t.input(shape=(1, 1, 4, 4), name="x")))


@case(ShapeError, r"mask \[3, 3\] does not broadcast to the scores \[1, 2, 4, 4\]", r"\[L, S\] = \[4, 4\]")
def an_attention_mask_of_the_wrong_shape():
    record(lambda t: nn.MultiHeadAttention(8, 2)(t.input(shape=(1, 4, 8), name="x"),
                                                  mask=np.zeros((3, 3), np.float32)))


@case(ShapeError, r"layer_norm: weight \[4\] should be \[3\], one per element of the last axis")
def a_layer_norm_scale_of_the_wrong_length():
    record(lambda t: F.layer_norm(t.input(shape=(2, 3), name="x"), t.leaf(np.ones(4, F32))))


@case(DifferentiationError, "wrt holds the module Linear", r"module.parameters\(\)")
def differentiating_with_respect_to_a_list_of_modules():
    def body(t):
        layer = nn.Linear(3, 1)
        return t.differentiate(layer(t.input(shape=(2, 3), name="x")).sum(), [layer])

    record(body)


@case(RecordingError, r"Linear.owner: assigning Linear would make a module its own descendant",
      "keep back-references out of the module tree")
def a_module_tree_with_a_loop():
    def body(t):
        outer = nn.Sequential(nn.Linear(2, 2))
        outer[0].owner = outer[0]  # a back-reference: the tree would loop
        return outer

    record(body)


# ---- checkpoints -------------------------------------------------------------------------------------

@case(CheckpointError, "missing from the file: w", "in the file but not in the network: v", "strict=False")
def loading_a_checkpoint_of_another_model(tmp_path):
    network, _ = _small()
    path = tmp_path / "other.safetensors"
    checkpoint.write(path, {"v": np.ones(2, F32)})
    checkpoint.load(path, network)


@case(CheckpointError, r"w: the file holds \[2, 2\] float32, the network needs \[3, 2\] float32")
def loading_a_checkpoint_of_the_wrong_shape(tmp_path):
    network, _ = _small()
    path = tmp_path / "wrong.safetensors"
    checkpoint.write(path, {"w": np.ones((2, 2), F32)})
    checkpoint.load(path, network)


@case(CheckpointError, "trunc|end of the file|shorter")
def loading_a_truncated_checkpoint(tmp_path):
    network, _ = _small()
    path = tmp_path / "cut.safetensors"
    checkpoint.save(path, network.parameters())
    path.write_bytes(path.read_bytes()[:-3])
    checkpoint.load(path, network)


@case(CheckpointError, "pickle|not a safetensors")
def loading_a_pickle_as_a_checkpoint(tmp_path):
    network, _ = _small()
    path = tmp_path / "model.pt"
    path.write_bytes(pickle.dumps({"w": np.ones((3, 2), F32)}))
    checkpoint.load(path, network)


@case(CheckpointError, "No such|does not exist|missing", "folder|directory")
def saving_into_a_missing_folder(tmp_path):
    network, _ = _small()
    checkpoint.save(tmp_path / "nowhere" / "model.safetensors", network.parameters())


@case(CheckpointError, "both hold 'w'", "prefix")
def saving_two_tables_with_one_name(tmp_path):
    network, _ = _small()
    checkpoint.save(tmp_path / "x.safetensors", network.parameters(), network.parameters())


# ---- compiled plans and the cache --------------------------------------------------------------------

def _compiled():
    network, (w, x, loss) = _small()
    return network, (w, x, loss), network.entry([loss]).lower().compile("llvm-cpu")


def _trained():
    def build(t):
        w = t.parameter(np.ones((3, 2), F32), name="w")
        loss = (t.input(np.ones((4, 3), F32), name="x") @ w).sum()
        return loss, topos.sgd(t, t.differentiate(loss, [w]), 0.1)
    network, (loss, updates) = Tape.record(build)
    return network, loss, updates, network.entry(updates.roots(loss)).lower().compile("llvm-cpu")


def _dialect():
    from topos.dialect.iree import cache, compiled, targets

    return cache, compiled, targets


def compiling_for_an_unknown_target():
    network, (w, x, loss) = _small()
    network.entry([loss]).lower().compile("tpu")


def compiling_for_the_native_cpu():
    network, (w, x, loss) = _small()
    network.entry([loss]).lower().compile("llvm-cpu", cpu="native")


def compiling_into_a_cache_that_is_a_file(tmp_path):
    network, (w, x, loss) = _small()
    (tmp_path / "cache").write_text("not a folder")
    network.entry([loss]).lower().compile("llvm-cpu", cache=tmp_path / "cache")


def compiling_with_a_cache_of_the_wrong_type():
    network, (w, x, loss) = _small()
    network.entry([loss]).lower().compile("llvm-cpu", cache=3)


@case(FeedError, r"input %1 \(x\)", r"expects shape \[4, 3\]")
def a_compiled_run_fed_the_wrong_shape():
    network, symbols, compiled = _compiled()
    compiled.forward(network.parameters(), {"x": np.ones((2, 3), F32)})


@case(SymbolError, "belong to another network family")
def a_compiled_run_with_another_networks_table():
    network, symbols, compiled = _compiled()
    compiled.forward(_small()[0].parameters())


@case(SymbolError, "not a result of this compiled plan", "add it to the entry.s roots or observe")
def reading_a_compiled_run_outside_its_results():
    network, (w, x, loss), compiled = _compiled()
    compiled.forward(network.parameters())[x]


@case(SymbolError, "another network")
def stepping_device_state_of_another_network():
    network, loss, updates, compiled = _trained()
    other, other_loss, other_updates, other_compiled = _trained()
    compiled.step(other_compiled.resident(other.parameters()), {}, updates)


@case(SymbolError, "these Updates belong to another network", "recorded on the network this plan was compiled from")
def stepping_with_updates_of_another_network():
    network, loss, updates, compiled = _trained()
    other, other_loss, other_updates, other_compiled = _trained()
    compiled.step(compiled.resident(network.parameters()), {}, other_updates)


@case(ArgumentError, "apply takes the host Parameters table", "got ResidentParameters",
      r"compiled\.step\(state, feeds, updates\)")
def applying_updates_to_device_state():
    network, loss, updates, compiled = _trained()
    state = compiled.resident(network.parameters())
    updates.apply(state, compiled.forward(state))


@case(SymbolError, "the run has no value for", "the next value of", r"updates\.roots\(loss\)")
def applying_updates_from_a_run_that_did_not_compute_them():
    network, loss, updates, compiled = _trained()
    evaluation = network.entry([loss]).lower().compile("llvm-cpu")
    updates.apply(network.parameters(), evaluation.forward(network.parameters()))


@case(SymbolError, r"not a parameter slot of this table: only parameters have slots \(here: w\)")
def reading_an_input_from_device_state():
    network, loss, updates, compiled = _trained()
    compiled.resident(network.parameters()).to_host()[network.named("x")]


@case(FeedError, "not a result of this plan's entry")
def stepping_with_updates_that_are_not_results():
    network, loss, updates, compiled = _trained()
    plain = network.entry([loss]).lower().compile("llvm-cpu")
    plain.step(plain.resident(network.parameters()), {}, updates)


# ---- the table ----------------------------------------------------------------------------------------


def _dialect_cases():
    cache, compiled, targets = _dialect()
    return [
        pytest.param(compiling_for_an_unknown_target, targets.TargetError, ("tpu", "llvm-cpu"),
                     id="compiling_for_an_unknown_target"),
        pytest.param(compiling_for_the_native_cpu, targets.TargetError, ("native", "'host'"),
                     id="compiling_for_the_native_cpu"),
        pytest.param(compiling_into_a_cache_that_is_a_file, cache.CacheError, ("cache", "TOPOS_CACHE_DIR|cache=False"),
                     id="compiling_into_a_cache_that_is_a_file"),
        pytest.param(compiling_with_a_cache_of_the_wrong_type, cache.CacheError, ("cache",),
                     id="compiling_with_a_cache_of_the_wrong_type"),
    ]


CASES.extend(_dialect_cases())


@pytest.fixture(autouse=True)
def _private_compile_cache(tmp_path_factory, monkeypatch):
    """Compiles of this table land in a cache of its own, never the user's."""
    monkeypatch.setenv("TOPOS_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "misuse-cache"))



def test_the_catalogue_has_at_least_eighty_rows():
    assert len(CASES) >= 80


@pytest.mark.parametrize("fn, error, words", CASES)
def test_each_misuse_is_a_clear_topos_error_at_the_users_line(fn, error, words, tmp_path):
    arguments = {"tmp_path": tmp_path} if "tmp_path" in inspect.signature(fn).parameters else {}
    with pytest.raises(error) as caught:
        fn(**arguments)
    message = str(caught.value)
    assert isinstance(caught.value, topos.ToposError)
    site = re.match(r"(.+?):(\d+) in (\S+): ", message)
    assert site is not None, f"the message does not start with the user's line: {message}"
    lines, first = inspect.getsourcelines(fn)
    assert site.group(1).endswith("test_misuse.py"), message
    assert first <= int(site.group(2)) < first + len(lines), f"{site.group(0)} is not inside {fn.__name__}: {message}"
    assert message.count(site.group(0)) == 1, f"the user's line is named more than once: {message}"
    for word in words:
        assert re.search(word, message), f"{word!r} not in: {message}"
