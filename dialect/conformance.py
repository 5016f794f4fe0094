"""IREE conformance: how far a compiled opcode may stray from the oracle, and the cases that check it.

PLACEHOLDER DOCSTRING (rewritten once measured).
"""

from __future__ import annotations

import math
import time
import warnings
import zlib
from dataclasses import dataclass, field
from typing import Callable, Mapping, NamedTuple, Sequence

import ml_dtypes
import numpy as np

import topos
from topos import MAP_FUNCTIONS, OPCODES, Tape, by_name
from topos.element import is_element, short_name
from topos.plan.numerics import Envelope

# ---- the table ----------------------------------------------------------------------------

BIT_EXACT = Envelope(0.0, note="bit-exact: the compiled bits are the oracle's (any NaN matches any NaN)")

DTYPES: tuple[np.dtype, ...] = (topos.float32, topos.float64, topos.bfloat16)


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
# topos.plan.numerics.FAST_KERNELS uses). Values: one Envelope per element type.
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
    "pow": _map(64, 64, 64, "placeholder"),
    "map:exp": _map(64, 64, 64, "placeholder"),
    "map:log": _map(64, 64, 64, "placeholder"),
    "map:sqrt": _exact(),
    "map:tanh": _map(64, 64, 64, "placeholder"),
    "map:sin": _map(64, 64, 64, "placeholder"),
    "map:cos": _map(64, 64, 64, "placeholder"),
    "map:log1p": _map(64, 64, 64, "placeholder"),
    "map:expm1": _map(64, 64, 64, "placeholder"),
    "map:erf": _map(64, 64, 64, "placeholder"),
    "map:erf_derivative": _map(64, 64, 64, "placeholder"),
    "matmul": _accumulating(64, 64, 64, "placeholder"),
    "sum": _accumulating(64, 64, 64, "placeholder"),
    "sum_along": _accumulating(64, 64, 64, "placeholder"),
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
    "log_softmax": _accumulating(64, 64, 64, "placeholder"),
    "logsumexp": _accumulating(64, 64, 64, "placeholder"),
}

# Per-target departures from TABLE, measured where the target could run.
TARGET_TABLES: dict[str, dict[str, dict[str, Envelope]]] = {}


def table_key(opcode_name: str, function: str | None = None) -> str:
    """The TABLE key of an opcode: its name, or ``map:<function>`` for map."""
    if opcode_name == "map":
        if function is None:
            raise KeyError("map needs its function to name an envelope (map:exp, map:log, ...)")
        return f"map:{function}"
    return opcode_name


def envelope(opcode_name: str, function: str | None, dtype, target: str = "llvm-cpu") -> Envelope:
    """The envelope a compiled ``opcode_name`` (``function`` for map) must meet for ``dtype``."""
    key = table_key(opcode_name, function)
    name = short_name(np.dtype(dtype))
    override = TARGET_TABLES.get(target, {}).get(key, {}).get(name)
    if override is not None:
        return override
    try:
        return TABLE[key][name]
    except KeyError:
        raise KeyError(f"no IREE envelope for {key} in {name}; add it to topos.dialect.conformance.TABLE") from None


def is_bit_exact(chosen: Envelope) -> bool:
    return chosen.ulps == 0 and not chosen.accumulates


# ---- measuring one node ----------------------------------------------------------------------

_BITS = {topos.float64: np.int64, topos.float32: np.int32, topos.bfloat16: np.int16}


def _finfo(dtype):
    return ml_dtypes.finfo(dtype) if dtype == topos.bfloat16 else np.finfo(dtype)


