"""Helpers for the lowering tests: a network's StableHLO, an independent evaluator, one case per opcode.

The evaluator is the StableHLO reference interpreter shipped in jaxlib
(``jaxlib.mlir.dialects.stablehlo.eval_module``): a second MLIR build
whose semantics come from the StableHLO specification, not from IREE and
not from topos. jaxlib is a development-only dependency; ``evaluator()``
skips the calling test with a reason when it is absent.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

import topos
from topos.dialect.ir.context import new_context
from topos.dialect.ir.emit import emit_module
from topos.dialect.pipeline import to_stablehlo

# ---- arguments of an emitted module ------------------------------------------------------


@functools.cache
def _context():
    # One context for every test module: a fresh context costs ~15 ms, and MLIR keeps
    # the IR of separate modules independent within one context.
    return new_context()


def emitted(network, roots, observes=()):
    """The topos module of ``network`` (roots, then observes), built in the shared context."""
    return emit_module(network, list(roots), list(observes), context=_context())


def argument_nodes(module) -> list[int]:
    """Node indices of @main's arguments, read from the topos module (an ir.Module or its text)."""
    from iree.compiler import ir

    with _context():
        if isinstance(module, str):
            module = ir.Module.parse(module)
        main = next(op.operation for op in module.body.operations if op.operation.name == "func.func")
        block = main.regions[0].blocks[0]
        owner = {}
        for op in block.operations:
            if op.operation.name in ("topos.parameter", "topos.input"):
                owner[op.operands[0].get_name()] = ir.IntegerAttr(op.attributes["node"]).value
        return [owner[argument.get_name()] for argument in block.arguments]


def argument_values(network, module, parameters, feeds=None) -> list[np.ndarray]:
    """The arrays to pass for @main's arguments: parameter slots, then fed or default inputs."""
    feeds = {network.check(s): np.asarray(v) for s, v in (feeds or {}).items()}
    values = []
    for i in argument_nodes(module):
        symbol = network.symbol(i)
        if network.node(symbol).opcode.name == "parameter":
            values.append(np.asarray(parameters[symbol]))
        else:
            values.append(feeds.get(i, network.payload(symbol)))
    return values


# ---- the independent evaluator ----------------------------------------------------------


class Evaluator:
    """The StableHLO reference interpreter in jaxlib's own MLIR build."""

    def __init__(self):
        from jaxlib.mlir import ir, passmanager
        from jaxlib.mlir._mlir_libs import _jax_mlir_ext, _stablehlo
        from jaxlib.mlir.dialects import chlo, stablehlo

        _stablehlo.register_stablehlo_passes()
        registry = ir.DialectRegistry()
        _jax_mlir_ext.register_dialects(registry)
        self.ir, self.passmanager, self.stablehlo = ir, passmanager, stablehlo
        self.context = ir.Context()
        self.context.append_dialect_registry(registry)
        self.context.load_all_available_dialects()
        stablehlo.register_dialect(self.context)
        chlo.register_dialect(self.context)

    def __call__(self, text: str, arguments) -> list[np.ndarray]:
        """Run @main of a StableHLO module on NumPy arrays; bf16 results come back as bf16."""
        ir = self.ir
        with self.context, ir.Location.unknown():
            module = ir.Module.parse(text)
            # The interpreter has no chlo: expand chlo.erf with chlo's own legalization.
            self.passmanager.PassManager.parse(
                "builtin.module(func.func(chlo-legalize-to-stablehlo))"
            ).run(module.operation)
            bf16 = self._widen_bf16_results(module)
            outputs = self.stablehlo.eval_module(module, [self._attribute(a) for a in arguments])
            arrays = [self._array(o) for o in outputs]
            return [a.astype(topos.bfloat16) if k in bf16 else a for k, a in enumerate(arrays)]

    def _attribute(self, array: np.ndarray):
        ir = self.ir
        array = np.array(array, order="C")  # ascontiguousarray would make rank 0 into rank 1
        if array.dtype == topos.bfloat16:
            return ir.DenseElementsAttr.get(array.view(np.uint16), type=ir.BF16Type.get(),
                                            shape=list(array.shape))
        return ir.DenseElementsAttr.get(array, shape=list(array.shape))

    def _array(self, attribute) -> np.ndarray:
        ir = self.ir
        type_ = ir.RankedTensorType(attribute.type)
        if type_.rank == 0:  # the buffer protocol refuses rank-0 attributes
            element = type_.element_type
            dtype = np.float64 if isinstance(element, ir.F64Type) else np.float32
            return np.array(attribute.get_splat_value().value, dtype=dtype)
        return np.array(attribute)

    def _widen_bf16_results(self, module) -> set[int]:
        """Convert bf16 results to f32 (exactly): the bindings cannot read bf16 attributes back."""
        ir = self.ir
        main = next(op.operation for op in module.body.operations if op.operation.name == "func.func")
        block = main.regions[0].blocks[0]
        ret = list(block.operations)[-1]
        widened = set()
        for k, value in enumerate(list(ret.operands)):
            type_ = ir.RankedTensorType(value.type)
            if isinstance(type_.element_type, ir.BF16Type):
                with ir.InsertionPoint(ret):
                    wide = ir.Operation.create(
                        "stablehlo.convert", results=[ir.RankedTensorType.get(type_.shape, ir.F32Type.get())],
                        operands=[value],
                    ).result
                ret.operands[k] = wide
                widened.add(k)
        if widened:
            function_type = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
            results = [v.type for v in ret.operands]
            main.attributes["function_type"] = ir.TypeAttr.get(
                ir.FunctionType.get(function_type.inputs, results)
            )
        return widened


