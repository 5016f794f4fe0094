"""topos.optim: one rule, two readings (host transform and recorded graph), checked against torch.optim."""

from __future__ import annotations

import numpy as np
import pytest

import topos
import topos.nn.functional as F
from topos import Numerics, Tape, nn, optim, selection
from topos.base.errors import ArgumentError, DifferentiationError, FeedError, SymbolError

F32, F64 = np.float32, np.float64
RNG = np.random.default_rng(11)
BATCHES = [(RNG.standard_normal((8, 5)), RNG.integers(0, 3, 8)) for _ in range(4)]


def _no_bias_decay(name):
    return not name.endswith("bias")


OPTIMIZERS = {
    "sgd": lambda: optim.SGD(lr=0.1),
    "sgd-momentum": lambda: optim.SGD(lr=0.05, momentum=0.9),
    "sgd-nesterov-decay": lambda: optim.SGD(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.01),
    "adam": lambda: optim.Adam(lr=0.01),
    "adam-l2": lambda: optim.Adam(lr=0.01, betas=(0.8, 0.99), weight_decay=0.1),
    "adamw-policy": lambda: optim.AdamW(lr=0.01, weight_decay=0.1, decay=_no_bias_decay),
}


def _model(tape, dtype):
    model = nn.Mlp([5, 7, 3], dtype=dtype)
    x = tape.input(shape=(8, 5), dtype=dtype, name="x")
    y = tape.input(shape=(8,), extent=3, name="y")
    return model, F.cross_entropy(model(x), y)


def _forward(dtype):
    return Tape.record(lambda tape: _model(tape, dtype)[1])


def _trained(make, dtype):
    holder = {}

    def record(tape):
        model, loss = _model(tape, dtype)
        holder["optimizer"] = make()
        return loss, holder["optimizer"].record(tape.differentiate(loss, model.parameters()))

    network, (loss, updates) = Tape.record(record)
    return network, loss, updates, holder["optimizer"]


def _feeds(step, dtype):
    x, y = BATCHES[step % len(BATCHES)]
    return {"x": x.astype(dtype), "y": y}


def _host_steps(make, dtype, steps, rates=None):
    network, loss = _forward(dtype)
    optimizer = make()
    parameters, state = network.parameters(), None
    for k in range(steps):
        gradients = network.forward(parameters, _feeds(k, dtype)).backward(loss).parameters(parameters)
        parameters, state = optimizer.step(parameters, gradients, state, lr=None if rates is None else rates[k])
    return parameters, state


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_host_and_exact_plan_readings_are_bit_identical(name, dtype):
    rates = [0.02, 0.01, 0.01, 0.005, 0.02]
    host, state = _host_steps(OPTIMIZERS[name], dtype, 5, rates)
    network, loss, updates, optimizer = _trained(OPTIMIZERS[name], dtype)
    plan = network.entry(updates.roots(loss), numerics=Numerics.EXACT).lower()
    table = network.parameters()
    for k in range(5):
        feeds = {**_feeds(k, dtype), optimizer.learning_rate: rates[k]}
        table = updates.apply(table, plan.forward(table, feeds))
    for name_ in host.names():
        assert host[name_].tobytes() == table[name_].tobytes(), name_
    assert set(state) <= set(table.names())  # the host state has the recorded state's names
    for name_ in state:
        assert state[name_].tobytes() == table[name_].tobytes(), name_


def test_the_recorded_state_is_state_and_the_rate_an_input():
    network, loss, updates, optimizer = _trained(OPTIMIZERS["adam"], F32)
    nodes = {node.name: node for node in network.nodes() if node.name}
    assert nodes["optim.lr"].opcode.name == "input" and network.payload(nodes["optim.lr"].symbol) == np.float32(0.01)
    assert nodes["optim.step"].role == "state" and not nodes["optim.step"].trainable
    assert nodes["optim.exp_avg.0.weight"].role == "state" and nodes["optim.exp_avg_sq.2.bias"].shape == (3,)
    assert network.trainable_symbols() == tuple(network.named(n) for n in ("0.weight", "0.bias", "2.weight", "2.bias"))
    updated = [network.name(p) for p, _ in updates.pairs()]
    assert updated[:3] == ["0.weight", "optim.exp_avg.0.weight", "optim.exp_avg_sq.0.weight"]
    assert updated[-1] == "optim.step" and len(updated) == 4 * 3 + 1
    assert optimizer.learning_rate == nodes["optim.lr"].symbol


