"""Forward mode: tangents pushed through a sealed spec by replaying it over dual numbers.

Reverse mode is built into topos (``topos/readings/differentiate.py``). Forward mode
is a second reading of the same spec, and it needs nothing from the core
beyond ``Opcode.express``: every node is replayed in recording order over a
:class:`Dual` payload, and each opcode computes a primal and a tangent.

* The primal comes from the opcode itself (``opcode.express`` over the
  primal payloads), so its bits are the oracle's.
* The tangent comes from one JVP rule per opcode, :data:`TANGENT_RULES`,
  written against the recordable vocabulary like the reverse rules are.
  A ``map`` function's rule is in :data:`MAP_TANGENTS`.

A Dual's halves are themselves recordable payloads. ``Eager`` arrays give
numbers (:func:`jvp`); tape ``Value``s record the tangent as new nodes
(``examples/forward_mode.py`` shows it). ``tests/test_forward_mode.py``
grades every rule against reverse mode and finite differences, and fails
when an opcode or a map function has no rule here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from topos.base.copies import own
from topos.base.element import is_element, short_name
from topos.base.errors import DifferentiationError, SymbolError
from topos.readings.differentiate import direction_array
from topos.readings.eager import Eager
from topos.readings.interpret import bind_feeds, bind_parameters, source_value
from topos.spec.opcodes import by_name
from topos.spec.opcodes.elementwise import log_of_base
from topos.spec.parameters import Parameters
from topos.spec.recordable import Recordable
from topos.spec.run import Run
from topos.spec.symbol import Symbol

# ---- the payload ----------------------------------------------------------------------------------------


class Dual(Recordable):
    """A primal and its tangent, two payloads of one shape; a tangent of None is an exact zero."""

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
        return Dual(out, _rule(opcode.name)(primals, tangents, out, **attributes))

    def _constant(self, array):
        return Dual(self.primal._constant(array))  # a constant's tangent is zero

    def __repr__(self) -> str:
        return f"Dual({self.primal!r}, {self.tangent!r})"


# ---- one JVP rule per opcode: (primals, tangents, output, **attributes) -> tangent or None -------------


def _plus(*terms):
    """The sum of the terms that are not None (None when all are)."""
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


def _linear(name: str) -> Callable[..., Any]:
    """A linear opcode pushes the tangent through itself; a selection operand stays primal."""

    def rule(primals, tangents, out, **attributes):
        if tangents[0] is None:
            return None
        return by_name(name).express([tangents[0], *primals[1:]], attributes)

    return rule


MAP_TANGENTS: Mapping[str, Callable[[Any, Any, Any], Any]] = {  # (x, out, tangent) -> tangent of f(x)
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
"""The tangent of each ``map`` function, keyed like ``topos.MAP_FUNCTIONS``."""


def _map(p, t, out, function):
    if t[0] is None:
        return None
    try:
        rule = MAP_TANGENTS[function]
    except KeyError:
        raise NotImplementedError(
            f"forward mode has no tangent for map function {function!r}; add one to MAP_TANGENTS "
            "in topos/readings/forward_mode.py"
        ) from None
    return rule(p[0], out, t[0])


def _maximum(p, t, out):
    left = p[0].step(p[1])  # ties go left, as in the opcode
    return _plus(_times(t[0], left), _times(t[1], 1 - left))


def _div(p, t, out):
    numerator = _plus(t[0], _neg(_times(t[1], out)))  # d(a / b) = (da - db * out) / b
    return None if numerator is None else numerator / p[1]


def _pow(p, t, out):
    moving_base = _times(t[0], p[1] * p[0] ** (p[1] - 1))
    moving_exponent = None if t[1] is None else t[1] * out * log_of_base(p[0])  # no log(a) unless b moves
    return _plus(moving_base, moving_exponent)


def _log_softmax(p, t, out, axis):
    if t[0] is None:
        return None
    mean = (out.exp() * t[0]).sum_along(axis).broadcast_along(axis, p[0].shape[axis])
    return t[0] - mean  # d log_softmax = t - sum(softmax * t)


def _logsumexp(p, t, out, axis):
    if t[0] is None:
        return None
    # softmax spelled exp(log_softmax(x)), as the reverse rule does: exp(x - out) loses the log at scale
    return (p[0].log_softmax(axis).exp() * t[0]).sum_along(axis)


TANGENT_RULES: Mapping[str, Callable[..., Any]] = {
    "add": lambda p, t, out: _plus(t[0], t[1]),
    "sub": lambda p, t, out: _plus(t[0], _neg(t[1])),
    "neg": lambda p, t, out: _neg(t[0]),
    "mul": lambda p, t, out: _plus(_times(t[0], p[1]), _times(t[1], p[0])),
    "div": _div,
    "pow": _pow,
    "maximum": _maximum,
    "step": lambda p, t, out: None,  # piecewise constant
    "map": _map,
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
"""The JVP rule of every non-source opcode: ``rule(primals, tangents, output, **attributes)``.

