"""Arguments the facades used to take without a word, or met with an error from inside NumPy or Python.

Each case here once recorded a silent wrong result (a boolean mask added
as 0/1, a rate of None training to NaN, ``ignore_index=True`` zeroing
every row) or raised a raw TypeError/AttributeError. Now each is refused
with a ToposError that names the argument and the fix.
"""

from __future__ import annotations

import numpy as np
import pytest

import topos
from topos import (
    ArgumentError,
    DifferentiationError,
    FeedError,
    RecordingError,
    ShapeError,
    SymbolError,
    Tape,
    init,
    nn,
    optim,
)
from topos.nn import functional as F

F32 = np.float32


def refused(error, words, build):
    """``build(tape)`` inside a recording raises ``error`` matching ``words``, at this file's line."""
    with pytest.raises(error, match=words) as caught:
        Tape.record(lambda tape: build(tape) or tape.leaf(np.zeros((), F32)))
    assert str(caught.value).startswith(f"{__file__}:"), str(caught.value)


def _attention(mask=None, causal=False):
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((2, 3, 4)).astype(F32) for _ in range(3))

    def model(tape):
        return F.scaled_dot_product_attention(tape.leaf(q), tape.leaf(k), tape.leaf(v), mask=mask, causal=causal)

    network, out = Tape.record(model)
    return network.forward(network.parameters())[out]


def test_a_boolean_attention_mask_means_what_it_means_to_pytorch():
    allowed = np.tril(np.ones((3, 3), bool))
    assert _attention(allowed).tobytes() == _attention(causal=True).tobytes()
    assert _attention(allowed).tobytes() == _attention(F.causal_mask(3)).tobytes()
    assert _attention(np.ones((3, 3), bool)).tobytes() == _attention().tobytes()
    assert _attention(allowed).tobytes() != _attention(allowed.astype(F32)).tobytes()  # 0/1 is additive


@pytest.mark.parametrize("options, words", [
    ({"mask": "abc"}, r"mask must be a Value or an array of numbers .* or of bools \(True to attend\), got str"),
    ({"causal": "no"}, "causal must be True or False, got 'no'"),
    ({"scale": float("nan")}, "scale must be a finite number, got nan"),
])
def test_attention_refuses_a_mask_causal_or_scale_it_cannot_read(options, words):
    x = np.ones((3, 4), F32)
    refused(ArgumentError, words, lambda t: F.scaled_dot_product_attention(t.leaf(x), t.leaf(x), t.leaf(x), **options))


def test_causal_mask_sizes_are_checked():
    for bad, words in [(-1, "length must be an int >= 1, got -1"), (2.5, "length must be an int >= 1, got 2.5")]:
        with pytest.raises(ArgumentError, match=words):
            F.causal_mask(bad)
    with pytest.raises(ArgumentError, match="source_length must be an int >= 1"):
        F.causal_mask(2, "3")
    assert F.causal_mask(np.int64(2)).shape == (2, 2)


@pytest.mark.parametrize("ignore", [True, 1.5, "1", -1])
def test_ignore_index_must_be_an_int_label(ignore):
    logits, labels = np.zeros((2, 3), F32), topos.selection([0, 1], extent=3)
    refused(ArgumentError, "cross_entropy: ignore_index must be an int >= 0",
            lambda t: F.cross_entropy(t.leaf(logits), t.leaf(labels), ignore_index=ignore))


@pytest.mark.parametrize("eps", [-10.0, float("nan")])
def test_batch_norm_refuses_an_eps_the_other_norms_refuse(eps):
    x, ones = np.ones((2, 3), F32), np.ones(3, F32)
    refused(ArgumentError, "batch_norm: eps must be >= 0",
            lambda t: F.batch_norm(t.leaf(x), t.leaf(ones), t.leaf(ones), eps=eps))
    refused(ArgumentError, "batch_norm_inference: eps must be >= 0",
            lambda t: F.batch_norm_inference(t.leaf(x), *(t.leaf(ones) for _ in range(4)), eps=eps))


def test_linear_names_a_weight_that_is_not_a_matrix():
    x = np.ones((2, 3), F32)
    refused(ShapeError, r"linear: weight \[3\] must be rank 2, \[out_features, in_features\]",
            lambda t: F.linear(t.leaf(x), t.leaf(np.ones(3, F32))))


def test_softmax_takes_numpy_integer_axes_and_refuses_bools():
    x = np.arange(6, dtype=F32).reshape(2, 3)

    def both(t):
        value = t.leaf(x)
        return F.softmax(value, np.int64(1)), F.softmax(value, 1)

    network, (a, b) = Tape.record(both)
    run = network.forward(network.parameters())
    assert run[a].tobytes() == run[b].tobytes()
    refused(ArgumentError, "axis must be an int, got bool True", lambda t: F.log_softmax(t.leaf(x), True))


def test_selections_meet_the_opcodes_refusal_or_a_fix_that_exists():
    indices = topos.selection([0, 1, 2], extent=5)
    refused(ShapeError, "expected a float tensor", lambda t: F.rms_norm(t.input(indices)))
    refused(ShapeError, r"Dropout\(p=0.5\) masks float values, but the input \[3\] is index<5>, a selection",
            lambda t: nn.Dropout(0.5)(t.input(indices)))
    refused(ShapeError, r"is index<5>, a selection \(indices\); embed the indices first \(nn.Embedding\)",
            lambda t: nn.Linear(3, 4)(t.input(indices)))


@pytest.mark.parametrize("factory", [init.zeros, init.normal, init.kaiming_uniform, init.truncated_normal])
def test_an_initializer_factory_passed_uncalled_says_to_call_it(factory):
    refused(ArgumentError, rf"Linear: init=init.{factory.__name__} is the factory of an initializer, not one; "
                           rf"call it: init=init.{factory.__name__}\(...\)",
            lambda t: nn.Linear(3, 4, init=factory))