def test_the_step_count_and_bias_corrections_live_in_the_graph():
    network, loss, updates, _ = _trained(OPTIMIZERS["adam"], F64)
    table = network.parameters()
    run = network.forward(table, _feeds(0, F64))
    assert run[updates[network.named("optim.step")]] == 1.0
    assert sum(node.opcode.name == "pow" for node in network.nodes()) == 2  # beta1**t, beta2**t once


def test_sgd_without_momentum_keeps_no_state():
    network, loss, updates, _ = _trained(OPTIMIZERS["sgd"], F32)
    assert [network.name(p) for p, _ in updates.pairs()] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert optim.SGD(lr=0.1).init(_forward(F32)[0].parameters()) == {}


def test_adamw_decays_only_what_its_policy_names():
    network, loss = _forward(F64)
    parameters = network.parameters()
    zero = parameters.map(np.zeros_like)
    decayed, _ = optim.AdamW(lr=0.1, weight_decay=0.5, decay=_no_bias_decay).step(parameters, zero)
    assert np.array_equal(decayed["0.weight"], parameters["0.weight"] * (1 - 0.1 * 0.5))
    assert np.array_equal(decayed["0.bias"], parameters["0.bias"])


# ---- against torch.optim -----------------------------------------------------------------------------

torch = pytest.importorskip("torch")

TORCH_OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "sgd-nesterov-decay": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.01),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01),
    "adam-l2": lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.99), weight_decay=0.1),
    "adamw-policy": lambda p: torch.optim.AdamW(
        [{"params": [q for n, q in p if not n.endswith("bias")], "weight_decay": 0.1},
         {"params": [q for n, q in p if n.endswith("bias")], "weight_decay": 0.0}], lr=0.01),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_one_hundred_steps_agree_with_torch_optim_in_float64(name):
    network, loss = _forward(F64)
    parameters = network.parameters()
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3)).double()
    with torch.no_grad():
        for key, tensor in model.state_dict().items():
            tensor.copy_(torch.tensor(parameters[key]))
    named = list(model.named_parameters())
    theirs = TORCH_OPTIMIZERS[name](named if name == "adamw-policy" else [q for _, q in named])
    optimizer, state = OPTIMIZERS[name](), None
    for k in range(100):
        feeds = _feeds(k, F64)
        gradients = network.forward(parameters, feeds).backward(loss).parameters(parameters)
        parameters, state = optimizer.step(parameters, gradients, state)
        theirs.zero_grad()
        torch.nn.functional.cross_entropy(model(torch.tensor(feeds["x"])), torch.tensor(feeds["y"])).backward()
        theirs.step()
    for key, tensor in model.state_dict().items():
        np.testing.assert_allclose(parameters[key], tensor.numpy(), rtol=1e-10, atol=1e-12, err_msg=key)


# ---- misuse ------------------------------------------------------------------------------------------


def test_stepping_with_gradients_of_another_network_is_refused_at_the_line():
    one, loss = _forward(F32)
    two, loss2 = _forward(F32)
    parameters = one.parameters()
    gradients = two.forward(two.parameters(), _feeds(0, F32)).backward(loss2)
    with pytest.raises(SymbolError, match=r"test_optim.py:\d+.*another network"):
        optim.Adam().step(parameters, gradients)
    with pytest.raises(SymbolError, match=r"test_optim.py:\d+.*not over the same slots"):
        optim.Adam().step(parameters, gradients.parameters(two.parameters()))
    with pytest.raises(FeedError, match="takes gradients as a table"):
        optim.Adam().step(parameters, {"0.weight": 1})


def test_state_made_for_other_parameters_is_refused():
    network, loss = _forward(F32)
    parameters = network.parameters()
    other, _ = Tape.record(lambda tape: nn.Linear(2, 2).weight)
    with pytest.raises(SymbolError, match="made for other parameters"):
        optim.Adam().step(parameters, parameters.map(np.zeros_like), optim.Adam().init(other.parameters()))


def test_recording_an_optimizer_over_an_input_or_state_is_refused():
    def over_input(tape):
        x = tape.input(np.ones(2, F32))
        optim.SGD(lr=0.1).record(tape.differentiate((x * x).sum(), [x]))

    with pytest.raises(DifferentiationError, match="not a trainable parameter"):
        Tape.record(over_input)


@pytest.mark.parametrize("build, words", [
    (lambda: optim.SGD(lr=0.0), "must be positive"),
    (lambda: optim.SGD(lr=0.1, nesterov=True), "Nesterov momentum needs momentum"),
    (lambda: optim.Adam(betas=(1.0, 0.9)), r"betas must lie in \[0, 1\)"),
    (lambda: optim.AdamW(weight_decay=-1.0), "weight_decay must be >= 0"),
])
def test_bad_hyperparameters_are_refused(build, words):
    with pytest.raises(ValueError, match=words):
        build()