@functools.cache
def _evaluator() -> Evaluator | None:
    try:
        return Evaluator()
    except ImportError:
        return None


def evaluator() -> Evaluator:
    """The shared evaluator, or skip: the semantic tests need jaxlib (a dev-only dependency)."""
    found = _evaluator()
    if found is None:
        pytest.skip("jaxlib is not installed: the StableHLO reference interpreter comes from jaxlib "
                    "(pip install jax jaxlib)")
    return found


def lowered_results(network, roots, parameters=None, feeds=None) -> tuple[str, list[np.ndarray]]:
    """Emit, lower and evaluate ``roots``: (StableHLO text, one array per root)."""
    parameters = parameters if parameters is not None else network.parameters()
    module = emitted(network, roots)
    hlo = to_stablehlo(module)
    return hlo, evaluator()(hlo, argument_values(network, module, parameters, feeds))


# ---- comparing with the oracle ----------------------------------------------------------

_INTEGER = {np.dtype(np.float64): np.int64, np.dtype(np.float32): np.int32, topos.bfloat16: np.int16}


def ulp_distance(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """How many representable numbers of the element type lie between got and want (0 when equal).

    Zeros of either sign are the same number; two NaNs are distance 0; a NaN
    against a number is infinitely far.
    """
    dtype = np.dtype(want.dtype)
    bits = _INTEGER[dtype]
    width = np.iinfo(bits).bits

    def ordered(x):
        raw = np.asarray(x, dtype=dtype).reshape(-1).view(bits).astype(np.int64)
        # Map sign-magnitude bit patterns onto a line where adjacent floats differ by one.
        return np.where(raw < 0, -(raw & ((1 << (width - 1)) - 1)), raw)

    got = np.asarray(got).astype(dtype).reshape(-1)
    want = np.asarray(want).reshape(-1)
    distance = np.abs(ordered(got) - ordered(want)).astype(np.float64)
    both_nan = np.isnan(got.astype(np.float64)) & np.isnan(want.astype(np.float64))
    one_nan = np.isnan(got.astype(np.float64)) ^ np.isnan(want.astype(np.float64))
    return np.where(both_nan, 0.0, np.where(one_nan, np.inf, distance))


def bitwise_equal(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal bits, except that any NaN matches any NaN."""
    got = np.asarray(got).astype(want.dtype).reshape(-1)
    want = np.asarray(want).reshape(-1)
    same = got.view(np.uint8) == want.view(np.uint8)
    if same.all():
        return True
    g, w = got.astype(np.float64), want.astype(np.float64)
    return bool(np.all((np.isnan(g) & np.isnan(w)) | ((g == w) & (np.signbit(g) == np.signbit(w)))))


# ---- one case per opcode ----------------------------------------------------------------

ELEMENTS = (topos.float32, topos.float64, topos.bfloat16)
ELEMENT_IDS = {topos.float32: "f32", topos.float64: "f64", topos.bfloat16: "bf16"}
EPSILON = {topos.float64: 2.0**-52, topos.float32: 2.0**-23, topos.bfloat16: 2.0**-7}

# Values where IEEE edge cases live: signed zeros, infinities, NaN, a subnormal, ties.
SPECIALS = (0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 1e-40, 3.0, 3.0)


def data(dtype, shape, key: str, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    """Seeded uniform data: the same arrays on every run for the same key."""
    import zlib

    rng = np.random.default_rng(zlib.crc32(f"{key}/{np.dtype(dtype).name}/{shape}".encode()))
    return rng.uniform(low, high, shape).astype(dtype)


def with_specials(dtype, shape, key: str, shift: int = 0) -> np.ndarray:
    """Seeded data whose first entries are SPECIALS (rotated by ``shift``)."""
    flat = data(dtype, shape, key).reshape(-1)
    specials = np.roll(np.array(SPECIALS, dtype=np.float64), shift).astype(dtype)
    count = min(len(specials), flat.size)
    flat[:count] = specials[:count]
    return flat.reshape(shape)


@dataclass(frozen=True)
class Case:
    """One recording that exercises an opcode, and the envelope its lowering must meet.

    ``envelope`` is ``"exact"`` (bitwise equal; any NaN matches any NaN) or a
    family name in ENVELOPES: |got - want| <= ulps * eps * max(|want|, floor).
    """

    name: str
    opcode: str
    record: Callable  # (tape, dtype) -> root Value
    envelope: str = "exact"
    floor: float = 0.0


def _binary_exact(name):
    def record(t, d):
        a = t.input(with_specials(d, (4, 5), name))
        b = t.input(with_specials(d, (4, 5), name + "b", shift=3))
        return getattr(a, name)(b)

    return Case(name, name, record)


def _map_case(function, low, high, envelope="transcendental"):
    def record(t, d):
        return t.input(data(d, (6, 7), function, low, high)).map(function)

    return Case(f"map_{function}", "map", record, envelope)


def _ties(name):
    """Ties, signed zeros and NaNs on either side: where ``maximum`` and ``step`` must not guess."""

    def record(t, d):
        left = t.input(np.array([1.0, -0.0, 0.0, np.nan, 2.0, np.nan, -np.inf, 5.0], dtype=d))
        right = t.input(np.array([1.0, 0.0, -0.0, 1.0, np.nan, np.nan, -np.inf, -5.0], dtype=d))
        return getattr(left, name)(right)

    return Case(f"{name}_ties", name, record)


# C99 pow's special cases: integer powers of negative bases, 0**0, nan**0, 1**nan, infinities.
_POW_BASES = (-2.0, -8.0, 0.0, np.nan, 1.0, -1.0, 0.0, -0.0, np.inf, -np.inf, -np.inf, 2.0, 0.5, -3.0, -0.0)
_POW_EXPONENTS = (3.0, 1 / 3, 0.0, 0.0, np.nan, np.inf, -1.0, -1.0, -1.0, 3.0, 2.0, -np.inf, np.inf, 2.0, 3.0)


def _selection(indices, extent, fed=True):
    def make(t):
        chosen = topos.selection(indices, extent)
        return t.input(chosen) if fed else t.leaf(chosen)

    return make


CASES: tuple[Case, ...] = (
    Case("parameter", "parameter", lambda t, d: t.parameter(with_specials(d, (3, 4), "p"))),
    Case("input", "input", lambda t, d: t.input(with_specials(d, (3, 4), "i"))),
    Case("leaf", "leaf", lambda t, d: t.leaf(with_specials(d, (3, 4), "l"))),
    _binary_exact("add"),
    _binary_exact("sub"),
    _binary_exact("mul"),
    _binary_exact("div"),
    Case("neg", "neg", lambda t, d: -t.input(with_specials(d, (3, 4), "n"))),
    _ties("maximum"),
    Case("maximum", "maximum", lambda t, d: t.input(data(d, (4, 5), "m1")).maximum(
        t.input(data(d, (4, 5), "m2")))),
    _ties("step"),
    Case("pow_special_values", "pow", lambda t, d: t.input(np.array(_POW_BASES, dtype=d)) ** t.input(
        np.array(_POW_EXPONENTS, dtype=d))),
    Case("pow", "pow", lambda t, d: t.input(data(d, (5, 6), "pb", 0.1, 4.0)) ** t.input(
        data(d, (5, 6), "pe", -3.0, 3.0)), "transcendental"),
    _map_case("exp", -10.0, 10.0),
    _map_case("log", 1e-3, 100.0),
    _map_case("sqrt", 0.0, 100.0, envelope="exact"),
    _map_case("tanh", -5.0, 5.0),
    _map_case("sin", -10.0, 10.0),
    _map_case("cos", -10.0, 10.0),
    _map_case("log1p", -0.9, 10.0),
    _map_case("expm1", -5.0, 5.0),
    _map_case("erf", -4.0, 4.0),
    _map_case("erf_derivative", -4.0, 4.0, envelope="erf_derivative"),
    Case("matmul", "matmul", lambda t, d: t.input(data(d, (4, 9), "a", 0.5, 1.5)) @ t.input(
        data(d, (9, 3), "b", 0.5, 1.5)), "accumulation"),
    Case("matmul_batched", "matmul", lambda t, d: t.input(data(d, (2, 3, 7), "a", 0.5, 1.5)) @ t.input(
        data(d, (2, 7, 5), "b", 0.5, 1.5)), "accumulation"),
    Case("sum_rank3", "sum", lambda t, d: t.input(data(d, (3, 4, 5), "s", 0.5, 1.5)).sum(),
         "accumulation"),
    Case("sum_rank1", "sum", lambda t, d: t.input(data(d, (17,), "s", 0.5, 1.5)).sum(), "accumulation"),
    Case("sum_rank0", "sum", lambda t, d: t.input(data(d, (), "s")).sum()),
    Case("sum_negative_zeros", "sum", lambda t, d: t.input(np.full((2, 3), -0.0, d)).sum()),
    Case("sum_along0", "sum_along", lambda t, d: t.input(data(d, (5, 3, 4), "a", 0.5, 1.5)).sum_along(0),
         "accumulation"),
    Case("sum_along2", "sum_along", lambda t, d: t.input(data(d, (3, 4, 9), "a", 0.5, 1.5)).sum_along(2),
         "accumulation"),
    Case("broadcast", "broadcast", lambda t, d: t.input(data(d, (1, 1), "b")).broadcast((2, 3))),
    Case("broadcast_scalar", "broadcast", lambda t, d: t.input(data(d, (), "b")).broadcast((4,))),
    Case("broadcast_along", "broadcast_along",
         lambda t, d: t.input(data(d, (2, 3), "ba")).broadcast_along(1, 4)),
    Case("broadcast_to_rank0", "broadcast", lambda t, d: t.input(data(d, (1,), "b")).broadcast(())),
    Case("reshape", "reshape", lambda t, d: t.input(data(d, (2, 3, 4), "r")).reshape((6, 4))),
    Case("reshape_rank0", "reshape", lambda t, d: t.input(data(d, (1, 1), "r")).reshape(())),
    Case("permute", "permute", lambda t, d: t.input(data(d, (2, 3, 4), "pm")).permute((2, 0, 1))),
    Case("narrow", "narrow", lambda t, d: t.input(data(d, (3, 6), "nw")).narrow(1, 2, 3)),
    Case("pad", "pad", lambda t, d: t.input(with_specials(d, (3, 4), "pd")).pad(0, 1, 6)),
    Case("unfold", "unfold",
         lambda t, d: t.input(data(d, (2, 11, 3), "u")).unfold(1, size=3, step=2, dilation=2)),
    Case("unfold_single_lane", "unfold", lambda t, d: t.input(data(d, (5, 2), "u")).unfold(0, 1, 2)),
    Case("fold_overlapping", "fold",
         lambda t, d: t.input(data(d, (2, 6, 3, 2), "f")).fold(1, size=3, step=1, dilation=1, extent=8)),
    Case("fold_strided", "fold",
         lambda t, d: t.input(data(d, (4, 2), "f")).fold(0, size=2, step=3, dilation=2, extent=12)),
    Case("fold_rank4", "fold",
         lambda t, d: t.input(data(d, (2, 3, 2, 5), "f")).fold(1, size=2, step=1, dilation=2, extent=5)),
    Case("gather", "gather", lambda t, d: t.input(with_specials(d, (5, 3), "g")).gather(
        _selection([[0, 4, 4], [2, 0, 1]], 5, fed=False)(t))),
    Case("gather_vector_table", "gather",
         lambda t, d: t.input(data(d, (5,), "g")).gather(_selection([3, 3, 1, 0], 5)(t))),
    Case("gather_rank0_selection", "gather",
         lambda t, d: t.input(data(d, (5, 3), "g")).gather(_selection(3, 5)(t))),
    Case("scatter_rank0_selection", "scatter",
         lambda t, d: t.input(data(d, (3,), "sc")).scatter(_selection(3, 5)(t))),
    Case("scatter_repeated", "scatter", lambda t, d: t.input(data(d, (6, 3), "sc")).scatter(
        _selection([1, 3, 1, 0, 1, 3], 5)(t))),
    Case("scatter_rank2_selection", "scatter", lambda t, d: t.input(data(d, (2, 3), "sc")).scatter(
        _selection([[2, 2, 0], [2, 1, 2]], 4, fed=False)(t))),
    Case("log_softmax", "log_softmax",
         lambda t, d: t.input(data(d, (4, 6), "ls", -8.0, 8.0)).log_softmax(1), "stable", 1.0),
    Case("log_softmax_axis0", "log_softmax",
         lambda t, d: t.input(data(d, (5, 3), "ls", -8.0, 8.0)).log_softmax(0), "stable", 1.0),
    Case("log_softmax_nonfinite", "log_softmax", lambda t, d: t.input(np.array(
        [[-np.inf, -np.inf], [np.inf, 1.0], [-np.inf, 2.0], [300.0, -300.0]], dtype=d)).log_softmax(1),
        "stable", 1.0),
    Case("log_softmax_rank1", "log_softmax",
         lambda t, d: t.input(data(d, (7,), "ls", -8.0, 8.0)).log_softmax(0), "stable", 1.0),
    Case("logsumexp", "logsumexp",
         lambda t, d: t.input(data(d, (4, 6), "lse", -8.0, 8.0)).logsumexp(1), "stable", 1.0),
    Case("logsumexp_nonfinite", "logsumexp", lambda t, d: t.input(np.array(
        [[-np.inf, -np.inf], [np.inf, 1.0], [-np.inf, 2.0], [300.0, -300.0]], dtype=d)).logsumexp(1),
        "stable", 1.0),
)


# Envelopes in units of the element's epsilon times max(|want|, case.floor), measured
# against the reference interpreter (largest seen in parentheses, f32 / f64 / bf16):
# transcendental (1.5 / 1.0 / 0), erf_derivative (3.8 / 4.2 / 0; the error grows
# like x**2 * eps because x*x rounds before exp), accumulation on cancellation-free
# data of at most 63 terms (2.1 / 0.95 / 0), stable with floor 1 (1.0 / 1.9 / 0).
ENVELOPES: dict[str, dict] = {
    "transcendental": {topos.float32: 4.0, topos.float64: 4.0, topos.bfloat16: 1.0},
    "erf_derivative": {topos.float32: 8.0, topos.float64: 8.0, topos.bfloat16: 1.0},
    "accumulation": {topos.float32: 8.0, topos.float64: 8.0, topos.bfloat16: 1.0},
    "stable": {topos.float32: 4.0, topos.float64: 4.0, topos.bfloat16: 1.0},
}


def check_envelope(got, want, envelope: str, dtype, floor: float = 0.0, what: str = "") -> None:
    """Assert ``got`` meets ``envelope`` against the oracle's ``want`` (see Case)."""
    want = np.asarray(want)
    got = np.asarray(got)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if envelope == "exact":
        assert bitwise_equal(got, want), f"{what}: bits differ: got {got!r}, want {want!r}"
        return
    allowed = ENVELOPES[envelope][np.dtype(dtype)]
    g, w = got.astype(np.float64), want.astype(np.float64)
    with np.errstate(invalid="ignore"):
        same = (np.isnan(g) & np.isnan(w)) | (g == w)
        error = np.abs(g - w)
        bound = allowed * EPSILON[np.dtype(dtype)] * np.maximum(np.abs(w), floor)
    bad = ~same & ~(error <= bound)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.size} outside the {envelope} envelope "
            f"({allowed} eps); first at {where}: got {g[where]!r}, want {w[where]!r}"
        )
