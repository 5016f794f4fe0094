"""Feeds: {input symbol: array-like} per run, checked against the recorded input's shape and type."""

from __future__ import annotations

import numpy as np
import pytest

import topos
from topos import Tape
from topos.base.errors import FeedError, SymbolError, ToposError

F32 = np.float32


def _model(tape):
    x = tape.input(np.zeros((2, 3), F32))
    s = tape.input(np.float64(1.5))
    indices = tape.input(topos.selection([0, 0], 4))
    table = tape.parameter(np.arange(12, dtype=F32).reshape(4, 3))
    c = tape.leaf(np.ones((2, 3), F32))
    rows = table.gather(indices)
    y = (x + rows) * c
    return x, s, indices, table, c, y


@pytest.fixture
def recorded():
    network, symbols = Tape.record(_model)
    return network, network.parameters(), symbols


def _error(recorded, feeds, kind=FeedError) -> str:
    network, parameters, _ = recorded
    with pytest.raises(kind) as caught:
        network.forward(parameters, feeds)
    assert isinstance(caught.value, ToposError)
    return str(caught.value)


# ---- accepted feeds --------------------------------------------------------------------------------


def test_fed_arrays_are_used_and_unfed_inputs_take_their_defaults(recorded):
    network, parameters, (x, s, indices, table, c, y) = recorded
    data = np.arange(6, dtype=F32).reshape(2, 3)
    run = network.forward(parameters, {x: data, indices: np.array([3, 1])})
    assert np.array_equal(run[x], data)
    assert float(run[s]) == 1.5
    expected = (data.astype(np.float64) + np.arange(12.0).reshape(4, 3)[[3, 1]]).astype(F32)
    assert np.array_equal(run[y], expected)
    defaults = network.forward(parameters)
    assert np.array_equal(defaults[x], np.zeros((2, 3), F32)) and defaults[indices].tolist() == [0, 0]


@pytest.mark.parametrize(
    "value",
    [[[1, 2, 3], [4, 5, 6]], [[1.0, 2.5, 3.0], [4.0, 5.0, 6.0]], ((1, 2, 3), (4, 5, 6))],
    ids=["int-lists", "float-lists", "tuples"],
)
def test_python_lists_are_converted_to_the_inputs_element_type(recorded, value):
    network, parameters, (x, *_) = recorded
    got = network.forward(parameters, {x: value})[x]
    assert got.dtype == F32 and got.shape == (2, 3)
    assert np.array_equal(got, np.asarray(value, dtype=np.float64).astype(F32))


@pytest.mark.parametrize("value", [2, 2.0, np.float64(2.0), np.array(2.0)], ids=["int", "float", "np.float64", "0-d"])
def test_python_numbers_and_matching_numpy_scalars_feed_a_rank_zero_input(recorded, value):
    network, parameters, (x, s, *_) = recorded
    got = network.forward(parameters, {s: value})[s]
    assert got.dtype == np.float64 and got.shape == () and float(got) == 2.0


def test_python_floats_are_rounded_to_a_narrow_input_type():
    network, x = Tape.record(lambda tape: tape.input(np.zeros(2, topos.bfloat16)))
    got = network.forward(network.parameters(), {x: [1.0 / 3.0, 1000.1]})[x]
    assert got.dtype == topos.bfloat16
    assert np.array_equal(got, np.array([1.0 / 3.0, 1000.1]).astype(topos.bfloat16))


def test_a_fed_array_is_copied_so_later_changes_do_not_reach_the_run(recorded):
    network, parameters, (x, *_) = recorded
    data = np.ones((2, 3), F32)
    run = network.forward(parameters, {x: data})
    data[:] = 5.0
    assert np.array_equal(run[x], np.ones((2, 3), F32))
    assert not run[x].flags.writeable


def test_selection_feeds_accept_any_integer_array(recorded):
    network, parameters, (x, s, indices, *_) = recorded
    for value in (np.array([3, 2], np.int32), np.array([1, 0], np.uint8), [2, 3]):
        got = network.forward(parameters, {indices: value})[indices]
        assert got.tolist() == list(np.asarray(value)) and got.dtype == np.int64


