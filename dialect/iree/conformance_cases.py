"""IREE conformance cases: every opcode, forward and recorded gradient, recorded to be compiled and graded.

``FAMILIES`` groups the cases so that one compiled module covers a whole
family in one element type: every case's output, one loss over the
differentiable ones (each output weighted and summed), and the loss's
recorded gradients (``tape.differentiate``), with every node observed.
``run_family`` compiles it for a target, runs it once, and grades every
node with ``topos.dialect.iree.conformance.check_values``. Special values
(signed zeros, infinities, NaN, subnormals) are forward-only cases, since
they would make every gradient NaN.

``DIVERGENCES`` lists what is known not to conform, each with its cause
and where the fix belongs; ``FamilyResult.unexplained()`` is every
failure none of them covers. The tests (``tests/iree/test_conformance.py``)
and the GPU check (``benchmarks/gpu_check.py``) run these same cases.

    python -m topos.dialect.iree.conformance_cases [target ...]   # measure and print the table
"""

from __future__ import annotations

import math
import time
import warnings
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from topos.base.element import float32, selection, short_name
from topos.base.errors import ToposError
from topos.dialect.iree.conformance import (
    DTYPES,
    TABLE,
    NodeReport,
    check_values,
    envelope,
    float_info,
    is_bit_exact,
    table_key,
)
from topos.spec.tape import Tape

# ---- the conformance cases ---------------------------------------------------------------------

# IEEE edge cases: signed zeros, infinities, NaN, subnormals (f32/bf16 and f64), ties.
SPECIALS = (0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, -1.0, 1e-40, 5e-324, 3.0, 0.5, -2.5)


class Recorder:
    """What a case records with: seeded inputs of one element type, tracked for differentiation."""

    def __init__(self, tape: Tape, dtype, label: str):
        self.tape = tape
        self.dtype = np.dtype(dtype)
        self.label = label
        self.differentiable: list = []

    def _rng(self, key) -> np.random.Generator:
        return np.random.default_rng(zlib.crc32(f"{self.label}/{key}/{self.dtype.name}".encode()))

    def data(self, shape, low: float = -2.0, high: float = 2.0, key: str = "") -> np.ndarray:
        """Seeded uniform data of this element type (the same on every run)."""
        return self._rng((key, tuple(shape), low, high)).uniform(low, high, shape).astype(self.dtype)

    def logs(self, shape, low: float, high: float, key: str = "") -> np.ndarray:
        """Seeded positive data, uniform in log2 between 2**low and 2**high, within this type's finite range.

        The span is cut to the type's range (float16's is 2**-24 to 2**16) so that a wide case
        of a narrow type spreads over its finite values instead of rounding a third of them to
        inf; the draw itself keeps the requested span's seed.
        """
        drawn = self._rng((key, tuple(shape), "log", low, high)).uniform(low, high, shape)
        finite = float_info(self.dtype)
        lowest, highest = math.log2(float(finite.smallest_subnormal)), math.log2(float(finite.max))
        if low < lowest or high > highest:  # an affine map keeps the draw's spread over the cut span
            new_low, new_high = max(low, lowest), min(high, highest)
            drawn = new_low + (drawn - low) * (new_high - new_low) / (high - low)
        return np.exp2(drawn).astype(self.dtype)

    def input(self, array, differentiable: bool = True):
        """An input of this element type; the family differentiates with respect to the ``differentiable`` ones."""
        value = self.tape.input(np.asarray(array, dtype=self.dtype))
        if differentiable:
            self.differentiable.append(value)
        return value

    def uniform(self, shape, low: float = -2.0, high: float = 2.0, key: str = "", differentiable: bool = True):
        return self.input(self.data(shape, low, high, key), differentiable)

    def specials(self):
        """A forward-only input holding SPECIALS."""
        return self.input(np.array(SPECIALS), differentiable=False)

    def pairs(self):
        """Two forward-only inputs holding every (special, special) pair."""
        values = np.array(SPECIALS, dtype=np.float64)
        left = np.repeat(values, len(values)).astype(self.dtype)
        right = np.tile(values, len(values)).astype(self.dtype)
        return self.input(left, False), self.input(right, False)

    def selection(self, indices, extent: int, fed: bool = True):
        """A selection: fed as an input, or recorded as a leaf."""
        chosen = selection(indices, extent)
        return self.tape.input(chosen) if fed else self.tape.leaf(chosen)


