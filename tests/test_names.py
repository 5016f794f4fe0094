"""Names, state slots, required inputs and shape buckets: the core pieces the facades stand on."""

from __future__ import annotations

import numpy as np
import pytest

import topos
from topos import Numerics, Tape
from topos.base.errors import DifferentiationError, FeedError, RecordingError, SealedError, ShapeError, SymbolError

F32 = np.float32


def _model(batch: int):
    def record(tape):
        w = tape.parameter(np.arange(6, dtype=F32).reshape(2, 3), name="fc.weight")
        steps = tape.parameter(np.zeros((), F32), name="optim.step", trainable=False)
        x = tape.input(shape=(batch, 2), name="x")
        out = (x @ w).sum() + steps
        return w, steps, x, out
    return Tape.record(record)


def test_describe_shows_names_and_roles():
    network, _ = _model(4)
    lines = network.describe().splitlines()
    assert "name=fc.weight" in lines[0]
    assert "name=optim.step state" in lines[1]
    assert "name=x required" in lines[2]
    assert "name=" not in lines[3]


def test_nodes_and_values_carry_names_and_trainability():
    seen = {}

    def record(tape):
        w = tape.parameter(np.ones(2, F32), name="w")
        s = tape.parameter(np.ones(2, F32), trainable=False)
        seen.update(w=(w.name, w.trainable), s=(s.name, s.trainable))
        return w, s

    network, (w, s) = Tape.record(record)
    assert seen == {"w": ("w", True), "s": (None, False)}
    assert network.node(w).name == "w" and network.node(w).trainable and network.node(w).role == ""
    assert network.node(s).name is None and not network.node(s).trainable and network.node(s).role == "state"
    assert network.name(w) == "w" and network.name(s) == f"%{s.index}"
    assert network.named("w") == w and dict(network.names()) == {"w": w}
    assert network.trainable_symbols() == (w,) and network.parameter_symbols() == (w, s)


def test_an_unknown_name_lists_the_names_there_are():
    network, _ = _model(4)
    with pytest.raises(SymbolError, match="fc.weight, optim.step, x"):
        network.named("fc.wieght")


@pytest.mark.parametrize("bad", ["", "two words", "%3", 7, "w\x00", "fc\x1b[31m", "tab\tname"])
def test_an_invalid_name_is_refused_at_the_recording_line(bad):
    with pytest.raises(SymbolError, match=r"test_names.py:\d+.*not a valid name"):
        Tape.record(lambda tape: tape.parameter(np.ones(2, F32), name=bad))


def test_two_sources_with_one_name_are_refused_when_sealing_with_both_lines():
    def record(tape):
        tape.parameter(np.ones(2, F32), name="weight")
        tape.parameter(np.ones(3, F32), name="weight")

    both = r"named 'weight': %0 \(recorded at .*test_names.py:\d+.*\) and %1.*parent Module"
    with pytest.raises(SymbolError, match=both):
        Tape.record(record)


def test_only_sources_take_names_and_a_reopened_network_keeps_its_names():
    network, (w, *_rest) = _model(4)
    tape = network.reopen()
    with pytest.raises(SealedError, match="cannot change"):
        tape.name(w, "renamed")
    with tape:
        total = tape.resolve(w).sum()
        with pytest.raises(SymbolError, match="only parameters and inputs take names"):
            tape.name(total, "total")
        tape.parameter(np.ones(1, F32), name="extra")
    longer = tape.seal()
    assert longer.name(w) == "fc.weight" and "extra" in longer.names()


def test_parameters_are_read_and_replaced_by_name():
    network, (w, steps, *_rest) = _model(4)
    table = network.parameters()
    assert table.names() == ("fc.weight", "optim.step")
    assert np.array_equal(table["fc.weight"], table[w]) and table.symbol("optim.step") == steps
    assert "fc.weight" in table and "nope" not in table
    assert table.trainable("fc.weight") and not table.trainable(steps)
    named = table.named()
    assert list(named) == ["fc.weight", "optim.step"] and not named["fc.weight"].flags.writeable
    replaced = table.with_payloads({"fc.weight": np.zeros((2, 3), F32)})
    assert not replaced["fc.weight"].any() and table["fc.weight"].any()
    assert replaced.names() == table.names() and "fc.weight" in repr(replaced)
    with pytest.raises(SymbolError, match="no slot is named 'fc.bias'; the slots are: fc.weight, optim.step"):
        table["fc.bias"]


def test_gradient_tables_keep_the_names():
    network, (w, steps, x, out) = _model(4)
    table = network.parameters()
    gradients = network.forward(table, {x: np.ones((4, 2), F32)}).backward(out).parameters(table)
    assert gradients.names() == table.names()
    assert np.array_equal(gradients["fc.weight"], np.full((2, 3), 4.0, F32))


def test_inputs_are_fed_by_name_and_a_required_input_must_be_fed():
    network, (w, steps, x, out) = _model(4)
    table = network.parameters()
    by_name = network.forward(table, {"x": np.ones((4, 2), F32)})[out]
    by_symbol = network.forward(table, {x: np.ones((4, 2), F32)})[out]
    assert by_name == by_symbol == 60.0
    with pytest.raises(FeedError, match=r"input x \(%2, recorded at .*test_names.py:\d+.*\) is required.*\[4, 2\] f32"):
        network.forward(table)
    with pytest.raises(FeedError, match="required"):
        network.entry([out], numerics=Numerics.EXACT).lower().forward(table)
    assert network.payload(x) is None