# ---- refused feeds ----------------------------------------------------------------------------------


def test_wrong_shape_names_the_input_and_both_shapes(recorded):
    _, _, (x, *_) = recorded
    message = _error(recorded, {x: np.zeros((3, 2), F32)})
    assert f"input {x!r}" in message and "[2, 3]" in message and "[3, 2]" in message
    assert f"{__file__}:" in message  # where the input was recorded


def test_wrong_shape_from_a_list_names_both_shapes(recorded):
    _, _, (x, *_) = recorded
    message = _error(recorded, {x: [1.0, 2.0, 3.0]})
    assert f"input {x!r}" in message and "[2, 3]" in message and "[3]" in message


@pytest.mark.parametrize("dtype", [np.float64, topos.bfloat16, np.int32], ids=["f64", "bf16", "int32"])
def test_wrong_element_type_names_the_input_and_both_types(recorded, dtype):
    _, _, (x, *_) = recorded
    message = _error(recorded, {x: np.zeros((2, 3), dtype)})
    assert f"input {x!r}" in message and "f32" in message and np.dtype(dtype).name in message
    assert "astype" in message


def test_a_numpy_scalar_of_another_type_is_refused(recorded):
    _, _, (x, s, *_) = recorded
    message = _error(recorded, {s: np.float32(1.0)})
    assert f"input {s!r}" in message and "f64" in message and "float32" in message


@pytest.mark.parametrize("value", [[[1, 2, 3], [4, 5]], "abc", object()], ids=["ragged", "string", "object"])
def test_unconvertible_values_raise_feed_error_naming_the_input(recorded, value):
    _, _, (x, *_) = recorded
    message = _error(recorded, {x: value})
    assert f"input {x!r}" in message and "[2, 3] f32" in message


@pytest.mark.parametrize("which", [3, 4, 5], ids=["parameter", "leaf", "computed"])
def test_feeding_a_non_input_names_the_symbol_and_what_it_is(recorded, which):
    network, _, symbols = recorded
    symbol = symbols[which]
    message = _error(recorded, {symbol: np.zeros(network.node(symbol).shape, F32)})
    assert f"{symbol!r} is a {network.node(symbol).opcode.name}, not an input" in message


def test_a_symbol_of_another_network_is_refused(recorded):
    _, foreign = Tape.record(lambda tape: tape.input(np.zeros((2, 3), F32)))
    message = _error(recorded, {foreign: np.zeros((2, 3), F32)}, SymbolError)
    assert repr(foreign) in message and "another tape" in message


def test_a_symbol_beyond_the_network_is_refused(recorded):
    network, _, _ = recorded
    unknown = topos.Symbol(network.family, len(network) + 3)
    message = _error(recorded, {unknown: 1.0}, SymbolError)
    assert repr(unknown) in message and "recorded after" in message


@pytest.mark.parametrize("key", [0, None], ids=["int", "none"])
def test_a_key_that_is_not_a_symbol_is_refused_with_its_type(recorded, key):
    message = _error(recorded, {key: 1.0}, SymbolError)
    assert type(key).__name__ in message and "not a Symbol" in message


def test_a_string_key_is_a_name_and_an_unknown_name_is_refused(recorded):
    message = _error(recorded, {"x": 1.0}, SymbolError)
    assert "no parameter or input is named 'x'" in message and "name=" in message


@pytest.mark.parametrize(
    "value, words",
    [
        (np.array([1, 4]), ["index 4", "position (1,)", "[0, 4)"]),
        (np.array([-1, 0]), ["index -1", "position (0,)", "[0, 4)"]),
    ],
    ids=["past-the-end", "negative"],
)
def test_selection_indices_out_of_range_name_the_index_and_extent(recorded, value, words):
    _, _, (x, s, indices, *_) = recorded
    message = _error(recorded, {indices: value})
    assert f"input {indices!r}" in message
    for word in words:
        assert word in message