@dataclass(frozen=True)
class Case:
    """One recording that exercises an opcode (``key``: its TABLE key).

    With ``gradient`` the case's output joins its family's loss, so the
    recorded gradient of the case is compiled and checked too; special
    values (infinities, NaN) are forward-only, since they would turn
    every gradient into NaN.
    """

    name: str
    key: str
    record: Callable[[Recorder], object]
    gradient: bool = True


def _binary(name: str) -> tuple[Case, Case]:
    """The opcode on seeded data (its gradient too), and forward-only on every pair of SPECIALS."""

    def regular(r):
        a, b = r.uniform((4, 5), key="a"), r.uniform((4, 5), key="b")
        return getattr(a, name)(b)

    def specials(r):
        a, b = r.pairs()
        return getattr(a, name)(b)

    return Case(name, name, regular), Case(f"{name}/specials", name, specials, gradient=False)


def _divide(r):
    signs = np.where(r.data((4, 5), key="sign") < 0, -1.0, 1.0)
    b = r.input((r.data((4, 5), 0.5, 2.0, "b").astype(np.float64) * signs).astype(r.dtype))
    return r.uniform((4, 5), key="a") / b


# C99 pow's special cases: negative bases with integer powers, 0**0, nan**0, 1**nan, infinities.
_POW_BASES = (-2.0, -8.0, 0.0, math.nan, 1.0, -1.0, 0.0, -0.0, math.inf, -math.inf, -math.inf, 2.0, 0.5,
              -3.0, -0.0)
_POW_EXPONENTS = (3.0, 1 / 3, 0.0, 0.0, math.nan, math.inf, -1.0, -1.0, -1.0, 3.0, 2.0, -math.inf,
                  math.inf, 2.0, 3.0)


def _sources(r):
    """A parameter, an input and a leaf, each returned as it is (the case observes all three)."""
    r.tape.parameter(r.data((3, 4), key="parameter"))
    r.input(np.array(SPECIALS), differentiable=False)
    return r.tape.leaf(np.array(SPECIALS, dtype=np.float64).astype(r.dtype))


def _map_cases(function: str, low: float, high: float, wide: tuple | None) -> list[Case]:
    key = f"map:{function}"
    cases = [
        Case(function, key, lambda r: r.uniform((6, 7), low, high, function).map(function)),
        Case(f"{function}/specials", key, lambda r: r.specials().map(function), gradient=False),
    ]
    if function in ("sin", "cos"):  # small arguments of both signs, where sin(x) ~ x
        def record_small(r):
            magnitudes = r.logs((8, 8), -40, -3, function + "/small").astype(np.float64)
            signs = np.where(r.data((8, 8), key="small-sign") < 0, -1.0, 1.0)
            return r.input((magnitudes * signs).astype(r.dtype), False).map(function)

        cases.append(Case(f"{function}/small", key, record_small, gradient=False))
    if wide is not None:
        wide_low, wide_high, logarithmic = wide

        def record_wide(r):
            if logarithmic:
                magnitudes = r.logs((8, 8), wide_low, wide_high, function)
                signs = np.where(r.data((8, 8), key="sign") < 0, -1.0, 1.0) if low < 0 else 1.0
                return r.input((magnitudes.astype(np.float64) * signs).astype(r.dtype), False).map(function)
            return r.input(r.data((8, 8), wide_low, wide_high, function + "/wide"), False).map(function)

        cases.append(Case(f"{function}/wide", key, record_wide, gradient=False))
    return cases


