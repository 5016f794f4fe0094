"""Forward mode (JVP) as a reading of the spec: dual numbers replayed with Opcode.express.

topos has reverse mode built in. Forward mode needs no support from the
core: a payload class that speaks the recordable vocabulary (``Dual``
below) is replayed over a sealed network node by node, and every opcode
computes a primal and a tangent. The primal comes from the opcode itself
(``opcode.express``), so its bits are the oracle's; the tangent comes from
a small per-opcode JVP rule written in this file.

Three checks, printed by ``main()``:

1. On a small ReLU MLP with dyadic numbers, the JVP equals the dot product
   of the reverse-mode gradient with the tangent, bit for bit.
2. Forward over reverse (the tangent of the recorded gradient) equals
   reverse over reverse (``tape.vjp`` of the gradient), bit for bit: two
   Hessian-vector products.
3. On a tanh MLP, where rounding is unavoidable, the JVP agrees with the
   gradient's dot product to a few ulps; and the same Dual replayed over a
   tape's Values *records* the JVP as new nodes, whose bits equal the eager JVP.

Why dyadic inputs make equality exact: every parameter, input and tangent
is a multiple of 1/128 below 2 in magnitude, so it has at most 9
significant bits. add, sub, mul, matmul, sum and relu then produce numbers
whose significands stay far below float64's 53 bits, so no operation
rounds. Both modes compute the same exact real number, only in a different
order, and exact arithmetic does not care about order.

Run: python examples/forward_mode.py
"""

from __future__ import annotations

import numpy as np

import topos
from topos import Tape
from topos.recordable import Eager

# ---- the payload -------------------------------------------------------------------------------------


class Dual(topos.Recordable):
    """A (primal, tangent) pair of payloads; a tangent of None is an exact zero.

    The two halves are themselves recordable payloads: ``Eager`` arrays give
    an eager JVP; tape ``Value``s record the JVP as nodes. The rules below
    only use the recordable vocabulary, so they serve both.
    """

    __slots__ = ("primal", "tangent")

    def __init__(self, primal, tangent=None):
        self.primal = primal
        self.tangent = tangent

    @property
    def shape(self):
        return self.primal.shape

    @property
    def dtype(self):
        return self.primal.dtype

    def _express(self, opcode, operands, attributes):
        primals = [o.primal for o in operands]
        out = opcode.express(primals, attributes)  # the opcode's own bits
        tangents = [o.tangent for o in operands]
        return Dual(out, TANGENT_RULES[opcode.name](primals, tangents, out, **attributes))

    def _constant(self, array):
        return Dual(self.primal._constant(array))  # a constant's tangent is zero


# ---- JVP rules: the tangent of each opcode's output --------------------------------------------------


def _plus(*terms):
    """Sum of the terms that are not None (None when all are)."""
    present = [t for t in terms if t is not None]
    if not present:
        return None
    total = present[0]
    for t in present[1:]:
        total = total + t
    return total


def _times(tangent, factor):
    return None if tangent is None else tangent * factor


def _neg(tangent):
    return None if tangent is None else -tangent


def _linear(name):
    """A linear opcode pushes the tangent through itself (a selection operand stays primal)."""

    def rule(primals, tangents, out, **attributes):
        if tangents[0] is None:
            return None
        return topos.by_name(name).express([tangents[0], *primals[1:]], attributes)

    return rule


MAP_TANGENTS = {  # function -> (x, out, tangent) -> tangent of f(x)
    "exp": lambda x, out, t: t * out,
    "log": lambda x, out, t: t / x,
    "sqrt": lambda x, out, t: t / (out + out),
    "tanh": lambda x, out, t: t * (1 - out * out),
    "sin": lambda x, out, t: t * x.cos(),
    "cos": lambda x, out, t: -(t * x.sin()),
    "log1p": lambda x, out, t: t / (1 + x),
    "expm1": lambda x, out, t: t * (out + 1),
    "erf": lambda x, out, t: t * x.erf_derivative(),
    "erf_derivative": lambda x, out, t: -(t * (x + x) * out),
}


