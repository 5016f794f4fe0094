"""Gradient checking: the backward scan graded against float64 finite differences.

``check_gradients(network, parameters, feeds, target)`` answers two
questions about every parameter (or fed input) the target depends on:

1. *Are the derivative rules right?*  Every node of the spec is replayed
   with ``Opcode.express`` over float64 arrays (the *float64 twin*: the
   same opcodes, attributes and recorded constants, with every float
   source widened exactly to float64). Central finite differences of the
   twin's target are compared with a reverse scan of the twin written with
   ``Opcode.vjp``. Both sides are float64, so this check is tight whatever
   the network's element type.
2. *How far are the network's own gradients from the truth?*
   ``run.backward(target)`` in the network's element type is compared with
   the same finite differences, under an envelope that the element type
   sets (:data:`TOLERANCES`).

Why a twin instead of finite differences in the network's own type: a
float32 difference quotient loses about half of its 24 bits to
cancellation, and a bfloat16 one loses all 8, so it cannot grade a
gradient. Widening is exact, so the twin evaluates the very function the
spec records (including its float32-rounded constants) without rounding
it again at every step. Topos has no cast opcode, so the float nodes
connected to a target all share its element type.

Finite differences use Richardson extrapolation of central differences,
``(4 D(h/2) - D(h)) / 3`` with ``D(h) = (f(x + h) - f(x - h)) / 2h``,
whose error is O(h^4); ``h = step * max(1, |x|)``, and each quotient
divides by the distance between the two rounded points actually used.
Keep inputs farther than ``h`` from kinks (relu, abs, maximum ties, step
thresholds): a difference quotient across a kink is not a derivative.

The error of one parameter is *norm-wise relative*: the largest
elementwise difference divided by the largest magnitude either gradient
reaches in that parameter. Elements with small gradients are therefore
judged against the parameter's scale, which keeps roundoff in
near-zero entries from reading as failure.

Second order needs nothing special: when the target is built from
recorded gradients (``sum(gradient * v)``), the twin replays the gradient
nodes too, and the check compares Hessian-vector products.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from topos.base.element import bfloat16, float32, float64, is_element, short_name
from topos.base.errors import ArgumentError, DifferentiationError, ToposError
from topos.base.provenance import Site
from topos.readings.differentiate import scalar_target
from topos.readings.interpret import bind_feeds, bind_parameters, source_value
from topos.spec.symbol import Symbol

TOLERANCES: Mapping[np.dtype, float] = MappingProxyType({
    # float64: over the opcode table the finite differences agree with the
    # scan to about 1e-11; the margin covers steeper functions than those.
    float64: 1e-7,
    # float32 / bfloat16: the backward scan rounds every intermediate to the
    # element type, a few ulps per node on a short chain (2^-24, 2^-8).
    float32: 1e-4,
    bfloat16: 5e-2,
})
"""Default envelope, per element type, for the network's own gradients."""

DEFAULT_STEP = 2.0**-10
"""Default relative finite-difference step (Richardson uses it and its half)."""


class GradientCheckError(ToposError, AssertionError):
    """Backward-scan gradients disagree with finite differences beyond the tolerance."""


@dataclass(frozen=True)
class GradientEntry:
    """One checked parameter or input: how far its gradients are from finite differences."""

    symbol: Symbol
    kind: str  # "parameter" or "input"
    shape: tuple[int, ...]
    site: Site
    error: float  # the network's backward scan vs float64 finite differences
    rule_error: float  # the float64 twin's reverse scan vs the same finite differences
    largest: float  # the largest |finite difference| in this entry
    worst_element: tuple[int, ...]
    backward_at_worst: float
    finite_difference_at_worst: float
    name: str | None = None  # the slot's or input's recorded name, if it has one

    @property
    def label(self) -> str:
        """``%0 w``: the symbol, and the name where there is one."""
        return repr(self.symbol) if self.name is None else f"{self.symbol!r} {self.name}"


