"""Every opcode, forward and recorded gradient, compiled by IREE for llvm-cpu and graded against the oracle.

Each family of ``topos.dialect.iree.conformance_cases.FAMILIES`` is one module per
element type: every case's output, a loss over the differentiable ones,
and its recorded gradients, with every node observed. Each compiled node
is graded against the oracle kernel on the operands it was given (its
local error) within ``topos.dialect.iree.conformance.TABLE``; nodes whose operands are all
sources are also compared with ``network.forward`` directly, and the loss
and gradients end to end. Known departures (``DIVERGENCES``)
are split out: each is shown to still occur, and its nodes are asserted
to conform under ``xfail(strict=True)``, so a fix turns into a failure
that asks for the entry to be removed.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import topos
from topos import MAP_FUNCTIONS, OPCODES
from topos.base.element import short_name
from topos.dialect.iree import conformance_cases
from topos.dialect.iree.conformance import (
    BIT_EXACT,
    END_TO_END_ULPS,
    FLUSHES_SUBNORMALS,
    TABLE,
    compare,
    deviation,
    envelope,
    flush_subnormals,
    is_bit_exact,
    table_key,
)
from topos.dialect.iree.conformance_cases import DIVERGENCES, FAMILIES, divergence_of

from iree_support import ELEMENT_PARAMETERS, HAS_LINKER, compile_cache  # noqa: F401  (autouse fixture)

TARGET = "llvm-cpu"

# The opcodes the issue requires to be bit-exact on llvm-cpu.
ISSUE_BIT_EXACT = ("add", "sub", "mul", "div", "neg", "map:sqrt", "maximum", "reshape", "permute", "narrow",
                   "pad", "broadcast", "broadcast_along")


@functools.cache
def family(name: str, dtype_name: str) -> conformance_cases.FamilyResult:
    """One compiled and graded family, shared by every test of this module."""
    return conformance_cases.run_family(name, np.dtype(dtype_name), TARGET)


def _dtypes() -> list[np.dtype]:
    return [topos.float32, topos.bfloat16] + ([topos.float64] if HAS_LINKER else [])


def _all_results():
    return [family(name, dtype.name) for name in FAMILIES for dtype in _dtypes()]


@pytest.mark.parametrize("dtype", ELEMENT_PARAMETERS)
@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_compiled_node_is_within_its_envelope_of_the_oracle_kernel(name, dtype):
    result = family(name, np.dtype(dtype).name)
    assert len(result.reports) >= len(FAMILIES[name])
    bad = result.unexplained()
    assert not bad, "\n".join(str(report) for report in bad)


@pytest.mark.parametrize("dtype", ELEMENT_PARAMETERS)
@pytest.mark.parametrize("name", list(FAMILIES))
def test_nodes_fed_only_by_sources_match_network_forward_directly(name, dtype):
    """For these nodes the local reference is the oracle's own value: compare with network.forward."""
    result = family(name, np.dtype(dtype).name)
    network = result.graph.network
    checked = 0
    for report in result.reports:
        node = network.nodes()[report.index]
        if node.is_source or not report.isolated or divergence_of(report, TARGET) is not None:
            continue
        operands = [np.asarray(result.oracle[s]) for s in node.operands]
        if any(flush_subnormals(o).tobytes() != o.tobytes() for o in operands):
            continue  # subnormal operands: the oracle does not flush them, llvm-cpu does (see test below)
        want = np.asarray(result.oracle[node.symbol])
        chosen = envelope(node.opcode.name, node.attributes.get("function"), node.dtype, TARGET)
        key = table_key(node.opcode.name, node.attributes.get("function"))
        verdict = compare(flush_subnormals(result.values[report.index]), flush_subnormals(want), chosen, key,
                          dict(node.attributes), operands)
        assert verdict.ok, f"{report}: against network.forward: {verdict.detail}"
        checked += 1
    assert checked >= 1


@pytest.mark.parametrize("dtype", ELEMENT_PARAMETERS)
@pytest.mark.parametrize("name", list(FAMILIES))
def test_compiled_loss_and_recorded_gradients_match_the_oracle_end_to_end(name, dtype):
    result = family(name, np.dtype(dtype).name)
    graph = result.graph
    for symbol in (graph.loss, *graph.gradients):
        error = result.relative_error(symbol)
        assert error <= END_TO_END_ULPS, (
            f"{name} {np.dtype(dtype).name}: {symbol!r} is {error:.3g} eps of its largest magnitude away "
            f"from network.forward (allowed {END_TO_END_ULPS})")


