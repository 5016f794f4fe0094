"""IREE conformance: the envelope table, and the judge that grades one compiled node against the oracle.

A compiled node is judged by its *local* error: its value against the
oracle's reference kernel applied to the very operand values it was given
(``deviation``). Error a node inherits from its operands is its operands'
business, so one node can be judged in isolation (``topos.bisect`` names
the first node that fails). ``TABLE`` holds, for every opcode and every
map function, per element type, either ``BIT_EXACT`` or an ``Envelope``
(``topos.readings.plan.numerics.Envelope``, the same class the FAST posture
declares): ``|compiled - reference| <= ulps * eps * scale + tiny``.
``scale`` is ``|reference|``, or for accumulations (``accumulates``) the
term count times the sum of ``|terms|``; ``scale()`` spells each one out.
The cases that exercise the table, the known divergences and the runner
live in ``topos.dialect.iree.conformance_cases``.

Why each entry is what it is
----------------------------
* Bit-exact. One IEEE operation rounds once, everywhere: add, sub, mul,
  div, neg, sqrt; maximum and step are a compare and a select (ties and
  NaN go left, as the lowering writes them); sources pass through; the
  element moves (reshape, permute, narrow, pad, broadcast,
  broadcast_along, unfold, gather) copy bits; fold and scatter are
  lowered in the reference's own order (lane by lane, positions
  ascending). bfloat16 single operations compute in float32 and round
  once, which is exact too. Measured: 0 ulps on every isolated node.
* Two llvm-cpu behaviours that are not IREE bugs but are not the
  oracle's IEEE either, each modelled rather than waived:
  - IREE's CPU runtime runs every dispatch with denormals flushed
    (DAZ|FTZ, ``iree_fpu_state_push``; no flag turns it off). On a
    target in ``FLUSHES_SUBNORMALS`` subnormal operands are flushed
    before the reference runs, and both sides are flushed before they
    are compared: bit-exact then means "the same bits once subnormals
    read as signed zeros".
  - LLVM contracts ``a * b + c`` into one fused multiply-add inside a
    dispatch, even when the product is itself an observed result. An
    add or sub whose operand is a product (seen through element moves)
    may differ by the product's skipped rounding plus one rounding of
    the result: ``eps * (|product| + |result|)`` (measured 0.25 of it).
* Maps and pow: IREE's own approximations (float32 polynomials; float64
  through libm, since f64 links a system shared object). Envelopes are
  in ulps of ``|reference|``, except where any working-precision
  implementation's error grows with the argument; there the scale is
  the condition: sin and cos ``max(|reference|, |x|)`` (range reduction
  by a rounded pi/2 leaves an absolute error growing with ``|x|``),
  erf_derivative ``|reference| * (1 + x**2)`` (``x * x`` rounds before
  ``exp``), pow ``|reference| * (1 + |b log a|)``. One constant then
  holds over the whole domain instead of only the domain measured.
* bfloat16 maps, pow and accumulations compute in float32 and round once:
  at most one bfloat16 rounding from the reference (1 ulp; measured 0).
  An element registered with ``topos.base.element.register`` that computes in
  a wider type has no column: ``narrow_envelope`` makes the same argument
  for it (float16 and float8_e5m2 on llvm-cpu: measured at most 0.001 and
  0 over every conformance family, tests/iree/test_element_seam_compiled.py).
* Accumulations (matmul, sum, sum_along, log_softmax, logsumexp): any
  summation order, so the classic reordered-sum bound with 1 unit.
* Margins: each envelope is the worst seen over the conformance cases
  and a 200 000-point sweep per map (float32 and float64, domains below),
  times at least 1.5, rounded up; at least 2 ulps for float32/float64
  maps, 1 for bfloat16 and for accumulations.

Measured on llvm-cpu (x86-64 host CPU, IREE 3.13), worst local error in
each envelope's unit over the conformance cases, then over the sweep
(sweep domains: exp [-87, 88], log 2**[-120, 120], tanh [-20, 20],
sin/cos [-1e4, 1e4], log1p [-0.999, 10] and 2**[-20, 60], expm1
[-80, 80], erf [-6, 6], erf_derivative [-9, 9], pow a = 2**[-30, 30],
b = [-4, 4]); bfloat16 isolated nodes only (see the divergences):

    key                 f32 cases/sweep  env   f64 cases/sweep  env   bf16 cases  env
    exp                 0.89 / 1.0        2    0.80 / 1.0        2    0           1
    log                 0.96 / 1.0        2    0.91 / 1.0        2    0           1
    tanh                1.56 / 2.4        4    0.82 / 1.8        3    0           1
    sin                 2.21 / 5.8        8    0.20 / 1.0        2    0           1
    cos                 1.00 / 4.2        8    0.58 / 0.68       2    0.0003      1
    log1p               0.99 / 1.9        3    divergent         2    0           1
    expm1               0.62 / 1.6        3    divergent         2    0           1
    erf                 1.65 / 3.0        5    1.19 / 1.8        3    0           1
    erf_derivative      0.96 / 1.0        2    0.89 / 0.89       2    0           1
    pow                 0.59 / 0.94       3    0.63 / 0.97       2    0           1
    matmul              0.36              1    0.34              1    0           1
    sum                 0.16              1    0.23              1    0           1
    sum_along           0.15              1    0.23              1    0           1
    log_softmax         0.15              1    0.12              1    0           1
    logsumexp           0                 1    0.12              1    0           1
    everything else     0 (bit-exact; sub in a fused multiply-add 0.25 of its allowance)

Other targets: vulkan was measured on Mesa lavapipe (float32; float64
and bfloat16 are refused by ``topos.dialect.iree.targets``): the same table
except exp and expm1 (GLSL's Exp allows 3 + 2|x| ulps; measured 35 over
|x| <= 88, envelope 48, in ``TARGET_TABLES``); lavapipe keeps subnormals.
cuda was measured on an NVIDIA H200 (IREE 3.13, sm_80 PTX, 2026-12-04,
``benchmarks/gpu_check.py``): the llvm-cpu table holds except float32
sqrt, which IREE lowers to PTX's ``sqrt.approx.f32`` (relative error
2**-23: measured 1 ulp on 6 of 42 elements; envelope 2, and 1 for
bfloat16, whose float32 square root may now round the other way), in
``TARGET_TABLES``; every other worst deviation was inside the llvm-cpu
envelopes (the measured column is in docs/performance.md, "On a GPU").
rocm and metal use the llvm-cpu table until measured.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import ml_dtypes
import numpy as np

from topos.base.element import bfloat16, compute_type, element_of, float32, float64, is_element, short_name
from topos.readings.plan.numerics import Envelope, accumulation_scale
from topos.spec.opcodes import MAP_FUNCTIONS, OPCODES, by_name

# ---- the table ----------------------------------------------------------------------------

BIT_EXACT = Envelope(0.0, note="bit-exact: the compiled bits are the oracle's (any NaN matches any NaN)")

DTYPES: tuple[np.dtype, ...] = (float32, float64, bfloat16)


def _per_dtype(f32: Envelope, f64: Envelope, bf16: Envelope) -> dict[str, Envelope]:
    return {"f32": f32, "f64": f64, "bf16": bf16}


def _exact() -> dict[str, Envelope]:
    return _per_dtype(BIT_EXACT, BIT_EXACT, BIT_EXACT)


def _map(f32: float, f64: float, bf16: float, note: str) -> dict[str, Envelope]:
    return _per_dtype(Envelope(f32, note=note), Envelope(f64, note=note), Envelope(bf16, note=note))


def _accumulating(f32: float, f64: float, bf16: float, note: str) -> dict[str, Envelope]:
    return _per_dtype(
        Envelope(f32, accumulates=True, note=note),
        Envelope(f64, accumulates=True, note=note),
        Envelope(bf16, accumulates=True, note=note),
    )


# Keys are opcode names, and "map:<function>" for each map function (the keys
# topos.readings.plan.numerics.FAST_KERNELS uses). Values: one Envelope per element type.
TABLE: dict[str, dict[str, Envelope]] = {
    "leaf": _exact(),
    "parameter": _exact(),
    "input": _exact(),
    "add": _exact(),
    "sub": _exact(),
    "mul": _exact(),
    "div": _exact(),
    "neg": _exact(),
    "maximum": _exact(),
    "step": _exact(),
    "pow": _map(3, 2, 1, "relative to |exact| * (1 + |b log a|): exp(b log a) in working precision"),
    "map:exp": _map(2, 2, 1, "relative to |exact|"),
    "map:log": _map(2, 2, 1, "relative to |exact|"),
    "map:sqrt": _exact(),
    "map:tanh": _map(4, 3, 1, "relative to |exact|"),
    "map:sin": _map(8, 2, 1, "relative to max(|exact|, |x|): range reduction by a rounded pi/2"),
    "map:cos": _map(8, 2, 1, "relative to max(|exact|, |x|): range reduction by a rounded pi/2"),
    "map:log1p": _map(3, 2, 1, "relative to |exact|"),
    "map:expm1": _map(3, 2, 1, "relative to |exact|"),
    "map:erf": _map(5, 3, 1, "relative to |exact|"),
    "map:erf_derivative": _map(2, 2, 1, "relative to |exact| * (1 + x**2): x * x rounds before exp"),
    "matmul": _accumulating(1, 1, 1, "k * (|a| @ |b|): any summation order, fused multiply-adds"),
    "sum": _accumulating(1, 1, 1, "n * sum(|x|): any summation order"),
    "sum_along": _accumulating(1, 1, 1, "n * sum(|x|) along the axis: any summation order"),
    "broadcast": _exact(),
    "broadcast_along": _exact(),
    "reshape": _exact(),
    "permute": _exact(),
    "narrow": _exact(),
    "pad": _exact(),
    "unfold": _exact(),
    "fold": _exact(),
    "gather": _exact(),
    "scatter": _exact(),
    "log_softmax": _accumulating(1, 1, 1, "n * (|x - max| + log S + 1): native exp and log, any sum order"),
    "logsumexp": _accumulating(1, 1, 1, "n * (|max| + log S + 1): native exp and log, any sum order"),
}

# Per-target departures from TABLE, measured where the target could run.
_VULKAN_EXP = Envelope(48, note="relative to |exact|; GLSL.std.450 Exp allows 3 + 2|x| ulps, "
                                "measured 35 on Mesa lavapipe for |x| <= 88")
_CUDA_SQRT = "relative to |exact|; PTX sqrt.approx.f32 (relative error 2**-23), measured 1 on an H200"
TARGET_TABLES: dict[str, dict[str, dict[str, Envelope]]] = {
    "vulkan": {"map:exp": {"f32": _VULKAN_EXP}, "map:expm1": {"f32": _VULKAN_EXP}},
    "cuda": {"map:sqrt": {"f32": Envelope(2, note=_CUDA_SQRT),
                          "bf16": Envelope(1, note="one bfloat16 rounding of " + _CUDA_SQRT)}},
}


# End to end (a whole loss or gradient against network.forward, errors composed through the
# graph): max |compiled - oracle| <= END_TO_END_ULPS * eps * max |oracle| per result. Measured
# at most 4.3 over the conformance families on llvm-cpu; a sanity bound, not a per-op envelope.
END_TO_END_ULPS = 16.0


def table_key(opcode_name: str, function: str | None = None) -> str:
    """The TABLE key of an opcode: its name, or ``map:<function>`` for map."""
    if opcode_name == "map":
        if function is None:
            raise KeyError("map needs its function to name an envelope (map:exp, map:log, ...)")
        return f"map:{function}"
    return opcode_name


def envelope(opcode_name: str, function: str | None, dtype, target: str = "llvm-cpu") -> Envelope:
    """The envelope a compiled ``opcode_name`` (``function`` for map) must meet for ``dtype``.

    An element registered with ``topos.base.element.register`` that computes in
    a wider type has no column of its own: it reads :func:`narrow_envelope`.
    """
    key = table_key(opcode_name, function)
    name = short_name(np.dtype(dtype))
    override = TARGET_TABLES.get(target, {}).get(key, {}).get(name)
    if override is not None:
        return override
    column = TABLE.get(key, {})
    if name in column:
        return column[name]
    if key in TABLE and is_element(np.dtype(dtype)) and element_of(dtype).narrow:
        return narrow_envelope(opcode_name, function, dtype, target)
    raise KeyError(f"no IREE envelope for {key} in {name}; add it to topos.dialect.iree.conformance.TABLE")


def narrow_envelope(opcode_name: str, function: str | None, dtype, target: str = "llvm-cpu") -> Envelope:
    """The envelope of a registered element that computes in a wider type and rounds once.

    Bit-exact where its compute type's entry is; otherwise one unit (one
    rounding of the element), the argument bfloat16's column makes: the
    compute type's own error (a few float32 ulps) is far below the
    element's rounding, so the compiled value and the oracle's are at
    most one rounding apart. Refused (KeyError) when the compute type's
    error is not that small next to the element's.
    """
    element = element_of(dtype)
    wide = envelope(opcode_name, function, element.compute, target)
    if is_bit_exact(wide):
        return BIT_EXACT
    if wide.ulps * float(float_info(element.compute).eps) > float(float_info(element.dtype).eps) / 8:
        raise KeyError(
            f"no IREE envelope for {table_key(opcode_name, function)} in {element.name}: its compute type's "
            f"envelope ({wide.ulps:g} ulps of {short_name(element.compute)}) is not small next to one "
            f"{element.name} rounding; add a {element.name} column to topos.dialect.iree.conformance.TABLE"
        )
    return Envelope(1.0, accumulates=wide.accumulates,
                    note=f"{element.name} computes in {short_name(element.compute)} and rounds once: "
                         f"at most one {element.name} rounding from the reference")


def is_bit_exact(chosen: Envelope) -> bool:
    """Whether an envelope demands the oracle's bits (``BIT_EXACT``)."""
    return chosen.ulps == 0 and not chosen.accumulates


