"""Divergence bisection: which recorded line made a compiled run leave the oracle?

``bisect(entry, parameters, feeds)`` compiles the entry's graph once with
every computed node of its closure observed, runs it, and walks the nodes
in recording order. Each node is judged by its *local* error: its compiled
value against the reference kernel applied to the compiled values of its
own operands. Error a node inherits from upstream therefore stays with the
node that made it, and the first node outside its envelope is the one to
blame. The *global* error (compiled value against the oracle) is reported
beside it, to show how far the divergence travelled.

The MLIR/IREE side is imported only when ``bisect`` runs, so ``import
topos`` stays pure NumPy.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from topos.base.element import is_element, short_name
from topos.base.provenance import Site
from topos.readings.plan.entry import an_entry
from topos.readings.plan.numerics import Numerics
from topos.spec.network import describe_line, plural

# ---- the report --------------------------------------------------------------------------------


@dataclass(frozen=True)
class OperandSummary:
    """One input of a node as the compiled run produced it: shape, element type, range, NaNs."""

    index: int
    opcode: str
    shape: tuple[int, ...]
    dtype: str
    minimum: float | None  # None when every element is NaN (or the operand is empty)
    maximum: float | None
    has_nan: bool
    has_inf: bool

    def __str__(self) -> str:
        where = f"%{self.index} {self.opcode}"
        kind = f"{list(self.shape)} {self.dtype}"
        if self.minimum is None:
            span = "every element NaN"
        else:
            span = f"min {self.minimum:.6g}  max {self.maximum:.6g}"
            span += "  has NaN" if self.has_nan else "  no NaN"
        if self.has_inf:
            span += ", has inf"
        return f"{where:<18} {kind:<16} {span}"


@dataclass(frozen=True)
class NodeCheck:
    """One node's verdict: local error (own operands as compiled) and global error (vs the oracle)."""

    index: int
    local_ok: bool
    local_worst: Any  # in the unit of topos.dialect.iree.conformance (see its Deviation)
    local_detail: str  # empty when ok
    global_worst: float  # representable numbers between compiled and oracle (inf: NaN for a number)
    global_detail: str


@dataclass(frozen=True)
class Divergence:
    """The first node outside its envelope: what it is, where the user recorded it, and how it erred."""

    index: int
    line: str  # the node's describe line
    site: Site  # the user's recording line
    operands: tuple[OperandSummary, ...]
    envelope: str
    local_worst: Any
    local_detail: str
    global_worst: float
    global_detail: str

    def __str__(self) -> str:
        lines = [
            "first node outside its envelope:",
            self.line,
            f"  recorded at {self.site}",
            "  inputs (as compiled; sources as fed or recorded):",
        ]
        lines += [f"    {operand}" for operand in self.operands] or ["    (none)"]
        lines += [
            f"  envelope:     {self.envelope}",
            f"  local error:  {self.local_detail}",
            "                (compiled value vs the reference kernel on the compiled inputs)",
            f"  global error: {self.global_detail}",
            "                (compiled value vs the oracle)",
        ]
        return "\n".join(lines)


