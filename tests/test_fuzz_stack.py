"""A differential fuzzer over the whole stack: random graphs, four readings that must agree.

Hypothesis draws random well-typed graphs over all 27 opcodes (every map
function included) in float32, float64 and bfloat16, each with a rank-0
loss and its recorded gradients (``tape.differentiate(loss, parameters)``);
see ``tests/_fuzz_graphs.py`` for what is drawn. Every graph is read four
ways:

1. the EXACT plan of the loss, the gradients and some observed values
   against the oracle (``network.forward``): bit for bit;
2. the recorded gradients (``run[adjoints[p]]``) against the backward scan
   (``run.backward(loss)[p]``): bit for bit;
3. IREE on llvm-cpu, node by node by *local* error, as ``topos.bisect``
   judges (every computed node observed; each compared with its reference
   kernel on its compiled operands, within ``conformance.TABLE``); several
   graphs share one network so that one compile serves them all;
4. ``topos.check_gradients`` (float64 finite differences): float64 graphs
   must pass outright, float32 and bfloat16 graphs by their float64 *rule
   error* (their own rounding is reported, not asserted).

A disagreement is a failure unless it is one of the ``KNOWN`` divergences
below, each matched by a precise test on the failing node and each with
its reproduction run as a strict xfail (a fix turns it into a failure
that asks for the entry to be removed), or, where topos works around the
shape found while the IREE bug stands, as a test of the workaround. Check 4 also sets aside what
float64 finite differences cannot judge: a quotient that crosses a
maximum/step kink or leaves the function's domain, and a parameter whose
elements, re-graded one by one at other steps, either agree with the rules
or cannot be resolved by any quotient; each is counted and printed.
``docs/reliability.md`` has the figures and the reproductions.

    .venv/bin/python -m pytest -q tests/test_fuzz_stack.py -s            # default: about 2 minutes
    .venv/bin/python -m pytest -q tests/test_fuzz_stack.py -m slow -s    # 10,000 graphs
    TOPOS_FUZZ_SEED=7 .venv/bin/python -m pytest -q tests/test_fuzz_stack.py -m slow   # other graphs

Both runs draw the same graphs every time (derandomized); ``TOPOS_FUZZ_SEED``
draws another set, the same for the same seed, to explore past them.
"""

from __future__ import annotations

import collections
import math
import os
import re
import shutil
import warnings
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.control import event as _hypothesis_event

import topos
from topos import MAP_FUNCTIONS, OPCODES, Numerics, Tape
from topos.base.element import is_element

from _fuzz_graphs import (
    DTYPES,
    Graph,
    Op,
    Ref,
    ancestors,
    branches,
    float64_gradients,
    float64_values,
    graphs,
    record_alone,
    record_together,
    to_python,
)

# Unset: derandomized, the same graphs every run. A number: another set of graphs, fixed by it.
EXPLORATION_SEED = os.environ.get("TOPOS_FUZZ_SEED", "").strip() or None
SETTINGS = dict(deadline=None, database=None, derandomize=EXPLORATION_SEED is None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])


def _drawn(run):
    """``run`` with the exploration seed applied, when one is set."""
    if EXPLORATION_SEED is None:
        return run
    try:
        return seed(int(EXPLORATION_SEED))(run)
    except ValueError:
        raise pytest.UsageError(f"TOPOS_FUZZ_SEED={EXPLORATION_SEED!r} should be an integer, such as 7") from None


HOST_GRAPHS = 400  # checks 1, 2 and 4 in the default run
IREE_BATCHES, BATCH = 4, 8  # check 3 in the default run: 4 compiles of 8 graphs each
SLOW_HOST_GRAPHS = 10_000
SLOW_IREE_BATCHES = 125  # 1,000 graphs, every tenth of the slow run's count
HAS_LINKER = bool(shutil.which("ld") or shutil.which("cc"))  # float64 on llvm-cpu links a shared object


def event(text: str) -> None:
    """hypothesis.event inside a test (shown by --hypothesis-show-statistics); nothing outside one."""
    if currently_in_test_context():
        _hypothesis_event(text)


def _bits(array) -> bytes:
    array = np.ascontiguousarray(array)
    return repr((array.shape, array.dtype.str)).encode() + array.tobytes()


