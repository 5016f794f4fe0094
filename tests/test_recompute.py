"""The checkpointed backward (topos.readings.recompute): run.backward's gradients bit for bit, in less memory.

``recompute.backward`` keeps only segment boundaries in its forward sweep
and recomputes each segment during the backward scan. It is graded against
``network.forward`` followed by ``run.backward(target).parameters(...)``:

* every row of the opcode table, first and second order, in every element
  type and for several segment lengths: the same value and gradients,
  bit for bit. Each call also audits ``reads()``: a rule handed a value its
  opcode does not declare fails, so these rows check every rule's reads;
* a deep tanh MLP (and a residual one, whose skips cross segments): bit for
  bit, and a lower tracemalloc peak than the plain pair, with segments of
  about sqrt(n) nodes lower still than one segment;
* a ``reads()`` that leaves out a value its rule uses is named.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import topos
from topos import DifferentiationError, Tape
from topos.readings import recompute

from test_differentiate import CASES, DTYPES, assert_bitwise, record_case, short


def assert_same_as_plain(network, target, parameters=None, feeds=None, segment=None) -> None:
    parameters = network.parameters() if parameters is None else parameters
    run = network.forward(parameters, feeds)
    plain = run.backward(target).parameters(parameters)
    value, gradients = recompute.backward(network, parameters, feeds, target, segment=segment)
    assert_bitwise(value, run[target], "the target's value")
    assert gradients.symbols() == parameters.symbols()
    for symbol in parameters.symbols():
        assert_bitwise(gradients[symbol], plain[symbol], f"d {target!r} / d {symbol!r}, segment {segment}")


@pytest.mark.parametrize("dtype", DTYPES, ids=short)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradients_equal_the_plain_backward_bitwise_for_every_opcode(case, dtype):
    r = record_case(case, dtype, second_order=True)
    for target in (r.loss, r.second):
        for segment in (None, 1, 2):
            assert_same_as_plain(r.network, target, segment=segment)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_segment_length_gives_the_same_bits(case):
    r = record_case(case, topos.float32, second_order=True)
    for segment in range(1, len(r.network) + 1):
        assert_same_as_plain(r.network, r.second, segment=segment)


# ---- a deep MLP: the same bits in less memory -----------------------------------------------------------


def deep_mlp(layers: int, width: int, batch: int, residual: bool = False):
    """A tanh MLP of ``layers`` square layers over a fed batch, its mean square as the loss."""
    rng = np.random.default_rng(layers)

    def model(tape):
        x = tape.input(np.zeros((batch, width)))
        h = x
        for _ in range(layers):
            w = tape.parameter(rng.standard_normal((width, width)) / np.sqrt(width))
            b = tape.parameter(rng.standard_normal((1, width)) / 8)
            z = (h @ w + b.broadcast_to((batch, width))).tanh()
            h = h + z if residual else z
        return x, (h * h).mean()

    network, (x, loss) = Tape.record(model)
    return network, x, loss, {x: rng.standard_normal((batch, width))}


def peak_bytes(fn):
    """The most bytes ``fn()`` has allocated at once (tracemalloc; NumPy reports its buffers to it)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("residual", [False, True], ids=["chain", "residual"])
def test_a_deep_mlp_gets_the_plain_bits(residual):
    network, x, loss, feeds = deep_mlp(12, 8, 16, residual)
    for segment in (None, 3, 7, len(network)):
        assert_same_as_plain(network, loss, feeds=feeds, segment=segment)


def test_a_deep_mlp_peaks_lower_than_the_plain_backward():
    network, x, loss, feeds = deep_mlp(40, 32, 256)
    parameters = network.parameters()
    plain = peak_bytes(lambda: network.forward(parameters, feeds).backward(loss).parameters(parameters))
    segments = peak_bytes(lambda: recompute.backward(network, parameters, feeds, loss))
    whole = peak_bytes(lambda: recompute.backward(network, parameters, feeds, loss, segment=len(network)))
    figures = f"plain {plain / 2**20:.2f} MiB, sqrt(n) segments {segments / 2**20:.2f}, one segment {whole / 2**20:.2f}"
    assert segments < plain / 3, figures
    assert segments < whole, figures  # the recomputation itself pays, beyond reads() and freed cotangents


# ---- reads(), checked on every rule call ----------------------------------------------------------------


def test_a_rule_that_reads_an_undeclared_value_is_named(monkeypatch):
    network, x, loss, feeds = deep_mlp(2, 3, 4)
    monkeypatch.setattr(type(topos.by_name("matmul")), "READS", frozenset({1}))
    with pytest.raises(RuntimeError, match=r"rule of matmul used operand 0.*matmul.reads\(\) does not declare"):
        recompute.backward(network, network.parameters(), feeds, loss)


def test_misuse_is_refused():
    network, x, loss, feeds = deep_mlp(1, 3, 4)
    hidden = network.node(loss).operands[0]
    with pytest.raises(DifferentiationError, match=r"rank-0 target.*shape \[4, 3\]"):
        recompute.backward(network, network.parameters(), feeds, network.node(hidden).operands[0])
    picked, picks = Tape.record(lambda tape: tape.input(shape=(), extent=3, name="picks"))
    with pytest.raises(DifferentiationError, match=r"target %0 is a selection .*must be a float scalar"):
        recompute.backward(picked, picked.parameters(), {"picks": np.array(1)}, picks)
    for segment in (0, 2.0, True):
        with pytest.raises(topos.ArgumentError, match="segment must be a positive number of nodes"):
            recompute.backward(network, network.parameters(), feeds, loss, segment=segment)