@pytest.mark.parametrize("build, words", [
    (lambda: optim.SGD(lr=float("inf")), r"SGD: the learning rate lr must be positive and finite.*got float inf"),
    (lambda: optim.SGD(lr=float("nan")), r"SGD: the learning rate lr must be positive and finite.*got float nan"),
    (lambda: optim.SGD(lr="0.1"), r"SGD: the learning rate lr must be positive and finite.*got str '0.1'"),
    (lambda: optim.SGD(lr=None), r"SGD: the learning rate lr must be positive and finite.*got NoneType None"),
    (lambda: optim.Adam(lr=-1e-3), r"Adam: the learning rate lr must be positive"),
    (lambda: optim.SGD(lr=0.1, momentum=float("nan")), r"SGD: momentum must be >= 0 \(a finite number\), got nan"),
    (lambda: optim.SGD(lr=0.1, momentum=-0.5), r"SGD: momentum must be >= 0"),
    (lambda: optim.SGD(lr=0.1, weight_decay=float("nan")), r"SGD: weight_decay must be >= 0"),
    (lambda: optim.AdamW(weight_decay=float("inf")), r"AdamW: weight_decay must be >= 0"),
    (lambda: optim.Adam(eps=-1e-8), r"Adam: eps must be > 0 \(a finite number\), got -1e-08"),
    (lambda: optim.AdamW(eps=0.0), r"AdamW: eps must be > 0"),
    (lambda: optim.Adam(betas=(0.9,)), r"Adam: betas must be a pair \(beta1, beta2\) of numbers in \[0, 1\)"),
    (lambda: optim.Adam(0.01, 0.9), r"Adam: betas must be a pair .*got 0.9; pass it as betas=\(...\)"),
    (lambda: optim.Adam(betas=(0.9, float("nan"))), r"Adam: betas must lie in \[0, 1\) and be finite"),
    (lambda: optim.Adam(decay="bias"), r"Adam: decay must be a function of a parameter's name"),
    (lambda: optim.SGD(lr=0.1, prefix="my optim"), r"SGD: prefix must be a non-empty name without whitespace"),
])
def test_hyperparameters_that_are_not_finite_numbers_in_range_are_refused(build, words):
    with pytest.raises(ArgumentError, match=words) as caught:
        build()
    assert "test_optim.py" in str(caught.value)


def test_hyperparameters_of_numpy_types_and_list_betas_are_accepted():
    adam = optim.Adam(lr=np.float32(0.01), betas=[0.8, np.float64(0.99)], eps=np.float32(1e-6))
    assert adam.betas == (0.8, 0.99) and adam.lr == pytest.approx(0.01)
    assert optim.SGD(lr=1, momentum=0).lr == 1.0


def test_a_step_rate_override_is_checked_like_the_constructors():
    network, loss = _forward(F32)
    parameters = network.parameters()
    gradients = network.forward(parameters, _feeds(0, F32)).backward(loss).parameters(parameters)
    sgd = optim.SGD(lr=0.1)
    for bad in (float("nan"), float("inf"), 0.0, "0.1"):
        with pytest.raises(ArgumentError, match=r"SGD.step: the learning rate lr must be positive and finite"):
            sgd.step(parameters, gradients, lr=bad)
    stepped, _ = sgd.step(parameters, gradients, lr=0.5)
    expected = parameters["0.weight"] - np.float32(0.5) * gradients["0.weight"]
    np.testing.assert_array_equal(stepped["0.weight"], expected)


def test_a_state_of_another_element_type_is_refused_naming_the_entries():
    network, loss = _forward(F32)
    parameters = network.parameters()
    adam = optim.Adam()
    wider = optim.OptimizerState({n: a.astype(F64) for n, a in adam.init(parameters).named().items()})
    with pytest.raises(FeedError, match=r"another element type[\s\S]*optim.exp_avg.0.weight: float64, the "
                                        r"parameters need float32"):
        adam.step(parameters, parameters.map(np.zeros_like), wider)


def test_a_state_of_another_network_with_as_many_entries_lists_the_shapes_that_differ():
    network, loss = _forward(F32)
    parameters = network.parameters()
    other, _ = Tape.record(lambda tape: nn.Mlp([5, 4, 3])(tape.input(np.ones((1, 5), F32))))
    state = optim.Adam().init(other.parameters())
    assert len(state) == len(optim.Adam().init(parameters))
    with pytest.raises(SymbolError, match=r"made for other parameters[\s\S]*optim.exp_avg.0.weight: \[4, 5\], "
                                          r"these parameters need \[7, 5\]"):
        optim.Adam().step(parameters, parameters.map(np.zeros_like), state)