class GradientReport:
    """The outcome of :func:`check_gradients`: one entry per wrt, a verdict, a table."""

    def __init__(self, target, dtype, step, tolerance, rule_tolerance, entries):
        self.target = target
        self.dtype = dtype
        self.step = step
        self.tolerance = tolerance
        self.rule_tolerance = rule_tolerance
        self.entries: tuple[GradientEntry, ...] = tuple(entries)

    def passed(self, entry: GradientEntry) -> bool:
        """True when ``entry`` is within both tolerances."""
        return entry.error <= self.tolerance and entry.rule_error <= self.rule_tolerance

    @property
    def ok(self) -> bool:
        """True when every entry is within both tolerances."""
        return all(self.passed(e) for e in self.entries)

    @property
    def worst(self) -> GradientEntry | None:
        """The entry farthest outside (or closest to) its tolerances."""
        if not self.entries:
            return None
        tiny = np.finfo(np.float64).tiny  # a zero tolerance still ranks entries

        def excess(e: GradientEntry) -> float:
            return max(e.error / max(self.tolerance, tiny), e.rule_error / max(self.rule_tolerance, tiny))

        return max(self.entries, key=excess)

    @property
    def worst_error(self) -> float:
        """The largest error of the network's own gradients over all entries."""
        return max((e.error for e in self.entries), default=0.0)

    @property
    def worst_rule_error(self) -> float:
        """The largest error of the float64 twin's gradients over all entries."""
        return max((e.rule_error for e in self.entries), default=0.0)

    def assert_ok(self) -> GradientReport:
        """Raise GradientCheckError naming the worst parameter unless every entry passes."""
        if self.ok:
            return self
        e = self.worst
        assert e is not None
        failed = [f"{x.kind} {x.label}" for x in self.entries if not self.passed(x)]
        raise GradientCheckError(
            f"gradient check of {self.target!r} failed for {', '.join(failed)}; worst is "
            f"{e.kind} {e.label} {list(e.shape)} (recorded at {e.site}): "
            f"relative error {e.error:.2e} (tolerance {self.tolerance:.0e} for "
            f"{short_name(self.dtype)}), float64 rule error {e.rule_error:.2e} "
            f"(tolerance {self.rule_tolerance:.0e}); at element {list(e.worst_element)} the "
            f"backward scan gives {e.backward_at_worst:.9g}, finite differences "
            f"{e.finite_difference_at_worst:.9g}.\n"
            "If the rule error is small, the element type's rounding is the cause; if both "
            "are large, check the derivative rules on this path, or move inputs away from "
            "kinks (relu, abs, maximum ties, step thresholds).\n" + str(self)
        )

    HEADER = ("wrt", "kind", "shape", "max |grad|", "error", "f64 rule error", "verdict")

    def rows(self) -> list[tuple[str, ...]]:
        """One row of text per entry, in ``HEADER``'s columns: what ``str`` and the Jupyter card show."""
        return [(e.label, e.kind, str(list(e.shape)), f"{e.largest:.3e}", f"{e.error:.2e}", f"{e.rule_error:.2e}",
                 "ok" if self.passed(e) else "FAIL") for e in self.entries]

    def __str__(self) -> str:
        header, rows = self.HEADER, self.rows()
        widths = [max(len(r[c]) for r in (header, *rows)) for c in range(len(header))]
        lines = [
            f"gradient check of {self.target!r}: {short_name(self.dtype)} backward scan vs float64 "
            f"finite differences (Richardson, step {_format_step(self.step)})",
            "  " + "  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip(),
        ]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.append(
            f"tolerance {self.tolerance:.0e} ({short_name(self.dtype)}), "
            f"float64 rule tolerance {self.rule_tolerance:.0e}: {'ok' if self.ok else 'FAILED'}"
        )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"<GradientReport of {self.target!r}: {len(self.entries)} entries, "
            f"worst error {self.worst_error:.2e}, {'ok' if self.ok else 'FAILED'}>"
        )

    def _repr_html_(self) -> str:
        from topos.views.display import gradient_report_card  # the Jupyter card, loaded only when a notebook asks

        return gradient_report_card(self)


