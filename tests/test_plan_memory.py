"""A plan's memory accounting against what NumPy really allocates (tracemalloc).

NumPy reports its data buffers to ``tracemalloc``, so the traced peak
during ``plan.forward`` is the real high-water mark of the run's arrays.
The plan predicts it from shapes: ``plan.peak()`` counts, just after each
step, the bytes of every computed value still live (sources are the
caller's and are not counted).

The bound checked is ``predicted <= measured <= predicted + margin`` with

    margin = max over the graph's kernels of that kernel's own footprint
             (its output plus its scratch), measured in isolation,
             + 256 KiB for Python objects and NumPy's small-buffer cache.

Why that margin: while node n runs, the live values are the plan's
``live before n``, plus n's kernel footprint (output + temporaries); the
plan counts only the output. Inside an elementwise chain a non in-place
link (``sqrt``) holds the previous link's buffer and its own output at
once, which is again at most one kernel footprint beyond the root the plan
counts. For the graphs here (IEEE-exact elementwise ops, the IEEE-exact
map ``sqrt``, and reference matmuls) the footprint is about two nodes: the
reference matmul keeps its accumulator and one product buffer of the
output's size. (refmath's transcendental maps are left out: they work in
chunks of ``refmath.CHUNK`` elements, so their scratch is a few dozen
chunk-sized temporaries whatever the node's size, measured below, but
their output is one more buffer than an in-place link's.)
The oracle (``network.forward``) retains everything, so it must measure
between ``retain-all`` and ``retain-all + margin``.
"""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest

from topos import Numerics, Tape
from topos.base import refmath
from topos.spec.opcodes import by_name

from conftest import generator

N = 512  # every large node is [512, 512] float64: 2 MiB
NODE = N * N * 8
SLACK = 256 * 1024


def _long_chain(tape):
    """Matmul, then eight rounds of elementwise work whose input stays live across the round, then matmul."""
    rng = generator("memory", "chain")
    p0 = tape.parameter(rng.standard_normal((N, N)) / np.sqrt(N))
    p1 = tape.parameter(rng.standard_normal((N, N)) / np.sqrt(N))
    shift = tape.parameter(rng.standard_normal((N, N)))
    h = p0 @ p1
    for _ in range(8):
        a = h * 0.5 + shift
        b = (a * a + 1.0).sqrt()
        h = (h / b).maximum(-h * 0.25)  # h is read again here: it stays live across the round
    return (h @ p1).sum_along(0)


@pytest.fixture(scope="module")
def chain():
    network, out = Tape.record(_long_chain)
    return network, out


def traced_peak(fn) -> tuple[int, object]:
    """Bytes allocated above the starting level at the high-water mark of ``fn()``, and its result."""
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        start = tracemalloc.get_traced_memory()[0]
        result = fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak - start, result


def kernel_footprint(network, run_values) -> int:
    """The largest single-kernel footprint (output + scratch) among the network's nodes, measured alone."""
    largest = 0
    seen = set()
    for node in network.nodes():
        if node.is_source:
            continue
        key = (node.opcode.name, tuple(node.attributes.items()), node.shape,
               tuple(run_values[o].shape for o in node.operands))
        if key in seen:
            continue
        seen.add(key)
        operands = [run_values[o] for o in node.operands]
        kernel, attributes = node.opcode.kernel, dict(node.attributes)
        footprint, _ = traced_peak(lambda: kernel(*operands, **attributes))  # noqa: B023  (called here, at once)
        largest = max(largest, footprint)
    return largest


@pytest.fixture(scope="module")
def margin(chain):
    network, out = chain
    oracle = network.forward(network.parameters())
    return kernel_footprint(network, oracle) + SLACK


def test_calibrated_margin_is_a_few_nodes(margin):
    """The graph's worst kernel is the reference matmul: accumulator plus one product buffer."""
    assert NODE <= margin <= 3 * NODE


@pytest.mark.parametrize("numerics", list(Numerics), ids=lambda n: n.name)
def test_measured_peak_matches_the_planned_peak(chain, margin, numerics):
    network, out = chain
    plan = network.entry([out], numerics=numerics).lower()
    parameters = network.parameters()
    predicted, at = plan.peak()
    measured, run = traced_peak(lambda: plan.forward(parameters))
    assert run[out].shape == (N,)
    assert predicted <= measured <= predicted + margin, (
        f"plan predicted a peak of {predicted} bytes (at node {at}), tracemalloc measured {measured}; "
        f"allowed margin {margin}\n{plan.describe()}"
    )


def test_planned_peak_is_far_below_retain_all(chain, margin):
    network, out = chain
    plan = network.entry([out], numerics=Numerics.EXACT).lower()
    predicted, _ = plan.peak()
    retain_all = plan.retain_all_bytes()
    assert retain_all >= 30 * NODE
    assert predicted + margin < retain_all / 4


def test_the_oracle_measures_near_retain_all(chain, margin):
    """network.forward keeps every value, so its real peak is the plan's retain-all figure."""
    network, out = chain
    plan = network.entry([out], numerics=Numerics.EXACT).lower()
    assert plan.schedule == tuple(range(len(network))), "the whole network is the closure here"
    retain_all = plan.retain_all_bytes()
    parameters = network.parameters()
    measured, run = traced_peak(lambda: network.forward(parameters))
    assert retain_all <= measured <= retain_all + margin


def test_refmath_scratch_is_chunk_sized_not_node_sized():
    """refmath's tanh (expm1 inside: its most temporaries) on a node: its output plus chunk-sized scratch.

    Over the whole array at once it held 9 to 30 node-sized temporaries;
    chunked, the scratch is bounded by the chunk, not by the node.
    """
    x = generator("memory", "tanh").standard_normal((N, N))
    footprint, _ = traced_peak(lambda: by_name("map").kernel(x, function="tanh"))
    chunk_bytes = refmath.CHUNK * 8
    assert NODE <= footprint <= NODE + 48 * chunk_bytes, (footprint, NODE, chunk_bytes)
    assert 48 * chunk_bytes < NODE  # the bound means something: the node is larger than the whole scratch


def test_a_narrow_window_does_not_keep_its_operand_alive():
    """A kept window of a large dead value must not pin the large buffer past its planned free."""

    def model(tape):
        big = tape.parameter(np.ones((N, N))) * 2.0
        return big.narrow(0, 0, 1)  # the first row: a contiguous window

    network, corner = Tape.record(model)
    plan = network.entry([corner], numerics=Numerics.EXACT).lower()
    parameters = network.parameters()
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        run = plan.forward(parameters)
        held = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert np.all(run[corner] == 2.0)
    assert held < NODE / 4, f"the finished run still holds {held} bytes for a {N * 8}-byte result"


def test_a_narrow_window_is_its_own_buffer():
    x = np.arange(12.0).reshape(3, 4)
    for axis in (0, 1):
        window = by_name("narrow").kernel(x, axis=axis, start=1, length=1)
        assert not np.shares_memory(window, x)