def test_dropout_masks_need_a_generator():
    with pytest.raises(ArgumentError, match="dropout_mask: pass a topos.init.Generator .* got int 5"):
        init.dropout_mask(5, 3, 0.5)

    def model(tape):
        dropout = nn.Dropout(0.5)
        dropout(tape.leaf(np.ones(3, F32)))
        with pytest.raises(ArgumentError, match=r"Dropout\(p=0.5\).mask_feeds: pass a topos.init.Generator"):
            dropout.mask_feeds(3)
        return tape.leaf(np.zeros((), F32))

    Tape.record(model)


# ---- the in-graph SGD and the optimizers -------------------------------------------------------


def _loss(tape):
    w = tape.parameter(np.ones((2, 2), F32), name="w")
    return w, (w * w).sum()


@pytest.mark.parametrize("rate", [None, float("nan"), -1.0, 0.0, True, "0.1", [0.1, 0.2]])
def test_sgd_refuses_a_rate_the_optimizers_refuse(rate):
    def model(tape):
        w, loss = _loss(tape)
        topos.sgd(tape, tape.differentiate(loss, [w]), rate)

    refused(ArgumentError, "sgd: the learning rate lr must be positive and finite", model)


def test_sgd_refuses_a_rate_its_parameters_cannot_hold_and_a_rate_value_of_rank_one():
    def overflowing(tape):
        w, loss = _loss(tape)
        topos.sgd(tape, tape.differentiate(loss, [w]), 1e39)

    refused(ArgumentError, r"sgd: the learning rate lr = 1e\+39: f32 holds magnitudes up to", overflowing)

    def ranked(tape):
        w, loss = _loss(tape)
        topos.sgd(tape, tape.differentiate(loss, [w]), tape.input(np.ones(2, F32)))

    refused(ShapeError, r"sgd: the learning rate %\d+ has shape \[2\]; pass a number or a rank-0 Value", ranked)


def test_sgd_and_record_refuse_adjoints_that_are_not_open_on_the_tape():
    def other_tape(tape):
        w, loss = _loss(tape)
        topos.sgd(Tape(), tape.differentiate(loss, [w]), 0.1)

    refused(SymbolError, "sgd: the adjoints were recorded on another tape", other_tape)

    def not_adjoints(tape):
        w, loss = _loss(tape)
        topos.sgd(tape, loss, 0.1)

    refused(ArgumentError, "sgd takes the Adjoints that tape.differentiate", not_adjoints)

    def detached(tape):
        w, loss = _loss(tape)
        return tape.differentiate(loss, [w])

    _, adjoints = Tape.record(detached)
    with pytest.raises(RecordingError, match="Adam.record: these adjoints are detached"):
        optim.Adam().record(adjoints)
    with pytest.raises(ArgumentError, match="Adam.record takes the Adjoints .* got list"):
        optim.Adam().record([])


def test_optimizers_step_only_parameter_tables():
    def model(tape):
        w, loss = _loss(tape)
        return loss

    network, loss = Tape.record(model)
    parameters = network.parameters()
    gradients = network.forward(parameters).backward(loss)
    for call in (lambda: optim.Adam().step({"w": np.ones((2, 2), F32)}, gradients),
                 lambda: optim.Adam().init({"w": np.ones((2, 2), F32)}), lambda: optim.SGD(0.1).layout(None)):
        with pytest.raises(FeedError, match="optimizers step a Parameters table .* got (dict|NoneType)"):
            call()
    with pytest.raises(ArgumentError, match=r"SGD.step: the learning rate lr = 1e\+39: f32 holds magnitudes"):
        optim.SGD(0.1).step(parameters, gradients, lr=1e39)


def test_updates_refuse_a_slot_twice_and_what_is_not_pairs():
    def model(tape):
        w, loss = _loss(tape)
        with pytest.raises(DifferentiationError, match=r"slots \[%0\] are updated twice"):
            topos.Updates([(w, w * 2.0), (w, w * 3.0)])
        with pytest.raises(ArgumentError, match="Updates takes .parameter, next value. pairs, got NoneType"):
            topos.Updates(None)
        return loss

    Tape.record(model)


# ---- topos.init ------------------------------------------------------------------------------


def test_draws_that_would_overflow_are_refused_and_take_nothing_from_the_stream():
    generator = init.Generator(0)
    for call, words in [
        (lambda: generator.uniform(4, -1.7e308, 1.7e308, np.float64), "high - low must be finite in float64"),
        (lambda: generator.uniform(4, -1e300, 1e300, F32), r"values as large as .*e\+299 do not fit float32"),
        (lambda: init.constant(1e300)(generator, (2,)), r"values as large as 1e\+300 do not fit float32"),
    ]:
        with pytest.raises(ArgumentError, match=words):
            call()
    assert generator.position == 0
    assert init.constant(1e300)(generator, (2,), np.float64).tolist() == [1e300, 1e300]


def test_gains_are_checked_where_they_are_given():
    with pytest.raises(ArgumentError, match="gain must be positive, got -1.0"):
        init.xavier_uniform(-1.0)
    with pytest.raises(ArgumentError, match="gain must be positive, got 0.0"):
        init.xavier_uniform(0.0)
    with pytest.raises(ArgumentError, match="gain must be non-negative, got -1.0"):
        init.xavier_normal(-1.0)
    assert not init.xavier_normal(0.0)(init.Generator(0), (2, 3)).any()
    with pytest.raises(ArgumentError, match=r"nonlinearity must be a name such as 'relu', got list \['tanh'\]"):
        init.calculate_gain(["tanh"])
