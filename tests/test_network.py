"""The sealed Network: immutable, uncopyable, readable node by node and as describe lines."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

import topos
from topos import Network, Tape
from topos.base.errors import SealedError, SymbolError
from topos.base.provenance import Site

from conftest import DESCRIBE_LINE

F32 = np.float32


def _model(tape):
    w = tape.parameter(np.full((3, 2), 0.5, F32))
    x = tape.input(np.ones((4, 3), F32))
    table = tape.leaf(np.arange(6, dtype=F32).reshape(3, 2))
    rows = table.gather(tape.leaf(topos.selection([2, 0], 3)))
    h = (x @ w).tanh()
    loss = h.sum_along(1).permute((0,)).sum() + rows.sum()
    return w, x, table, h, loss


@pytest.fixture
def recorded():
    return Tape.record(_model)


# ---- immutability ------------------------------------------------------------------------------


def test_network_attributes_cannot_be_set_or_deleted(recorded):
    network, _ = recorded
    with pytest.raises(SealedError, match="immutable"):
        network.columns = ()
    with pytest.raises(AttributeError):  # the columns are a tuple of tuples: nothing in them can be set either
        network.columns.opcodes = ()
    with pytest.raises(TypeError):
        network.columns.opcodes[0] = None
    with pytest.raises(SealedError):
        network.anything = 1
    with pytest.raises(SealedError):
        del network.columns
    assert len(network) == 12


@pytest.mark.parametrize(
    "duplicate",
    [copy.copy, copy.deepcopy, pickle.dumps, lambda n: pickle.dumps(n, protocol=0)],
    ids=["copy", "deepcopy", "pickle", "pickle-protocol-0"],
)
def test_network_cannot_be_copied_or_pickled(recorded, duplicate):
    network, _ = recorded
    with pytest.raises(SealedError, match="not copyable"):
        duplicate(network)


def test_network_cannot_be_constructed_directly():
    with pytest.raises(TypeError, match="Tape.record"):
        Network()


def test_nodes_are_frozen_snapshots(recorded):
    network, (w, *_) = recorded
    node = network.node(w)
    with pytest.raises(AttributeError):
        node.shape = (1,)
    permute = next(n for n in network.nodes() if n.opcode.name == "permute")
    with pytest.raises(TypeError):
        permute.attributes["order"] = (1,)


def test_recorded_payloads_are_read_only_copies_of_what_the_user_passed():
    initial = np.ones(3, F32)

    def model(tape):
        return tape.parameter(initial)

    network, w = Tape.record(model)
    initial[:] = 7.0
    assert network.payload(w).tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError):
        network.payload(w)[0] = 2.0
    assert network.parameters()[w].tolist() == [1.0, 1.0, 1.0]


# ---- reading nodes -----------------------------------------------------------------------------


def test_nodes_list_every_node_in_recording_order_with_symbols_as_operands(recorded):
    network, (w, x, table, h, loss) = recorded
    nodes = network.nodes()
    assert [n.index for n in nodes] == list(range(len(network)))
    for node in nodes:
        assert node == network.node(node.symbol)
        assert all(isinstance(s, topos.Symbol) and s.index < node.index for s in node.operands)
        assert node.is_source == (node.opcode.name in ("leaf", "parameter", "input"))
    matmul = next(n for n in nodes if n.opcode.name == "matmul")
    assert matmul.operands == (x, w) and matmul.shape == (4, 2) and matmul.dtype == topos.float32
    assert network.node(h).attributes == {"function": "tanh"}


def test_node_opcodes_follow_the_recorded_expressions(recorded):
    network, _ = recorded
    names = [n.opcode.name for n in network.nodes()]
    assert names[:7] == ["parameter", "input", "leaf", "leaf", "gather", "matmul", "map"]
    assert names[7:] == ["sum_along", "permute", "sum", "sum", "add"]


def test_payload_is_the_recorded_value_for_sources_and_none_otherwise(recorded):
    network, (w, x, table, h, loss) = recorded
    assert np.array_equal(network.payload(w), np.full((3, 2), 0.5, F32))
    assert np.array_equal(network.payload(x), np.ones((4, 3), F32))
    assert np.array_equal(network.payload(table), np.arange(6, dtype=F32).reshape(3, 2))
    selection = network.nodes()[3]
    assert network.payload(selection.symbol).tolist() == [2, 0]
    assert str(selection.dtype) == "index<3>"
    assert network.payload(h) is None and network.payload(loss) is None


def test_consumers_list_the_readers_of_each_node(recorded):
    network, (w, x, table, h, loss) = recorded
    consumers = network.consumers()
    assert len(consumers) == len(network)
    for node in network.nodes():
        for operand in node.operands:
            assert node.index in consumers[operand.index]
    assert consumers[loss.index] == ()
    # x * x reads x twice but is one consumer.
    square, symbols = Tape.record(lambda tape: (lambda y: (y, y * y))(tape.input(1.0)))
    assert square.consumers()[symbols[0].index] == (1,)


# ---- describe ----------------------------------------------------------------------------------


def test_describe_has_one_parseable_line_per_node_then_a_summary(recorded):
    network, _ = recorded
    lines = network.describe().splitlines()
    assert len(lines) == len(network) + 1
    for line, node in zip(lines, network.nodes()):
        match = DESCRIBE_LINE.match(line)
        assert match, f"unparseable describe line: {line!r}"
        assert int(match["index"]) == node.index
        assert match["opcode"] == node.opcode.name
        operands = [int(o) for o in match["operands"].split(",") if o.strip()]
        assert operands == [s.index for s in node.operands]
        assert [int(d) for d in match["shape"].split(",") if d.strip()] == list(node.shape)
        assert match["dtype"] == topos.base.element.short_name(node.dtype)
    assert lines[-1] == "network: 12 nodes (1 parameter, 1 input, 2 leaves)"


def test_describe_shows_attributes_and_uniform_leaf_values(recorded):
    network, _ = recorded
    lines = {n.opcode.name: line for n, line in zip(network.nodes(), network.describe().splitlines())}
    assert DESCRIBE_LINE.match(lines["map"])["attributes"] == "function=tanh"
    assert DESCRIBE_LINE.match(lines["sum_along"])["attributes"] == "axis=1"
    assert DESCRIBE_LINE.match(lines["permute"])["attributes"] == "order=[0]"
    assert DESCRIBE_LINE.match(lines["sum"])["attributes"] is None
    leaves = [line for n, line in zip(network.nodes(), network.describe().splitlines()) if n.opcode.name == "leaf"]
    # A non-uniform leaf shows no value; uniform ones read "value=c".
    assert DESCRIBE_LINE.match(leaves[0])["attributes"] is None
    uniform, _ = Tape.record(lambda tape: tape.input(np.ones(2, F32)) * 0.25)
    assert DESCRIBE_LINE.match(uniform.describe().splitlines()[1])["attributes"] == "value=0.25"


def test_describe_summary_counts_singular_and_plural():
    network, _ = Tape.record(lambda tape: tape.leaf(1.0))
    assert network.describe().splitlines()[-1] == "network: 1 node (0 parameters, 0 inputs, 1 leaf)"


def test_node_str_is_its_describe_line_without_leaf_value(recorded):
    network, _ = recorded
    lines = network.describe().splitlines()
    for node, line in zip(network.nodes(), lines):
        if node.opcode.name != "leaf":
            assert str(node) == line


def test_describe_with_sites_appends_the_recording_line(recorded):
    network, _ = recorded
    for line in network.describe(sites=True).splitlines()[:-1]:
        assert f"# {__file__}:" in line and line.endswith("in _model")


def test_repr_counts_nodes_parameters_and_inputs(recorded):
    network, _ = recorded
    assert repr(network) == "<Network 12 nodes, 1 parameter, 1 input>"


# ---- symbol checks ------------------------------------------------------------------------------


def test_a_symbol_of_another_network_is_refused_everywhere(recorded):
    network, _ = recorded
    other, foreign = Tape.record(lambda tape: tape.input(1.0))
    for read in (network.node, network.payload, network.forward(network.parameters()).__getitem__):
        with pytest.raises(SymbolError, match="another tape") as caught:
            read(foreign)
        assert "%0" in str(caught.value)


def test_a_non_symbol_is_refused_with_its_type_named(recorded):
    network, _ = recorded
    for wrong in (0, "%0", None):
        with pytest.raises(SymbolError, match="not a Symbol") as caught:
            network.node(wrong)
        assert type(wrong).__name__ in str(caught.value)


def test_a_value_passed_where_a_symbol_belongs_is_refused():
    leaked = {}

    def model(tape):
        leaked["x"] = tape.input(1.0)
        return leaked["x"]

    network, _ = Tape.record(model)
    with pytest.raises(SymbolError, match="Value, not a Symbol; use its Symbol: the one Tape.record returned"):
        network.node(leaked["x"])
    with pytest.raises(SymbolError, match=r"or value\.symbol"):
        network.forward(network.parameters())[leaked["x"]]


def test_a_symbol_beyond_the_network_says_to_use_the_newer_network(recorded):
    network, _ = recorded
    with pytest.raises(SymbolError, match="12 nodes") as caught:
        network.node(topos.Symbol(network.family, 12))
    assert "%12" in str(caught.value) and "newer network" in str(caught.value)


def test_symbols_are_hashable_and_equal_within_a_family(recorded):
    network, (w, *_) = recorded
    same = network.symbol(w.index)
    assert same == w and hash(same) == hash(w) and {w: 1}[same] == 1
    other, foreign = Tape.record(lambda tape: tape.parameter(1.0))
    assert foreign.index == w.index and foreign != w


# ---- the columns reader and the spec's own construction doors ----------------------------------


def test_the_columns_reader_hands_out_copies_of_payloads_and_keeps_splats_splats(recorded):
    network, (w, x, table, h, loss) = recorded
    read = network.columns.payloads[table.index]
    assert not read.flags.writeable and not np.shares_memory(read, network.columns.payloads[table.index])
    read.setflags(write=True)  # an array that owns its data may be made writable: it is the reader's own
    read[...] = 7.0
    assert np.array_equal(network.payload(table), np.arange(6, dtype=F32).reshape(3, 2))  # the spec is untouched
    lifted, _ = Tape.record(lambda tape: tape.input(np.ones((64, 64), F32)) * 0.5)
    leaf = next(n.index for n in lifted.nodes() if n.opcode.name == "leaf")
    splat = lifted.columns.payloads[leaf]
    assert splat.shape == (64, 64) and not any(splat.strides)  # one stored element, not 4096


def test_network_from_columns_refuses_what_is_not_a_tapes_columns(recorded):
    network, _ = recorded
    with pytest.raises(topos.ArgumentError, match=r"Tape.record"):
        Network.from_columns(network.family, tuple(network.columns), lambda n: None)


def test_leaf_digest_takes_a_leafs_node_index(recorded):
    network, (w, x, table, h, loss) = recorded
    assert len(network.leaf_digest(table.index)) == 32
    for wrong in (w.index, table, -1, len(network)):
        with pytest.raises(SymbolError, match=r"leaf_digest takes the node index of a leaf"):
            network.leaf_digest(wrong)


def test_tape_locate_and_compact_refuse_what_they_cannot_do_at_the_users_line():
    tape = Tape()
    w = tape.parameter(np.ones(2, F32))
    y = w * 2.0
    with pytest.raises(SymbolError, match=r"test_network.py:\d+.*locate takes the newest Value"):
        tape.locate(w, Site("model.py", 1, "model"))
    with pytest.raises(topos.ArgumentError, match=r"locate takes a topos.base.provenance.Site"):
        tape.locate(y, "here")
    with pytest.raises(topos.ArgumentError, match=r"test_network.py:\d+.*compact\(start=...\)"):
        tape.compact("0", [y])
    with pytest.raises(SymbolError, match=r"compact keeps Values of this tape"):
        tape.compact(1, [np.ones(2)])
    with pytest.raises(topos.ArgumentError, match=r"a parameter or an input was recorded after %0"):
        tape.compact(0, [y])
    start = len(tape)
    unused = y * 3.0  # noqa: F841 - dropped: nothing kept needs it
    kept = y + 1.0
    renumber = tape.compact(start, [kept])
    assert len(tape) == start + 2 and renumber[kept._index] == start + 1  # the product and its leaf went