@dataclass
class Tally:
    """What one fuzzing run did: graphs and checks run, what was set aside and why, opcodes seen."""

    graphs: Counter = field(default_factory=Counter)  # (dtype, mode)
    checks: Counter = field(default_factory=Counter)  # check name -> times run
    set_aside: Counter = field(default_factory=Counter)  # (check, reason) -> elements or graphs
    opcodes: Counter = field(default_factory=Counter)
    own_error_over_tolerance: Counter = field(default_factory=Counter)  # f32/bf16 parameters, reported only
    worst_own_error: dict = field(default_factory=dict)

    def seen(self, graph: Graph, network) -> None:
        self.graphs[graph.dtype, graph.mode] += 1
        for node in network.nodes():
            name = node.opcode.name
            self.opcodes[f"map:{node.attributes['function']}" if name == "map" else name] += 1

    def summary(self, title: str) -> str:
        total = sum(self.graphs.values())
        by_dtype = Counter()
        for (dtype, _), n in self.graphs.items():
            by_dtype[dtype] += n
        lines = [f"{title}: {total} graphs ({', '.join(f'{d} {n}' for d, n in sorted(by_dtype.items()))}; "
                 f"tame {sum(n for (_, m), n in self.graphs.items() if m == 'tame')}, "
                 f"wild {sum(n for (_, m), n in self.graphs.items() if m == 'wild')})"]
        lines += [f"  check {name}: {n}" for name, n in sorted(self.checks.items())]
        lines += [f"  set aside, {check}: {reason}: {n}" for (check, reason), n in sorted(self.set_aside.items())]
        for dtype, n in sorted(self.own_error_over_tolerance.items()):
            lines.append(f"  {dtype} backward scan outside check_gradients' default tolerance (reported, "
                         f"not asserted): {n} parameters; worst error {self.worst_own_error.get(dtype, 0.0):.2e}")
        lines.append(f"  nodes by opcode: {dict(sorted(self.opcodes.items()))}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Known:
    """A known divergence between two readings of the stack: its name, what happens, where the fix belongs."""

    name: str
    what: str
    fix: str


def _covers_vocabulary(tally: Tally) -> None:
    """The generator is not vacuous: every opcode, every map function and every element type occurred."""
    wanted = {o.name for o in OPCODES if o.name != "map"} | {f"map:{f}" for f in MAP_FUNCTIONS}
    missing = wanted - set(tally.opcodes)
    assert not missing, f"the fuzzer never recorded {sorted(missing)}"
    assert {d for d, _ in tally.graphs} == set(DTYPES)


# ---- check 1: the EXACT plan against the oracle, bit for bit ------------------------------------------


def check_exact_plan(network, built, oracle, tally: Tally) -> None:
    plan = network.entry(built.roots(), observe=built.observes, numerics=Numerics.EXACT).lower()
    planned = plan.forward(network.parameters(), built.feeds)
    differing = [s for s in plan.results if _bits(planned[s]) != _bits(oracle[s])]
    tally.checks["1 exact plan == oracle (graphs)"] += 1
    if not differing:
        return
    raise AssertionError(f"check 1: the EXACT plan differs from the oracle at {differing}\n"
                         f"{to_python(built.graph)}\n{plan.describe()}")


# ---- check 2: recorded gradients against the backward scan, bit for bit ----------------------------------


def check_recorded_gradients(network, built, oracle, tally: Tally) -> None:
    scanned = oracle.backward(built.loss)
    for parameter, gradient in built.adjoints.pairs():
        assert _bits(oracle[gradient]) == _bits(scanned[parameter]), (
            f"check 2: the recorded gradient of {parameter!r} differs from the backward scan\n"
            f"{to_python(built.graph)}")
    tally.checks["2 recorded gradients == backward scan (graphs)"] += 1


# ---- check 4: float64 finite differences --------------------------------------------------------------


def _quotient_hazard(network, oracle, built, entry, step: float) -> str | None:
    """Why the difference quotients of ``entry`` cannot measure a derivative, if they cannot.

    Replays the float64 twin at every point the quotients evaluate (x +- h, x +- h/2): a maximum or
    step that changes side is a kink; an inf or NaN that appears is the edge of the function's domain.
    """
    base = float64_values(network, oracle)
    taken = branches(network, base)
    closure = [j for j in ancestors(network, built.loss.index) if np.asarray(base[j]).dtype.kind == "f"]
    i = entry.symbol.index
    for element in np.ndindex(*network.nodes()[i].shape):
        x = float(base[i][element])
        h = step * max(1.0, abs(x))
        for offset in (h, -h, h / 2, -h / 2):
            moved = base[i].copy()
            moved[element] = x + offset
            values = float64_values(network, oracle, {i: moved})
            after = branches(network, values)
            if any(not np.array_equal(taken[k], after[k]) for k in taken):
                return "difference quotient crosses a maximum/step kink"
            with np.errstate(invalid="ignore"):
                if not all(np.isfinite(values[j]).all() for j in closure):
                    return "difference quotient leaves the function's domain (inf or NaN)"
    return None


def _between(network, i: int, target: int) -> list[int]:
    """The float nodes on a path from node ``i`` to ``target``, ``i`` excluded."""
    path = set(ancestors(network, target))
    reached, between = {i}, []
    for node in network.nodes()[i + 1: target + 1]:
        if node.index in path and any(s.index in reached for s in node.operands):
            reached.add(node.index)
            if is_element(node.dtype):
                between.append(node.index)
    return between


def _quotient(network, oracle, target: int, i: int, base, element: tuple, h: float) -> float:
    """(f(x + h) - f(x - h)) / (the distance between the rounded points), on the float64 replay."""
    x = float(base[element])
    plus, minus = base.copy(), base.copy()
    plus[element], minus[element] = x + h, x - h
    up = float(float64_values(network, oracle, {i: plus})[target])
    down = float(float64_values(network, oracle, {i: minus})[target])
    return (up - down) / ((x + h) - (x - h))


# Steps from coarse to fine around check_gradients' 2^-10: a quotient too coarse for a function that
# turns on a scale far below h = step * max(1, |x|) (cos of a value near 5000, 1/x near x = 0.09)
# settles at a finer step; one lost in roundoff settles at a coarser one.
STEPS = (2.0**-6, 2.0**-10, 2.0**-14, 2.0**-18, 2.0**-22, 2.0**-26)


def _rounding_reach(network, values, cotangents: dict, between: list[int]) -> float:
    """How far rounding can move the loss: each node's rounding, about eps times the largest
    magnitude it computes from (its value or an operand), times the loss's sensitivity to it.

    A value that cancels (log_softmax's largest element of a nearly one-hot row, -7e-16 computed
    as -6.7e-16 from operands near 17) is off by most of itself, and a loss that divides by it
    turns that into a quotient no step resolves: the cotangent carries the amplification.
    """
    reach, nodes = 0.0, network.nodes()
    with np.errstate(all="ignore"):
        for j in between:
            g = cotangents.get(j)
            if g is None:
                continue
            node = nodes[j]
            operands = [float(np.max(np.abs(values[s.index]), initial=0.0)) for s in node.operands
                        if np.asarray(values[s.index]).dtype.kind == "f"]
            scale = np.maximum(np.abs(values[j]), max(operands, default=0.0))
            reach += float(np.sum(np.abs(g) * scale))
    return reach


STEADY = 0.1  # how far the rules' derivative may move across a step, relative to the largest


def _rule_steady(network, oracle, target: int, i: int, base, element: tuple, h: float, at: float,
                 scale: float) -> bool:
    """Whether the rules' derivative holds nearly still over the points a quotient at ``h`` reads.

    Quotients that agree can still be blind: cos(x) + 2x at x = -1e30 in float64 has quotients
    of exactly 2 at every step (the smallest, 2^-26 |x|, spans 1e21 periods of cos), while the
    rules say 2 - sin(x). A derivative that moves within the step is not what the quotient measures.
    ``scale``: the parameter's largest derivative, which the check is norm-wise against.
    """
    def rule_at(point: float) -> float:
        moved = base.copy()
        moved[element] = point
        values = float64_values(network, oracle, {i: moved})
        return float(float64_gradients(network, values, target, [i])[i][element])

    x = float(base[element])
    with np.errstate(all="ignore"):
        # Richardson absorbs a derivative that bends smoothly across the step (erf's tail moves 1% over
        # 2^-10 of its argument); one that moves by a tenth of the largest derivative is not bending.
        return all(abs(rule_at(x + d) - at) <= STEADY * max(abs(at), scale, 1e-300) for d in (h, -h, h / 2, -h / 2))


def _judged_by_element(network, oracle, built, entry, tolerance: float) -> str | None:
    """Grade a failing entry element by element where finite differences can: why it is set aside, or None.

    At each element, Richardson values ``R(h) = (4 q(h/2) - q(h)) / 3`` are taken at the STEPS from
    coarse to fine, and the element is judged at the first two consecutive steps whose values agree
    to ``sqrt(tolerance)`` and where the rules' derivative holds still across the step
    (``_rule_steady``): there the quotient has converged on what the rules give. The judged value must match the
    derivative rules within ``tolerance`` norm-wise (as check_gradients measures), with roundoff as
    slack: the quotient's, about ``16 eps M / h`` (``M`` the largest magnitude among the nodes
    between the parameter and the loss, which round what the step changes, or, when larger, their
    rounding weighted by the loss's sensitivity to each, ``_rounding_reach``), and the rule's own,
    ``8 eps`` times the largest term summed into the cotangent (x / x at x = 1e-40 adds -1e40 and
    1e40 to a gradient of 1, and the 1 is lost: no rule is wrong, the sum cancels). Elements with
    no converged pair cannot be judged by a float64 quotient at all (the function turns faster
    than any step can follow, cos near 1e30). Returns None when a judged element disagrees.
    """
    values = float64_values(network, oracle)
    target, i = built.loss.index, entry.symbol.index
    between = _between(network, i, target)
    magnitude = max((float(np.max(np.abs(values[j]), initial=0.0)) for j in between), default=0.0)
    terms: dict = {}
    cotangents: dict = {}
    rule = float64_gradients(network, values, target, [i], terms, cotangents)[i]
    magnitude = max(magnitude, _rounding_reach(network, values, cotangents, between))
    base = values[i]
    largest = float(np.max(np.abs(rule), initial=0.0))
    judged: list[tuple[float, float, float]] = []  # (rule, converged quotient, roundoff of both)
    unjudged = 0
    for element in np.ndindex(*base.shape):
        x = float(base[element])
        previous = None
        for step in STEPS:
            h = step * max(1.0, abs(x))
            coarse = _quotient(network, oracle, target, i, base, element, h)
            fine = _quotient(network, oracle, target, i, base, element, h / 2)
            value, noise = (4.0 * fine - coarse) / 3.0, 16 * 2.0**-52 * magnitude / h
            if previous is not None and abs(previous - value) <= math.sqrt(tolerance) * max(abs(previous), abs(value)) \
                    and _rule_steady(network, oracle, target, i, base, element, h, float(rule[element]), largest):
                # the rule's own roundoff: its cotangent is a sum of terms as large as terms[i]
                judged.append((float(rule[element]), value, noise + 8 * 2.0**-52 * float(terms[i][element])))
                break
            previous = value
        else:
            unjudged += 1
    scale = max([float(np.max(np.abs(rule), initial=0.0))] + [abs(q) for _, q, _ in judged])
    if any(abs(q - g) > tolerance * scale + 2 * noise for g, q, noise in judged):
        return None
    if unjudged:
        return "elements no float64 difference quotient can judge"
    if any(abs(q - g) > tolerance * scale for g, q, _ in judged):
        return "gradient below the resolution of the quotient or of the rule's own sum"
    return "truncation or roundoff of step 2^-10 (the elements agree at another step)"


def _passes(report, entry, float64: bool) -> bool:
    return report.passed(entry) if float64 else entry.rule_error <= report.rule_tolerance




def check_finite_differences(network, built, oracle, tally: Tally) -> None:
    graph = built.graph
    closure = ancestors(network, built.loss.index)
    with np.errstate(all="ignore"):
        finite = all(np.isfinite(np.asarray(oracle[network.symbol(j)]).astype(np.float64)).all()
                     for j in closure if is_element(network.nodes()[j].dtype))
    if not finite:
        tally.set_aside["4 finite differences", "graph has inf or NaN (graphs)"] += 1
        event("check 4: skipped, inf or NaN")
        return
    parameters = network.parameters()
    report = topos.check_gradients(network, parameters, built.feeds, built.loss)
    float64 = graph.dtype == "f64"
    for entry in report.entries:
        tally.checks["4 finite differences (parameters)"] += 1
        if _passes(report, entry, float64):
            if not float64:  # the element type's own rounding, where the quotients are meaningful
                worst = tally.worst_own_error.get(graph.dtype, 0.0)
                tally.worst_own_error[graph.dtype] = max(worst, entry.error)
                tally.own_error_over_tolerance[graph.dtype] += entry.error > report.tolerance
            continue
        reason = _quotient_hazard(network, oracle, built, entry, report.step)
        if reason is None:
            reason = _judged_by_element(network, oracle, built, entry, report.rule_tolerance)
        if reason is None:
            raise AssertionError(f"check 4: finite differences disagree with the derivative rules\n"
                                 f"{to_python(graph)}\n{report}")
        tally.set_aside["4 finite differences", reason + " (parameters)"] += 1
        event(f"check 4: set aside, {reason}")


def check_host(graph: Graph, tally: Tally) -> None:
    """Checks 1, 2 and 4 on one graph."""
    network, built = record_alone(graph)
    tally.seen(graph, network)
    event(f"{graph.dtype} {graph.mode}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # inf and NaN are data here
        oracle = network.forward(network.parameters(), built.feeds)
        check_exact_plan(network, built, oracle, tally)
        check_recorded_gradients(network, built, oracle, tally)
        check_finite_differences(network, built, oracle, tally)


# ---- check 3: IREE on llvm-cpu, node by node by local error ----------------------------------------------


GATHER_FUSION = Known(
    "iree-gather-producer-fusion",
    "an elementwise value that a gather reads and that is also returned (or read by another op) is "
    "written only at the rows the gather selects; its other rows are left uninitialised",
    "IREE (3.13.0) dispatch creation (producer fused into the gather while still used elsewhere)")
SIN_COS_LARGE_ARGUMENT = Known(
    "iree-sin-cos-large-argument",
    "float32 and bfloat16 sin and cos on llvm-cpu lose the range reduction from |x| of about 5e7 on: "
    "the results leave [-1, 1] (sin(1e10) = -6e21, sin(1e20) = -inf; the oracle gives -0.488, 0.657)",
    "IREE (3.13.0) math approximation of sin/cos; in topos, dialect/passes/lowering.py could reduce the "
    "argument (or compute float32 sin/cos in float64) before IREE sees it")
F64_ERF_SIGN = Known(
    "iree-f64-erf-sign",
    "a float64 erf returned beside its negation, the negation's negation and exp(-x * x) (what "
    "erf's derivative reads) comes back with its sign flipped, erf(-0.7448) = +0.7078; the "
    "negation returned beside it is right, and is flagged only because it is judged on that value",
    "IREE (3.13.0): the module is four lines of StableHLO (see docs/reliability.md)")
GLOBAL_WRITE = Known(
    "iree-global-write-outside-distribution",
    "iree-compile refuses a module it should compile: \"'linalg.generic' op write affecting operations "
    "on global resources are restricted to workgroup distributed contexts\" at a narrow of a padded, "
    "doubled scatter, when every node is a result (as bisect compiles); found by the slow run, not "
    "yet minimised below one fuzzed graph",
    "IREE (3.13.0) llvm-cpu dispatch distribution; in topos, dialect/passes/lowering.py once minimised")
BINDING_COUNT = Known(
    "iree-binding-count",
    "IREE's CPU runtime refuses to load a module it compiled, 'binding count 41 > 32' at "
    "hal.command_buffer.dispatch: a chain of 40 rank-0 elementwise nodes, every one a result (as "
    "bisect compiles), fused into one dispatch that binds each result separately",
    "IREE (3.13.0) stream binding layout; iree-compile's --iree-stream-resource-alias-mutable-bindings=true "
    "loads it, a flag the in-process compiler API (Session.set_flags) does not accept")
KNOWN = (GATHER_FUSION, SIN_COS_LARGE_ARGUMENT, F64_ERF_SIGN, GLOBAL_WRITE, BINDING_COUNT)
# Fixed, each with its reproduction kept below as a regression test (docs/reliability.md): the
# logsumexp rule (its weights are softmax(x)), the one-element in-place add of EXACT plans, IREE's
# sum of a splat of constants (constant reductions are folded on the host), its refusal of a
# one-element slice taken to more axes by reshape or broadcast and of one recorded row gathered
# (re-sliced from a widened operand; a static slice), float64 constant evaluation without
# libm (--iree-opt-const-eval=false), and sin(-0) (the lowering returns a zero argument as it is).
# Worked around for the shape found, their matchers kept: the gather and the global write (one
# recorded row gathered again and again is that row broadcast).
LARGE_ARGUMENT = 2.0**24  # below it, IREE's float32 sin and cos measured within their envelope

_NODE_IN_DIAGNOSTIC = re.compile(r"\(node %(\d+) (\w+)\)")


def _refused(network, error: Exception) -> tuple[Known, list[int]] | None:
    """Which known divergence made IREE refuse the module, and the nodes that trigger it."""
    text = str(error)
    if "write affecting operations on global resources" in text:
        nodes = [int(i) for i, name in _NODE_IN_DIAGNOSTIC.findall(text) if name == "narrow"]
        return (GLOBAL_WRITE, nodes) if nodes else None
    every = network.nodes()
    if re.search(r"binding count \d+ > 32", text):  # names no node: every rank-0 computed node is a suspect
        nodes = [n.index for n in every if not n.is_source and n.shape == ()]
        return (BINDING_COUNT, nodes) if len(nodes) > 32 else None
    return None


def _constant(network, i: int) -> bool:
    """Whether node ``i`` is a function of constants: every float source it reads is a leaf.

    Selections do not count: a gather from a splat table is a splat whichever rows it picks.
    """
    nodes = network.nodes()
    return all(nodes[j].opcode.name == "leaf" for j in ancestors(network, i)
               if nodes[j].is_source and is_element(nodes[j].dtype))


def _known_outside(network, i: int, compiled: dict, oracle) -> Known | None:
    """Which known divergence explains node ``i`` leaving its envelope, if one does."""
    from topos.dialect.iree.conformance import deviation

    nodes = network.nodes()
    node = nodes[i]
    name = node.opcode.name
    if name == "map" and node.attributes["function"] in ("sin", "cos") and node.dtype != topos.float64:
        (j,) = (s.index for s in node.operands)
        x = np.asarray(compiled[j] if j in compiled else oracle[node.operands[0]])
        small = np.abs(x.astype(np.float64)) < LARGE_ARGUMENT
        if not small.all() and deviation(name, dict(node.attributes), np.asarray(compiled[i])[small],
                                         [x[small]]).ok:
            return SIN_COS_LARGE_ARGUMENT
    if _erf_sign_flipped(network, i, compiled, oracle):
        return F64_ERF_SIGN
    if name == "neg" and _erf_sign_flipped(network, node.operands[0].index, compiled, oracle) and \
            _bits(compiled[i]) == _bits(compiled[node.operands[0].index]):  # -erf, right beside the flipped erf
        return F64_ERF_SIGN
    readers = [n for n in network.nodes() if n.opcode.name == "gather" and n.operands[0].index == i]
    if readers and not node.is_source:
        selected = set()
        for reader in readers:
            selected.update(int(k) for k in np.asarray(oracle[reader.operands[1]]).reshape(-1))
        got, want = np.asarray(compiled[i]).astype(np.float64), _local_reference(node, compiled, oracle)
        rows = {int(r) for r in np.argwhere(_bits_differ(got, want).reshape(got.shape[:1] + (-1,)))[:, 0]}
        if rows and not rows & selected:
            return GATHER_FUSION
    return None


def _erf_sign_flipped(network, i: int, compiled: dict, oracle) -> bool:
    """Whether node ``i`` is a float64 erf whose compiled value is its reference with the sign flipped."""
    from topos.dialect.iree.conformance import deviation

    node = network.nodes()[i]
    if node.opcode.name != "map" or node.attributes["function"] != "erf" or node.dtype != topos.float64:
        return False
    (operand,) = node.operands
    x = compiled[operand.index] if operand.index in compiled else np.asarray(oracle[operand])
    return deviation("map", dict(node.attributes), -np.asarray(compiled[i]), [x]).ok


def _local_reference(node, compiled: dict, oracle) -> np.ndarray:
    """The node's reference kernel on its compiled operands (sources as fed), in float64."""
    operands = [compiled[s.index] if s.index in compiled else np.asarray(oracle[s]) for s in node.operands]
    with np.errstate(all="ignore"):
        return np.asarray(node.opcode.kernel(*operands, **dict(node.attributes))).astype(np.float64)


def _bits_differ(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    same = (got == want) & (np.signbit(got) == np.signbit(want))
    return ~(same | (np.isnan(got) & np.isnan(want)))


def _compiled_values(network, entry, parameters, feeds) -> dict:
    """Every computed node's compiled value, compiled exactly as bisect compiles it (a cache hit)."""
    closure = sorted(entry.closure())
    observed = [network.symbol(i) for i in closure if not network.nodes()[i].is_source
                and is_element(network.nodes()[i].dtype)]
    compiled = network.entry(list(entry.roots), observe=observed, numerics=Numerics.FAST).lower()
    run = compiled.compile("llvm-cpu").forward(parameters, feeds)
    return {s.index: np.asarray(run[s]) for s in observed}


def check_compiled(batch: list[Graph], tally: Tally) -> None:
    """Check 3 on a batch of graphs recorded into one network: one compile, every node judged."""
    from topos.dialect.iree.compile import CompileError

    batch = [g for g in batch if HAS_LINKER or g.dtype != "f64"]
    while batch:
        network, builts = record_together(batch)
        starts = [min(s.index for s in b.pool) for b in builts]
        entry = network.entry([r for b in builts for r in b.roots()], observe=[o for b in builts for o in b.observes])
        parameters = network.parameters()
        feeds = {k: v for b in builts for k, v in b.feeds.items()}
        try:
            report = topos.bisect(entry, parameters, feeds)
        except CompileError as error:
            refused = _refused(network, error)
            if refused is None:
                raise AssertionError(f"check 3: IREE refused the batch\n{error}\n\n"
                                     + "\n\n".join(to_python(g) for g in batch)) from None
            known, triggers = refused
            counts = collections.Counter(max(k for k, start in enumerate(starts) if start <= i) for i in triggers)
            # Each graph that triggers it goes; for the binding count, the one with the most rank-0 nodes.
            owners = {counts.most_common(1)[0][0]} if known is BINDING_COUNT else set(counts)
            tally.set_aside["3 IREE local error", f"{known.name} (graphs)"] += len(owners)
            event(f"check 3: set aside, {known.name}")
            batch = [g for k, g in enumerate(batch) if k not in owners]
            continue
        break
    else:
        return
    for graph in batch:
        tally.seen(graph, record_alone(graph)[0])
    tally.checks["3 IREE local error (graphs)"] += len(batch)
    tally.checks["3 IREE local error (nodes)"] += report.checked
    tally.checks["3 IREE compiles"] += 1
    if report.ok:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        oracle = network.forward(parameters, feeds)
    compiled = _compiled_values(network, entry, parameters, feeds)
    unexplained = []
    for i in report.outside:
        known = _known_outside(network, i, compiled, oracle)
        if known is None:
            unexplained.append(i)
        else:
            tally.set_aside["3 IREE local error", f"{known.name} (nodes)"] += 1
            event(f"check 3: known divergence {known.name}")
    if unexplained:
        owners = sorted({max(k for k, start in enumerate(starts) if start <= i) for i in unexplained})
        raise AssertionError(
            f"check 3: nodes {unexplained} leave their IREE envelope (local error)\n{report}\n\n"
            + "\n\n".join(to_python(batch[k]) for k in owners))


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    """Compiles of this module go to a fresh folder: nothing comes from, or lands in, the user's cache."""
    folder = tmp_path_factory.mktemp("topos-fuzz-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TOPOS_CACHE_DIR", str(folder))
        yield folder


# ---- the runs -----------------------------------------------------------------------------------------


def _fuzz_host(examples: int) -> Tally:
    tally = Tally()

    @settings(max_examples=examples, **SETTINGS)
    @given(graphs())
    def run(graph):
        check_host(graph, tally)

    _drawn(run)()
    return tally


def _fuzz_iree(batches: int) -> Tally:
    tally = Tally()

    @settings(max_examples=batches, **SETTINGS)
    @given(st.lists(graphs(), min_size=BATCH, max_size=BATCH))
    def run(batch):
        check_compiled(batch, tally)

    _drawn(run)()
    return tally


def test_random_graphs_agree_on_the_host_exact_plan_recorded_gradients_and_finite_differences():
    tally = _fuzz_host(HOST_GRAPHS)
    print("\n" + tally.summary("checks 1, 2, 4"))
    _covers_vocabulary(tally)
    assert tally.checks["1 exact plan == oracle (graphs)"] == sum(tally.graphs.values())
    assert tally.checks["4 finite differences (parameters)"] > HOST_GRAPHS // 2


def test_random_graphs_compiled_by_iree_stay_within_each_nodes_envelope(compile_cache):
    pytest.importorskip("iree.compiler")
    pytest.importorskip("iree.runtime")
    tally = _fuzz_iree(IREE_BATCHES)
    print("\n" + tally.summary("check 3"))
    assert tally.checks["3 IREE compiles"] >= IREE_BATCHES // 2


@pytest.mark.slow
def test_ten_thousand_random_graphs_agree_on_the_host():
    tally = _fuzz_host(SLOW_HOST_GRAPHS)
    print("\n" + tally.summary("checks 1, 2, 4 (slow)"))
    _covers_vocabulary(tally)


@pytest.mark.slow
def test_a_thousand_random_graphs_compiled_by_iree_stay_within_each_nodes_envelope(compile_cache):
    pytest.importorskip("iree.compiler")
    pytest.importorskip("iree.runtime")
    tally = _fuzz_iree(SLOW_IREE_BATCHES)
    print("\n" + tally.summary("check 3 (slow)"))
    _covers_vocabulary(tally)


# ---- the known divergences, reproduced (strict xfail: a fix makes these pass, and then fail) ------------


def _compiles_to_the_oracles_bits(network, results) -> None:
    """Every result of ``network``, compiled for llvm-cpu, has the oracle's bits."""
    compiled = network.entry(list(results)).lower().compile("llvm-cpu")
    run, oracle = compiled.forward(network.parameters()), network.forward(network.parameters())
    for symbol in results:
        assert _bits(run[symbol]) == _bits(oracle[symbol]), symbol


def test_fixed_unit_slice_reshape_compiles(compile_cache):
    pytest.importorskip("iree.compiler")

    def model(tape):
        x = tape.input(np.array([1.0, 2.0], np.float32))
        window = x.narrow(0, 0, 1).reshape((1, 1))  # or x.unfold(0, 1, 2): a [1, 1] slice
        return window, -window

    network, (window, negated) = Tape.record(model)
    compiled = network.entry([negated], observe=[window]).lower().compile("llvm-cpu")
    assert _bits(compiled.forward(network.parameters())[negated]) == _bits(
        network.forward(network.parameters())[negated])


@pytest.mark.parametrize("length", [1, 2])
def test_fixed_one_window_unfold_compiles(compile_cache, length):
    """The slow IREE fuzz's refusals of 2026-12-02: one window of one element, observed and summed."""
    pytest.importorskip("iree.compiler")

    def model(tape):
        x = tape.parameter(np.array([0.5478467345237732, -0.9208531379699707][:length], np.float32))
        window = x.unfold(0, 1, 2, 1)  # [length] -> [1, 1]
        return window, window.sum()

    network, (window, total) = Tape.record(model)
    plan = network.entry([total], observe=[window]).lower()
    assert "[0:1:2]" not in plan.emit_stablehlo()  # a one-element slice is emitted with stride 1
    compiled = plan.compile("llvm-cpu")
    run, oracle = compiled.forward(network.parameters()), network.forward(network.parameters())
    for symbol in (window, total):
        assert _bits(run[symbol]) == _bits(oracle[symbol])


def test_fixed_one_window_reshaped_to_more_axes_compiles(compile_cache):
    """The slow IREE fuzz's refusal at a reshape (2026-12-02): a one-element window taken to four
    axes, returned and reduced, was refused as a reshape and as the broadcast_in_dim workaround."""
    pytest.importorskip("iree.compiler")

    def model(tape):
        x = tape.parameter(np.array([[-1.75], [0.75]], np.float32))
        window = x.unfold(0, 1, 2, 2)  # [2, 1] -> [1, 1, 1]: the first row's one element
        wide = window.reshape((1, 1, 1, 1))
        return window, wide, wide.logsumexp(2)

    _compiles_to_the_oracles_bits(*Tape.record(model))


def test_fixed_gather_of_an_unfold_compiles(compile_cache):
    """The slow IREE fuzz's LLVM translation failure (2026-12-02): rows gathered from an unfold's windows,
    when the unfold was lowered as a slice of its operand widened by the lane axis."""
    pytest.importorskip("iree.compiler")

    def model(tape):
        x = tape.parameter(np.array([[3.5, 1.75], [2.25, 3.5]], np.float32))
        windows = x.unfold(1, 1, 2, 1)  # [2, 2] -> [2, 1, 1]
        rows = windows.gather(tape.leaf(topos.selection([[0, 1, 1], [0, 1, 0], [1, 0, 0]], 2)))
        return windows, rows

    _compiles_to_the_oracles_bits(*Tape.record(model))


@pytest.mark.parametrize("index", [0, 2])
def test_fixed_one_recorded_row_gathered_compiles(compile_cache, index):
    """iree-unit-slice-reshape's fourth form (2026-12-02): one row of a [3, 1] table gathered by a
    recorded selection, returned, and summed: IREE folded the gather into a slice it then refused.
    One recorded index is emitted as that static slice, which compiles."""
    pytest.importorskip("iree.compiler")

    def model(tape):
        table = tape.parameter(np.array([[1.5], [-0.25], [-0.125]], np.float32))
        row = table.gather(tape.leaf(topos.selection([index], 3)))  # [1, 1]
        bigger = row.maximum(row)
        return row, bigger, bigger.sum()

    network, results = Tape.record(model)
    assert "stablehlo.gather" not in network.entry(list(results)).lower().emit_stablehlo()
    _compiles_to_the_oracles_bits(network, results)


@pytest.mark.parametrize("rows, run", [([1, 2, 3], True), ([[0, 1], [2, 3]], True), ([3, 1, 2], False),
                                       ([2, 2], True), ([1, 3], False)])
def test_recorded_rows_in_a_run_are_gathered_as_a_slice(compile_cache, rows, run):
    """Recorded positions k, k+1, ... (row-major) are a static slice of the table, and k, k, ... that row
    broadcast: the same copy as the gather (metal could not compile such an index vector fused into a
    reduction; IREE wrote a table gathered at [0, 0] and also returned at row 0 only). Any other
    recorded selection stays a gather. All give the oracle's bits, NaN and -0.0 rows included."""
    pytest.importorskip("iree.compiler")

    def model(tape):
        table = tape.parameter(np.array([[1.5, np.nan], [-0.0, 2.0], [-0.25, np.inf], [3.0, -1.0]], np.float32))
        picked = table.gather(tape.leaf(topos.selection(rows, 4)))
        return picked, picked.exp()

    network, results = Tape.record(model)
    text = network.entry(list(results)).lower().emit_stablehlo()
    assert ("stablehlo.gather" in text) is not run, text
    _compiles_to_the_oracles_bits(network, results)


NONFINITE = np.array([np.nan, np.inf, -np.inf, 0.5, -1.0, 3.0], np.float32)


@pytest.mark.parametrize("function", ["exp", "log", "sqrt", "tanh", "sin", "cos", "log1p", "expm1", "erf"])
def test_fixed_math_of_a_recorded_nonfinite_constant_runs_instead_of_folding(compile_cache, function):
    """iree-folded-nonfinite (2026-12-04): IREE inlined a recorded constant into its dispatch, where LLVM
    evaluated exp, logistic and expm1 of a NaN to 0 and sin, cos and tan of a NaN or an infinity to 0
    (under the no-NaN assumptions of IREE's approximations); the same module computed NaN from an input.
    A float constant holding a NaN or an infinity now reaches IREE behind an optimization barrier."""
    pytest.importorskip("iree.compiler")

    def model(tape):
        values = tape.leaf(NONFINITE)
        return values.map(function), values.map(function) * 2.0

    network, results = Tape.record(model)
    text = network.entry(list(results)).lower().emit_stablehlo()
    assert "stablehlo.optimization_barrier" in text, text  # the leaf, or the non-finite values of it
    run = network.entry(list(results)).lower().compile("llvm-cpu", cache=False).forward(network.parameters())
    oracle = network.forward(network.parameters())
    for symbol in results:
        got, want = np.asarray(run[symbol], np.float64), oracle[symbol].astype(np.float64)
        assert np.array_equal(np.isnan(got), np.isnan(want)), (function, got, want)
        finite = np.isfinite(want)
        assert np.array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)]), (function, got)
        assert np.allclose(got[finite], want[finite], rtol=1e-6, atol=0), (function, got, want)