# ---- measuring one node ----------------------------------------------------------------------

_BITS = {8: np.int64, 4: np.int32, 2: np.int16, 1: np.int8}  # signed integers of each width, by bytes


def float_info(dtype) -> np.finfo:
    """NumPy's finfo for NumPy's floats, ml_dtypes' for its formats (bfloat16, the 8-bit floats)."""
    dtype = np.dtype(dtype)
    return np.finfo(dtype) if dtype.char in "efdg" else ml_dtypes.finfo(dtype)


def ulp_distance(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Representable numbers between got and want, elementwise (-0 and +0 one apart; NaN vs NaN 0)."""
    dtype = np.dtype(want.dtype)
    bits = _BITS[dtype.itemsize]
    width = 8 * np.dtype(bits).itemsize

    def ordered(x):
        raw = np.ascontiguousarray(x, dtype=dtype).reshape(-1).view(bits).astype(np.int64)
        return np.where(raw < 0, -(raw & ((1 << (width - 1)) - 1)) - 1, raw)

    g64 = np.asarray(got).astype(np.float64).reshape(-1)
    w64 = np.asarray(want).astype(np.float64).reshape(-1)
    distance = np.abs(ordered(got) - ordered(want)).astype(np.float64)
    both_nan = np.isnan(g64) & np.isnan(w64)
    one_nan = np.isnan(g64) ^ np.isnan(w64)
    return np.where(both_nan, 0.0, np.where(one_nan, np.inf, distance)).reshape(np.shape(want))


# Maps whose error an implementation in working precision can only bound relative to the
# function's condition number: the result of a few-ulp perturbation of the argument.
_CONDITIONED = {
    # range reduction by a rounded pi/2 leaves an absolute error growing with |x|
    "map:sin": lambda x, exact: np.maximum(np.abs(exact), np.abs(x)),
    "map:cos": lambda x, exact: np.maximum(np.abs(exact), np.abs(x)),
    # exp(-x*x) after x*x rounds: relative error grows with x**2
    "map:erf_derivative": lambda x, exact: np.abs(exact) * (1.0 + x * x),
}


def scale(key: str, attributes: Mapping, operands: Sequence[np.ndarray], exact: np.ndarray,
          accumulates: bool) -> np.ndarray:
    """The magnitude an envelope is proportional to.

    Elementwise: ``|exact|`` (the convention of topos.readings.plan.numerics),
    except where the error of any working-precision implementation grows
    with the argument (``_CONDITIONED``): sin and cos ``max(|exact|, |x|)``,
    erf_derivative ``|exact| * (1 + x**2)``, pow ``|exact| * (1 + |b log a|)``.
    Accumulations: the term count times the sum of ``|terms|`` (matmul
    ``k * (|a| @ |b|)``, sums ``n * sum(|x|)``), the classic bound for a
    reordered sum. log_softmax and logsumexp: ``n * (|x - max| + log S + 1)``
    and ``n * (|max| + log S + 1)`` with ``S = sum(exp(x - max))``.
    """
    wide = [np.asarray(o).astype(np.float64) for o in operands]
    if not accumulates:
        if key in _CONDITIONED:
            return _CONDITIONED[key](wide[0], exact.astype(np.float64))
        if key == "pow":
            base, exponent = wide
            return np.abs(exact.astype(np.float64)) * (1.0 + np.abs(exponent * np.log(np.abs(base))))
        return np.abs(exact.astype(np.float64))
    return accumulation_scale(key, attributes, operands)


# Targets whose runtime flushes subnormal operands and results to (signed) zero.
# IREE's CPU runtime runs every dispatch with DAZ|FTZ set (iree_fpu_state_push(
# IREE_FPU_STATE_FLAG_FLUSH_DENORMALS_TO_ZERO)); no compiler flag changes that.
FLUSHES_SUBNORMALS: dict[str, bool] = {"llvm-cpu": True}


def flush_subnormals(array: np.ndarray) -> np.ndarray:
    """``array`` with every value that is subnormal in its compute type replaced by a zero of the same sign.

    The flush acts on the arithmetic, which runs in the compute type: a
    float16 subnormal is a normal float32, so IREE keeps it (bfloat16's
    exponent range is float32's, so its subnormals are float32's).
    """
    array = np.asarray(array)
    if not is_element(array.dtype):
        return array
    tiny = float(float_info(compute_type(array.dtype)).tiny)
    with np.errstate(invalid="ignore"):
        wide = array.astype(np.float64)
        small = (wide != 0) & (np.abs(wide) < tiny)
    if not small.any():
        return array
    return np.where(small, np.copysign(0.0, wide), wide).astype(array.dtype)


class Deviation(NamedTuple):
    """How one compiled value compares with its reference: ok, the worst error, and why.

    ``worst`` is in the envelope's own unit: ulps of the element type for a
    bit-exact envelope (0 when every bit agrees), otherwise the largest
    ``(|compiled - reference| - tiny) / (eps * scale)`` over the elements,
    so ``ok`` is ``worst <= envelope.ulps``.
    """

    ok: bool
    worst: float
    detail: str


def compare(got, want, chosen: Envelope, key: str = "", attributes: Mapping | None = None,
            operands: Sequence[np.ndarray] = (), products: Sequence[np.ndarray] = ()) -> Deviation:
    """Grade ``got`` against the reference ``want`` under ``chosen`` (see Deviation).

    ``products`` (for add and sub): operand values that are products the
    compiler may have fused with this addition into one fused multiply-add.
    Bits that differ are then allowed ``eps * (sum |product| + |want|)``:
    the product's own rounding, which the fused form skips, plus one
    rounding of the result.
    """
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return Deviation(False, math.inf, f"shape {list(got.shape)} where the reference has {list(want.shape)}")
    if got.dtype != want.dtype:
        return Deviation(False, math.inf, f"element type {got.dtype} where the reference has {want.dtype}")
    if not is_element(want.dtype):  # index payloads: integers must agree exactly
        same = np.array_equal(got, want)
        return Deviation(same, 0.0 if same else math.inf, "" if same else "indices differ")
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        g, w = got.astype(np.float64), want.astype(np.float64)
        if is_bit_exact(chosen) and len(products):
            info = float_info(want.dtype)
            magnitude = sum(np.abs(np.asarray(p).astype(np.float64)) for p in products) + np.abs(w)
            yardstick = float(info.eps) * magnitude
            same = (ulp_distance(got, want) == 0)
            excess = np.maximum(np.abs(g - w) - float(info.tiny), 0.0)
            used = np.where(same, 0.0, np.where(excess == 0, 0.0, excess / yardstick))
            used = np.where(np.isnan(used), np.inf, used)
            worst = float(used.max(initial=0.0))
            bad = used > 1.0
            bound = yardstick + float(info.tiny)
        elif is_bit_exact(chosen):
            distance = ulp_distance(got, want)
            bad = distance != 0
            worst = float(distance.max(initial=0.0))
            bound = np.zeros_like(w)
        else:
            info = float_info(want.dtype)
            yardstick = float(info.eps) * scale(key, attributes or {}, operands, want, chosen.accumulates)
            yardstick = np.broadcast_to(yardstick, w.shape)
            same = (g == w) | (np.isnan(g) & np.isnan(w))
            excess = np.maximum(np.abs(g - w) - float(info.tiny), 0.0)
            used = np.where(same, 0.0, np.where(excess == 0, 0.0, excess / yardstick))
            used = np.where(np.isnan(used), np.inf, used)
            worst = float(used.max(initial=0.0))
            bad = used > chosen.ulps
            bound = chosen.ulps * yardstick + float(info.tiny)
    if not bad.any():
        return Deviation(True, worst, "")
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    if is_bit_exact(chosen) and not len(products):
        unit, limit = "ulps", "bit-exactness"
    elif is_bit_exact(chosen):
        unit, limit = "eps*(|product|+|result|)", "a fused multiply-add's allowance"
    else:
        unit = "eps*scale"
        limit = f"{chosen.ulps:g} {unit}"
    detail = (f"{int(bad.sum())} of {bad.size} elements outside {limit}; first at {where}: "
              f"compiled {g[where]!r}, reference {w[where]!r}, worst {worst:.3g} {unit}")
    if unit != "ulps":
        detail += f", bound {bound[where]:.3g}"
    return Deviation(False, worst, detail)


def deviation(opcode_name: str, attributes: Mapping, compiled_value, operand_values: Sequence,
              target: str = "llvm-cpu", *, products: Sequence[int] = ()) -> Deviation:
    """Judge one compiled node in isolation: its value against the oracle kernel on the same operands.

    The reference is ``opcode.kernel(*operand_values, **attributes)``, so
    the error measured is this node's own (local) error, not what it
    inherited from its operands. On a target that flushes subnormals
    (FLUSHES_SUBNORMALS) operands are flushed before the kernel runs and
    both sides are flushed before they are compared. ``products`` lists the
    operand positions of an add or sub that hold products the compiler may
    have contracted into a fused multiply-add (see ``compare``).
    Returns ``Deviation(ok, worst, detail)``.
    """
    opcode = by_name(opcode_name)
    attributes = dict(attributes)
    operands = [np.asarray(v) for v in operand_values]
    if opcode.is_source:
        raise ValueError(f"{opcode_name} is a source: compare its value with what was fed, bit for bit")
    got = np.asarray(compiled_value)
    if FLUSHES_SUBNORMALS.get(target, False):
        operands = [flush_subnormals(v) for v in operands]
        got = flush_subnormals(got)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = np.asarray(opcode.kernel(*operands, **attributes))
    if FLUSHES_SUBNORMALS.get(target, False):
        want = flush_subnormals(want)
    chosen = envelope(opcode_name, attributes.get("function"), want.dtype, target)
    key = table_key(opcode_name, attributes.get("function"))
    fused = [operands[k] for k in products] if opcode_name in ("add", "sub") else []
    return compare(got, want, chosen, key, attributes, operands, fused)



def table_keys_expected() -> set[str]:
    """The TABLE keys the vocabulary needs: every opcode but map, and map:<function> for each function."""
    return {o.name for o in OPCODES if o.name != "map"} | {f"map:{f}" for f in MAP_FUNCTIONS}


# ---- grading a compiled run node by node ----------------------------------------------------------


@dataclass(frozen=True)
class NodeReport:
    """One node's verdict: which node, what it is, which case recorded it, and its Deviation.

    ``isolated``: every operand is a source (fed, or a constant), so the
    compiled node saw exactly the operands the oracle saw, and its local
    reference is the oracle's own value for it.
    """

    index: int
    key: str
    dtype: str
    case: str
    isolated: bool
    deviation: Deviation

    @property
    def ok(self) -> bool:
        return self.deviation.ok

    def __str__(self) -> str:
        verdict = "ok" if self.ok else "FAIL"
        return (f"%{self.index} {self.key} {self.dtype} [{self.case}{'' if self.isolated else ', chained'}]: "
                f"{verdict}, worst {self.deviation.worst:.3g}"
                + (f" -- {self.deviation.detail}" if self.deviation.detail else ""))


# Opcodes that only move elements: a product seen through them is still a product.
_MOVES = frozenset({"broadcast", "broadcast_along", "reshape", "permute", "narrow", "pad"})


def _is_product(network, j: int) -> bool:
    """Whether node ``j`` is a multiply, possibly seen through element moves (a fusable product)."""
    while network.columns.opcodes[j].name in _MOVES:
        (j,) = network.columns.operands[j]
    return network.columns.opcodes[j].name == "mul"


def check_values(network, values: Mapping[int, np.ndarray], sources: Mapping[int, np.ndarray],
                 target: str = "llvm-cpu", case_of: Mapping[int, str] | None = None) -> list[NodeReport]:
    """Grade every node in ``values`` (compiled results by node index) against its local reference.

    A non-source node is judged by ``deviation`` with its operands taken
    from ``values`` (compiled) or ``sources`` (what was fed); a source node
    must return exactly what was fed. An add or sub whose operand is a
    product gets the fused multiply-add allowance (see ``compare``).
    """
    reports = []
    for i in sorted(values):
        opcode = network.columns.opcodes[i]
        attributes = dict(network.columns.attributes[i])
        name = short_name(network.columns.specs[i].dtype)
        case = (case_of or {}).get(i, "")
        if opcode.is_source:
            reports.append(NodeReport(i, opcode.name, name, case, True, compare(values[i], sources[i], BIT_EXACT)))
            continue
        operand_nodes = network.columns.operands[i]
        isolated = all(network.columns.opcodes[j].is_source for j in operand_nodes)
        operands = [values[j] if j in values else sources[j] for j in operand_nodes]
        key = table_key(opcode.name, attributes.get("function"))
        products = [k for k, j in enumerate(operand_nodes) if _is_product(network, j)]
        reports.append(NodeReport(i, key, name, case, isolated, deviation(
            opcode.name, attributes, values[i], operands, target, products=products)))
    return reports