def _selection_cases() -> list[Case]:
    return [
        Case("gather", "gather", lambda r: r.uniform((5, 3), key="table").gather(
            r.selection([[0, 4, 4], [2, 0, 1]], 5, fed=False))),
        Case("gather/vector", "gather", lambda r: r.uniform((5,), key="vector").gather(
            r.selection([3, 3, 1, 0], 5))),
        Case("gather/specials", "gather", lambda r: r.specials().gather(
            r.selection([11, 4, 1, 0, 2, 2], len(SPECIALS))), gradient=False),
        Case("scatter", "scatter", lambda r: r.uniform((6, 3), key="rows").scatter(
            r.selection([1, 3, 1, 0, 1, 3], 5))),
        Case("scatter/rank2", "scatter", lambda r: r.uniform((2, 3), key="rows2").scatter(
            r.selection([[2, 2, 0], [2, 1, 2]], 4, fed=False))),
        # Any order but the reference's (ascending positions) rounds row 1 differently.
        Case("scatter/order", "scatter", lambda r: r.input(
            np.array([[1.0], [2.0**-24], [2.0**-24], [-1.0]]).astype(r.dtype), False).scatter(
            r.selection([1, 1, 1, 1], 2)), gradient=False),
    ]


_NONFINITE_ROWS = [[-math.inf, -math.inf, 0.0], [math.inf, 1.0, 2.0], [-math.inf, 2.0, 1.0],
                   [300.0, -300.0, 0.0], [math.nan, 1.0, 2.0]]

FAMILIES: dict[str, tuple[Case, ...]] = {
    "elementwise": (
        Case("sources", "leaf", _sources, gradient=False),
        *_binary("add"), *_binary("sub"), *_binary("mul"),
        Case("div", "div", _divide), _binary("div")[1],
        Case("neg", "neg", lambda r: -r.uniform((4, 5))),
        Case("neg/specials", "neg", lambda r: -r.specials(), gradient=False),
        *_binary("maximum"),
        Case("maximum/ties", "maximum", lambda r: r.input(r.data((4, 5), key="t")).maximum(
            r.input(r.data((4, 5), key="t"))), gradient=False),
        *_binary("step"),
        Case("pow", "pow", lambda r: r.uniform((5, 6), 0.1, 4.0, "base") ** r.uniform((5, 6), -3.0, 3.0, "e")),
        Case("pow/specials", "pow", lambda r: r.input(np.array(_POW_BASES), False) ** r.input(
            np.array(_POW_EXPONENTS), False), gradient=False),
        Case("pow/wide", "pow", lambda r: r.input(r.logs((8, 8), -20, 20, "base"), False) ** r.input(
            r.data((8, 8), -4.0, 4.0, "e"), False), gradient=False),
    ),
    "map": tuple(
        case
        for function, low, high, wide in (
            ("exp", -10.0, 10.0, (-80.0, 80.0, False)),
            ("log", 1e-3, 100.0, (-120.0, 120.0, True)),
            ("sqrt", 0.0, 100.0, (-120.0, 120.0, True)),
            ("tanh", -5.0, 5.0, (-20.0, 20.0, False)),
            ("sin", -10.0, 10.0, (-1000.0, 1000.0, False)),
            ("cos", -10.0, 10.0, (-1000.0, 1000.0, False)),
            ("log1p", -0.9, 10.0, (-30.0, 60.0, True)),
            ("expm1", -5.0, 5.0, (-80.0, 80.0, False)),
            ("erf", -4.0, 4.0, (-30.0, 4.0, True)),
            ("erf_derivative", -4.0, 4.0, (-9.0, 9.0, False)),
        )
        for case in _map_cases(function, low, high, wide)
    ),
    "linear": (
        Case("matmul", "matmul", lambda r: r.uniform((4, 9), key="a") @ r.uniform((9, 3), key="b")),
        Case("matmul/batched", "matmul",
             lambda r: r.uniform((2, 3, 7), key="a") @ r.uniform((2, 7, 5), key="b")),
        Case("matmul/long", "matmul",
             lambda r: r.uniform((8, 256), key="a") @ r.uniform((256, 4), key="b")),
        Case("sum", "sum", lambda r: r.uniform((3, 4, 5)).sum()),
        Case("sum/long", "sum", lambda r: r.uniform((1000,), key="long").sum()),
        Case("sum/rank0", "sum", lambda r: r.uniform(()).sum()),
        Case("sum/specials", "sum", lambda r: r.specials().sum(), gradient=False),
        Case("sum/negative-zeros", "sum", lambda r: r.input(np.full((2, 3), -0.0), False).sum(),
             gradient=False),
        Case("sum_along", "sum_along", lambda r: r.uniform((5, 3, 4)).sum_along(0)),
        Case("sum_along/last", "sum_along", lambda r: r.uniform((3, 4, 9)).sum_along(2)),
        Case("sum_along/specials", "sum_along", lambda r: r.specials().reshape((3, 4)).sum_along(1),
             gradient=False),
    ),
    "shape": (
        Case("broadcast", "broadcast", lambda r: r.uniform((1, 1)).broadcast((2, 3))),
        Case("broadcast/scalar", "broadcast", lambda r: r.uniform(()).broadcast((4,))),
        Case("broadcast_along", "broadcast_along", lambda r: r.uniform((2, 3)).broadcast_along(1, 4)),
        Case("reshape", "reshape", lambda r: r.uniform((2, 3, 4)).reshape((6, 4))),
        Case("reshape/rank0", "reshape", lambda r: r.uniform((1, 1)).reshape(())),
        Case("permute", "permute", lambda r: r.uniform((2, 3, 4)).permute((2, 0, 1))),
        Case("permute/specials", "permute", lambda r: r.specials().reshape((3, 4)).permute((1, 0)),
             gradient=False),
        Case("narrow", "narrow", lambda r: r.uniform((3, 6)).narrow(1, 2, 3)),
        Case("pad", "pad", lambda r: r.uniform((3, 4)).pad(0, 1, 6)),
        Case("pad/specials", "pad", lambda r: r.specials().pad(0, 2, 15), gradient=False),
        Case("unfold", "unfold", lambda r: r.uniform((2, 11, 3)).unfold(1, size=3, step=2, dilation=2)),
        Case("unfold/single-lane", "unfold", lambda r: r.uniform((5, 2)).unfold(0, 1, 2)),
        Case("fold", "fold", lambda r: r.uniform((2, 6, 3, 2)).fold(1, size=3, step=1, dilation=1, extent=8)),
        Case("fold/strided", "fold", lambda r: r.uniform((4, 2)).fold(0, size=2, step=3, dilation=2, extent=12)),
    ),
    "index": tuple(_selection_cases()),
    "stable": (
        Case("log_softmax", "log_softmax", lambda r: r.uniform((4, 6), -8.0, 8.0).log_softmax(1)),
        Case("log_softmax/axis0", "log_softmax", lambda r: r.uniform((5, 3), -8.0, 8.0).log_softmax(0)),
        Case("log_softmax/wide", "log_softmax",
             lambda r: r.uniform((4, 40), -80.0, 80.0, differentiable=False).log_softmax(1), gradient=False),
        Case("log_softmax/nonfinite", "log_softmax",
             lambda r: r.input(np.array(_NONFINITE_ROWS), False).log_softmax(1), gradient=False),
        Case("logsumexp", "logsumexp", lambda r: r.uniform((4, 6), -8.0, 8.0).logsumexp(1)),
        Case("logsumexp/axis0", "logsumexp", lambda r: r.uniform((5, 3), -8.0, 8.0).logsumexp(0)),
        Case("logsumexp/wide", "logsumexp",
             lambda r: r.uniform((4, 40), -80.0, 80.0, differentiable=False).logsumexp(1), gradient=False),
        Case("logsumexp/nonfinite", "logsumexp",
             lambda r: r.input(np.array(_NONFINITE_ROWS), False).logsumexp(1), gradient=False),
    ),
}