@pytest.mark.parametrize("dtype", ELEMENT_PARAMETERS)
def test_issue_listed_opcodes_are_bit_exact(dtype):
    """add, sub, mul, div, neg, sqrt, maximum and the moves: exact in the table and in every isolated node."""
    name = np.dtype(dtype).name
    seen = set()
    for key in ISSUE_BIT_EXACT:
        assert is_bit_exact(TABLE[key][short_name(np.dtype(dtype))]), key
    for result in (family(f, name) for f in FAMILIES):
        for report in result.reports:
            if report.key in ISSUE_BIT_EXACT and report.isolated:
                assert report.deviation.worst == 0 and report.ok, str(report)
                seen.add(report.key)
    assert seen == set(ISSUE_BIT_EXACT)


def test_every_opcode_and_map_function_has_cases_and_an_envelope():
    expected = {o.name for o in OPCODES if o.name != "map"} | {f"map:{f}" for f in MAP_FUNCTIONS}
    assert set(TABLE) == expected
    for key in expected:
        assert set(TABLE[key]) == {"f32", "f64", "bf16"}, key
    assert conformance_cases.recorded_keys() == expected
    forward = {case.key for cases in FAMILIES.values() for case in cases} | {"parameter", "input"}
    assert forward == expected


@pytest.mark.parametrize("dtype", ELEMENT_PARAMETERS)
def test_every_table_key_is_graded_on_some_node(dtype):
    name = np.dtype(dtype).name
    short = short_name(np.dtype(dtype))
    graded = {r.key for f in FAMILIES for r in family(f, name).reports if divergence_of(r, TARGET) is None}
    wholly_divergent = {key for d in DIVERGENCES if TARGET in d.targets and short in d.dtypes
                        and not d.cases and not d.chained_only for key in d.keys}
    assert graded == set(TABLE) - wholly_divergent


_LOCAL = [d for d in DIVERGENCES if TARGET in d.targets]


def _covered(divergence) -> list:
    reports = []
    for dtype in _dtypes():
        if short_name(dtype) in divergence.dtypes:
            for name in FAMILIES:
                reports.extend(family(name, dtype.name).covered_by(divergence))
    return reports


@pytest.mark.parametrize("divergence", _LOCAL, ids=lambda d: d.name)
def test_known_divergence_still_occurs(divergence):
    """Each entry of DIVERGENCES names nodes that exist and that really fail today."""
    covered = _covered(divergence)
    assert covered, f"{divergence.name} covers no node: its cases or keys were renamed"
    assert any(not r.ok for r in covered), f"{divergence.name} no longer occurs: remove it from DIVERGENCES"


@pytest.mark.parametrize("divergence", [
    pytest.param(d, marks=pytest.mark.xfail(strict=True, reason=d.reason)) for d in _LOCAL
], ids=lambda d: d.name)
def test_known_divergence_conforms(divergence):
    bad = [r for r in _covered(divergence) if not r.ok]
    assert not bad, "\n".join(str(r) for r in bad[:5])


# ---- the two llvm-cpu behaviours the checker models, shown to be real -----------------------------


def test_llvm_cpu_flushes_subnormal_operands_to_zero():
    """IREE's CPU runtime sets DAZ/FTZ: 1e-40 + 0 comes back 0, so deviation must flush to judge it."""
    result = family("elementwise", "float32")
    network = result.graph.network
    node = network.node(result.graph.outputs["add/specials"])
    a, b = (np.asarray(result.oracle[s]) for s in node.operands)
    got = result.values[node.index]
    subnormal = (a != 0) & (np.abs(a) < np.finfo(np.float32).tiny) & (b == 0)
    assert subnormal.any()
    assert np.all(got[subnormal] == 0) and np.all(result.oracle[node.symbol][subnormal] != 0)
    assert FLUSHES_SUBNORMALS[TARGET]


def _host_has_fma() -> bool:
    try:
        with open("/proc/cpuinfo") as info:
            return any(line.startswith("flags") and " fma " in f"{line} " for line in info)
    except OSError:
        return True  # not Linux: assume a current CPU, and let the test say otherwise


