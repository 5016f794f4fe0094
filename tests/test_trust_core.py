"""Trust in the core: nothing handed out aliases kept state, every conversion rounds once, indices are integers."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

import topos
from topos import Numerics, Tape, optim, selection
from topos.base.errors import FeedError

F32, F64, BF16 = np.float32, np.float64, np.dtype(ml_dtypes.bfloat16)
torch = pytest.importorskip("torch")


def _network():
    def record(tape):
        w = tape.parameter(np.array([[1.0, 2.0], [3.0, 4.0]], F64), name="w")
        x = tape.input(np.array([[1.0, -1.0]], F64), name="x")
        c = tape.leaf(np.array([[0.5, 0.5]], F64))
        loss = ((x @ w + c) * (x @ w + c)).sum()
        return w, x, c, loss
    return Tape.record(record)


def _scribble_flag(array):
    array.setflags(write=True)
    array[...] = 99.0


def _scribble_torch(array):
    with warnings.catch_warnings():  # torch says the array is not writable, then shares it anyway
        warnings.simplefilter("ignore", UserWarning)
        tensor = torch.from_numpy(array)
    tensor.mul_(10)


def _readers(network, symbols):
    w, x, c, loss = symbols
    parameters = network.parameters()
    run = network.forward(parameters)
    gradients = run.backward(loss)
    table = gradients.parameters(parameters)
    plan_run = network.entry([loss], observe=[x], numerics=Numerics.EXACT).lower().forward(parameters)
    _, state = optim.Adam().step(parameters, table)
    return {
        "run[input default]": lambda: run[x],
        "run[parameter]": lambda: run[w],
        "run[computed]": lambda: run[loss],
        "plan run[observed]": lambda: plan_run[x],
        "payload(leaf)": lambda: network.payload(c),
        "payload(input)": lambda: network.payload(x),
        "parameters[symbol]": lambda: parameters[w],
        "parameters[name]": lambda: parameters["w"],
        "parameters.arrays()": lambda: parameters.arrays()[0],
        "parameters.items()": lambda: next(iter(parameters.items()))[1],
        "parameters.named()": lambda: parameters.named()["w"],
        "gradients[symbol]": lambda: gradients[w],
        "gradients table": lambda: table["w"],
        "optimizer state": lambda: state["optim.exp_avg.w"],
        "optimizer state.named()": lambda: state.named()["optim.step"],
    }


@pytest.mark.parametrize("scribble", [_scribble_flag, _scribble_torch], ids=["setflags", "torch.from_numpy"])
def test_writing_to_anything_handed_out_changes_nothing_kept(scribble):
    network, symbols = _network()
    readers = _readers(network, symbols)
    before = {name: read().copy() for name, read in readers.items()}
    expected_loss = float(network.forward(network.parameters())[symbols[3]])
    for name, read in readers.items():
        handed = read()
        assert not handed.flags.writeable, name
        scribble(handed)
        assert np.array_equal(read(), before[name]), name  # the next read is untouched
    assert float(network.forward(network.parameters())[symbols[3]]) == expected_loss


def test_a_callback_of_map_and_zip_gets_copies():
    network, (w, *_rest) = _network()
    parameters = network.parameters()

    def vandal(a, *others):
        a.setflags(write=True)
        a[...] = -1.0
        return a

    parameters.map(vandal)
    parameters.zip(parameters, vandal)
    assert np.array_equal(parameters[w], [[1.0, 2.0], [3.0, 4.0]])


# ---- rounding once -------------------------------------------------------------------------------

TRICKY = 1 + 2**-8 + 2**-30  # halfway-plus-a-little in bfloat16; through float32 it rounds to 1.0
ONCE = float(np.array(1 + 2**-7, F32).astype(BF16))


def test_the_tricky_value_rounds_once_through_convert_whatever_mldtypes_does():
    assert float(np.float64(TRICKY).astype(BF16)) in (1.0, ONCE)  # 1.0: ml_dtypes 0.6.0, via float32
    assert float(topos.base.element.convert(TRICKY, BF16)) == ONCE == 1.0078125


def test_every_conversion_into_bfloat16_rounds_once():
    def record(tape):
        x = tape.input(np.zeros(3, BF16), name="x")
        w = tape.parameter(np.zeros(3, BF16), name="w")
        lifted = x + TRICKY
        return x, w, lifted, topos.sgd(tape, tape.differentiate((w * w).sum(), [w]), TRICKY)

    network, (x, w, lifted, updates) = Tape.record(record)
    run = network.forward(network.parameters(), {"x": [0.0, 0.0, 0.0]})
    assert (run[lifted].astype(F64) == ONCE).all()  # a Python scalar beside a bfloat16 Value
    fed = network.forward(network.parameters(), {"x": [TRICKY] * 3})
    assert (fed[x].astype(F64) == ONCE).all()  # a fed list
    replaced = network.parameters().with_payloads({"w": np.full(3, TRICKY)})
    assert (replaced["w"].astype(F64) == ONCE).all()  # a float64 array into a bfloat16 slot
    stepped = network.parameters().step(network.parameters(), lambda p, g: np.full(3, TRICKY))
    assert (stepped["w"].astype(F64) == ONCE).all()  # a rule returning float64
    leaves = [n for n in network.nodes() if n.opcode.name == "leaf" and n.shape == (3,)]
    once = [n for n in leaves if (network.payload(n.symbol).astype(F64) == ONCE).all()]
    assert len(once) == 2  # the lifted scalar and sgd's rate
    assert float(optim.SGD(lr=TRICKY).step(network.parameters(), network.parameters())[0]["w"][0]) == 0.0
    assert float(topos.nn.functional.causal_mask(2, dtype=BF16)[0, 1]) == float(
        topos.base.element.convert(-1e9, BF16))


# ---- selections ------------------------------------------------------------------------------------


@pytest.mark.parametrize("indices, words", [
    (np.array([0.0, 1.7]), "must be integers, got float64"),
    (np.array([True, False]), "booleans"),
    ([0, -1], "index -1"),
    ([0, 4], "index 4"),
])
def test_a_selection_is_integers_in_range_however_it_is_built(indices, words):
    with pytest.raises(ValueError, match=words):
        selection(indices, 4)
    with pytest.raises(ValueError, match=words):
        topos.Selection(np.asarray(indices), 4)


@pytest.mark.parametrize("fed, words", [
    (np.array([0.0, 1.0]), "must be integers, got float64"),
    (np.array([True, True]), "booleans"),
    (np.array([0, -1]), "index -1"),
])
def test_a_fed_selection_is_checked_the_same_way(fed, words):
    def record(tape):
        table = tape.parameter(np.ones((4, 2), F32))
        rows = tape.input(selection([0, 1], 4), name="rows")
        return table.gather(rows).sum()

    network, total = Tape.record(record)
    with pytest.raises(FeedError, match=f"rows.*selection.*{words}"):
        network.forward(network.parameters(), {"rows": fed})
    assert network.forward(network.parameters(), {"rows": selection([3, 3], 4)})[total] == 4.0