def check_gradients(
    network,
    parameters,
    feeds,
    target: Symbol,
    *,
    wrt: Sequence[Symbol] | Symbol | None = None,
    step: float | None = None,
    tolerance: float | None = None,
    rule_tolerance: float | None = None,
) -> GradientReport:
    """Grade ``run.backward(target)`` against float64 finite differences -> GradientReport.

    ``wrt`` lists parameters and/or inputs, or names one (default: every parameter).
    ``tolerance`` bounds the network's own gradients (default by element
    type, see :data:`TOLERANCES`); ``rule_tolerance`` bounds the float64
    twin's (default: the float64 tolerance, or ``tolerance`` for a float64
    network, where the two computations are the same).
    """
    t = scalar_target(network, target)
    dtype = network.columns.specs[t].dtype
    step = DEFAULT_STEP if step is None else _positive("step", step)
    if tolerance is None and dtype not in TOLERANCES:
        raise ArgumentError(f"check_gradients has no default tolerance for {short_name(dtype)}, an element type "
                            "registered outside topos: pass tolerance= (the relative error its gradients may reach)")
    tolerance = TOLERANCES[dtype] if tolerance is None else _positive("tolerance", tolerance)
    if rule_tolerance is None:
        rule_tolerance = tolerance if dtype == float64 else TOLERANCES[float64]
    else:
        rule_tolerance = _positive("rule_tolerance", rule_tolerance)
    checked = _wrt_symbols(network, wrt)
    if not checked:
        raise DifferentiationError("check_gradients: wrt=[] names nothing to check, so the report would pass "
                                   "having checked nothing; leave wrt out to check every parameter")
    indices = [_wrt_index(network, w) for w in checked]
    repeated = sorted({i for i in indices if indices.count(i) > 1})
    if repeated:
        raise DifferentiationError(f"check_gradients: wrt names {', '.join(f'%{i}' for i in repeated)} more "
                                   "than once; list each symbol once")

    run = network.forward(parameters, feeds)
    gradients = run.backward(target)
    twin = _Twin(network, parameters, feeds, t)
    twin_gradients = twin.reverse_scan(indices)

    entries = []
    for symbol, i in zip(checked, indices):
        reference = twin.finite_differences(i, step)
        backward = np.asarray(gradients[symbol], dtype=np.float64)
        error, where = _relative_error(backward, reference)
        rule_error, _ = _relative_error(twin_gradients[i], reference)
        entries.append(
            GradientEntry(
                symbol=symbol,
                kind=network.columns.opcodes[i].name,
                shape=network.columns.specs[i].shape,
                site=network.columns.sites[i],
                error=error,
                rule_error=rule_error,
                largest=float(np.max(np.abs(reference))),
                worst_element=where,
                backward_at_worst=float(backward[where]),
                finite_difference_at_worst=float(reference[where]),
                name=network.columns.names.get(i),
            )
        )
    return GradientReport(target, dtype, step, tolerance, rule_tolerance, entries)


def _positive(name: str, value) -> float:
    """A step or tolerance: a finite number above 0 (a negative tolerance would fail every entry)."""
    number = float(value) if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)) else math.nan
    if not (math.isfinite(number) and number > 0):
        raise ArgumentError(f"check_gradients: {name} must be a finite number > 0, got {value!r}")
    return number


def _format_step(step: float) -> str:
    """A power-of-two step as 2^-k (how it is chosen), anything else as a number."""
    mantissa, exponent = math.frexp(step)
    return f"2^{exponent - 1}" if mantissa == 0.5 else f"{step:g}"


def _wrt_symbols(network, wrt) -> tuple:
    """``wrt`` as a tuple: every parameter when None, one Symbol or Value, or the ones a list names."""
    if wrt is None:
        return tuple(network.parameter_symbols())
    if isinstance(wrt, Symbol) or hasattr(wrt, "symbol"):  # one symbol or Value
        return (wrt,)
    if isinstance(wrt, str) or not isinstance(wrt, Iterable):  # a name would be iterated into letters
        fix = f"for the slot named {wrt!r} pass network.named({wrt!r})" if isinstance(wrt, str) else (
            "leave wrt out to check every parameter")
        raise DifferentiationError(f"check_gradients: wrt takes a parameter or input (its Symbol or Value) or a "
                                   f"list of them, got {type(wrt).__name__} {wrt!r}; {fix}")
    return tuple(wrt)


def _wrt_index(network, symbol) -> int:
    i = network.check(symbol, "wrt")
    kind = network.columns.opcodes[i].name
    if kind not in ("parameter", "input"):
        raise DifferentiationError(
            f"wrt {symbol!r} is a {kind} node (recorded at {network.columns.sites[i]}); "
            "check gradients with respect to parameters or inputs"
        )
    if not is_element(network.columns.specs[i].dtype):
        raise DifferentiationError(f"wrt {symbol!r} is a selection; selections have no gradient")
    return i


