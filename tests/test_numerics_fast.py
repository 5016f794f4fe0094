"""FAST plans: BLAS and native math, each kernel within its declared envelope of the oracle.

``topos/readings/plan/numerics.py`` declares, next to every fast kernel, how far it
may stray from the reference kernel: ``|fast - exact| <= ulps * eps *
scale + tiny``. One checker here (``check_node``) applies that envelope
per node type, with ``scale`` defined per opcode:

* maps (exp, log, tanh, sin, cos, log1p, expm1) and pow: ``|exact|``;
* matmul: ``k * (|a| @ |b|)`` (term count times the sum of |terms|);
* sum / sum_along: the extent summed times the sum of ``|x|``;
* log_softmax: ``n * (|x - max| + log S + 1)`` and logsumexp
  ``n * (|max| + log S + 1)``, where ``S = sum(exp(x - max))`` along the
  axis: the result adds ``x - max`` (or ``max``) and ``log S``, and the
  ``+ 1`` is the sum of |terms| of ``S`` relative to ``S`` itself, which
  is what a reordered or natively exponentiated sum perturbs ``log S`` by.

Every node without a fast kernel must match the reference kernel bit for
bit. Whole graphs are checked node by node (each node's FAST value
against the reference kernel applied to the FAST operands), after showing
that observing every node does not change the FAST bits of the roots.
The checker is shown to fail on a violated envelope, and FAST is shown to
differ from EXACT (so the envelope is not vacuously met by equal bits).
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

import topos
from topos import Numerics, Tape
from topos.readings.plan.numerics import FAST_KERNELS, accumulation_scale, envelope_for

from conftest import ELEMENT_IDS, ELEMENTS, generator


def _finfo(dtype):
    return ml_dtypes.finfo(dtype) if dtype == topos.bfloat16 else np.finfo(dtype)


def _scale(name: str, attributes: dict, operands, exact: np.ndarray, accumulates: bool) -> np.ndarray:
    """The magnitude the envelope is proportional to, per opcode (see the module docstring)."""
    if not accumulates:
        return np.abs(exact.astype(np.float64))
    return accumulation_scale(name, attributes, operands)


def envelope_violations(node, operands, fast: np.ndarray) -> str | None:
    """None if ``fast`` is within node's declared envelope of the reference kernel, else why not."""
    attributes = dict(node.attributes)
    function = attributes.get("function")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        exact = np.asarray(node.opcode.kernel(*operands, **attributes))
        envelope = envelope_for(node.opcode.name, function)
        if envelope is None:
            if exact.shape == fast.shape and exact.tobytes() == np.ascontiguousarray(fast).tobytes():
                return None
            return f"node {node.index} ({node.opcode.name}) has no fast kernel but differs from the reference bits"
        info = _finfo(node.dtype)
        scale = _scale(node.opcode.name, attributes, operands, exact, envelope.accumulates)
        bound = envelope.ulps * float(info.eps) * scale + float(info.tiny)
        got, want = fast.astype(np.float64), exact.astype(np.float64)
        same = (got == want) | (np.isnan(got) & np.isnan(want))
        bad = ~same & ~(np.abs(got - want) <= bound)
    if not bad.any():
        return None
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    return (
        f"node {node.index} ({node.opcode.name}{':' + function if function else ''}, "
        f"{np.dtype(node.dtype).name}): {int(bad.sum())} of {bad.size} elements outside "
        f"{envelope.ulps} ulps; first at {where}: fast {got[where]!r}, exact {want[where]!r}, "
        f"bound {bound[where]:.3g}"
    )


def check_node(node, operands, fast) -> None:
    problem = envelope_violations(node, operands, fast)
    assert problem is None, problem


