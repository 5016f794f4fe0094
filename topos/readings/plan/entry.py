"""Entries: a declared export of a network — its roots, what it observes, and its posture."""

from __future__ import annotations

from collections.abc import Sequence

from topos.base.errors import ArgumentError, DifferentiationError, PlanError, SymbolError
from topos.readings.plan.numerics import Numerics
from topos.readings.plan.plan import Plan, execute
from topos.readings.recompute import rule_reads
from topos.spec.network import Network


class Entry:
    """What a run may read (roots, then observes) and how it may compute (numerics).

    Reading any other symbol from its runs fails loudly, even when the
    value happens to exist (rule 2).
    """

    __slots__ = ("network", "roots", "observes", "numerics", "backward", "_readable", "_closure", "_kept")

    def __init__(self, network, roots: Sequence, observe: Sequence = (), numerics: Numerics = Numerics.FAST,
                 backward=None):
        if not isinstance(numerics, Numerics):
            raise ArgumentError(f"numerics must be Numerics.EXACT or Numerics.FAST, got {numerics!r}")
        roots = _symbols(roots)
        observes = _symbols(observe)
        if not roots:
            raise SymbolError("an entry needs at least one root")
        for role, symbols in (("root", roots), ("observed symbol", observes)):
            for s in symbols:
                network.check(s, role)
        self.network = network
        self.roots = tuple(roots)
        self.observes = tuple(observes)
        self.numerics = numerics
        ordered: list[int] = []
        for s in (*roots, *observes):
            if s.index not in ordered:
                ordered.append(s.index)
        self._readable = tuple(ordered)
        self._closure: frozenset[int] | None = None
        self._kept: frozenset[int] | None = None
        # The backward posture: runs will be differentiated by the backward scan from this target,
        # so a plan keeps what the derivative rules on its path read (their reads() contracts).
        self.backward = None if backward is None else _backward_target(network, backward)

    @property
    def results(self) -> tuple:
        """Declared results in order (roots then observes, first occurrence kept)."""
        return tuple(self.network.symbol(i) for i in self._readable)

    def closure(self) -> frozenset[int]:
        """The ancestor closure of roots and observes: every node a run must evaluate."""
        if self._closure is None:
            operands = self.network.columns.operands
            seen: set[int] = set()
            stack = list(self._readable) + ([self.backward.index] if self.backward is not None else [])
            while stack:
                n = stack.pop()
                if n in seen:
                    continue
                seen.add(n)
                stack.extend(operands[n])
            self._closure = frozenset(seen)
        return self._closure

    def kept(self) -> frozenset[int]:
        """What a plan of this entry keeps to the end of a run: the results, and under the backward
        posture the target and every value a derivative rule on its path reads (``Opcode.reads``)."""
        if self._kept is None:
            kept = set(self._readable)
            if self.backward is not None:
                t = self.backward.index
                ancestors = sorted(self.network.entry([self.backward]).closure())
                kept |= {t} | rule_reads(self.network, ancestors)
            self._kept = frozenset(kept)
        return self._kept

    def interpret(self, parameters, feeds=None):
        """Evaluate only the closure, with this entry's posture, and return a Run of the declared results.

        Under the backward posture the run's ``backward(target)`` works too.
        """
        return execute(self.network, sorted(self.closure()), frozenset(self._readable), parameters,
                       feeds, self.numerics, fusions=(), free_after=None, backward=self.backward)

    def lower(self):
        """Derive the Plan: schedule, liveness, elected fusions."""
        return Plan(self)

    def without_backward(self) -> Entry:
        """The same roots, observes and numerics without the backward posture: what a forward-only run keeps."""
        return Entry(self.network, self.roots, self.observes, self.numerics)

    def __repr__(self) -> str:
        posture = f", backward={self.backward!r}" if self.backward is not None else ""
        return (f"Entry(roots={list(self.roots)}, observe={list(self.observes)}, "
                f"numerics=Numerics.{self.numerics.name}{posture})")

    def _repr_html_(self) -> str:
        from topos.views.display import entry_card  # the Jupyter card, loaded only when a notebook asks

        return entry_card(self)


def _symbols(values) -> list:
    if hasattr(values, "symbol") or not isinstance(values, (list, tuple)):
        values = [values]
    return [v.symbol if hasattr(v, "symbol") else v for v in values]


def _backward_target(network, target):
    (symbol,) = _symbols([target])
    t = network.check(symbol, "backward target")
    shape = network.columns.specs[t].shape
    if shape != ():
        raise DifferentiationError(
            f"backward= names the target the backward scan differentiates, a rank-0 loss; {symbol!r} has "
            f"shape {list(shape)} (recorded at {network.columns.sites[t]}): reduce it with .sum() or .mean() first"
        )
    return network.symbol(t)


def an_entry(owner: str, value: object) -> Entry:
    """``value`` if it is an Entry; else a PlanError naming what it is and the Entry to pass instead."""
    if isinstance(value, Entry):
        return value
    if isinstance(value, Plan):
        fix = "pass plan.entry"
    elif isinstance(getattr(value, "plan", None), Plan):  # a compiled plan
        fix = "pass compiled.plan.entry"
    elif isinstance(value, Network):
        fix = "declare what to check with network.entry([loss]) (its roots) and pass that"
    else:
        fix = "declare one with network.entry([loss]) and pass it"
    raise PlanError(f"{owner} takes an Entry (network.entry(...) or plan.entry), got {type(value).__name__}; {fix}")
