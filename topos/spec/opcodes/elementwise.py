"""Elementwise opcodes: equal shapes in, the same shape out, no implicit broadcasting.

IEEE-exact ufuncs (add, subtract, multiply, divide, sqrt, comparisons) are
used as they are; every transcendental goes through ``refmath``. Arithmetic
runs in the element's compute type and is rounded once to the element.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from topos.base import refmath
from topos.base.element import compute_type, round_to
from topos.spec.opcodes.base import OUTPUT, Opcode, Refusal, Spec, element_operand, register, same_specs


def _binary(ufunc, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    work = compute_type(a.dtype)
    return round_to(ufunc(a.astype(work, copy=False), b.astype(work, copy=False)), a.dtype)


class _Binary(Opcode):
    arity = 2

    def infer(self, a: Spec, b: Spec) -> Spec:
        return same_specs(a, b)


@register
class Add(_Binary):
    """a + b."""

    name = "add"

    def kernel(self, a, b):
        return _binary(np.add, a, b)

    def rule(self, a, b, out, g):
        return g, g


@register
class Sub(_Binary):
    """a - b.

    The one documented exception to rule 4: ``a + (-b)`` has the same bits
    (negation is exact), but every reader and every backend expects a
    subtraction, and its adjoint reads better as one node than two.
    """

    name = "sub"

    def kernel(self, a, b):
        return _binary(np.subtract, a, b)

    def rule(self, a, b, out, g):
        return g, -g


@register
class Mul(_Binary):
    """a * b."""

    name = "mul"
    READS = frozenset({0, 1})

    def kernel(self, a, b):
        return _binary(np.multiply, a, b)

    def rule(self, a, b, out, g):
        return g * b, g * a


@register
class Div(_Binary):
    """a / b."""

    name = "div"
    READS = frozenset({1, OUTPUT})

    def kernel(self, a, b):
        return _binary(np.divide, a, b)

    def rule(self, a, b, out, g):
        return g / b, -(g * out) / b


@register
class Pow(_Binary):
    """a ** b elementwise, both tensors (C99 pow semantics)."""

    name = "pow"
    READS = frozenset({0, 1, OUTPUT})

    def kernel(self, a, b):
        return refmath.pow(a, b)

    def rule(self, a, b, out, g):
        return g * b * a ** (b - 1), g * out * log_of_base(a)


def log_of_base(a):
    """log(a) for pow's exponent derivative a**b * log(a), with 0 where a is zero (of either sign).

    There a**b * log(a) is 0 * -inf = NaN, while the derivative's limit is 0 for b > 0 (0**b is 0
    for every positive b); PyTorch and JAX give 0 there too. log(a + [a == 0]) is log(a) elsewhere,
    bit for bit (a + 0 == a).
    """
    zero = a.step(0.0) * (-a).step(0.0)  # 1 exactly where a == 0, else 0
    return (a + zero).log()


@register
class Maximum(_Binary):
    """The larger of a and b; ties (and a NaN on the left) go left."""

    name = "maximum"
    READS = frozenset({0, 1})

    def kernel(self, a, b):
        with np.errstate(invalid="ignore"):  # ml_dtypes warns on NaN comparisons
            return np.where((a >= b) | np.isnan(a), a, b)

    def rule(self, a, b, out, g):
        left = a.step(b)
        return g * left, g * (1 - left)


@register
class Step(_Binary):
    """1 where x >= threshold, else 0. Its derivative is zero, not undefined."""

    name = "step"

    def kernel(self, x, threshold):
        with np.errstate(invalid="ignore"):
            return (x >= threshold).astype(x.dtype)

    def rule(self, x, threshold, out, g):
        return None, None


@register
class Neg(Opcode):
    """-x."""

    name = "neg"
    arity = 1

    def infer(self, x: Spec) -> Spec:
        element_operand(x)
        return x

    def kernel(self, x):
        return np.negative(x)

    def rule(self, x, out, g):
        return (-g,)


# ---- map: one opcode, one parameter naming the function ---------------------------


def _sqrt(x: np.ndarray) -> np.ndarray:
    return round_to(np.sqrt(x.astype(compute_type(x.dtype), copy=False)), x.dtype)


@dataclass(frozen=True)
class MapFunction:
    """One unary function of ``map``: its reference forward, its rule, and what the rule reads."""

    forward: Callable[[np.ndarray], np.ndarray]
    rule: Callable  # (x, out, g) -> cotangent
    reads: frozenset


MAP_FUNCTIONS: dict[str, MapFunction] = {
    "exp": MapFunction(refmath.exp, lambda x, out, g: g * out, frozenset({OUTPUT})),
    "log": MapFunction(refmath.log, lambda x, out, g: g / x, frozenset({0})),
    "sqrt": MapFunction(_sqrt, lambda x, out, g: g / (out + out), frozenset({OUTPUT})),
    "tanh": MapFunction(refmath.tanh, lambda x, out, g: g * (1 - out * out), frozenset({OUTPUT})),
    "sin": MapFunction(refmath.sin, lambda x, out, g: g * x.cos(), frozenset({0})),
    "cos": MapFunction(refmath.cos, lambda x, out, g: -g * x.sin(), frozenset({0})),
    "log1p": MapFunction(refmath.log1p, lambda x, out, g: g / (1 + x), frozenset({0})),
    "expm1": MapFunction(refmath.expm1, lambda x, out, g: g * (out + 1), frozenset({OUTPUT})),
    "erf": MapFunction(refmath.erf, lambda x, out, g: g * x.erf_derivative(), frozenset({0})),
    "erf_derivative": MapFunction(
        refmath.erf_derivative, lambda x, out, g: -g * (x + x) * out, frozenset({0, OUTPUT})
    ),
}


@register
class Map(Opcode):
    """A unary function applied elementwise; ``function`` names which (see MAP_FUNCTIONS)."""

    name = "map"
    arity = 1
    attribute_names = ("function",)

    def reads(self, function):
        return MAP_FUNCTIONS[function].reads

    def infer(self, x: Spec, function) -> Spec:
        element_operand(x)
        if function not in MAP_FUNCTIONS:
            raise Refusal(
                f"unknown map function {function!r}",
                f"map functions are {', '.join(MAP_FUNCTIONS)}",
            )
        return x

    def kernel(self, x, function):
        return MAP_FUNCTIONS[function].forward(x)

    def rule(self, x, out, g, function):
        return (MAP_FUNCTIONS[function].rule(x, out, g),)