A tangent of None is an exact zero, and a rule returns None when its output's tangent is one.
"""


def _rule(name: str) -> Callable[..., Any]:
    try:
        return TANGENT_RULES[name]
    except KeyError:
        raise NotImplementedError(
            f"forward mode has no tangent rule for opcode {name!r}; add one to TANGENT_RULES in "
            "topos/readings/forward_mode.py (tests/test_forward_mode.py lists every opcode that needs one)"
        ) from None


# ---- the replay and the JVP -----------------------------------------------------------------------------


def replay(network, source: Callable[[Any], Recordable]) -> dict[int, Any]:
    """Replay the spec in recording order over a payload: node index -> that node's payload.

    ``source(node)`` gives each source node's payload; every other node is
    ``node.opcode.express`` over its operands' payloads.
    """
    values: dict[int, Any] = {}
    for node in network.nodes():
        if node.is_source:
            values[node.index] = source(node)
        else:
            operands = [values[s.index] for s in node.operands]
            values[node.index] = node.opcode.express(operands, node.attributes)
    return values


class Tangents:
    """The tangents of one JVP: ``tangents[symbol]`` is that node's derivative along the direction."""

    __slots__ = ("_network", "_arrays")

    def __init__(self, network, arrays: dict[int, np.ndarray]):
        self._network = network
        self._arrays = arrays

    @property
    def network(self):
        """The network whose nodes these tangents are indexed by."""
        return self._network

    def __getitem__(self, symbol) -> np.ndarray:
        """A read-only copy of the tangent at ``symbol`` (zeros where no direction reaches it)."""
        i = self._network.check(symbol)
        array = self._arrays.get(i)
        if array is not None:
            return own(array)
        spec = self._network.columns.specs[i]
        if not is_element(spec.dtype):
            raise SymbolError(f"{symbol!r} is a selection; selections have no tangent")
        return own(np.zeros(spec.shape, dtype=spec.dtype))

    def reached(self, symbol) -> bool:
        """True when the direction reaches ``symbol`` (its tangent was computed, not an exact zero)."""
        return self._network.check(symbol) in self._arrays

    def __repr__(self) -> str:
        return f"<Tangents: {len(self._arrays)} of {len(self._network)} nodes reached>"


def jvp(network, parameters, feeds, tangents) -> tuple[Run, Tangents]:
    """Forward mode over every node: the run's values and their tangents along a direction.

    ``tangents`` maps parameters and inputs (Symbols or names) to arrays of
    their shape and element type (Python numbers and lists are converted,
    a NumPy array of another type is refused): the direction. Sources it
    does not name have tangent zero.
    The run's values are ``network.forward(parameters, feeds)``'s bits; the
    tangent at a node is its Jacobian-vector product along the direction.
    """
    bound_parameters = bind_parameters(network, parameters)
    bound_feeds = bind_feeds(network, feeds)
    directions = _directions(network, tangents)

    def source(node):
        primal = Eager(source_value(network, node.index, bound_parameters, bound_feeds), node.dtype)
        direction = directions.get(node.index)
        return Dual(primal, None if direction is None else Eager(direction))

    duals = replay(network, source)
    values = {i: dual.primal.array for i, dual in duals.items()}
    arrays = {i: dual.tangent.array for i, dual in duals.items() if dual.tangent is not None}
    return Run(network, values), Tangents(network, arrays)


def _directions(network, tangents) -> dict[int, np.ndarray]:
    """Check each tangent against its source node: node index -> read-only array of its spec."""
    if tangents is not None and not isinstance(tangents, (Mapping, Parameters)):
        fix = ("; pair each with its direction: {symbol: array}" if isinstance(tangents, (list, tuple, set, Symbol))
               else "")
        raise DifferentiationError(
            f"jvp's tangents map parameters and inputs (Symbols or names) to arrays, the direction, got "
            f"{type(tangents).__name__}{fix}"
        )
    directions = {}
    for symbol, tangent in (tangents or {}).items():
        if isinstance(symbol, str):
            symbol = network.named(symbol)
        i = network.check(symbol, "tangent's symbol")
        kind, spec, site = network.columns.opcodes[i].name, network.columns.specs[i], network.columns.sites[i]
        if kind not in ("parameter", "input"):
            raise DifferentiationError(
                f"a tangent was given for {symbol!r}, a {kind} node (recorded at {site}); "
                "directions belong to parameters and inputs"
            )
        if not is_element(spec.dtype):
            raise DifferentiationError(
                f"a tangent was given for {symbol!r}, a selection (recorded at {site}); "
                "selections are indices and have no tangent"
            )
        array = direction_array(tangent, spec.dtype, f"the tangent of {symbol!r}", f"the {kind} recorded at {site}")
        if array.shape != spec.shape:
            raise DifferentiationError(
                f"the tangent of {symbol!r} has shape {list(array.shape)}, the node is "
                f"{list(spec.shape)} {short_name(spec.dtype)} (recorded at {site})"
            )
        directions[i] = own(array)
    return directions


__all__ = ["MAP_TANGENTS", "TANGENT_RULES", "Dual", "Tangents", "jvp", "replay"]