def ulp_distance(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Representable numbers between got and want, elementwise (-0 and +0 one apart; NaN vs NaN 0)."""
    dtype = np.dtype(want.dtype)
    bits = _BITS[dtype]
    width = np.iinfo(bits).bits

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

    Elementwise: ``|exact|`` (the convention of topos.plan.numerics),
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
    if key == "matmul":
        a, b = wide
        return a.shape[-1] * (np.abs(a) @ np.abs(b))
    if key == "sum":
        return np.asarray(wide[0].size * np.sum(np.abs(wide[0])))
    if key == "sum_along":
        axis = attributes["axis"]
        return wide[0].shape[axis] * np.sum(np.abs(wide[0]), axis=axis)
    if key in ("log_softmax", "logsumexp"):
        x, axis = wide[0], attributes["axis"]
        peak = np.max(x, axis=axis, keepdims=True)
        peak = np.where(np.isfinite(peak), peak, 0.0)
        log_total = np.log(np.sum(np.exp(x - peak), axis=axis, keepdims=True))
        first = np.abs(x - peak) if key == "log_softmax" else np.abs(peak)
        result = x.shape[axis] * (first + log_total + 1.0)
        return result if key == "log_softmax" else np.squeeze(result, axis)
    raise KeyError(f"no envelope scale is defined for the accumulating opcode {key!r}")


# Targets whose runtime flushes subnormal operands and results to (signed) zero.
# IREE's CPU runtime runs every dispatch with DAZ|FTZ set (iree_fpu_state_push(
# IREE_FPU_STATE_FLAG_FLUSH_DENORMALS_TO_ZERO)); no compiler flag changes that.
FLUSHES_SUBNORMALS: dict[str, bool] = {"llvm-cpu": True}


def flush_subnormals(array: np.ndarray) -> np.ndarray:
    """``array`` with every subnormal replaced by a zero of the same sign."""
    array = np.asarray(array)
    if not is_element(array.dtype):
        return array
    tiny = float(_finfo(array.dtype).tiny)
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
            info = _finfo(want.dtype)
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
            info = _finfo(want.dtype)
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
        """Seeded positive data, uniform in log2 between 2**low and 2**high."""
        return np.exp2(self._rng((key, tuple(shape), "log", low, high)).uniform(low, high, shape)).astype(self.dtype)

    def input(self, array, differentiable: bool = True):
        value = self.tape.input(np.asarray(array, dtype=self.dtype))
        if differentiable:
            self.differentiable.append(value)
        return value

    def uniform(self, shape, low: float = -2.0, high: float = 2.0, key: str = "", differentiable: bool = True):
        return self.input(self.data(shape, low, high, key), differentiable)

    def specials(self, repeat: int = 1, shift: int = 0, differentiable: bool = False):
        """An input holding SPECIALS (rotated by ``shift``), each value ``repeat`` times in a row."""
        values = np.roll(np.array(SPECIALS, dtype=np.float64), shift)
        return self.input(np.repeat(values, repeat).astype(self.dtype), differentiable)

    def pairs(self):
        """Two forward-only inputs holding every (special, special) pair."""
        values = np.array(SPECIALS, dtype=np.float64)
        left = np.repeat(values, len(values)).astype(self.dtype)
        right = np.tile(values, len(values)).astype(self.dtype)
        return self.input(left, False), self.input(right, False)

    def selection(self, indices, extent: int, fed: bool = True):
        chosen = topos.selection(indices, extent)
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


def _binary(name: str, low=-2.0, high=2.0) -> tuple[Case, Case]:
    def regular(r):
        a, b = r.uniform((4, 5), low, high, "a"), r.uniform((4, 5), low, high, "b")
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
    r.tape.parameter(r.data((3, 4), key="parameter"))
    return r.tape.leaf(np.array(SPECIALS, dtype=np.float64).astype(r.dtype))


def _map_cases(function: str, low: float, high: float, wide: tuple | None) -> list[Case]:
    key = f"map:{function}"
    cases = [
        Case(function, key, lambda r: r.uniform((6, 7), low, high, function).map(function)),
        Case(f"{function}/specials", key, lambda r: r.specials().map(function), gradient=False),
    ]
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


def case_keys() -> set[str]:
    """Every TABLE key some case records, gradients included (they record opcodes too)."""
    keys = {case.key for cases in FAMILIES.values() for case in cases}
    return keys | {"parameter", "input"}  # every case feeds inputs; "sources" records a parameter


def table_keys_expected() -> set[str]:
    """The TABLE keys the vocabulary needs: every opcode but map, and map:<function> for each function."""
    return {o.name for o in OPCODES if o.name != "map"} | {f"map:{f}" for f in MAP_FUNCTIONS}


# ---- recording, compiling and grading a family ------------------------------------------------------


@dataclass
class FamilyGraph:
    """A family's recording: every case's output, one loss over the differentiable ones, its gradients."""

    name: str
    dtype: np.dtype
    network: object
    outputs: dict  # case name -> Symbol
    loss: object
    gradients: tuple
    case_of: dict  # node index -> case name (nodes recorded after the cases: "loss+gradient")

    def entry(self):
        """Roots: the loss and its gradients; observes: every other node a case or gradient computed."""
        roots = [self.loss, *self.gradients]
        rooted = {s.index for s in roots}
        observe = [self.network.symbol(i) for i in range(len(self.network))
                   if i not in rooted and (not self.network._opcodes[i].is_source or
                                           i in {s.index for s in self.outputs.values()})]
        return self.network.entry(roots, observe=observe)


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
            for i in range(start, len(tape)):
                case_of[i] = case.name
            outputs[case.name] = out
            if case.gradient:
                weights = recorder.data(out.shape, 0.5, 1.5, "weights/" + case.name)
                terms.append((out * tape.leaf(weights)).sum())
        start = len(tape)
        loss = terms[0]
        for term in terms[1:]:
            loss = loss + term
        adjoints = tape.differentiate(loss, recorder.differentiable)
        for i in range(start, len(tape)):
            case_of[i] = "loss+gradient"
        return outputs, loss, tuple(adjoints.gradients)

    network, (outputs, loss, gradients) = Tape.record(model)
    return FamilyGraph(name, dtype, network, outputs, loss, gradients, case_of)


@dataclass(frozen=True)
class NodeReport:
    """One node's verdict: which node, what it is, which case recorded it, and its Deviation."""

    index: int
    key: str
    dtype: str
    case: str
    deviation: Deviation

    @property
    def ok(self) -> bool:
        return self.deviation.ok

    def __str__(self) -> str:
        verdict = "ok" if self.ok else "FAIL"
        return (f"%{self.index} {self.key} {self.dtype} [{self.case}]: {verdict}, worst {self.deviation.worst:.3g}"
                + (f" -- {self.deviation.detail}" if self.deviation.detail else ""))


@dataclass
class FamilyResult:
    """A compiled family run, graded node by node."""

    graph: FamilyGraph
    target: str
    reports: list = field(default_factory=list)
    compile_seconds: float = 0.0
    cache_hit: bool = False

    def failures(self) -> list:
        return [r for r in self.reports if not r.ok]

    def worst(self) -> dict:
        """key -> the worst deviation seen (in the key's envelope unit)."""
        found: dict[str, float] = {}
        for r in self.reports:
            found[r.key] = max(found.get(r.key, 0.0), r.deviation.worst)
        return found


# Opcodes that only move elements: a product seen through them is still a product.
_MOVES = frozenset({"broadcast", "broadcast_along", "reshape", "permute", "narrow", "pad"})


def _is_product(network, j: int) -> bool:
    """Whether node ``j`` is a multiply, possibly seen through element moves (a fusable product)."""
    while network._opcodes[j].name in _MOVES:
        (j,) = network._operands[j]
    return network._opcodes[j].name == "mul"


def check_values(network, values: Mapping[int, np.ndarray], sources: Mapping[int, np.ndarray],
                 target: str = "llvm-cpu", case_of: Mapping[int, str] | None = None) -> list[NodeReport]:
    """Grade every node in ``values`` (compiled results by node index) against its local reference.

    A non-source node is judged by ``deviation`` with its operands taken
    from ``values`` (compiled) or ``sources`` (what was fed); a source node
    must return exactly what was fed.
    """
    reports = []
    for i in sorted(values):
        opcode = network._opcodes[i]
        attributes = dict(network._attributes[i])
        dtype = network._specs[i].dtype
        name = short_name(dtype)
        case = (case_of or {}).get(i, "")
        if opcode.is_source:
            result = compare(values[i], sources[i], BIT_EXACT)
            reports.append(NodeReport(i, opcode.name, name, case, result))
            continue
        operands = [values[j] if j in values else sources[j] for j in network._operands[i]]
        key = table_key(opcode.name, attributes.get("function"))
        products = [k for k, j in enumerate(network._operands[i]) if _is_product(network, j)]
        reports.append(NodeReport(i, key, name, case, deviation(
            opcode.name, attributes, values[i], operands, target, products=products)))
    return reports


def run_family(name: str, dtype, target: str = "llvm-cpu", driver: str | None = None,
               cache=True) -> FamilyResult:
    """Record, compile for ``target``, run, and grade every node of family ``name`` in ``dtype``."""
    graph = record_family(name, dtype)
    network = graph.network
    started = time.perf_counter()
    compiled = graph.entry().lower().compile(target, driver, cache=cache)
    seconds = time.perf_counter() - started
    parameters = network.parameters()
    run = compiled.forward(parameters)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        oracle = network.forward(parameters)
    readable = {s.index for s in compiled.plan.entry.results}
    values = {i: np.asarray(run[network.symbol(i)]) for i in readable}
    sources = {i: oracle[network.symbol(i)] for i in range(len(network)) if network._opcodes[i].is_source}
    result = FamilyResult(graph, target, compile_seconds=seconds, cache_hit=compiled.cache_hit)
    result.reports = check_values(network, values, sources, target, graph.case_of)
    return result