@dataclass(frozen=True)
class BisectReport:
    """What ``bisect`` found: ``ok``, the ``first`` divergent node (or None), every node's check."""

    target: str
    checks: tuple[NodeCheck, ...]  # recording order
    first: Divergence | None
    roots: tuple[int, ...]
    network: Any = field(default=None, repr=False, compare=False)  # what topos.draw draws the checks on

    @property
    def ok(self) -> bool:
        """True when every node is within its envelope of the reference kernel on its compiled inputs."""
        return self.first is None

    @property
    def checked(self) -> int:
        return len(self.checks)

    @property
    def outside(self) -> tuple[int, ...]:
        """Every node whose local error is outside its envelope (the first one is ``first``)."""
        return tuple(c.index for c in self.checks if not c.local_ok)

    def worst_global(self) -> NodeCheck | None:
        """The node whose compiled value strays furthest from the oracle (None when nothing was checked)."""
        return max(self.checks, key=lambda c: c.global_worst, default=None)

    def __repr__(self) -> str:
        verdict = "ok" if self.first is None else f"divergence at %{self.first.index}"
        return f"<BisectReport on {self.target}: {verdict}, {plural(self.checked, 'node')} checked>"

    def summary(self) -> str:
        """One line: how many nodes were checked and what was found."""
        checked = f"{plural(self.checked, 'node')} checked in recording order on {self.target}"
        if not self.checks:
            return f"{checked}: the entry computes nothing (its closure is sources only)"
        if self.ok:
            return f"{checked}, every one within its envelope"
        outside = self.outside
        return (f"{checked}, {len(outside)} outside {'its' if len(outside) == 1 else 'their'} "
                f"envelope{'' if len(outside) == 1 else 's'} ({_indices(outside)})")

    def __str__(self) -> str:
        head = (f"topos bisect: no divergence on {self.target}" if self.first is None
                else f"topos bisect: divergence at node {self.first.index} on {self.target}")
        lines = [head, ""]
        if self.first is not None:
            lines += ["  " + line for line in str(self.first).splitlines()]
            lines.append("")
        by_index = {c.index: c for c in self.checks}
        for root in self.roots:
            check = by_index.get(root)
            if check is not None:
                lines.append(f"  root %{root} vs the oracle: {check.global_detail}")
        worst = self.worst_global()
        if worst is not None and worst.global_worst > 0 and worst.index not in self.roots and (
                self.first is None or worst.index != self.first.index):
            lines.append(f"  furthest from the oracle: %{worst.index}, {worst.global_detail}")
        lines.append(f"  {self.summary()}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        from topos.views.display import bisect_card  # the Jupyter card, loaded only when a notebook asks

        return bisect_card(self)


def _indices(indices: tuple[int, ...], at_most: int = 8) -> str:
    shown = ", ".join(f"%{i}" for i in indices[:at_most])
    return shown + (f", ... {len(indices) - at_most} more" if len(indices) > at_most else "")


# ---- bisect ------------------------------------------------------------------------------------


def bisect(entry, parameters, feeds=None, target: str = "llvm-cpu", *,
           rewrite: Callable[[str], str] | None = None) -> BisectReport:
    """Compile ``entry`` with every node observed, run it once, and name the first node that diverges.

    A node diverges when its compiled value is outside its envelope of the
    reference kernel applied to the compiled values of its operands (local
    error), so a downstream node is never blamed for error it inherited.
    A value of constants that the plan computes on the host
    (``Plan.folded_constants``) is judged on the oracle's operands, the
    ones it was computed from. ``rewrite`` (StableHLO text -> text) runs
    before IREE compiles: the way
    to inject a fault on purpose, or to try a hand-edited lowering.
    """
    an_entry("bisect", entry)
    from topos.dialect.iree import conformance
    from topos.dialect.iree.targets import target as find_target
    target = find_target(target).name  # the canonical name (cpu -> llvm-cpu) keys the envelope table
    network = entry.network
    closure = sorted(entry.closure())
    columns = network.columns
    checked = [i for i in closure if not columns.opcodes[i].is_source and is_element(columns.specs[i].dtype)]
    observed = [network.symbol(i) for i in checked]
    compiled_entry = network.entry(list(entry.roots), observe=observed, numerics=Numerics.FAST)
    oracle_entry = network.entry(list(entry.roots), observe=[network.symbol(i) for i in closure],
                                 numerics=Numerics.EXACT)
    plan = compiled_entry.lower()
    run = _compile(plan, target, rewrite).forward(parameters, feeds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the oracle's NaNs are data, not news
        oracle = oracle_entry.interpret(parameters, feeds)

    values = {i: np.asarray(run[network.symbol(i)]) for i in checked}
    sources = {i: oracle[network.symbol(i)] for i in closure if network.columns.opcodes[i].is_source}

    # The conformance table judges each node against the reference kernel on its compiled
    # operands (sources: what was fed), with its allowances (fused multiply-adds, flushed
    # subnormals); bisect adds the order, the blame and the report.
    judged = {r.index: r.deviation for r in conformance.check_values(network, values, sources, target)}
    # A value of constants the plan computed on the host (Plan.folded_constants) read the
    # oracle's operands, not IREE's: it is judged on those.
    folded = [i for i in plan.folded_constants() if i in values]
    at_oracle = {j: oracle[network.symbol(j)] for i in folded for j in network.columns.operands[i]}
    for report in conformance.check_values(network, {i: values[i] for i in folded}, at_oracle, target):
        judged[report.index] = report.deviation
    checks: list[NodeCheck] = []
    first: Divergence | None = None
    for i in checked:
        local = judged[i]
        whole = _global_error(values[i], oracle[network.symbol(i)], conformance.ulp_distance)
        checks.append(NodeCheck(i, bool(local.ok), local.worst, local.detail, *whole))
        if first is None and not local.ok:
            function = dict(network.columns.attributes[i]).get("function")
            chosen = conformance.envelope(network.columns.opcodes[i].name, function, network.columns.specs[i].dtype,
                                          target=target)
            inputs = [at_oracle[j] if i in folded else values[j] if j in values else sources[j]
                      for j in network.columns.operands[i]]
            first = _divergence(network, i, inputs, _describe_envelope(network.columns.opcodes[i].name, chosen),
                                local, whole)
    roots = tuple(dict.fromkeys(s.index for s in entry.roots))
    return BisectReport(target, tuple(checks), first, roots, entry.network)


def _divergence(network, i, operand_values, envelope: str, local, whole) -> Divergence:
    attributes = dict(network.columns.attributes[i])
    line = describe_line(i, network.columns.opcodes[i], network.columns.operands[i], tuple(attributes.items()),
                         network.columns.specs[i], network.columns.payloads.get(i))
    operands = tuple(_summarize(network, j, v) for j, v in zip(network.columns.operands[i], operand_values))
    return Divergence(i, line, network.columns.sites[i], operands, envelope, local.worst, local.detail, *whole)


def _global_error(got, want, ulp_distance) -> tuple[float, str]:
    """(worst distance in ulps, a sentence saying where) for a compiled value against the oracle."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return float("inf"), (f"{list(got.shape)} {got.dtype} where the oracle has "
                              f"{list(want.shape)} {want.dtype}")
    distance = np.asarray(ulp_distance(got, want), dtype=np.float64)
    differing = int(np.count_nonzero(distance))
    if differing == 0:
        return 0.0, "bitwise equal"
    at = np.unravel_index(int(np.argmax(distance)), distance.shape) if distance.ndim else ()
    g, w = float(got[at]), float(want[at])
    relative = ""
    if np.isfinite(g) and np.isfinite(w) and w != 0:
        relative = f" (relative {abs(g - w) / abs(w):.2g})"
    where = tuple(int(k) for k in at) or "the scalar"
    # str of an element-typed scalar is its shortest round-trip spelling: equal text means equal bits
    return float(distance[at]), (f"{differing} of {distance.size} elements differ; worst "
                                 f"{float(distance[at]):.3g} ulps{relative} at {where}: "
                                 f"compiled {got[at]!s}, oracle {want[at]!s}")


def _summarize(network, j: int, array: np.ndarray) -> OperandSummary:
    spec = network.columns.specs[j]
    wide = np.asarray(array).astype(np.float64)
    nan = np.isnan(wide)
    finite_or_inf = wide[~nan]
    low = high = None
    if finite_or_inf.size:
        low, high = float(finite_or_inf.min()), float(finite_or_inf.max())
    return OperandSummary(j, network.columns.opcodes[j].name, tuple(spec.shape), short_name(spec.dtype), low, high,
                          bool(nan.any()), bool(np.isinf(wide).any()))


def _compile(plan, target_name: str, rewrite):
    """``plan.compile(target)``, with ``rewrite`` applied to the StableHLO text before IREE sees it."""
    return plan.compile(target_name, rewrite=rewrite)


# ---- envelopes (topos.dialect.iree.conformance owns the table) --------------------------------------


_YARDSTICKS = {
    "log_softmax": "n x (|x - max| + log S + 1)",
    "logsumexp": "n x (|max| + log S + 1)",
}


def _describe_envelope(opcode_name: str, chosen) -> str:
    """An envelope in words: bit-exact, or how many epsilons of which yardstick."""
    ulps = getattr(chosen, "ulps", None)
    if ulps is None:
        return str(chosen)
    accumulates = getattr(chosen, "accumulates", False)
    if ulps == 0 and not accumulates:
        text = "bit-exact"
    else:
        yardstick = (_YARDSTICKS.get(opcode_name, "terms x sum of |terms|") if accumulates
                     else "|reference|")
        text = f"{ulps:g} eps x {yardstick}"
    note = getattr(chosen, "note", "")
    return f"{text} ({note})" if note and not note.startswith("bit-exact") else text
