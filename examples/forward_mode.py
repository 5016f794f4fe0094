"""Forward mode (JVP) as a reading of the spec: dual numbers replayed with Opcode.express.

topos has reverse mode built in. Forward mode needs no support from the
core: ``topos.readings.forward_mode`` replays a sealed network node by node over a
``Dual`` payload, and every opcode computes a primal and a tangent. The
primal comes from the opcode itself (``opcode.express``), so its bits are
the oracle's; the tangent comes from the opcode's JVP rule
(``topos.readings.forward_mode.TANGENT_RULES``). This file is a user of that module.

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

from topos import Tape
from topos.readings import forward_mode
from topos.readings.forward_mode import Dual, replay


def jvp(network, parameters, tangents, target):
    """(the run, the target's value, the target's directional derivative along ``tangents``)."""
    run, derivatives = forward_mode.jvp(network, parameters, None, tangents)
    return run, run[target], derivatives[target]


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
        hvp = tape.differentiate(sum(terms[1:], terms[0]), [w1, b1, w2, b2])
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
    _, _, forward = jvp(network, network.parameters(), tangents, loss)
    backward = reverse_dot(network, weights, loss, tangents)
    results["dyadic"] = (float(forward), backward)
    print("forward mode as a reading of the spec (float64)")
    print(f"  relu MLP, dyadic:  JVP {float(forward)!r}   <gradient, tangent> {backward!r}   "
          f"bitwise equal: {float(forward) == backward}")

    # The tangent of each recorded gradient node is a Hessian-vector product.
    run, derivatives = forward_mode.jvp(network, network.parameters(), None, tangents)
    over_reverse = [derivatives[g] for g in adjoints.gradients]
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