# ---- recording, compiling and grading a family ------------------------------------------------------


@dataclass
class FamilyGraph:
    """A family's recording: every case's output, one loss over the differentiable ones, its gradients."""

    name: str
    dtype: np.dtype
    network: Any
    outputs: dict  # case name -> Symbol
    loss: Any
    gradients: tuple
    case_of: dict  # node index -> the case that recorded it ("loss" and "gradient" after the cases)

    def entry(self):
        """Roots: the loss and its gradients; observes: every other computed node and the sources case."""
        network = self.network
        roots = [self.loss, *self.gradients]
        skip = {s.index for s in roots}
        shown = {i for i, case in self.case_of.items() if case == "sources"}
        observe = [network.symbol(i) for i in range(len(network))
                   if i not in skip and (not network.columns.opcodes[i].is_source or i in shown)]
        return network.entry(roots, observe=observe)


def record_family(name: str, dtype) -> FamilyGraph:
    """Record every case of family ``name`` in ``dtype``, then its loss and recorded gradients."""
    dtype = np.dtype(dtype)
    case_of: dict[int, str] = {}

    def model(tape):
        recorder = Recorder(tape, dtype, name)
        outputs, terms = {}, []
        for case in FAMILIES[name]:
            start = len(tape)
            out = case.record(recorder)
            case_of.update((i, case.name) for i in range(start, len(tape)))
            outputs[case.name] = out
            if case.gradient:
                start = len(tape)
                weights = recorder.data(out.shape, 0.5, 1.5, "weights/" + case.name)
                terms.append((out * tape.leaf(weights)).sum())
                case_of.update((i, "loss") for i in range(start, len(tape)))
        start = len(tape)
        loss = terms[0]
        for term in terms[1:]:
            loss = loss + term
        case_of.update((i, "loss") for i in range(start, len(tape)))
        start = len(tape)
        adjoints = tape.differentiate(loss, recorder.differentiable)
        case_of.update((i, "gradient") for i in range(start, len(tape)))
        return outputs, loss, tuple(adjoints.gradients)

    network, (outputs, loss, gradients) = Tape.record(model)
    return FamilyGraph(name, dtype, network, outputs, loss, gradients, case_of)