def test_a_selection_fed_with_floats_or_the_wrong_shape_is_refused(recorded):
    _, _, (x, s, indices, *_) = recorded
    message = _error(recorded, {indices: np.array([1.0, 2.0])})
    assert f"input {indices!r}" in message and "integer" in message and "float64" in message
    message = _error(recorded, {indices: np.array([1, 2, 3])})
    assert "[2]" in message and "[3]" in message


def test_indexing_a_selection_gives_a_selection_of_the_same_extent_without_a_second_check(monkeypatch):
    data = topos.selection(np.arange(12).reshape(6, 2) % 5, 5)
    import topos.base.element as element

    monkeypatch.setattr(element, "check_indices", lambda *a: pytest.fail("checked again"))
    for key, want in ((np.array([4, 0, 4]), data.indices[[4, 0, 4]]), (slice(1, 3), data.indices[1:3]),
                      ((slice(None), 1), data.indices[:, 1]), (2, data.indices[2]), ((2, 1), data.indices[2, 1])):
        taken = data[key]
        assert type(taken) is topos.Selection and taken.extent == 5
        assert np.array_equal(taken.indices, want) and taken.indices.dtype == np.int64
        assert taken.indices.flags.c_contiguous and not taken.indices.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            taken.indices[...] = 0
    # np.asarray of a selection stays what it was: one object, not a sequence of selections.
    assert np.asarray(data).dtype == object and np.asarray(data).shape == ()


def test_a_bad_key_into_a_selection_is_a_shape_error_at_the_callers_line():
    data = topos.selection(np.arange(6) % 4, 4)
    for key in (6, "rows", (0, 0)):
        with pytest.raises(topos.ShapeError, match=r"test_feeds\.py:\d+ .*selection\[.*shape \[6\]"):
            data[key]


def test_a_checked_selection_cannot_be_made_writeable_again():
    """Its indices are fed without a second check: flipping the flag back would let an index
    out of range reach IREE's gather, which clamps it silently."""
    given = np.array([[0, 1], [2, 3]])
    data = topos.selection(given, 4)
    given[0, 0] = 7  # the caller's array is not the selection's
    assert data.indices[0, 0] == 0
    for selection in (data, data[1:], data[[1, 1]], data[:, 1], data[0]):
        with pytest.raises(ValueError, match="WRITEABLE"):
            selection.indices.flags.writeable = True
    assert np.array_equal(data.indices, [[0, 1], [2, 3]])


# ---- the feeds themselves, and what the run hands back ---------------------------------------------


def _named_model(tape):
    w = tape.parameter(np.ones((4, 3), F32), name="w")
    x = tape.input(shape=(2, 4), name="x")
    lr = tape.input(np.float32(0.5), name="lr")
    y = (x @ w) * lr.broadcast_to((2, 3))
    return w, x, lr, y


@pytest.fixture
def named():
    network, symbols = Tape.record(_named_model)
    return network, network.parameters(), symbols


GOOD = np.arange(8, dtype=F32).reshape(2, 4)


def test_an_input_fed_by_its_symbol_and_by_its_name_is_refused_naming_both(named):
    network, parameters, (w, x, lr, y) = named
    with pytest.raises(FeedError, match=r"input %\d+ \(x\) \(recorded at .*test_feeds\.py:\d+.*\) is fed twice, "
                                        r"by its Symbol and by its name 'x'; feed it once"):
        network.forward(parameters, {x: GOOD, "x": GOOD + 1})
    assert np.array_equal(network.forward(parameters, {"x": GOOD})[x], network.forward(parameters, {x: GOOD})[x])


@pytest.mark.parametrize("feeds", [[GOOD], GOOD, ((None, GOOD),), "x"], ids=["list", "array", "pairs", "str"])
def test_feeds_that_are_not_a_mapping_are_refused_with_a_dict_to_pass_instead(named, feeds):
    network, parameters, _ = named
    with pytest.raises(FeedError, match=rf"feeds must be a dict of \{{input Symbol or name: array\}}, "
                                        rf"got {type(feeds).__name__}; e\.g\. \{{x: batch\}}.* or \{{'x': batch\}}"):
        network.forward(parameters, feeds)


