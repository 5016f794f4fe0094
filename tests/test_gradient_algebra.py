"""Gradient algebra: fields and tables add, scale, map and zip, so micro-batches and shards accumulate."""

from __future__ import annotations

import numpy as np
import pytest

from topos import Gradients, Tape
from topos.base.errors import SymbolError

F64 = np.float64
RNG = np.random.default_rng(7)
X = RNG.standard_normal((8, 3))
Y = RNG.standard_normal((8, 1))


def _model(rows: int):
    def record(tape):
        w = tape.parameter(np.array([[0.5], [-1.0], [2.0]]), name="w")
        b = tape.parameter(np.zeros(1), name="b")
        unused = tape.parameter(np.ones(2), name="unused")
        x = tape.input(shape=(rows, 3), dtype=F64, name="x")
        y = tape.input(shape=(rows, 1), dtype=F64, name="y")
        error = x @ w + b.broadcast_along(0, rows) - y
        return w, b, unused, (error * error).sum()
    return Tape.record(record)


def test_micro_batch_gradients_add_up_to_the_full_batch_gradient():
    full, (w, b, unused, loss) = _model(8)
    half, (hw, hb, hunused, hloss) = _model(4)
    parameters = full.parameters()
    expected = full.forward(parameters, {"x": X, "y": Y}).backward(loss).parameters(parameters)
    halves = half.parameters(parameters)
    fields = [half.forward(halves, {"x": X[i:i + 4], "y": Y[i:i + 4]}).backward(hloss) for i in (0, 4)]
    field = fields[0] + fields[1]
    assert isinstance(field, Gradients) and field.reached(hw) and not field.reached(hunused)
    total = field.parameters(halves)
    for name in ("w", "b"):
        np.testing.assert_allclose(total[name], expected[name], rtol=1e-12)
    # the same sum as tables, and zip over any number of tables
    tables = [f.parameters(halves) for f in fields]
    assert all(np.array_equal(a, b) for a, b in zip((tables[0] + tables[1]).arrays(), total.arrays()))
    averaged = tables[0].zip(tables[1], tables[0], lambda a, b, c: (a + b + c) / 3)
    assert np.array_equal(averaged["w"], (tables[0]["w"] + tables[1]["w"] + tables[0]["w"]) / 3)


def test_a_field_scales_maps_and_zips_node_by_node():
    network, (w, b, unused, loss) = _model(8)
    field = network.forward(network.parameters(), {"x": X, "y": Y}).backward(loss)
    assert np.array_equal((field * 0.5)[w], field[w] * 0.5)
    assert np.array_equal((0.5 * field)[w], field[w] * 0.5)
    assert np.array_equal((field / 4.0)[b], field[b] / 4.0)
    assert np.array_equal(field.map(np.sign)[w], np.sign(field[w]))
    zipped = field.zip(field, field, lambda a, b, c: a + b - c)
    assert np.array_equal(zipped[w], field[w]) and zipped[unused].shape == (2,) and not zipped[unused].any()
    assert not (field * 2.0)[w].flags.writeable
    assert "a sum" not in repr(field) and "a sum" not in repr(field + field)


def test_fields_of_two_networks_do_not_combine():
    one, (w, b, unused, loss) = _model(8)
    two, (_, _, _, loss2) = _model(8)
    field = one.forward(one.parameters(), {"x": X, "y": Y}).backward(loss)
    other = two.forward(two.parameters(), {"x": X, "y": Y}).backward(loss2)
    with pytest.raises(SymbolError, match="same network"):
        field + other
    with pytest.raises(TypeError, match="function last"):
        field.zip(field)
    table = one.parameters()
    with pytest.raises(SymbolError, match="same network"):
        table + two.parameters()
    with pytest.raises(TypeError, match="function last"):
        table.zip(table)
