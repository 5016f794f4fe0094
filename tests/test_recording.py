"""Recording: sources, operators, detaching, errors at the user's line, sealing, reopening."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import topos
from topos import Tape, Value
from topos.base.errors import FeedError, SealedError, ShapeError, SymbolError, ToposError

from conftest import assert_close, line_here

F32 = np.float32


def _lines(network) -> list[list[str]]:
    """describe() as split columns, summary line dropped."""
    return [line.split() for line in network.describe().splitlines()[:-1]]


# ---- Tape.record and detach -------------------------------------------------------------------


def test_record_detaches_nested_tuples_lists_and_dicts_into_symbols():
    def model(tape):
        a = tape.input(np.float64(1.0))
        b = a * 2.0
        c = b + a
        return {"a": a, "rest": (b, [c, {"again": a}]), "note": "kept", "count": 3}

    network, out = Tape.record(model)
    assert isinstance(out, dict) and isinstance(out["rest"], tuple) and isinstance(out["rest"][1], list)
    a, (b, [c, inner]) = out["a"], out["rest"]
    again = inner["again"]
    for symbol in (a, b, c, again):
        assert isinstance(symbol, topos.Symbol) and not isinstance(symbol, Value)
    assert again == a
    assert [network.node(s).opcode.name for s in (a, b, c)] == ["input", "mul", "add"]
    assert out["note"] == "kept" and out["count"] == 3


def test_detach_of_a_bare_value_is_its_symbol():
    network, symbol = Tape.record(lambda tape: tape.leaf(1.0))
    assert isinstance(symbol, topos.Symbol) and symbol.index == 0
    assert len(network) == 1


def test_sources_record_parameter_input_and_leaf_with_their_payloads():
    initial = np.arange(6, dtype=F32).reshape(2, 3)
    default = np.ones(3, np.float64)

    def model(tape):
        return tape.parameter(initial), tape.input(default), tape.leaf(np.float32(2.5))

    network, (w, x, c) = Tape.record(model)
    assert [network.node(s).opcode.name for s in (w, x, c)] == ["parameter", "input", "leaf"]
    assert [network.node(s).shape for s in (w, x, c)] == [(2, 3), (3,), ()]
    assert [network.node(s).dtype for s in (w, x, c)] == [topos.float32, topos.float64, topos.float32]
    assert np.array_equal(network.payload(w), initial)
    assert np.array_equal(network.payload(x), default)
    assert float(network.payload(c)) == 2.5
    assert network.parameter_symbols() == (w,) and network.input_symbols() == (x,)


def test_value_reports_shape_dtype_and_symbol_while_recording():
    seen = {}

    def model(tape):
        x = tape.input(np.zeros((4, 1, 2), topos.bfloat16))
        y = x.sum_along(2)
        seen.update(shape=y.shape, dtype=y.dtype, symbol=y.symbol, ndim=y.ndim, tape=y.tape is tape)
        return y

    _, y = Tape.record(model)
    assert seen == {"shape": (4, 1), "dtype": topos.bfloat16, "symbol": y, "ndim": 2, "tape": True}


def test_python_numbers_and_lists_record_as_float64():
    network, (a, b, c) = Tape.record(lambda tape: (tape.leaf(2), tape.leaf([1, 2]), tape.input(0.5)))
    assert [network.node(s).dtype for s in (a, b, c)] == [topos.float64] * 3
    assert network.node(b).shape == (2,)


@pytest.mark.parametrize(
    "payload, words",
    [
        (np.arange(3), ["int64", "selection"]),
        (np.zeros(3, np.float16), ["float16", "float32"]),
        (np.zeros((2, 0), F32), ["empty", "[2, 0]"]),
        ([[1.0, 2.0], [3.0]], ["leaf: the payload [[1.0, 2.0], [3.0]] is ragged", "same length"]),
    ],
    ids=["integer-array", "float16", "empty", "ragged"],
)
def test_unsupported_source_payloads_raise_shape_error_at_the_line(payload, words):
    def model(tape):
        line = line_here() + 2
        with pytest.raises(ShapeError) as caught:
            tape.leaf(payload)
        return line, str(caught.value)

    _, (line, message) = Tape.record(model)
    assert f"{__file__}:{line}" in message
    for word in words:
        assert word in message


def test_a_value_is_not_a_source_payload():
    def model(tape):
        x = tape.input(1.0)
        with pytest.raises(ShapeError, match="payload is a Value"):
            tape.leaf(x)
        return x

    Tape.record(model)


def test_a_value_has_no_truth_value():
    def model(tape):
        x = tape.input(1.0)
        with pytest.raises(TypeError, match="shape"):
            bool(x)
        return x

    Tape.record(model)


# ---- operators -----------------------------------------------------------------------------------

X = np.array([[0.5, 1.25, 2.0], [3.0, 0.75, 1.5]], F32)
Y = np.array([[1.5, 0.5, 0.25], [2.0, 4.0, 1.0]], F32)
W = np.array([[1.0, -2.0], [0.5, 0.25], [-1.0, 3.0]], F32)

OPERATORS = [
    # (label, expression over x, y, w, float64 reference, opcodes it records after the inputs)
    ("x+y", lambda x, y, w: x + y, lambda x, y, w: x + y, ["add"]),
    ("x+2", lambda x, y, w: x + 2.0, lambda x, y, w: x + 2.0, ["leaf", "add"]),
    ("2+x", lambda x, y, w: 2.0 + x, lambda x, y, w: 2.0 + x, ["leaf", "add"]),
    ("x-y", lambda x, y, w: x - y, lambda x, y, w: x - y, ["sub"]),
    ("x-2", lambda x, y, w: x - 2.0, lambda x, y, w: x - 2.0, ["leaf", "sub"]),
    ("2-x", lambda x, y, w: 2.0 - x, lambda x, y, w: 2.0 - x, ["leaf", "sub"]),
    ("x*y", lambda x, y, w: x * y, lambda x, y, w: x * y, ["mul"]),
    ("x*3", lambda x, y, w: x * 3, lambda x, y, w: x * 3, ["leaf", "mul"]),
    ("3*x", lambda x, y, w: 3 * x, lambda x, y, w: 3 * x, ["leaf", "mul"]),
    ("x/y", lambda x, y, w: x / y, lambda x, y, w: x / y, ["div"]),
    ("x/2", lambda x, y, w: x / 2.0, lambda x, y, w: x / 2.0, ["leaf", "div"]),
    ("2/x", lambda x, y, w: 2.0 / x, lambda x, y, w: 2.0 / x, ["leaf", "div"]),
    ("x**y", lambda x, y, w: x**y, lambda x, y, w: x**y, ["pow"]),
    ("x**2", lambda x, y, w: x**2.0, lambda x, y, w: x**2.0, ["leaf", "pow"]),
    ("2**x", lambda x, y, w: 2.0**x, lambda x, y, w: 2.0**x, ["leaf", "pow"]),
    ("-x", lambda x, y, w: -x, lambda x, y, w: -x, ["neg"]),
    ("x@w", lambda x, y, w: x @ w, lambda x, y, w: x @ w, ["matmul"]),
    ("ndarray@x", lambda x, y, w: np.ones((4, 2), F32) @ x, lambda x, y, w: np.ones((4, 2)) @ x, ["leaf", "matmul"]),
    ("x@ndarray", lambda x, y, w: x @ W, lambda x, y, w: x @ w, ["leaf", "matmul"]),
    ("ndarray+x", lambda x, y, w: Y + x, lambda x, y, w: y + x, ["leaf", "add"]),
    ("np.float32*x", lambda x, y, w: np.float32(3) * x, lambda x, y, w: 3 * x, ["leaf", "mul"]),
    ("x.add(y)", lambda x, y, w: x.add(y), lambda x, y, w: x + y, ["add"]),
    ("x.sub(y)", lambda x, y, w: x.sub(y), lambda x, y, w: x - y, ["sub"]),
    ("x.mul(y)", lambda x, y, w: x.mul(y), lambda x, y, w: x * y, ["mul"]),
    ("x.div(y)", lambda x, y, w: x.div(y), lambda x, y, w: x / y, ["div"]),
    ("x.pow(y)", lambda x, y, w: x.pow(y), lambda x, y, w: x**y, ["pow"]),
    ("x.neg()", lambda x, y, w: x.neg(), lambda x, y, w: -x, ["neg"]),
    ("x.matmul(w)", lambda x, y, w: x.matmul(w), lambda x, y, w: x @ w, ["matmul"]),
]


@pytest.mark.parametrize("label, expression, reference, opcodes", OPERATORS, ids=[o[0] for o in OPERATORS])
def test_operator_records_its_opcode_and_computes_like_float64(label, expression, reference, opcodes):
    def model(tape):
        x, y, w = tape.input(X), tape.input(Y), tape.input(W)
        return expression(x, y, w)

    network, out = Tape.record(model)
    assert [node.opcode.name for node in network.nodes()[3:]] == opcodes
    got = network.forward(network.parameters())[out]
    want = reference(X.astype(np.float64), Y.astype(np.float64), W.astype(np.float64))
    # Matmul rounds once per k step (k = 3 here); everything else rounds once.
    assert_close(got, want, topos.float32, 4 if "@" in label or "matmul" in label else 1, what=label)
    assert got.dtype == np.float32


@pytest.mark.parametrize("element", [topos.float32, topos.float64, topos.bfloat16], ids=["f32", "f64", "bf16"])
def test_a_python_scalar_records_a_leaf_of_the_values_shape_and_dtype(element):
    def model(tape):
        x = tape.input(np.zeros((2, 3), element))
        return x, 2.0 - x

    network, (x, out) = Tape.record(model)
    leaf, sub = network.nodes()[1:]
    assert (leaf.opcode.name, leaf.shape, leaf.dtype) == ("leaf", (2, 3), element)
    # The reflected form puts the constant on the left.
    assert sub.operands == (leaf.symbol, x)
    assert np.array_equal(network.payload(leaf.symbol), np.full((2, 3), 2.0, element))
    short = {topos.float32: "f32", topos.float64: "f64", topos.bfloat16: "bf16"}[element]
    assert network.describe().splitlines()[1].split() == ["1", "leaf", "()", "value=2", "[2,", "3]", short]


@pytest.mark.parametrize("element", [topos.float32, topos.float64, topos.bfloat16], ids=["f32", "f64", "bf16"])
def test_a_lifted_number_and_a_broadcast_payload_are_stored_as_one_element(element):
    shape = (512, 768)

    def model(tape):
        x = tape.input(np.ones(shape, element))
        kept = tape.leaf(np.broadcast_to(np.array(-0.0, element), shape))  # a caller's broadcast stays one too
        return x * 0.044715 + kept

    network, out = Tape.record(model)
    kept, lifted = (n.symbol for n in network.nodes() if n.opcode.name == "leaf")  # in recording order
    for symbol, value in ((lifted, 0.044715), (kept, -0.0)):
        stored = network.columns.payloads[symbol.index]
        assert stored.shape == shape and not any(stored.strides) and not stored.flags.writeable
        want = topos.base.element.convert(np.full(shape, value), element)
        handed = network.payload(symbol)  # the caller's own full copy
        assert handed.tobytes() == want.tobytes() and handed.flags.c_contiguous
    # The oracle reads the stride-0 payloads like any array.
    got = network.forward(network.parameters())[out]
    lifted = topos.base.element.convert(np.float64(0.044715), element)
    assert got.tobytes() == (np.ones(shape, element) * lifted).tobytes()
    # The digest of a splat is its own: another number gives another plan digest.
    other, out2 = Tape.record(lambda tape: tape.input(np.ones(shape, element)) * 0.5)
    assert network.entry([out]).lower().digest() != other.entry([out2]).lower().digest()


def test_a_bool_or_a_string_next_to_a_value_is_a_shape_error_that_records_nothing():
    def model(tape):
        x = tape.input(1.0)
        for other in (True, "2", [1.0], 1j, None):
            with pytest.raises(ShapeError):
                x * other
            with pytest.raises(ShapeError):
                other + x
        return x

    network, _ = Tape.record(model)
    assert len(network) == 1  # nothing recorded by the refused expressions


def test_numpy_arrays_and_scalars_on_either_side_of_a_value_still_record():
    def model(tape):
        x = tape.input(np.ones(3, np.float32))
        return (np.ones(3, np.float32) + x, np.float64(2) * x, x * np.float32(3), x ** np.int64(2),
                x * ml_dtypes.bfloat16(2), ml_dtypes.bfloat16(2) * x)

    network, results = Tape.record(model)
    run = network.forward(network.parameters())
    for got, want in zip(results, (2.0, 2.0, 3.0, 1.0, 2.0, 2.0)):
        assert network.node(got).dtype == np.float32
        assert np.array_equal(run[got], np.full(3, want, np.float32))


def test_a_type_that_takes_a_value_in_its_reflected_operator_keeps_its_turn():
    class Takes:
        def __radd__(self, other):
            return ("taken", other.shape)

    network, taken = Tape.record(lambda t: t.input(np.ones(3)) + Takes())
    assert taken == ("taken", (3,)) and len(network) == 1


@pytest.mark.parametrize("number", [float("nan"), float("inf"), -float("inf"), 16777217, 3.4e38, -1e-300],
                         ids=["nan", "inf", "-inf", "rounds", "near-max", "underflows"])
def test_numbers_that_round_or_are_not_finite_still_lift_into_f32(number):
    network, out = Tape.record(lambda t: t.input(np.ones(2, np.float32)) * number)
    leaf = network.nodes()[1]
    with np.errstate(over="ignore"):
        want = np.float32(number)
    assert np.array_equal(network.payload(leaf.symbol), np.full(2, want), equal_nan=True)


@pytest.mark.parametrize("element, number", [(np.float32, 1e300), (np.float32, 10**39), (np.float64, 10**400),
                                             (ml_dtypes.bfloat16, -1e39)], ids=["f32", "f32-int", "f64", "bf16"])
def test_a_number_that_would_become_inf_is_refused_naming_the_element_type(element, number):
    def model(tape):
        x = tape.input(np.ones(2, element))
        with pytest.raises(ShapeError, match="does not fit") as caught:
            number + x
        return str(caught.value)

    network, message = Tape.record(model)
    assert "largest" in message and "scale it" in message and len(network) == 1
    assert ("record the Value in float64" in message) == (element is not np.float64)


# ---- errors at the user's line -------------------------------------------------------------------


def test_shape_error_names_this_file_line_opcode_both_shapes_and_a_hint():
    def model(tape):
        a = tape.input(np.zeros((2, 3), F32))
        b = tape.input(np.zeros((3, 2), F32))
        line = line_here() + 2
        with pytest.raises(ShapeError) as caught:
            a + b
        return line, caught.value

    _, (line, error) = Tape.record(model)
    assert isinstance(error, ToposError) and isinstance(error, ValueError)
    message = str(error)
    assert message.startswith(f"{__file__}:{line} in model: add:")
    assert "[2, 3]" in message and "[3, 2]" in message
    assert "\n  hint: " in message and "broadcast_to" in message


def _helper_that_multiplies(a, b):
    return a @ b  # the innermost user line: the one the error must name


def test_shape_error_names_the_innermost_user_line_not_topos_internals():
    def model(tape):
        a = tape.input(np.zeros((2, 3), F32))
        with pytest.raises(ShapeError) as caught:
            _helper_that_multiplies(a, a)
        return caught.value

    _, error = Tape.record(model)
    line = _helper_that_multiplies.__code__.co_firstlineno + 1
    assert str(error).startswith(f"{__file__}:{line} in _helper_that_multiplies: matmul:")


def test_element_type_mismatch_names_both_types():
    def model(tape):
        a, b = tape.input(np.zeros(2, F32)), tape.input(np.zeros(2, topos.bfloat16))
        line = line_here() + 2
        with pytest.raises(ShapeError) as caught:
            a * b
        return line, str(caught.value)

    _, (line, message) = Tape.record(model)
    assert f"{__file__}:{line}" in message
    assert "mul" in message and "f32" in message and "bf16" in message and "hint" in message


def test_a_failed_recording_leaves_the_tape_unchanged():
    def model(tape):
        a = tape.input(np.zeros((2, 3), F32))
        with pytest.raises(ShapeError):
            a.sum_along(5)
        return a

    network, _ = Tape.record(model)
    assert len(network) == 1


# ---- sealing and mixing ------------------------------------------------------------------------


def test_using_a_value_after_its_tape_is_sealed_raises_sealed_error():
    leaked = {}

    def model(tape):
        leaked["x"] = tape.input(np.ones(2, F32))
        leaked["tape"] = tape
        return leaked["x"]

    Tape.record(model)
    x, tape = leaked["x"], leaked["tape"]
    assert tape.sealed
    for attempt in (lambda: x + 1.0, lambda: x * x, lambda: x.exp(), lambda: x.sum(),
                    lambda: tape.input(1.0), lambda: tape.seal(), lambda: tape.resolve(x.symbol)):
        with pytest.raises(SealedError, match="sealed"):
            attempt()
    # What is already known stays readable.
    assert x.shape == (2,) and x.dtype == topos.float32


def test_mixing_values_of_two_tapes_raises_symbol_error():
    first, second = Tape(), Tape()
    a, b = first.input(np.ones(2, F32)), second.input(np.ones(2, F32))
    for attempt in (lambda: a + b, lambda: b - a, lambda: a.maximum(b)):
        with pytest.raises(SymbolError, match="another tape"):
            attempt()
    assert len(first) == 1 and len(second) == 1


def test_seal_freezes_a_hand_built_tape_into_a_network():
    tape = Tape()
    x = tape.input(np.ones(2, F32))
    y = x.tanh()
    assert len(tape) == 2 and not tape.sealed
    assert tape.describe().splitlines()[-1] == "tape: 2 nodes (0 parameters, 1 input, 0 leaves)"
    network = tape.seal()
    assert isinstance(network, topos.Network) and tape.sealed
    assert network.node(y.symbol).opcode.name == "map"


# ---- reopening -----------------------------------------------------------------------------------


def _base():
    def model(tape):
        w = tape.parameter(np.array([0.5, -1.5], F32))
        x = tape.input(np.array([2.0, 4.0], F32))
        return w, x, (w * x).tanh()

    return Tape.record(model)


def test_reopen_keeps_symbols_valid_and_old_symbols_read_the_same_values():
    network, (w, x, y) = _base()
    feeds = {x: np.array([1.0, -3.0], F32)}
    before = network.forward(network.parameters(), feeds)

    tape = network.reopen()
    assert len(tape) == len(network) and not tape.sealed
    z = tape.resolve(y) * tape.resolve(x) + tape.parameter(np.float32(1.0)).broadcast((2,))
    longer = tape.seal()

    assert len(longer) > len(network)
    for symbol in (w, x, y):
        assert longer.node(symbol) == network.node(symbol)
    parameters = network.parameters().carried(longer)
    after = longer.forward(parameters, feeds)
    for symbol in (w, x, y):
        assert np.array_equal(after[symbol], before[symbol])
    want = before[y].astype(np.float64) * feeds[x] + 1.0
    assert_close(after[z.symbol], want, topos.float32, 2)


def test_a_network_can_be_reopened_only_once_but_its_continuation_can_be_reopened():
    network, (w, x, y) = _base()
    tape = network.reopen()
    tape.resolve(y).exp()
    longer = tape.seal()
    with pytest.raises(SealedError, match="already reopened"):
        network.reopen()
    again = longer.reopen()
    assert len(again) == len(longer)


def test_symbols_recorded_after_reopening_are_unknown_to_the_older_network():
    network, (w, x, y) = _base()
    tape = network.reopen()
    newer = tape.resolve(y).exp().symbol
    tape.seal()
    with pytest.raises(SymbolError, match="recorded after this network was sealed"):
        network.node(newer)


def test_a_value_of_the_sealed_tape_cannot_be_used_on_the_reopened_tape():
    leaked = {}

    def model(tape):
        leaked["x"] = tape.input(np.ones(2, F32))
        return leaked["x"]

    network, x = Tape.record(model)
    tape = network.reopen()
    with pytest.raises(SealedError, match="resolve"):
        tape.resolve(x) + leaked["x"]


def test_resolve_refuses_symbols_of_another_family_or_beyond_the_tape():
    network, (w, x, y) = _base()
    other, foreign = Tape.record(lambda tape: tape.input(1.0))
    tape = network.reopen()
    with pytest.raises(SymbolError, match="family"):
        tape.resolve(foreign)
    with pytest.raises(SymbolError, match="beyond"):
        tape.resolve(topos.Symbol(network.family, 99))
    with pytest.raises(SymbolError):
        tape.resolve(3)


def test_old_parameters_do_not_silently_serve_a_network_with_new_slots():
    network, (w, x, y) = _base()
    tape = network.reopen()
    tape.parameter(np.float32(1.0))
    longer = tape.seal()
    with pytest.raises(FeedError, match="carried"):
        longer.forward(network.parameters())


# ---- provenance ----------------------------------------------------------------------------------


def test_every_node_remembers_the_users_file_line_and_function():
    def model(tape):
        x = tape.input(1.0)
        line = line_here() + 1
        return line, x.exp()

    network, (line, y) = Tape.record(model)
    site = network.node(y).site
    assert (site.file, site.line, site.function) == (__file__, line, "model")
    assert f"# {__file__}:{line} in model" in network.describe(sites=True).splitlines()[1]


def test_record_is_deterministic_for_the_same_function():
    def model(tape):
        x = tape.input(np.ones((2, 2), F32))
        return (x @ x).relu().sum()

    first, _ = Tape.record(model)
    second, _ = Tape.record(model)
    assert first.describe() == second.describe()
    assert first.family is not second.family
    assert math.isfinite(float(first.forward(first.parameters())[first.symbol(len(first) - 1)]))


def test_a_declared_input_allocates_nothing_of_its_shape():
    import tracemalloc

    tracemalloc.start()
    try:
        network, (x, rows) = Tape.record(lambda t: (t.input(shape=(4096, 4096)), t.input(shape=(4096, 4096), extent=7)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20, f"recording two required 16M-element inputs took {peak} bytes"
    nodes = [network.node(s) for s in (x, rows)]
    assert [(n.shape, str(n.dtype), n.role) for n in nodes] == [
        ((4096, 4096), "float32", "required"), ((4096, 4096), "index<7>", "required")]


def test_a_declared_input_that_is_not_required_falls_back_on_zeros():
    def record(t):
        x = t.input(shape=(2, 3), dtype=np.float64, required=False)
        rows = t.input(shape=(2,), extent=3, required=False)
        return x, rows, x.sum() + t.parameter(np.ones((3, 1))).gather(rows).sum()

    network, (x, rows, out) = Tape.record(record)
    run = network.forward(network.parameters())
    assert run[x].dtype == np.float64 and run[x].tolist() == [[0.0] * 3] * 2
    assert run[rows].tolist() == [0, 0] and run[out] == 2.0


def test_symbols_copy_and_deepcopy_as_themselves_and_still_read_runs():
    import copy

    network, loss = Tape.record(lambda t: t.input(np.ones(3, np.float32), name="x").sum())
    copied = copy.deepcopy({"loss": loss})["loss"]
    assert copied == loss and copied.family is loss.family and copy.copy(loss) == loss
    assert network.forward(network.parameters())[copied] == 3.0