def test_a_second_optimizer_on_one_recording_needs_another_prefix():
    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.second = nn.Linear(2, 3), nn.Linear(3, 1)

    def record(tape, prefix):
        pair = Pair()
        loss = pair.second(pair.first(tape.input(np.ones((1, 2), F32)))).sum()
        first = optim.Adam().record(tape.differentiate(loss, pair.first.parameters()))
        second = optim.SGD(lr=0.1, momentum=0.9, prefix=prefix)
        second.record(tape.differentiate(loss, pair.second.parameters()))
        return first, second

    with pytest.raises(SymbolError, match=r"SGD.record: this recording already holds optimizer state named "
                                          r"'optim.lr'.*prefix='optim2'"):
        Tape.record(lambda tape: record(tape, "optim"))
    network, _ = Tape.record(lambda tape: record(tape, "optim2"))
    assert "optim2.momentum_buffer.second.weight" in network.parameters().names()


def test_state_from_checks_the_tensors_it_is_given():
    network, loss = _forward(F32)
    parameters = network.parameters()
    adam = optim.Adam()
    named = adam.init(parameters).named()
    assert set(adam.state_from(named, parameters)) == set(named)
    del named["optim.step"]
    named["optim.exp_avg.0.weight"] = np.zeros((1, 1), F32)
    with pytest.raises(FeedError, match=r"missing: optim.step[\s\S]*optim.exp_avg.0.weight: \[1, 1\]"):
        adam.state_from(named, parameters)


def test_optimizer_state_is_read_only_and_not_shared():
    _, state = _host_steps(OPTIMIZERS["adam"], F32, 1)
    array = state["optim.exp_avg.0.weight"]
    assert not array.flags.writeable
    with pytest.raises(ValueError):
        array[0, 0] = 1.0


def test_a_learning_rate_input_exists_only_after_record():
    with pytest.raises(SymbolError, match="record"):
        _ = optim.SGD(lr=0.1).learning_rate


def test_two_element_types_get_a_rate_and_a_count_each():
    def record(tape):
        a = tape.parameter(np.ones(2, F32), name="a")
        b = tape.parameter(np.ones(2, F64), name="b")
        loss = (a * a).sum() + tape.leaf(np.float32(0.0))
        adjoints = tape.differentiate(loss, [a])
        updates = optim.Adam().record(adjoints)
        loss64 = (b * b).sum()
        return optim.Adam(prefix="second").record(tape.differentiate(loss64, [b])), updates

    network, _ = Tape.record(record)
    assert {"optim.lr", "optim.step", "second.lr", "second.step"} <= set(network.names())


def test_labels_as_selection_and_adam_train_the_model_down():
    network, loss, updates, optimizer = _trained(OPTIMIZERS["adam"], F32)
    plan = network.entry(updates.roots(loss)).lower()
    table = network.parameters()
    feeds = {"x": BATCHES[0][0].astype(F32), "y": selection(BATCHES[0][1], 3).indices}
    first = float(plan.forward(table, feeds)[loss])
    for _ in range(50):
        table = updates.apply(table, plan.forward(table, feeds))
    assert float(plan.forward(table, feeds)[loss]) < 0.5 * first
    assert isinstance(topos.Updates([]) + updates, topos.Updates)
    with pytest.raises(DifferentiationError, match="updated twice"):
        updates + updates


def test_the_rate_of_a_recorded_step_is_fed_not_assigned():
    holder = {}

    def record(tape):
        model = nn.Linear(3, 1)
        loss = model(tape.input(np.ones((2, 3), np.float32), name="x")).sum()
        holder["sgd"] = sgd = optim.SGD(lr=0.1)
        sgd.lr = 0.2  # before record: the default the recorded input takes
        return loss, sgd.record(tape.differentiate(loss, model.parameters()))

    network, (loss, updates) = Tape.record(record)
    sgd = holder["sgd"]
    assert network.payload(sgd.learning_rate) == np.float32(0.2)
    with pytest.raises(ArgumentError, match=r"SGD.lr: this optimizer's step is recorded, .* 'optim.lr'.*"
                                            r"\{'optim.lr': 0.5\}, or pass step\(\.\.\., lr=\) on the host"):
        sgd.lr = 0.5  # the compiled step would keep 0.2 while the host reading moved on
    assert sgd.lr == 0.2
    with pytest.raises(ArgumentError, match="lr must be"):
        optim.SGD(lr=0.1).lr = "fast"