def _relative_error(computed: np.ndarray, reference: np.ndarray) -> tuple[float, tuple[int, ...]]:
    """Norm-wise relative error and the element where the difference peaks."""
    difference = np.abs(computed - reference)
    where = tuple(int(k) for k in np.unravel_index(int(np.argmax(difference)), difference.shape))
    scale = max(float(np.max(np.abs(computed))), float(np.max(np.abs(reference))))
    worst = float(difference[where])
    if math.isnan(worst) or np.isnan(computed).any() or np.isnan(reference).any():
        return math.inf, where
    return (worst / scale if scale > 0 else 0.0), where


class _Twin:
    """The spec replayed over float64 arrays with ``Opcode.express``: the ancestors of one target."""

    def __init__(self, network, parameters, feeds, target: int):
        self._network = network
        self._target = target
        bound_parameters = bind_parameters(network, parameters)
        bound_feeds = bind_feeds(network, feeds)
        self._order = _ancestors(network, target)
        self._values: dict[int, np.ndarray] = {}
        for i in self._order:
            if network.columns.opcodes[i].is_source:
                self._values[i] = _widen(source_value(network, i, bound_parameters, bound_feeds))
            else:
                self._values[i] = self._express(i, self._values)

    def _express(self, i: int, values) -> np.ndarray:
        network = self._network
        operands = [values[j] for j in network.columns.operands[i]]
        return np.asarray(network.columns.opcodes[i].express(operands, dict(network.columns.attributes[i])))

    def _target_at(self, source: int, array: np.ndarray, dependents: list[int]) -> float:
        values = dict(self._values)
        values[source] = array
        for i in dependents:
            values[i] = self._express(i, values)
        return float(values[self._target])

    def finite_differences(self, source: int, step: float) -> np.ndarray:
        """d target / d source by Richardson-extrapolated central differences (float64)."""
        base = self._values.get(source)
        shape = self._network.columns.specs[source].shape
        if base is None:  # not an ancestor of the target: the derivative is exactly zero
            return np.zeros(shape)
        reached, dependents = {source}, []
        for i in self._order:  # only the nodes downstream of ``source`` change
            if i > source and any(j in reached for j in self._network.columns.operands[i]):
                reached.add(i)
                dependents.append(i)
        out = np.zeros(shape)
        for element in np.ndindex(*shape):
            x = float(base[element])

            def quotient(h: float, element=element, x=x) -> float:
                plus, minus = base.copy(), base.copy()
                plus[element], minus[element] = x + h, x - h
                span = (x + h) - (x - h)
                up = self._target_at(source, plus, dependents)
                down = self._target_at(source, minus, dependents)
                return (up - down) / span

            h = step * max(1.0, abs(x))
            out[element] = (4.0 * quotient(h / 2) - quotient(h)) / 3.0
        return out

    def reverse_scan(self, sources: Sequence[int]) -> dict[int, np.ndarray]:
        """d target / d each source by the derivative rules over float64 arrays (``Opcode.vjp``)."""
        network = self._network
        wanted = set(sources)
        flows: dict[int, Any] = {}
        for i in self._order:
            operands = network.columns.operands[i]
            flows[i] = i in wanted or any(flows[j] for j in operands)
        cotangents: dict[int, np.ndarray] = {self._target: np.ones(())}
        for i in reversed(self._order):
            g = cotangents.get(i)
            opcode = network.columns.opcodes[i]
            if g is None or opcode.is_source or not flows[i]:
                continue
            operands = network.columns.operands[i]
            contributions = opcode.vjp(
                [self._values[j] for j in operands], self._values[i], g, dict(network.columns.attributes[i])
            )
            for j, c in zip(operands, contributions):
                if c is None or not flows[j]:
                    continue
                c = np.asarray(c)
                cotangents[j] = c if j not in cotangents else cotangents[j] + c
        return {
            i: np.asarray(cotangents[i], dtype=np.float64)
            if i in cotangents
            else np.zeros(network.columns.specs[i].shape)
            for i in sources
        }


def _ancestors(network, target: int) -> list[int]:
    """The target and every node it reads, in recording order."""
    needed = {target}
    for i in range(target, -1, -1):
        if i in needed:
            needed.update(network.columns.operands[i])
    return sorted(needed)


def _widen(array: np.ndarray) -> np.ndarray:
    """A float source as float64 (exact for every element type); selections unchanged."""
    array = np.asarray(array)
    if array.dtype.kind in "iu":
        return array
    return array.astype(np.float64)


__all__ = [
    "DEFAULT_STEP", "TOLERANCES", "GradientCheckError", "GradientEntry", "GradientReport",
    "check_gradients",
]