def check_fast_graph(network, roots, parameters, feeds=None) -> topos.Run:
    """Run FAST with every node observed and check each node's envelope; return the observed run."""
    every = [n.symbol for n in network.nodes()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        observed = network.entry(roots, observe=every, numerics=Numerics.FAST).lower().forward(parameters, feeds)
        declared = network.entry(roots, numerics=Numerics.FAST).lower().forward(parameters, feeds)
    for root in roots:  # fusion and liveness do not change FAST bits either
        assert declared[root].tobytes() == observed[root].tobytes()
    for node in network.nodes():
        if not node.is_source:
            check_node(node, [observed[o] for o in node.operands], np.asarray(observed[node.symbol]))
    return observed


# ---- one opcode at a time ----------------------------------------------------------------------------

# key of FAST_KERNELS -> (how to record it over x (and y), domain of x, domain of y)
KERNEL_CASES = {
    "matmul": (lambda x, y: x @ y, (-3.0, 3.0), (-3.0, 3.0)),
    "sum": (lambda x, y: x.sum(), (-3.0, 3.0), None),
    "sum_along": (lambda x, y: x.sum_along(1), (-3.0, 3.0), None),
    "log_softmax": (lambda x, y: x.log_softmax(1), (-30.0, 30.0), None),
    "logsumexp": (lambda x, y: x.logsumexp(0), (-30.0, 30.0), None),
    "pow": (lambda x, y: x ** y, (0.05, 8.0), (-6.0, 6.0)),
    "map:exp": (lambda x, y: x.exp(), (-60.0, 60.0), None),
    "map:log": (lambda x, y: x.log(), (1e-6, 1e6), None),
    "map:tanh": (lambda x, y: x.tanh(), (-8.0, 8.0), None),
    "map:sin": (lambda x, y: x.sin(), (-40.0, 40.0), None),
    "map:cos": (lambda x, y: x.cos(), (-40.0, 40.0), None),
    "map:log1p": (lambda x, y: x.log1p(), (-0.9, 50.0), None),
    # Near zero, where expm1 is delicate: a libm expm1 (NumPy's path on CPUs without AVX-512)
    # and refmath both round well, and over [-40, 40] they agreed on all 960 points of one machine.
    "map:expm1": (lambda x, y: x.expm1(), (-0.35, 0.35), None),
}


def test_every_fast_kernel_has_a_case():
    assert set(KERNEL_CASES) == set(FAST_KERNELS)


def _kernel_network(key, dtype):
    record, x_domain, y_domain = KERNEL_CASES[key]
    rng = generator("fast", key, str(dtype))
    x = rng.uniform(*x_domain, (24, 40)).astype(dtype)
    if key == "matmul":
        y = rng.uniform(*y_domain, (40, 16)).astype(dtype)
    elif y_domain is not None:
        y = rng.uniform(*y_domain, x.shape).astype(dtype)
    else:
        y = None

    def model(tape):
        xv = tape.input(x)
        yv = tape.input(y) if y is not None else None
        return record(xv, yv)

    return Tape.record(model)


@pytest.mark.parametrize("element", ELEMENTS, ids=ELEMENT_IDS)
@pytest.mark.parametrize("key", sorted(KERNEL_CASES))
def test_fast_kernel_is_within_its_declared_envelope(key, element):
    network, out = _kernel_network(key, element)
    check_fast_graph(network, [out], network.parameters())


@pytest.mark.parametrize("element", [topos.float32, topos.float64], ids=["f32", "f64"])
def test_every_fast_kernel_changes_some_bits(element):
    """Each swap is real: on these operands FAST and EXACT disagree somewhere, for every fast kernel."""
    same = []
    for key in sorted(KERNEL_CASES):
        network, out = _kernel_network(key, element)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            fast = network.entry([out], numerics=Numerics.FAST).lower().forward(network.parameters())[out]
            exact = network.entry([out], numerics=Numerics.EXACT).lower().forward(network.parameters())[out]
        if fast.tobytes() == exact.tobytes():
            same.append(key)
    assert not same, f"FAST reproduced the oracle's bits for {same}"


def test_fast_matmul_is_blas_and_native_maps_are_numpys():
    """FAST really runs NumPy's own paths: its bits are ``a @ b`` and ``np.exp``."""
    rng = generator("fast", "native")
    a = (rng.standard_normal((64, 784)) / 28).astype(np.float32)
    b = rng.standard_normal((784, 128)).astype(np.float32)

    def model(tape):
        x, w = tape.input(a), tape.parameter(b)
        product = x @ w
        return product, product.exp()

    network, (product, exp) = Tape.record(model)
    run = network.entry([product, exp]).lower().forward(network.parameters())  # FAST is the default
    assert run[product].tobytes() == (a @ b).tobytes()
    assert run[exp].tobytes() == np.exp(a @ b).tobytes()


def test_fast_differs_from_exact_bits_and_stays_within_the_envelope():
    """The test has teeth: BLAS reorders the 784-term sums, so some bits change (within the envelope)."""
    rng = generator("fast", "teeth")
    a = rng.standard_normal((64, 784)).astype(np.float32)
    b = rng.standard_normal((784, 128)).astype(np.float32)

    def model(tape):
        return tape.input(a) @ tape.parameter(b)

    network, product = Tape.record(model)
    fast = network.entry([product], numerics=Numerics.FAST).lower().forward(network.parameters())[product]
    exact = network.entry([product], numerics=Numerics.EXACT).lower().forward(network.parameters())[product]
    assert exact.tobytes() == network.forward(network.parameters())[product].tobytes()
    differing = np.count_nonzero(fast != exact)
    assert differing > 0, "FAST matmul gave the oracle's bits: nothing here would catch a loose envelope"
    check_node(network.node(product), [a, b], fast)


def test_the_checker_rejects_a_violated_envelope():
    network, out = _kernel_network("matmul", topos.float32)
    run = network.entry([out], numerics=Numerics.FAST).lower().forward(network.parameters())
    node = network.node(out)
    operands = [network.payload(o) for o in node.operands]
    fast = np.array(run[out])
    check_node(node, operands, fast)
    exact = node.opcode.kernel(*operands)
    bound = 2.0 * np.finfo(np.float32).eps * 40 * (np.abs(operands[0]).astype(np.float64) @ np.abs(operands[1]))
    fast[3, 5] = np.float32(exact[3, 5] + 1.5 * bound[3, 5])
    assert "outside 2.0 ulps; first at (3, 5)" in envelope_violations(node, operands, fast)
    tanh_network, tanh_out = _kernel_network("map:tanh", topos.float64)
    tanh_node = tanh_network.node(tanh_out)
    x = tanh_network.payload(tanh_node.operands[0])
    nudged = np.array(tanh_node.opcode.kernel(x, function="tanh"))
    nudged[0, 0] = nudged[0, 0] * (1 + 8 * np.finfo(np.float64).eps)
    assert envelope_violations(tanh_node, [x], nudged) is not None
    exact_only = Tape.record(lambda tape: tape.input(x) * 2.0)
    node = exact_only[0].node(exact_only[1])
    assert "no fast kernel" in envelope_violations(node, [x, np.full_like(x, 2.0)], np.nextafter(x * 2.0, np.inf))


# ---- whole graphs ------------------------------------------------------------------------------------


def _mlp(dtype, sizes=(64, 48, 10), batch=16):
    """A tanh MLP with log_softmax cross-entropy and its recorded gradients."""
    rng = generator("fast", "mlp", str(dtype))

    def model(tape):
        x = tape.input(rng.standard_normal((batch, sizes[0])).astype(dtype))
        labels = rng.integers(0, sizes[-1], batch)
        targets = tape.input(np.eye(sizes[-1])[labels].astype(dtype))
        parameters, h = [], x
        for k, (m, n) in enumerate(zip(sizes[:-1], sizes[1:])):
            w = tape.parameter((rng.standard_normal((m, n)) / np.sqrt(m)).astype(dtype))
            b = tape.parameter((rng.standard_normal((n,)) * 0.1).astype(dtype))
            parameters += [w, b]
            h = h @ w + b.broadcast_along(0, batch)
            if k < len(sizes) - 2:
                h = h.tanh()
        loss = -(h.log_softmax(1) * targets).sum() / float(batch)
        return tape.differentiate(loss, parameters)

    network, adjoints = Tape.record(model)
    return network, adjoints.roots()


def _block(dtype, tokens=8, width=16):
    """A conv-less attention block: layer norm, softmax attention, a gated MLP, a logsumexp loss."""
    rng = generator("fast", "block", str(dtype))

    def model(tape):
        x = tape.input(rng.standard_normal((tokens, width)).astype(dtype))
        q, k, v, up = (tape.parameter((rng.standard_normal((width, width)) / 4).astype(dtype)) for _ in range(4))
        centered = x - x.mean_along(1).broadcast_along(1, width)
        variance = (centered * centered).mean_along(1) + 1e-5
        normed = centered / variance.sqrt().broadcast_along(1, width)
        scores = (normed @ q) @ (normed @ k).T * (1.0 / np.sqrt(width))
        attended = scores.softmax(1) @ (normed @ v)
        hidden = (attended @ up).sin() * (attended @ up).cos().exp() + attended.tanh().log1p()
        out = hidden.expm1() + (hidden * hidden + 1.0).log() ** 1.5
        loss = out.logsumexp(1).sum()
        return tape.differentiate(loss, [q, k, v, up])

    network, adjoints = Tape.record(model)
    return network, adjoints.roots()


@pytest.mark.parametrize("element", ELEMENTS, ids=ELEMENT_IDS)
@pytest.mark.parametrize("graph", [_mlp, _block], ids=["mlp", "attention_block"])
def test_whole_graph_fast_plan_is_within_envelopes_node_by_node(graph, element):
    network, roots = graph(element)
    observed = check_fast_graph(network, roots, network.parameters())
    oracle = network.forward(network.parameters())
    # End to end the errors compound, but a training step must still point the same way.
    loss = roots[0]
    np.testing.assert_allclose(
        observed[loss].astype(np.float64), oracle[loss].astype(np.float64),
        rtol=50 * float(_finfo(element).eps), atol=float(_finfo(element).eps),
    )
    for gradient in roots[1:]:
        fast, exact = observed[gradient].astype(np.float64), oracle[gradient].astype(np.float64)
        cosine = np.sum(fast * exact) / (np.linalg.norm(fast) * np.linalg.norm(exact))
        assert cosine > 0.99