def test_any_mapping_is_accepted_as_feeds_and_none_means_no_feeds(named):
    from types import MappingProxyType

    network, parameters, (w, x, lr, y) = named
    assert np.array_equal(network.forward(parameters, MappingProxyType({"x": GOOD}))[x], GOOD)
    with pytest.raises(FeedError, match="required and was not fed"):  # None is no feeds, as before
        network.forward(parameters, None)


@pytest.mark.parametrize("value, shown", [(1e300, r"float 1e\+300"), (-1e39, r"float -1e\+39"),
                                          ([[0.0, 1.0, 2.0, 3.0], [4.0, 5e38, 6.0, 7.0]],
                                           r"list 5e\+38 at position \(1, 1\)")],
                         ids=["float", "negative", "list"])
def test_a_python_number_beyond_the_inputs_range_is_refused_naming_it_and_the_range(named, value, shown):
    network, parameters, (w, x, lr, y) = named
    symbol = lr if isinstance(value, float) else x
    with pytest.raises(FeedError, match=rf"\(recorded at .*\) is f32, which cannot hold the fed {shown}: "
                                        r"f32 holds magnitudes up to 3\.40282e\+38 .* become -?inf"):
        network.forward(parameters, {x: GOOD, symbol: value})


def test_python_numbers_in_range_and_the_ieee_specials_still_feed_a_narrower_input(named, recwarn):
    network, parameters, (w, x, lr, y) = named
    for value in (3.0e38, -3.0e38, 1e-50, float("inf"), float("nan"), 2):
        got = network.forward(parameters, {x: GOOD, lr: value})[lr]
        assert got.dtype == F32 and np.array_equal(got, np.float32(value), equal_nan=True)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


@pytest.mark.parametrize("value", [True, np.True_, [[True] * 4, [False] * 4]], ids=["bool", "np.bool_", "list"])
def test_booleans_are_refused_by_a_float_input_as_boolean_arrays_are(named, value):
    network, parameters, (w, x, lr, y) = named
    symbol = x if isinstance(value, list) else lr
    with pytest.raises(FeedError, match=r"\(lr\)|\(x\)") as caught:
        network.forward(parameters, {x: GOOD, symbol: value})
    assert "f32" in str(caught.value) and "bool" in str(caught.value)
    assert float(network.forward(parameters, {x: GOOD, lr: float(True)})[lr]) == 1.0


def test_a_masked_array_is_refused_rather_than_fed_without_its_mask(named):
    network, parameters, (w, x, lr, y) = named
    masked = np.ma.masked_array(GOOD, mask=GOOD > 3)
    with pytest.raises(FeedError, match=r"input %\d+ \(x\) .*masked arrays are not supported.*\.filled\(value\)"):
        network.forward(parameters, {x: masked})
    filled = network.forward(parameters, {x: masked.filled(0.0)})[x]
    assert np.array_equal(filled, np.where(GOOD > 3, 0.0, GOOD).astype(F32))


def test_parameters_of_another_recording_are_refused_with_the_way_to_move_them_over(named):
    network, parameters, (w, x, lr, y) = named
    again, (w2, *_) = Tape.record(_named_model)
    trained = again.parameters().with_payloads({"w": np.full((4, 3), 2.0, F32)})
    with pytest.raises(SymbolError, match=r"another network family \(recording the same model twice makes two "
                                          r"networks.*network\.parameters\(\).*network\.parameters\(other_parameters\)"):
        network.forward(trained, {x: GOOD})
    moved = network.parameters(trained)  # the fix the message names
    assert np.array_equal(network.forward(moved, {x: GOOD})[w], np.full((4, 3), 2.0, F32))


def test_reading_a_run_by_name_says_runs_are_read_by_symbol(named):
    network, parameters, (w, x, lr, y) = named
    run = network.forward(parameters, {"x": GOOD})
    words = (r"run\['w'\]: 'w' is a str, not a Symbol; a run is read by Symbol, not by name "
             r"\(feeds accept names, runs do not\); read run\[network\.named\('w'\)\]")
    with pytest.raises(SymbolError, match=words):
        run["w"]
    with pytest.raises(SymbolError, match=r"no parameter or input named 'y'"):
        run["y"]
    assert "w" not in run
    assert np.array_equal(run[network.named("w")], run[w])


