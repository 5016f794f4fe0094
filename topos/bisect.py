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

import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import ml_dtypes
import numpy as np

from .element import is_element, short_name
from .network import describe_line, plural
from .provenance import Site

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
    local_worst: Any  # as the envelope table measures it (ulps for the stand-in table)
    local_detail: str
    global_worst: float  # ulps of |oracle| (inf where a NaN or inf replaced a number)
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
            "  inputs (as compiled):",
        ]
        lines += [f"    {operand}" for operand in self.operands] or ["    (none)"]
        lines += [
            f"  envelope:     {self.envelope}",
            f"  local error:  {self.local_detail}",
            f"                (compiled value vs the reference kernel on the compiled inputs)",
            f"  global error: {self.global_detail}",
            f"                (compiled value vs the oracle)",
        ]
        return "\n".join(lines)


@dataclass(frozen=True)
class BisectReport:
    """What ``bisect`` found: ``ok``, the ``first`` divergent node (or None), every node's check."""

    target: str
    checks: tuple[NodeCheck, ...]  # recording order
    first: Divergence | None
    roots: tuple[int, ...]
    envelopes_from: str  # which envelope table judged the nodes

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

    def summary(self) -> str:
        """One line: how many nodes were checked and what was found."""
        checked = f"{plural(self.checked, 'node')} checked in recording order on {self.target}"
        if self.ok:
            return f"{checked}, every one within its envelope"
        outside = self.outside
        return (f"{checked}, {len(outside)} outside {'its' if len(outside) == 1 else 'their'} "
                f"envelope{'' if len(outside) == 1 else 's'} ({_indices(outside)})")

    def __str__(self) -> str:
        head = (f"topos bisect: no divergence on {self.target}" if self.ok
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
        if worst is not None and worst.index not in self.roots:
            lines.append(f"  furthest from the oracle: %{worst.index}, {worst.global_detail}")
        lines.append(f"  {self.summary()}")
        lines.append(f"  envelopes: {self.envelopes_from}")
        return "\n".join(lines)


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
    ``rewrite`` (StableHLO text -> text) runs before IREE compiles: the way
    to inject a fault on purpose, or to try a hand-edited lowering.
    """
    from .plan import Numerics

    network = entry.network
    closure = sorted(entry.closure())
    checked = [i for i in closure if not network._opcodes[i].is_source and is_element(network._specs[i].dtype)]
    observed = [network.symbol(i) for i in checked]
    compiled_entry = network.entry(list(entry.roots), observe=observed, numerics=Numerics.FAST)
    oracle_entry = network.entry(list(entry.roots), observe=[network.symbol(i) for i in closure],
                                 numerics=Numerics.EXACT)
    run = _compile(compiled_entry.lower(), target, rewrite).forward(parameters, feeds)
    oracle = oracle_entry.interpret(parameters, feeds)
    conformance, envelopes_from = _conformance()

    compiled: dict[int, np.ndarray] = {}

    def value(i: int) -> np.ndarray:
        """The value node ``i`` had in the compiled run (sources are the arguments the run was given)."""
        if i not in compiled:
            symbol = network.symbol(i)
            compiled[i] = np.asarray(run[symbol] if i in checked else oracle[symbol])
        return compiled[i]

    checks: list[NodeCheck] = []
    first: Divergence | None = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for i in checked:
            name, attributes = network._opcodes[i].name, dict(network._attributes[i])
            operands = network._operands[i]
            here = value(i)
            local = conformance.deviation(name, attributes, here, [value(j) for j in operands])
            whole = _global_error(here, oracle[network.symbol(i)])
            checks.append(NodeCheck(i, bool(local[0]), local[1], local[2], *whole))
            if first is None and not local[0]:
                first = _divergence(network, i, [value(j) for j in operands], conformance, local, whole)
    roots = tuple(dict.fromkeys(s.index for s in entry.roots))
    return BisectReport(target, tuple(checks), first, roots, envelopes_from)


def _divergence(network, i, operand_values, conformance, local, whole) -> Divergence:
    attributes = dict(network._attributes[i])
    spec = network._specs[i]
    line = describe_line(i, network._opcodes[i], network._operands[i], tuple(attributes.items()),
                         spec, network._payloads.get(i))
    envelope = conformance.envelope(network._opcodes[i].name, attributes.get("function"), spec.dtype)
    operands = tuple(_summarize(network, j, v) for j, v in zip(network._operands[i], operand_values))
    return Divergence(i, line, network._sites[i], operands, str(envelope), local[1], local[2], *whole)


def _global_error(got, want) -> tuple[float, str]:
    """(worst error in ulps of |oracle|, a sentence saying where) for a compiled value against the oracle."""
    g, w = np.asarray(got).astype(np.float64), np.asarray(want).astype(np.float64)
    if g.shape != w.shape:
        return float("inf"), f"shape {list(g.shape)} where the oracle has {list(w.shape)}"
    info = ml_dtypes.finfo(np.asarray(want).dtype)
    with np.errstate(all="ignore"):
        same = (np.isnan(g) & np.isnan(w)) | ((g == w) & (np.signbit(g) == np.signbit(w)))
        units = np.abs(g - w) / (float(info.eps) * np.maximum(np.abs(w), float(info.tiny)))
    units = np.where(same, 0.0, np.where(np.isnan(units), np.inf, units))
    differing = int((~same).sum())
    if differing == 0:
        return 0.0, "bitwise equal"
    at = np.unravel_index(int(np.argmax(units)), units.shape) if units.ndim else ()
    where = tuple(int(k) for k in at)
    return float(units[at]), (f"{differing} of {same.size} elements differ; worst {float(units[at]):.3g} ulps "
                              f"at {where if where else 'the scalar'}: compiled {_number(g[at])}, "
                              f"oracle {_number(w[at])}")


def _summarize(network, j: int, array: np.ndarray) -> OperandSummary:
    spec = network._specs[j]
    wide = np.asarray(array).astype(np.float64)
    nan = np.isnan(wide)
    finite_or_inf = wide[~nan]
    low = high = None
    if finite_or_inf.size:
        low, high = float(finite_or_inf.min()), float(finite_or_inf.max())
    return OperandSummary(j, network._opcodes[j].name, tuple(spec.shape), short_name(spec.dtype), low, high,
                          bool(nan.any()), bool(np.isinf(wide).any()))


def _compile(plan, target_name: str, rewrite):
    """``plan.compile(target)``, with ``rewrite`` applied to the StableHLO text before IREE sees it."""
    if rewrite is None:
        return plan.compile(target_name)
    from .dialect.cache import CompileCache, key
    from .dialect.compiled import CompiledPlan, compile_stablehlo, compiler_version
    from .dialect.targets import flags_for
    from .dialect.targets import target as find_target

    chosen = find_target(target_name)
    started = time.perf_counter()
    text = rewrite(plan.emit_stablehlo())
    if not isinstance(text, str):
        raise TypeError(f"rewrite must return the StableHLO text as a str, got {type(text).__name__}")
    flags = flags_for(chosen, "f64" in text)
    store = CompileCache()
    entry_key = key(text, chosen.name, flags, compiler_version())
    vmfb = store.load(entry_key)
    hit = vmfb is not None
    if vmfb is None:
        vmfb = compile_stablehlo(text, flags)
        store.store(entry_key, vmfb)
    timings = {"rewrite+compile": time.perf_counter() - started}
    return CompiledPlan(plan, chosen, chosen.driver, flags, text, vmfb, timings, hit)


# ---- envelopes ---------------------------------------------------------------------------------


def _conformance():
    """The dialect's IREE envelope table, or this module's stand-in while that table does not exist."""
    import importlib

    try:
        conformance = importlib.import_module("topos.dialect.conformance")
    except ModuleNotFoundError as error:
        if error.name != "topos.dialect.conformance":
            raise
        return _Fallback, "bisect's stand-in table (topos.dialect.conformance not found)"
    return conformance, "topos.dialect.conformance"


@dataclass(frozen=True)
class _Envelope:
    """Stand-in envelope: ``|got - want| <= ulps * eps * scale + tiny``, or bitwise when ``ulps`` is 0."""

    opcode: str
    dtype: str
    ulps: float
    scale: str  # what the bound is proportional to

    def __str__(self) -> str:
        if self.ulps == 0:
            return f"{self.opcode} {self.dtype}: bitwise (IEEE-exact or data movement)"
        return f"{self.opcode} {self.dtype}: {self.ulps:g} ulps of {self.scale}"


_BITWISE = frozenset({
    "add", "sub", "mul", "div", "neg", "maximum", "step", "broadcast", "broadcast_along", "reshape",
    "permute", "narrow", "pad", "unfold", "gather",
})
_ACCUMULATING = frozenset({"matmul", "sum", "sum_along", "fold", "scatter"})
_STABLE = frozenset({"log_softmax", "logsumexp"})
_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


class _Fallback:
    """A minimal IREE envelope table with the interface of ``topos.dialect.conformance``."""

    @staticmethod
    def envelope(opcode_name: str, function: str | None, dtype) -> _Envelope:
        label = opcode_name if function is None else f"{opcode_name} {function}"
        dtype = np.dtype(dtype)
        short = short_name(dtype)
        if opcode_name in _BITWISE or (opcode_name == "map" and function == "sqrt"):
            return _Envelope(label, short, 0.0, "")
        if opcode_name in _ACCUMULATING:
            return _Envelope(label, short, 2.0, "terms x sum of |terms|")
        if opcode_name in _STABLE:
            return _Envelope(label, short, 8.0, "n x (|shifted| + log sum + 1)")
        narrow = dtype == _BFLOAT16
        ulps = 1.0 if narrow else (8.0 if function == "erf_derivative" else 4.0)
        return _Envelope(label, short, ulps, "|reference|")

    @staticmethod
    def deviation(opcode_name: str, attributes: Mapping[str, Any], compiled_value, operand_values):
        from .opcodes import by_name

        attributes = dict(attributes)
        operands = [np.asarray(o) for o in operand_values]
        got = np.asarray(compiled_value)
        with np.errstate(all="ignore"):
            want = np.asarray(by_name(opcode_name).kernel(*operands, **attributes))
            if got.shape != want.shape:
                return False, float("inf"), f"shape {list(got.shape)} where the reference has {list(want.shape)}"
            envelope = _Fallback.envelope(opcode_name, attributes.get("function"), want.dtype)
            info = ml_dtypes.finfo(want.dtype)
            g, w = got.astype(np.float64), want.astype(np.float64)
            same = (np.isnan(g) & np.isnan(w)) | ((g == w) & (np.signbit(g) == np.signbit(w)))
            scale = _scale(opcode_name, attributes, operands, w, envelope.ulps)
            error = np.abs(g - w)
            units = np.where(same, 0.0, np.where(np.isfinite(error), error, np.inf)
                             / (float(info.eps) * np.maximum(scale, float(info.tiny))))
            units = np.where(np.isnan(units), np.inf, units)
            if envelope.ulps == 0:
                bad = ~same
            else:
                bad = ~same & ~(error <= envelope.ulps * float(info.eps) * scale + float(info.tiny))
        if got.size == 0:
            return True, 0.0, "empty"
        at = np.unravel_index(int(np.argmax(units)), units.shape) if units.ndim else ()
        worst = float(units[at])
        where = tuple(int(k) for k in at)
        detail = (f"{worst:.3g} ulps at {where if where else 'the scalar'}: "
                  f"compiled {_number(g[at])}, reference {_number(w[at])}")
        if bad.any():
            detail = f"{int(bad.sum())} of {bad.size} elements outside; worst {detail}"
        elif envelope.ulps == 0:
            detail = "bitwise equal"
        return not bad.any(), worst, detail


def _number(x) -> str:
    return f"{float(x):.9g}"


def _scale(name: str, attributes: dict, operands, want: np.ndarray, ulps: float) -> np.ndarray:
    """What the stand-in envelope's bound is proportional to (see ``tests/test_numerics_fast.py``)."""
    wide = [o.astype(np.float64) for o in operands if is_element(o.dtype)]
    if name == "matmul":
        a, b = wide
        return a.shape[-1] * (np.abs(a) @ np.abs(b))
    if name == "sum":
        return wide[0].size * np.sum(np.abs(wide[0]))
    if name == "sum_along":
        axis = attributes["axis"]
        return wide[0].shape[axis] * np.sum(np.abs(wide[0]), axis=axis)
    if name in ("fold", "scatter"):
        from .opcodes import by_name

        terms = np.abs(operands[0]).astype(operands[0].dtype)
        total = np.asarray(by_name(name).kernel(terms, *operands[1:], **attributes)).astype(np.float64)
        return operands[0].size * total
    if name in _STABLE:
        x, axis = wide[0], attributes["axis"]
        peak = np.max(x, axis=axis, keepdims=True)
        peak = np.where(np.isfinite(peak), peak, 0.0)
        log_total = np.log(np.sum(np.exp(x - peak), axis=axis, keepdims=True))
        first = np.abs(x - peak) if name == "log_softmax" else np.abs(peak)
        scale = x.shape[axis] * (first + log_total + 1.0)
        return scale if name == "log_softmax" else np.squeeze(scale, axis)
    return np.abs(want)