@pytest.mark.parametrize("chain", ["log(-1).exp", "(0/0).exp", "(1e30*1e30).sin", "x*log(-1).exp"])
def test_fixed_math_of_a_nonfinite_value_of_constants_is_the_oracles(compile_cache, chain):
    """iree-folded-nonfinite, second form: finite constants whose value on the way is not finite. Folded by
    LLVM, exp(log(-1)) came out as the neighbouring element's value (0.5) and (0 / 0).exp() as exp(0.5);
    the plan now computes such a value with the oracle's kernels and emits it as a (fenced) leaf."""
    pytest.importorskip("iree.compiler")
    f32 = np.float32

    def model(tape):
        a, b = tape.leaf(np.array([-1.0, 0.5], f32)), tape.leaf(np.array([0.0, 0.5], f32))
        big = tape.leaf(np.array([1e30, 1.0], f32))
        return {"log(-1).exp": lambda: a.log().exp(), "(0/0).exp": lambda: (b / b).exp(),
                "(1e30*1e30).sin": lambda: (big * big).sin(),
                "x*log(-1).exp": lambda: tape.input(np.array([2.0, 3.0], f32), name="x") * a.log().exp()}[chain]()

    network, out = Tape.record(model)
    got = np.asarray(network.entry([out]).lower().compile("llvm-cpu", cache=False).forward(network.parameters())[out])
    want = network.forward(network.parameters())[out]
    assert np.isnan(want[0]) and np.isnan(got[0]), (got, want)
    assert np.allclose(got[1:], want[1:], rtol=1e-6), (got, want)