def recorded_keys() -> set[str]:
    """Every TABLE key that some family records, gradients included (recording only; nothing compiles)."""
    keys: set[str] = set()
    for name in FAMILIES:
        network = record_family(name, float32).network
        for node in network.nodes():
            keys.add(table_key(node.opcode.name, node.attributes.get("function")))
    return keys


# ---- what is known not to conform -------------------------------------------------------------


@dataclass(frozen=True)
class Divergence:
    """A known departure from the table: which nodes it covers, where, and why (with the fix's owner)."""

    name: str
    targets: tuple[str, ...]
    reason: str
    dtypes: tuple[str, ...] = ("f32", "f64", "bf16")
    cases: tuple[str, ...] = ()   # case names covered (empty: any case)
    keys: tuple[str, ...] = ()    # TABLE keys covered (empty: any key)
    chained_only: bool = False    # only nodes whose operands were computed in the same module

    def covers(self, report: NodeReport, target: str) -> bool:
        return (target in self.targets and report.dtype in self.dtypes
                and (not self.cases or report.case in self.cases)
                and (not self.keys or report.key in self.keys)
                and (not self.chained_only or not report.isolated))


DIVERGENCES: tuple[Divergence, ...] = (
    Divergence(
        "vulkan-log1p-naive", ("vulkan",),
        "IREE's SPIR-V path computes log1p as log(1 + x), losing small arguments "
        "(measured 5e6 eps on Mesa lavapipe for |x| down to 2**-30).",
        dtypes=("f32",), keys=("map:log1p",)),
    Divergence(
        "gpu-subnormal-log", ("vulkan", "cuda"),
        "IREE's float32 log (MLIR's polynomial approximation) replaces an argument at or below 2**-126 "
        "by 2**-126 before it evaluates, so a subnormal's log is log(2**-126): neither the value nor "
        "log(0), the oracle's answer once subnormals are flushed (llvm-cpu flushes them before the "
        "select, so there the answer is log(0)). Measured on Mesa lavapipe and on an H200; the "
        "select is in the cuda module's LLVM IR. bfloat16 computes its log in float32: the same.",
        dtypes=("f32", "bf16"), cases=("log/specials",)),
)


def divergence_of(report: NodeReport, target: str) -> Divergence | None:
    """The known divergence that covers a report, if any."""
    return next((d for d in DIVERGENCES if d.covers(report, target)), None)