@pytest.fixture(scope="module")
def compiled_named():
    pytest.importorskip("iree.runtime")
    network, symbols = Tape.record(_named_model)
    compiled = network.entry([symbols[3]]).lower().compile("llvm-cpu", cache=False)
    return network, network.parameters(), symbols, compiled


@pytest.mark.parametrize("case", [
    "list", "array", "bool", "masked", "twice",
    pytest.param("overflow", marks=pytest.mark.filterwarnings("error")),  # refused, not cast to inf with a warning
])
def test_a_compiled_plan_refuses_the_same_feeds(compiled_named, case):
    network, parameters, (w, x, lr, y), compiled = compiled_named
    feeds = {"list": [GOOD], "array": GOOD, "bool": {x: GOOD, lr: True},
             "masked": {x: np.ma.masked_array(GOOD, mask=GOOD > 3)},
             "twice": {x: GOOD, "x": GOOD + 1}, "overflow": {x: GOOD, lr: 1e300}}[case]
    with pytest.raises(FeedError):
        compiled.forward(parameters, feeds)
    assert np.array_equal(compiled.forward(parameters, {x: GOOD})[y], network.forward(parameters, {x: GOOD})[y])


# ---- Parameters arithmetic: a finite slot made inf or NaN is refused, whatever the number's type ---


@pytest.mark.parametrize("operate, shown", [
    (lambda p: p * 1e39, r"what table \* 1e\+39 gives, 1e\+39 at position \(0, 0\)"),
    (lambda p: p * np.float64(1e39), r"the float64 value 1e\+39 at position \(0, 0\)"),  # refused before too
    (lambda p: 1e39 * p, r"what table \* 1e\+39 gives, 1e\+39 at position \(0, 0\)"),
    (lambda p: p / 1e-45, r"what table / 1e-45 gives, 1\.0\d*e\+45 at position \(0, 0\)"),
    (lambda p: p * 3e38 + p * 3e38, r"what table \+ table gives, 6\.0\d*e\+38 at position \(0, 0\)"),
], ids=["python-float", "numpy-float64", "on-the-left", "divide", "add"])
def test_parameters_arithmetic_that_overflows_the_slot_type_is_a_feed_error(operate, shown):
    network, _ = Tape.record(lambda tape: tape.parameter(np.ones((4, 3), F32), name="w"))
    with np.errstate(all="raise"):  # no RuntimeWarning on the way to the error either
        with pytest.raises(FeedError, match=rf"parameter w is f32, which cannot hold {shown}: f32 holds magnitudes "
                                            r"up to 3\.40282e\+38 .*scale the value into range, or record the "
                                            r"parameter with a wider element type"):
            operate(network.parameters())


def test_parameters_arithmetic_keeps_infinities_it_was_given_and_refuses_float64_overflow():
    network, _ = Tape.record(lambda tape: tape.parameter(np.array([np.inf, 1.0], F32), name="w"))
    half = network.parameters() * 0.5  # inf * 0.5 is inf: not made by the operation, kept
    assert np.isinf(half["w"][0]) and half["w"][1] == 0.5
    wide, _ = Tape.record(lambda tape: tape.parameter(np.array([0.0, 1e300]), name="d"))
    with pytest.raises(FeedError, match=r"parameter d is f64, and table \* 1e\+300 turns its finite 1e\+300 at "
                                        r"position \(1,\) into inf; scale the value into range"):
        wide.parameters() * 1e300
    zeros, _ = Tape.record(lambda tape: tape.parameter(np.zeros(2, F32), name="z"))
    with pytest.raises(FeedError, match=r"parameter z is f32, and table \* 1e\+39 turns its finite 0\.0 at "
                                        r"position \(0,\) into nan"):  # 1e39 is inf in f32, and 0 * inf is NaN
        zeros.parameters() * 1e39
