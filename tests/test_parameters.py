"""Parameters: the caller-owned, immutable slot table that training steps transform."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

import topos
from topos import Parameters, Tape
from topos.base.errors import FeedError, SymbolError

F32 = np.float32

W0 = np.array([[1.0, -2.0], [0.5, 4.0]], F32)
B0 = np.array([0.25, -0.75], F32)


def _model(tape):
    w = tape.parameter(W0)
    b = tape.parameter(B0)
    x = tape.input(np.array([[1.0, 2.0]], F32))
    loss = ((x @ w) + b.reshape((1, 2))).tanh().sum()
    return w, b, x, loss


@pytest.fixture
def recorded():
    network, symbols = Tape.record(_model)
    return network, network.parameters(), symbols


def test_parameters_hold_each_slots_record_site_initial(recorded):
    network, parameters, (w, b, x, loss) = recorded
    assert isinstance(parameters, Parameters)
    assert len(parameters) == 2 and list(parameters) == [w, b] and parameters.symbols() == (w, b)
    assert np.array_equal(parameters[w], W0) and parameters[w].dtype == F32
    assert np.array_equal(parameters[b], B0)
    assert w in parameters and x not in parameters and "w" not in parameters
    assert [s for s, _ in parameters.items()] == [w, b]


def test_each_call_gives_an_independent_table(recorded):
    network, parameters, (w, *_) = recorded
    updated = parameters.map(lambda a: a * 2)
    assert np.array_equal(network.parameters()[w], W0)
    assert np.array_equal(parameters[w], W0) and np.array_equal(updated[w], W0 * 2)


def test_reading_a_non_parameter_or_foreign_symbol_raises_symbol_error(recorded):
    network, parameters, (w, b, x, loss) = recorded
    _, foreign = Tape.record(lambda tape: tape.parameter(1.0))
    for wrong in (x, loss, foreign, 0):
        with pytest.raises(SymbolError):
            parameters[wrong]


# ---- immutability --------------------------------------------------------------------------------


def test_parameters_cannot_be_assigned_and_their_arrays_are_read_only(recorded):
    _, parameters, (w, *_) = recorded
    with pytest.raises(TypeError, match="immutable"):
        parameters._arrays = ()
    with pytest.raises(TypeError):
        parameters[w] = W0
    with pytest.raises(ValueError):
        parameters[w][0, 0] = 9.0
    for array in parameters.arrays():
        assert not array.flags.writeable


def test_parameters_attributes_cannot_be_deleted(recorded):
    _, parameters, _ = recorded
    with pytest.raises(TypeError, match="immutable"):
        del parameters._arrays


def test_copies_serve_the_same_network_for_a_what_if(recorded):
    network, parameters, (w, b, x, loss) = recorded
    assert copy.copy(parameters) is parameters  # immutable: nothing to copy
    duplicate = copy.deepcopy(parameters)
    assert duplicate[w] is not parameters[w] and not duplicate[w].flags.writeable
    assert np.array_equal(duplicate[w], parameters[w])
    assert np.array_equal(network.forward(duplicate)[loss], network.forward(parameters)[loss])


def test_parameters_refuse_pickle_and_point_to_safetensors(recorded):
    _, parameters, _ = recorded
    with pytest.raises(TypeError, match="safetensors"):
        pickle.dumps(parameters)


# ---- the algebra -----------------------------------------------------------------------------------


def test_step_applies_the_rule_per_slot_and_leaves_the_old_table_alone(recorded):
    network, parameters, (w, b, x, loss) = recorded
    gradients = network.forward(parameters).backward(loss).parameters(parameters)
    stepped = parameters.step(gradients, lambda p, g: p - g * F32(0.5))
    for symbol, initial in ((w, W0), (b, B0)):
        assert np.array_equal(stepped[symbol], initial - gradients[symbol] * F32(0.5))
        assert np.array_equal(parameters[symbol], initial)
        assert stepped[symbol].dtype == F32 and not stepped[symbol].flags.writeable


def test_gradient_descent_steps_reduce_the_loss(recorded):
    network, parameters, (w, b, x, loss) = recorded
    losses = []
    for _ in range(5):
        run = network.forward(parameters)
        losses.append(float(run[loss]))
        gradients = run.backward(loss).parameters(parameters)
        parameters = parameters.step(gradients, lambda p, g: p - g * F32(0.1))
    assert all(later < earlier for earlier, later in zip(losses, losses[1:]))


def test_the_gradient_descent_example_trains_on_the_oracle_and_on_one_compiled_module(tmp_path, monkeypatch, capsys):
    """examples/gradient_descent.py: three rates on the oracle, then the same three through one module."""
    import importlib.util
    from pathlib import Path

    monkeypatch.setenv("TOPOS_CACHE_DIR", str(tmp_path))
    path = Path(__file__).resolve().parents[1] / "examples" / "gradient_descent.py"
    spec = importlib.util.spec_from_file_location("example_gradient_descent", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    results = example.main([])  # asserts the fit and each compiled run's gap to the oracle itself
    printed = capsys.readouterr().out
    assert "compiled for llvm-cpu" in printed and "One module, three states" in printed
    assert sorted(results) == [0.005, 0.02, 0.05]
    example.main(["--oracle-only"])
    assert "compiled for" not in capsys.readouterr().out


def test_the_gradient_descent_example_prints_a_target_it_cannot_compile_for_as_one_line(tmp_path):
    """Its docstring's --target: a refusal is one line and exit status 1 (metal holds no float64, on any machine)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "gradient_descent.py"
    done = subprocess.run([sys.executable, str(path), "--target", "metal"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TOPOS_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("error: ") and "metal" in done.stderr and done.stderr.count("\n") == 1


def test_map_zip_add_and_scalar_multiply_act_per_slot(recorded):
    _, parameters, (w, b, *_) = recorded
    doubled = parameters.map(lambda a: a + a)
    assert np.array_equal(doubled[w], W0 * 2) and np.array_equal(doubled[b], B0 * 2)
    zipped = parameters.zip(doubled, lambda a, c: c - a)
    assert np.array_equal(zipped[w], W0) and np.array_equal(zipped[b], B0)
    total = parameters + doubled
    assert np.array_equal(total[w], W0 * 3)
    for scaled in (parameters * 0.5, 0.5 * parameters):
        assert np.array_equal(scaled[w], W0 * F32(0.5)) and scaled[w].dtype == F32
    product = parameters * doubled
    assert np.array_equal(product[b], B0 * B0 * 2)


def test_an_update_that_changes_a_shape_raises_naming_the_slot_and_both_shapes(recorded):
    _, parameters, (w, *_) = recorded
    with pytest.raises(FeedError) as caught:
        parameters.map(lambda a: a.reshape(-1))
    message = str(caught.value)
    assert repr(w) in message and "[4]" in message and "[2, 2]" in message


def test_an_update_in_a_wider_float_type_is_rounded_back_to_the_slot_type(recorded):
    _, parameters, (w, *_) = recorded
    widened = parameters.map(lambda a: a.astype(np.float64) / 3.0)
    assert widened[w].dtype == F32
    assert np.array_equal(widened[w], (W0.astype(np.float64) / 3.0).astype(F32))


def test_an_integer_update_is_refused(recorded):
    _, parameters, (w, *_) = recorded
    with pytest.raises(FeedError, match="element type"):
        parameters.map(lambda a: np.zeros(a.shape, np.int32))


def test_bfloat16_slots_stay_bfloat16_through_a_step():
    network, w = Tape.record(lambda tape: tape.parameter(np.array([1.0, 2.0], topos.bfloat16)))
    parameters = network.parameters()
    stepped = parameters.step(parameters, lambda p, g: p - g * 0.25)
    assert stepped[w].dtype == topos.bfloat16
    assert stepped[w].astype(np.float64).tolist() == [0.75, 1.5]


def test_tables_of_different_networks_do_not_combine(recorded):
    _, parameters, _ = recorded
    other, _ = Tape.record(_model)
    with pytest.raises(SymbolError, match="same parameter slots"):
        parameters + other.parameters()
    with pytest.raises(SymbolError):
        parameters.step(other.parameters(), lambda p, g: p - g)


def test_with_payloads_replaces_some_slots_and_checks_them(recorded):
    _, parameters, (w, b, x, _) = recorded
    replacement = np.zeros((2, 2), F32)
    replaced = parameters.with_payloads({w: replacement})
    replacement[0, 0] = 5.0  # the table took a copy
    assert np.array_equal(replaced[w], np.zeros((2, 2), F32)) and np.array_equal(replaced[b], B0)
    with pytest.raises(FeedError, match=r"\[3\]"):
        parameters.with_payloads({b: np.zeros(3, F32)})
    with pytest.raises(SymbolError):
        parameters.with_payloads({x: np.zeros((1, 2), F32)})


def test_a_value_the_slot_type_cannot_hold_is_refused_not_made_inf(recorded):
    _, parameters, (w, b, *_) = recorded
    with np.errstate(all="raise"):  # no RuntimeWarning on the way to the error either
        with pytest.raises(FeedError, match=r"parameter %0 is f32, which cannot hold the float64 value 1e\+300.*"
                                            r"becom.* inf.*scale the value into range"):
            parameters.with_payloads({w: np.full((2, 2), 1e300)})
        with pytest.raises(FeedError, match=r"cannot hold .* 3e\+39 at position \(1,\)"):
            parameters.with_payloads({b: [1.0, 3e39]})  # a Python list converts, and is range-checked too
        with pytest.raises(FeedError, match="cannot hold .* 1e\\+300"):
            parameters.step(parameters, lambda p, g: np.full(p.shape, 1e300))  # a rule returning float64
        with pytest.raises(FeedError, match="cannot hold"):
            parameters.map(lambda a: a.astype(np.float64) * 1e39)
    # in range, a wider float (array or list) is rounded once to the slot's type, as documented
    assert parameters.with_payloads({w: np.full((2, 2), 0.1)})[w].tolist() == np.full((2, 2), 0.1, F32).tolist()
    assert parameters.with_payloads({b: [0.5, -1.0]})[b].dtype == F32
    assert np.isinf(parameters.with_payloads({b: [np.inf, 1.0]})[b][0])  # an infinity stays one


def test_an_update_that_is_not_an_array_is_a_feed_error_naming_the_slot(recorded):
    _, parameters, (w, *_) = recorded
    with pytest.raises(FeedError, match=r"parameter %0: the list .* does not convert"):
        parameters.with_payloads({w: [[1.0, 2.0], [3.0]]})
    with pytest.raises(FeedError, match="element type int64, the slot holds f32.*astype"):
        parameters.with_payloads({w: np.zeros((2, 2), np.int64)})


def test_forward_refuses_a_table_of_another_network(recorded):
    network, _, _ = recorded
    other, _ = Tape.record(_model)
    with pytest.raises(SymbolError, match="another network"):
        network.forward(other.parameters())
    with pytest.raises(FeedError, match="Parameters"):
        network.forward({})


# ---- across reopen ---------------------------------------------------------------------------------


def test_carried_keeps_trained_slots_and_gives_new_slots_their_initials(recorded):
    network, parameters, (w, b, x, loss) = recorded
    trained = parameters.map(lambda a: a - 1)
    tape = network.reopen()
    scale = tape.parameter(np.float32(3.0))
    tape.resolve(loss) * scale
    longer = tape.seal()

    carried = trained.carried(longer)
    assert list(carried) == [w, b, scale.symbol]
    assert np.array_equal(carried[w], W0 - 1) and np.array_equal(carried[b], B0 - 1)
    assert float(carried[scale.symbol]) == 3.0
    assert np.array_equal(longer.forward(carried)[loss], network.forward(trained)[loss])


def test_carried_refuses_a_network_of_another_family(recorded):
    _, parameters, _ = recorded
    other, _ = Tape.record(_model)
    with pytest.raises(SymbolError, match="another tape family"):
        parameters.carried(other)


def test_repr_lists_slots_shapes_and_types(recorded):
    _, parameters, (w, b, *_) = recorded
    assert repr(parameters) == f"Parameters({{{w!r}: [2, 2] float32, {b!r}: [2] float32}})"


def test_tables_take_what_a_learner_hands_them_or_say_what_to_hand():
    import topos
    from topos import ArgumentError, SymbolError, nn

    def record(tape):
        model = nn.Linear(3, 2)
        return model, model(tape.input(shape=(1, 3), name="x"))

    network, (model, y) = Tape.record(record)
    table = network.parameters()
    assert model.weight in table and np.array_equal(table[model.weight], table["weight"])  # a Value is its Symbol
    rate = 0.1 * np.cos(0.5)  # an np.float64, as a schedule gives
    assert np.array_equal((rate * table)["weight"], (table * rate)["weight"])
    assert np.array_equal((-table)["weight"], (table * -1)["weight"])
    assert np.array_equal((table - table)["weight"], np.zeros((2, 3), np.float32))
    for call, error, match in [
        (lambda: table[0], SymbolError, "indexed by Symbol or by name, not by position"),
        (lambda: table.map(3), ArgumentError, "map takes a function"),
        (lambda: table.with_payloads(None), ArgumentError, "with_payloads takes a mapping"),
        (lambda: table.with_payloads(table), ArgumentError, r"network.parameters\(table\)"),
        (lambda: table.with_payloads(("weight", np.zeros((2, 3), np.float32))), ArgumentError, "wrap one pair"),
        (lambda: table.with_payloads({"weight": np.zeros((2, 3), np.float32),
                                      model.weight.symbol: np.ones((2, 3), np.float32)}),
         topos.FeedError, "names slot weight twice"),
        (lambda: table.carried({}), ArgumentError, "carried takes the reopened Network"),
        (lambda: network.parameters("model.safetensors"), ArgumentError, r"topos.checkpoint.load\(path, network\)"),
        (lambda: network.parameters({model.weight.symbol: np.zeros((2, 3), np.float32)}), ArgumentError,
         r"keyed by Symbol .* table.named\(\)"),
        (lambda: network.named(["x"]), SymbolError, "named takes a name"),
        (lambda: table + 1.0, ArgumentError, r"takes a table over the same slots, got float 1.0; .*table.map"),
        (lambda: 1.0 + table, ArgumentError, r"takes a table over the same slots, got float 1.0"),
        (lambda: 1.0 - table, ArgumentError, r"Parameters - takes a table"),
        (lambda: table / 0, ArgumentError, r"/ 0 would fill every slot with inf or nan"),
        (lambda: table * float("nan"), ArgumentError, r"\* nan would fill every slot"),
    ]:
        with pytest.raises(error, match=match):
            call()