def test_a_nonfinite_leaf_read_by_math_of_a_finite_value_is_fenced(compile_cache):
    """tanh of +-inf is finite, so the plan leaves the tanh to IREE; its recorded operand is fenced, so
    IREE computes it from a buffer rather than folding it under no-infinity assumptions."""
    pytest.importorskip("iree.compiler")

    def model(tape):
        return tape.leaf(np.array([np.inf, -np.inf, 0.5], np.float32)).tanh()

    network, out = Tape.record(model)
    plan = network.entry([out]).lower()
    assert not plan.folded_constants()
    assert plan.emit_stablehlo().count("stablehlo.optimization_barrier") == 1
    got = plan.compile("llvm-cpu", cache=False).forward(network.parameters())[out]
    assert np.allclose(got, network.forward(network.parameters())[out], rtol=1e-6)


def test_a_finite_recorded_constant_is_not_fenced():
    pytest.importorskip("iree.compiler")

    def model(tape):
        return tape.leaf(np.array([0.5, -1.0, 3.0], np.float32)).exp()

    network, out = Tape.record(model)
    assert "optimization_barrier" not in network.entry([out]).lower().emit_stablehlo()


def test_fixed_one_element_slice_broadcast_to_more_axes_compiles(compile_cache):
    """iree-unit-slice-reshape's fifth form (the slow fuzz of 2026-12-02, at a logsumexp gradient):
    a one-element slice broadcast to a one-element value of more axes, returned and read by an
    elementwise op, was refused at the broadcast_along."""
    pytest.importorskip("iree.compiler")

    def model(tape):
        x = tape.parameter(np.array([0.5, -1.25], np.float32))
        one = x.narrow(0, 0, 1).broadcast_along(0, 1).broadcast_along(2, 1)  # [1] -> [1, 1] -> [1, 1, 1]
        return one, one.exp()

    _compiles_to_the_oracles_bits(*Tape.record(model))