def test_required_inputs_take_a_shape_and_dtype_or_an_extent():
    def record(tape):
        labels = tape.input(shape=(3,), extent=5, name="labels")
        wide = tape.input(shape=(2,), dtype=np.float64)
        kept = tape.input(np.ones(2, F32), required=True)
        return labels, wide, kept

    network, (labels, wide, kept) = Tape.record(record)
    assert network.node(labels).dtype == topos.SelectionType(5)
    assert network.node(wide).dtype == np.float64 and network.node(wide).role == "required"
    assert network.node(kept).role == "required" and network.payload(kept) is None
    with pytest.raises(ShapeError, match="give a default, or shape="):
        Tape.record(lambda tape: tape.input())
    with pytest.raises(ShapeError, match="not both"):
        Tape.record(lambda tape: tape.input(np.ones(2, F32), shape=(2,)))


def test_differentiate_refuses_state_slots_naming_them():
    def record(tape):
        moment = tape.parameter(np.ones(2, F32), name="optim.exp_avg.w", trainable=False)
        tape.differentiate((moment * moment).sum(), [moment])

    with pytest.raises(DifferentiationError, match=r"optim.exp_avg.w\) is state.*leave it out of wrt"):
        Tape.record(record)


def test_names_and_roles_travel_through_mlir_and_back():
    from topos.dialect.ir.parse import parse_spec

    network, _ = _model(4)
    text = network.emit_mlir()
    assert '"%0 parameter fc.weight"' in text and '"%1 parameter optim.step [state]"' in text
    assert '"%2 input x [required]"' in text
    rebuilt, roots, observes = parse_spec(text)
    assert rebuilt.describe() == network.describe()
    assert rebuilt.emit_mlir() == text


def test_a_feed_error_names_the_input():
    network, (w, steps, x, out) = _model(4)
    with pytest.raises(FeedError, match=r"input %2 \(x\).*expects shape \[4, 2\]"):
        network.forward(network.parameters(), {"x": np.ones((3, 2), F32)})


# ---- shape buckets: one model, one recording per shape --------------------------------------------


def test_a_table_of_one_recording_serves_another_by_names():
    training, _ = _model(64)
    sampling, (w, steps, x, out) = _model(1)
    trained = training.parameters().with_payloads({"fc.weight": np.full((2, 3), 2.0, F32)})
    moved = sampling.parameters(trained)
    assert moved.symbols() == sampling.parameters().symbols()
    assert np.array_equal(moved["fc.weight"], np.full((2, 3), 2.0, F32))
    assert sampling.forward(moved, {x: np.ones((1, 2), F32)})[out] == 12.0


def test_moving_by_names_reports_every_missing_and_misshaped_slot():
    def record(tape):
        tape.parameter(np.ones((3, 3), F32), name="fc.weight")
        tape.parameter(np.ones(3, F32), name="fc.bias")

    other, _ = Tape.record(record)
    training, _ = _model(64)
    with pytest.raises(FeedError) as caught:
        other.parameters(training.parameters())
    message = str(caught.value)
    assert "missing from the source: fc.bias" in message
    assert "fc.weight: the source holds [2, 3] float32, this network records [3, 3] float32" in message
    assert "strict=False" in message


def test_strict_false_keeps_missing_initials_and_extras_are_ignored():
    def record(tape):
        tape.parameter(np.ones((2, 3), F32), name="fc.weight")
        tape.parameter(np.full(3, 7.0, F32), name="fc.bias")

    other, _ = Tape.record(record)
    source = {"fc.weight": np.zeros((2, 3), F32), "unused": np.ones(1)}
    moved = other.parameters(source, strict=False)
    assert not moved["fc.weight"].any() and np.array_equal(moved["fc.bias"], np.full(3, 7.0, F32))


# ---- small conveniences ---------------------------------------------------------------------------


def test_reshape_infers_one_minus_one():
    def record(tape):
        x = tape.input(np.arange(24, dtype=F32).reshape(2, 3, 4))
        return x.reshape((-1, 4)), x.reshape((2, -1)), x.reshape(-1)

    network, (a, b, c) = Tape.record(record)
    assert network.node(a).shape == (6, 4) and network.node(b).shape == (2, 12) and network.node(c).shape == (24,)
    for bad, why in [((-1, -1), "cannot infer"), ((5, -1), "cannot infer"),
                     ((0, -1), r"shape \[0, -1\] has an extent that is neither a positive int nor -1")]:
        with pytest.raises(ShapeError, match=rf"test_names.py:\d+ in <lambda>: reshape: {why}"):
            Tape.record(lambda tape, bad=bad: tape.input(np.ones((2, 3), F32)).reshape(bad))


def test_indexing_a_value_points_to_gather_and_narrow():
    def record(tape):
        table = tape.parameter(np.ones((5, 2), F32))
        return table[np.array([0, 1])]

    with pytest.raises(ShapeError, match=r"test_names.py:\d+ in record: a Value cannot be indexed.*gather.*narrow"):
        Tape.record(record)


def test_the_recording_in_progress_is_known_only_inside_it():
    with pytest.raises(RecordingError, match="no recording is in progress"):
        Tape.current()
    seen = []
    Tape.record(lambda tape: seen.append(Tape.current() is tape))
    tape = Tape()
    with tape:
        inner_network, _ = Tape.record(lambda inner: seen.append(Tape.current() is inner))
        seen.append(Tape.current() is tape)
    assert seen == [True, True, True]
    with pytest.raises(RecordingError):
        Tape.current()