def _divided(tangent, divisor):
    return None if tangent is None else tangent / divisor


def _maximum(p, t, out):
    left = p[0].step(p[1])  # ties go left, as in the opcode
    return _plus(_times(t[0], left), _times(t[1], 1 - left))


def _log_softmax(p, t, out, axis):
    if t[0] is None:
        return None
    mean = (out.exp() * t[0]).sum_along(axis).broadcast_along(axis, p[0].shape[axis])
    return t[0] - mean  # d log_softmax = t - sum(softmax * t)


def _logsumexp(p, t, out, axis):
    if t[0] is None:
        return None
    softmax = (p[0] - out.broadcast_along(axis, p[0].shape[axis])).exp()
    return (softmax * t[0]).sum_along(axis)


TANGENT_RULES = {
    "add": lambda p, t, out: _plus(t[0], t[1]),
    "sub": lambda p, t, out: _plus(t[0], _neg(t[1])),
    "neg": lambda p, t, out: _neg(t[0]),
    "mul": lambda p, t, out: _plus(_times(t[0], p[1]), _times(t[1], p[0])),
    "div": lambda p, t, out: _divided(_plus(t[0], _neg(_times(t[1], out))), p[1]),
    "pow": lambda p, t, out: _plus(
        _times(t[0], p[1] * p[0] ** (p[1] - 1)),
        None if t[1] is None else t[1] * out * p[0].log(),  # no log(a) unless the exponent moves
    ),
    "maximum": _maximum,
    "step": lambda p, t, out: None,  # piecewise constant
    "map": lambda p, t, out, function: (
        None if t[0] is None else MAP_TANGENTS[function](p[0], out, t[0])
    ),
    "matmul": lambda p, t, out: _plus(
        None if t[0] is None else t[0] @ p[1], None if t[1] is None else p[0] @ t[1]
    ),
    "log_softmax": _log_softmax,
    "logsumexp": _logsumexp,
    **{
        name: _linear(name)
        for name in (
            "sum", "sum_along", "broadcast", "broadcast_along", "reshape", "permute",
            "narrow", "pad", "unfold", "fold", "gather", "scatter",
        )
    },
}


# ---- the replay --------------------------------------------------------------------------------------


def replay(network, source):
    """Walk the spec in recording order; ``source(node)`` gives each source's Dual."""
    values = {}
    for node in network.nodes():
        if node.is_source:
            values[node.index] = source(node)
        else:
            operands = [values[s.index] for s in node.operands]
            values[node.index] = node.opcode.express(operands, node.attributes)
    return values


def jvp(network, parameters, tangents, target, feeds=None):
    """Replay with Duals: (every node's Dual, target's value, target's directional derivative).

    ``tangents`` maps parameters (or inputs) to the direction; other sources get zero.
    """
    feeds = feeds or {}

    def source(node):
        if node.opcode.name == "parameter":
            array = parameters[node.symbol]
        elif node.opcode.name == "input":
            array = feeds.get(node.symbol, network.payload(node.symbol))
        else:
            array = network.payload(node.symbol)
        tangent = tangents.get(node.symbol)
        if tangent is None:
            return Dual(Eager(array, node.dtype))
        return Dual(Eager(array, node.dtype), Eager(np.asarray(tangent, node.dtype)))

    values = replay(network, source)
    out = values[target.index]
    zero = np.zeros(out.shape, out.dtype)
    return values, out.primal.array, zero if out.tangent is None else out.tangent.array


# ---- the demonstrations ------------------------------------------------------------------------------


def dyadic(rng, *shape):
    """Multiples of 1/8 in [-2, 2): at most five significant bits."""
    return rng.integers(-16, 16, shape) / 8.0