def test_fixed_fold_of_a_padded_value_places_every_window(compile_cache):
    """iree-pad-of-pad (2026-12-02): a strided fold of a padded value put its windows one place early."""
    pytest.importorskip("iree.compiler")

    def model(tape):
        x = tape.parameter(np.array([2.75], np.float32))
        padded = x.pad(0, 1, 2)  # [0, 2.75]
        return padded.reshape((2, 1)).fold(0, 1, 2, 2, 4)  # windows at 0 and 2: [0, 0, 2.75, 0]

    network, folded = Tape.record(model)
    plan = network.entry([folded]).lower()
    assert "interior = [1]" not in plan.emit_stablehlo()  # the placement is spelled with edge padding
    got = plan.compile("llvm-cpu").forward(network.parameters())[folded]
    want = network.forward(network.parameters())[folded]
    assert np.array_equal(want, [0.0, 0.0, 2.75, 0.0])
    assert _bits(got) == _bits(want), f"compiled {got}, oracle {want}"


@pytest.mark.skipif(not HAS_LINKER, reason="float64 on llvm-cpu links a system shared object: no ld or cc")
def test_fixed_f64_sin_of_a_constant_compiles(compile_cache):
    pytest.importorskip("iree.compiler")

    def model(tape):
        return tape.leaf(np.array([0.5, 2.0])).sin()  # float64: sin of a constant

    network, out = Tape.record(model)
    compiled = network.entry([out]).lower().compile("llvm-cpu")
    np.testing.assert_allclose(compiled.forward(network.parameters())[out],
                               network.forward(network.parameters())[out], rtol=1e-15)