@dataclass
class FamilyResult:
    """A compiled family run, graded node by node."""

    graph: FamilyGraph
    target: str
    reports: list = field(default_factory=list)
    compile_seconds: float = 0.0
    run_seconds: float = 0.0
    cache_hit: bool = False
    values: dict = field(default_factory=dict)  # node index -> compiled value
    oracle: Any = None                        # network.forward's Run

    def relative_error(self, symbol) -> float:
        """max |compiled - oracle| / (eps * max |oracle|) for one result: the end-to-end error."""
        got = self.values[symbol.index].astype(np.float64)
        want = np.asarray(self.oracle[symbol]).astype(np.float64)
        eps = float(float_info(self.graph.dtype).eps)
        scale = max(float(np.max(np.abs(want))), float(float_info(self.graph.dtype).tiny))
        return float(np.max(np.abs(got - want)) / (eps * scale))

    def unexplained(self) -> list:
        """Failing reports that no known divergence covers: each one is a bug."""
        return [r for r in self.reports if not r.ok and divergence_of(r, self.target) is None]

    def covered_by(self, divergence: Divergence) -> list:
        return [r for r in self.reports if divergence.covers(r, self.target)]

    def worst(self) -> dict:
        """key -> the worst deviation among the reports no divergence covers (in the key's unit)."""
        found: dict[str, float] = {}
        for r in self.reports:
            if divergence_of(r, self.target) is None:
                found[r.key] = max(found.get(r.key, 0.0), r.deviation.worst)
        return found


def run_family(name: str, dtype, target: str = "llvm-cpu", driver: str | None = None,
               cache=True) -> FamilyResult:
    """Record, compile for ``target``, run, and grade every node of family ``name`` in ``dtype``."""
    graph = record_family(name, dtype)
    network = graph.network
    started = time.perf_counter()
    compiled = graph.entry().lower().compile(target, driver, cache=cache)
    compiled_at = time.perf_counter()
    parameters = network.parameters()
    run = compiled.forward(parameters)
    readable = {s.index for s in compiled.plan.entry.results}
    values = {i: np.asarray(run[network.symbol(i)]) for i in readable}
    finished = time.perf_counter()
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        oracle = network.forward(parameters)
    sources = {i: oracle[network.symbol(i)] for i in range(len(network)) if network.columns.opcodes[i].is_source}
    result = FamilyResult(graph, target, compile_seconds=compiled_at - started,
                          run_seconds=finished - compiled_at, cache_hit=compiled.cache_hit,
                          values=values, oracle=oracle)
    result.reports = check_values(network, values, sources, target, graph.case_of)
    return result


def measure(targets: Sequence[str] = ("llvm-cpu",), dtypes: Sequence = DTYPES,
            families: Sequence[str] | None = None, cache=True, log=None) -> dict:
    """Run every family: {(target, key, dtype): worst deviation outside known divergences}.

    A family that fails to compile or run is logged and skipped.
    """
    table: dict[tuple[str, str, str], float] = {}
    for target in targets:
        for name in families or FAMILIES:
            for dtype in dtypes:
                try:
                    result = run_family(name, dtype, target, cache=cache)
                except ToposError as error:
                    if log:
                        log(f"{target} {name} {short_name(np.dtype(dtype))}: {str(error).splitlines()[0]}")
                    continue
                if log:
                    bad = result.unexplained()
                    log(f"{target} {name} {short_name(np.dtype(dtype))}: {len(result.reports)} nodes, "
                        f"{len(bad)} unexplained failures")
                    for report in bad[:5]:
                        log(f"    {report}")
                for key, worst in result.worst().items():
                    slot = (target, key, short_name(np.dtype(dtype)))
                    table[slot] = max(table.get(slot, 0.0), worst)
    return table


def format_table(measured: Mapping, target: str = "llvm-cpu") -> str:
    """Measured worst deviations beside the declared envelopes, one row per TABLE key."""
    names = [short_name(d) for d in DTYPES]
    lines = [f"{'key':<20}" + "".join(f"{n + ' worst':>12}{n + ' env':>10}" for n in names)]
    for key in sorted(TABLE):
        row = f"{key:<20}"
        for n, dtype in zip(names, DTYPES):
            worst = measured.get((target, key, n))
            opcode_name, function = key.split(":", 1) if key.startswith("map:") else (key, None)
            chosen = envelope(opcode_name, function, dtype, target)
            declared = "exact" if is_bit_exact(chosen) else f"{chosen.ulps:g}"
            row += f"{'-' if worst is None else f'{worst:.3g}':>12}{declared:>10}"
        lines.append(row)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """python -m topos.dialect.iree.conformance_cases [target ...]: measure and print the table."""
    import sys

    targets = list(argv if argv is not None else sys.argv[1:]) or ["llvm-cpu"]
    measured = measure(targets, log=print)
    for target in targets:
        print(f"\n{target}:")
        print(format_table(measured, target))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