@pytest.mark.skipif(not _host_has_fma(), reason="this CPU has no fused multiply-add instruction to contract to")
def test_llvm_cpu_fuses_a_product_into_the_following_subtraction():
    """LLVM contracts a * b - c into one fused multiply-add: the reason add and sub get an allowance."""
    result = family("map", "float32")
    network = result.graph.network
    fused = []
    for report in result.reports:
        node = network.nodes()[report.index]
        if report.key != "sub" or not any(network.columns.opcodes[s.index].name == "mul" for s in node.operands):
            continue
        left, right = (np.asarray(result.values.get(s.index, result.oracle[s])) for s in node.operands)
        separate = (left.astype(np.float32) - right).astype(np.float32)
        if result.values[report.index].tobytes() != separate.tobytes():
            fused.append(report)
    assert fused, "no contracted subtraction: llvm-cpu may have stopped fusing; revisit the allowance"
    assert all(r.ok and r.deviation.worst <= 1.0 for r in fused)


# ---- the checker itself can fail ---------------------------------------------------------------


def _next_after(x: np.ndarray) -> np.ndarray:
    return np.nextafter(x, np.asarray(np.inf, x.dtype)).astype(x.dtype)


@pytest.mark.parametrize("dtype", [topos.float32, topos.float64], ids=["f32", "f64"])
def test_deviation_rejects_one_ulp_on_a_bit_exact_opcode(dtype):
    a = np.linspace(0.5, 2.0, 7).astype(dtype)
    b = np.linspace(-1.0, 3.0, 7).astype(dtype)
    exact = a + b
    assert deviation("add", {}, exact, [a, b]).ok
    off = exact.copy()
    off[3] = _next_after(off[3:4])[0]
    verdict = deviation("add", {}, off, [a, b])
    assert not verdict.ok and verdict.worst == 1 and "(3,)" in verdict.detail


def test_deviation_rejects_a_map_beyond_its_envelope_and_accepts_within():
    x = np.linspace(-3.0, 3.0, 11).astype(np.float32)
    exact = topos.by_name("map").kernel(x, function="exp")
    ulps = envelope("map", "exp", np.float32).ulps
    inside = (exact.astype(np.float64) * (1 + 0.5 * ulps * 2.0**-23)).astype(np.float32)
    outside = (exact.astype(np.float64) * (1 + 3 * ulps * 2.0**-23)).astype(np.float32)
    assert deviation("map", {"function": "exp"}, inside, [x]).ok
    assert not deviation("map", {"function": "exp"}, outside, [x]).ok


def test_deviation_rejects_wrong_shapes_types_and_nan():
    a = np.ones((2, 3), np.float32)
    assert not deviation("neg", {}, np.ones((3, 2), np.float32), [a]).ok
    assert not deviation("neg", {}, -np.ones((2, 3), np.float64), [a]).ok
    assert not deviation("neg", {}, np.full((2, 3), np.nan, np.float32), [a]).ok
    zero = np.zeros((2, 3), np.float32)
    assert not deviation("neg", {}, zero, [zero]).ok  # +0 where -0 is due


def test_fused_multiply_add_allowance_is_one_rounding_of_the_product():
    product = np.array([1.0 + 2.0**-23], np.float32)
    one = np.array([1.0], np.float32)
    separate = (product - one).astype(np.float32)
    assert deviation("sub", {}, separate, [product, one], products=[0]).ok
    off_by_two_products = separate + np.float32(2.0**-21)
    assert not deviation("sub", {}, off_by_two_products, [product, one], products=[0]).ok
    assert not deviation("sub", {}, separate + np.float32(2.0**-23), [product, one]).ok  # no products: exact


def test_subnormals_are_flushed_only_for_targets_that_flush():
    a = np.array([1e-40, 1.0], np.float32)
    zero = np.zeros(2, np.float32)
    flushed = np.array([0.0, 1.0], np.float32)
    assert deviation("add", {}, flushed, [a, zero], "llvm-cpu").ok
    assert not deviation("add", {}, flushed, [a, zero], "vulkan").ok


def test_bit_exact_comparison_accepts_any_nan_payload_and_nothing_else():
    quiet = np.array([np.nan], np.float32)
    payload = np.array([0x7FC00001], np.uint32).view(np.float32)
    assert compare(payload, quiet, BIT_EXACT).ok
    assert not compare(np.array([np.inf], np.float32), quiet, BIT_EXACT).ok