def test_fixed_one_element_in_place_add_keeps_the_oracles_nan():
    def model(tape):
        a = tape.input(np.array(np.nan))  # +NaN
        b = tape.input(np.array(np.copysign(np.nan, -1.0)))  # -NaN
        return (a + a) + b  # one elementwise chain; its second add runs in place

    network, out = Tape.record(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        planned = network.entry([out], numerics=Numerics.EXACT).lower().forward(network.parameters())[out]
        want = network.forward(network.parameters())[out]
    assert _bits(planned) == _bits(want), f"plan {planned.tobytes().hex()}, oracle {want.tobytes().hex()}"


def test_fixed_splat_reduction_sums_every_element(compile_cache):
    pytest.importorskip("iree.compiler")

    def model(tape):
        w = tape.parameter(np.zeros(2, np.float32))
        x = tape.input(np.ones((2, 3), np.float32))
        loss = (x - w.broadcast_along(1, 3)).sum()  # d loss / d w = -sum_along(broadcast(1)) = -3
        return w, tape.differentiate(loss, [w])

    network, (w, adjoints) = Tape.record(model)
    compiled = network.entry(adjoints.roots()).lower().compile("llvm-cpu")
    got = compiled.forward(network.parameters())[adjoints[w]]
    want = network.forward(network.parameters())[adjoints[w]]
    assert np.array_equal(got, want), f"compiled {got}, oracle {want}"


def test_fixed_splat_reduction_of_a_gathered_constant_sums_every_element(compile_cache):
    # The slow fuzz's second form: the cotangent of a scatter is a gather of the seed's
    # broadcast, picked by an input selection, so the closure is not leaves alone.
    pytest.importorskip("iree.compiler")

    def model(tape):
        w = tape.parameter(np.array([0.5], np.float32))  # a one-element sum: two elements sum right
        rows = tape.input(topos.selection([0, 3, 3], 4))
        loss = w.broadcast_along(0, 3).scatter(rows, 4).sum()  # d loss / d w = sum_along(gather(1)) = 3
        return w, tape.differentiate(loss, [w])

    network, (w, adjoints) = Tape.record(model)
    compiled = network.entry(adjoints.roots()).lower().compile("llvm-cpu")
    got = compiled.forward(network.parameters())[adjoints[w]]
    want = network.forward(network.parameters())[adjoints[w]]
    assert np.array_equal(want, [3.0])
    assert np.array_equal(got, want), f"compiled {got}, oracle {want}"


@pytest.mark.xfail(strict=True, raises=topos.ToposError, reason=BINDING_COUNT.what)
def test_known_divergence_iree_loads_a_module_of_forty_observed_scalars(compile_cache):
    pytest.importorskip("iree.compiler")

    def model(tape):
        v = tape.parameter(np.float32(0.5))
        chain = []
        for k in range(40):
            v = (v * v + 1.0).map("sqrt") if k % 2 else -v
            chain.append(v)
        return chain

    network, chain = Tape.record(model)
    network.entry([chain[-1]], observe=chain[:-1]).lower().compile("llvm-cpu").forward(network.parameters())


def test_fixed_iree_compiles_a_narrow_of_a_padded_scatter_with_every_node_observed(compile_cache):
    """iree-global-write-outside-distribution's fuzzed graph: refused until 2026-12-04. The gradient of its
    scatter by the recorded selection [0, 0] gathers one row twice, and that gather is now lowered as the
    row broadcast (iree-gather-producer-fusion's workaround); the module compiles and gives the oracle's
    loss and gradient. The KNOWN matcher stays: the graph was never minimised, so the IREE bug may have
    other shapes."""
    pytest.importorskip("iree.compiler")

    def model(tape):  # the fuzzed graph as the slow run drew it (docs/reliability.md)
        v0 = tape.parameter(np.array([[[-0.852861225605011], [1.098866581916809]],
                                      [[-0.3308456838130951], [-1.0643808841705322]],
                                      [[-1.5375767946243286], [1.9701229333877563]],
                                      [[1.7394993305206299], [-1.4295520782470703]]], np.float32))
        v1 = tape.input(topos.selection([[1, 0], [1, 1], [0, 0], [1, 0]], 2))
        v2 = v0.scatter(v1, 2)
        v4 = v2.sub(v2).pad(1, 0, 2)
        v4.add(v4).narrow(0, 0, 2)
        v8 = v4.scatter(tape.leaf(topos.selection([0, 0], 1)), 1)
        v0.broadcast_to((4, 2, 1)).add(v0)
        v15 = v8.broadcast_along(0, 3).broadcast_along(0, 1).sum().add(v2.sum())
        loss = v15.add(v2.sum())
        return loss, tape.differentiate(loss, [v0])

    network, (loss, adjoints) = Tape.record(model)
    every = [network.symbol(n.index) for n in network.nodes() if not n.is_source and is_element(n.dtype)]
    roots = [loss, *adjoints.roots()]
    compiled = network.entry(roots, observe=every, numerics=Numerics.FAST).lower().compile("llvm-cpu")
    run, oracle = compiled.forward(network.parameters()), network.forward(network.parameters())
    for root in roots:
        np.testing.assert_allclose(run[root], oracle[root], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("picked", [[0, 0], [1, 1], [[0, 0], [0, 0]]])
def test_fixed_iree_gather_producer_fusion_writes_every_row(compile_cache, picked):
    """iree-gather-producer-fusion's reproduction: gathered by the recorded indices [0, 0], IREE wrote a
    table it also returned at row 0 only. One recorded row picked again and again is now lowered as
    that row broadcast (the same copy), and the table is whole."""
    pytest.importorskip("iree.compiler")

    def model(tape):
        w = tape.parameter(np.array([0.5, 3.0], np.float32))
        table = -w
        rows = table.gather(tape.leaf(topos.selection(picked, 2)))  # reads one row only
        return rows, table.exp()  # a second reader of the table

    network, (rows, other) = Tape.record(model)
    plan = network.entry([rows, other]).lower()
    assert "stablehlo.gather" not in plan.emit_stablehlo()
    run, oracle = plan.compile("llvm-cpu").forward(network.parameters()), network.forward(network.parameters())
    assert _bits(run[rows]) == _bits(oracle[rows])
    np.testing.assert_allclose(run[other], oracle[other], rtol=1e-6)


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=SIN_COS_LARGE_ARGUMENT.what)
def test_known_divergence_iree_sin_cos_large_argument_stays_in_range(compile_cache):
    pytest.importorskip("iree.compiler")

    def model(tape):
        return tape.input(np.array([1e10, 1e20], np.float32)).sin()

    network, out = Tape.record(model)
    got = network.entry([out]).lower().compile("llvm-cpu").forward(network.parameters())[out]
    assert np.all(np.abs(got) <= 1.0), f"compiled sin {got}, oracle {network.forward(network.parameters())[out]}"


@pytest.mark.parametrize("dtype", [np.float32, topos.bfloat16], ids=["f32", "bf16"])
def test_fixed_iree_sin_of_negative_zero_is_negative_zero(compile_cache, dtype):
    """iree-sin-negative-zero: IREE's float32 sin gave +0 for -0 (C99 and the oracle: -0). The lowering
    now returns a zero argument as it is."""
    pytest.importorskip("iree.compiler")

    def model(tape):
        return tape.input(np.array([-0.0, 0.0, -1e-3], dtype)).sin()

    network, out = Tape.record(model)
    got = network.entry([out]).lower().compile("llvm-cpu").forward(network.parameters())[out]
    want = network.forward(network.parameters())[out]
    assert np.array_equal(np.signbit(got), np.signbit(want)), f"compiled sin {got}, oracle {want}"


@pytest.mark.skipif(not HAS_LINKER, reason="float64 on llvm-cpu links a system shared object: no ld or cc")
@pytest.mark.xfail(strict=True, raises=AssertionError, reason=F64_ERF_SIGN.what)
def test_known_divergence_iree_f64_erf_keeps_its_sign(compile_cache):
    pytest.importorskip("iree.compiler")

    def model(tape):
        x = tape.parameter(np.array(-0.7448))
        value = x.erf()
        negated = -value
        return value, negated, -negated, x.erf_derivative()

    network, (value, negated, twice, derivative) = Tape.record(model)
    run = network.entry([twice, derivative], observe=[value, negated]).lower().compile("llvm-cpu").forward(
        network.parameters())
    assert float(run[value]) < 0, f"compiled erf(-0.7448) = {float(run[value])}"


def test_check_4_catches_a_wrong_derivative_rule(monkeypatch):
    """Check 4 is not vacuous: a sin rule off by 0.1% fails it (and is not set aside as an artefact)."""
    from topos.spec.opcodes import elementwise

    wrong = elementwise.MapFunction(elementwise.refmath.sin, lambda x, out, g: g * x.cos() * 1.001,
                                    frozenset({0}))
    monkeypatch.setitem(elementwise.MAP_FUNCTIONS, "sin", wrong)
    graph = Graph("f64", "tame", (Op("parameter", (np.array([0.3, -1.2, 2.0]),)), Op("map", (Ref(0), "sin")),
                                  Op("sum", (Ref(1),))), loss=2, wrt=(0,))
    with pytest.raises(AssertionError, match="check 4"):
        check_host(graph, Tally())


def test_fixed_judgement_sets_aside_a_loss_that_divides_by_a_cancelled_value():
    """fuzz-cancellation-resolution (TOPOS_FUZZ_SEED=1, 2026-12-02): log_softmax's largest element of
    a nearly one-hot row is -7.2e-16, computed as -6.7e-16 (log of 1 + 3 ulps), flat across every
    step; a loss dividing by it has quotients that settle at a value the rules (right for the smooth
    function) do not give. No rule is wrong: check 4 must set it aside as beyond resolution."""
    graph = Graph(dtype="f64", mode="wild", ops=(
        Op("parameter", (np.array([[[0.1257302210933933], [-0.1321048632913019]]]),)),
        Op("add", (Ref(0), Ref(0))),
        Op("neg", (Ref(0),)),
        Op("input", (np.array([[[135.24292899229388]]]),)),
        Op("matmul", (Ref(2), Ref(3))),
        Op("log_softmax", (Ref(4), 1)),
        Op("div", (Ref(0), Ref(5))),
        Op("sum", (Ref(6),))), loss=7, wrt=(0,))
    tally = Tally()
    check_host(graph, tally)  # raised AssertionError ('finite differences disagree') before the fix
    reason = "gradient below the resolution of the quotient or of the rule's own sum (parameters)"
    assert tally.set_aside["4 finite differences", reason] == 1, tally.set_aside


def test_fixed_judgement_sets_aside_a_derivative_that_turns_within_every_step():
    """fuzz-blind-quotient (TOPOS_FUZZ_SEED=1, 2026-12-02): cos(x) + 2x at x = -1e30, whose quotients
    agree on 2 at every step while the rules say 2 - sin(x); no step can follow cos there."""
    graph = Graph(dtype="f32", mode="wild", ops=(
        Op("parameter", (np.array(-1.0000000150474662e30, np.float32),)),
        Op("add", (Ref(0), Ref(0))),
        Op("map", (Ref(0), "cos")),
        Op("add", (Ref(2), Ref(1)))), loss=3, wrt=(0,))
    tally = Tally()
    check_host(graph, tally)  # raised AssertionError ('finite differences disagree') before the fix
    reason = "elements no float64 difference quotient can judge (parameters)"
    assert tally.set_aside["4 finite differences", reason] == 1, tally.set_aside


def test_fixed_logsumexp_rule_weights_sum_to_one_at_large_magnitude():
    def model(tape):
        w = tape.parameter(np.array([1e30, 1e30]))
        return w, tape.differentiate(w.logsumexp(0), [w])

    network, (w, adjoints) = Tape.record(model)
    gradient = network.forward(network.parameters())[adjoints[w]]
    np.testing.assert_allclose(gradient, [0.5, 0.5])  # softmax([1e30, 1e30])