def mlp(activation, rng):
    """A 3-4-2 MLP with a squared-error loss, its recorded gradients and HVP, on one tape."""
    x0, y0 = dyadic(rng, 5, 3), dyadic(rng, 5, 2)
    shapes = [(3, 4), (1, 4), (4, 2), (1, 2)]
    initials = [dyadic(rng, *s) for s in shapes]
    initials[1] += 1 / 128  # x @ w1 is a multiple of 1/64: no pre-activation lands on relu's kink
    directions = [dyadic(rng, *s) for s in shapes]

    def model(tape):
        x, y = tape.input(x0), tape.input(y0)
        w1, b1, w2, b2 = (tape.parameter(p) for p in initials)
        hidden = activation(x @ w1 + b1.broadcast_to((5, 4)))
        error = hidden @ w2 + b2.broadcast_to((5, 2)) - y
        loss = (error * error).sum()
        adjoints = tape.differentiate(loss, [w1, b1, w2, b2])
        # reverse over reverse: the gradient contracted with the directions, differentiated
        terms = [(g * tape.leaf(d)).sum() for g, d in zip(adjoints.gradients, directions)]
        hvp = tape.differentiate(_plus(*terms), [w1, b1, w2, b2])
        return [w1, b1, w2, b2], loss, adjoints, hvp

    network, (weights, loss, adjoints, hvp) = Tape.record(model)
    return network, weights, loss, adjoints, hvp, dict(zip(weights, directions))


def reverse_dot(network, weights, loss, tangents) -> float:
    """<reverse-mode gradient, tangent> over every parameter."""
    gradients = network.forward(network.parameters()).backward(loss)
    return float(sum(np.sum(gradients[w] * tangents[w]) for w in weights))


def recorded_jvp(network, tangents, target):
    """The same Dual replayed over a reopened tape's Values: the JVP becomes new nodes."""
    tape = network.reopen()

    def source(node):
        tangent = tangents.get(node.symbol)
        return Dual(tape.resolve(node.symbol), None if tangent is None else tape.leaf(tangent))

    values = replay(network, source)
    recorded = tape.seal()
    run = recorded.forward(network.parameters().carried(recorded))
    return run[values[target.index].tangent.symbol]


def main() -> dict:
    rng = np.random.default_rng(7)
    results = {}

    network, weights, loss, adjoints, hvp, tangents = mlp(lambda z: z.relu(), rng)
    values, value, forward = jvp(network, network.parameters(), tangents, loss)
    backward = reverse_dot(network, weights, loss, tangents)
    results["dyadic"] = (float(forward), backward)
    print("forward mode as a reading of the spec (float64)")
    print(f"  relu MLP, dyadic:  JVP {float(forward)!r}   <gradient, tangent> {backward!r}   "
          f"bitwise equal: {float(forward) == backward}")

    # The tangent of each recorded gradient node is a Hessian-vector product.
    run = network.forward(network.parameters())
    over_reverse = [values[g.index].tangent.array for g in adjoints.gradients]
    reverse_reverse = [run[h] for h in hvp.gradients]
    same = all(np.array_equal(a, b) for a, b in zip(over_reverse, reverse_reverse))
    results["hvp"] = (over_reverse, reverse_reverse)
    print(f"  forward-over-reverse HVP == reverse-over-reverse HVP, bitwise: {same}")

    network, weights, loss, adjoints, hvp, tangents = mlp(lambda z: z.tanh(), rng)
    _, _, forward = jvp(network, network.parameters(), tangents, loss)
    backward = reverse_dot(network, weights, loss, tangents)
    relative = abs(float(forward) - backward) / abs(backward)
    recorded = recorded_jvp(network, tangents, loss)
    results["tanh"] = (float(forward), backward, relative)
    results["recorded"] = (forward, recorded)
    print(f"  tanh MLP:          JVP {float(forward)!r}   <gradient, tangent> {backward!r}   "
          f"relative difference {relative:.1e}")
    print(f"  tanh MLP, JVP recorded as nodes == eager JVP, bitwise: "
          f"{np.array_equal(recorded, forward)}")
    return results


if __name__ == "__main__":
    main()
