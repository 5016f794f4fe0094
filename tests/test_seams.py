"""The five seams, each worked once and graded against the oracle (docs/seams.md).

* element type: what the seam is today (a closed table of three formats,
  each with a compute type), stated as tests;
* fusion pattern: a ``Pattern`` subclass registered with
  ``register_pattern``, offered, elected by a plan, bit-identical under EXACT;
* pass: a Python pass registered with ``register_pass`` and run by
  ``run_pipeline``, and one loaded through the ``topos.passes`` entry-point group;
* backend / emission target: a consumer that evaluates the emitted topos
  module by itself, and a new IREE target row reached by name;
* AD mode (the payload seam): an interval payload replayed over a spec with
  ``Opcode.express``; forward mode's dual numbers are worked in
  tests/test_express.py and examples/forward_mode.py.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

import topos
from topos import Numerics, ShapeError, Tape
from topos.base.element import compute_type, round_to
from topos.readings.plan.patterns import CATALOG, Candidate, Pattern, register_pattern

from conftest import ELEMENT_IDS, ELEMENTS, generator, line_here

ROOT = Path(__file__).resolve().parents[1]


# ---- 1. the element type ---------------------------------------------------------------------------


def test_element_types_are_a_closed_table_of_three_formats_with_compute_types():
    assert topos.ELEMENTS == (topos.float32, topos.float64, topos.bfloat16)
    assert [compute_type(d) for d in topos.ELEMENTS] == [topos.float32, topos.float64, topos.float32]


def test_an_unlisted_format_is_refused_at_the_recording_line():
    def model(tape):
        return tape.input(np.zeros(3, np.float16))

    line = line_here() - 2
    with pytest.raises(ShapeError, match=rf"test_seams.py:{line}.*float16 is not supported.*bfloat16"):
        Tape.record(model)


def test_bfloat16_accumulates_in_float32_and_rounds_once():
    # 1 + 2**-8 is a tie in bfloat16 and rounds back to 1; in float32 it is exact.
    values = np.array([1.0] + [2.0**-8] * 4, dtype=topos.bfloat16)
    network, total = Tape.record(lambda tape: tape.leaf(values).sum())
    got = network.forward(network.parameters())[total]
    assert got.dtype == topos.bfloat16
    assert float(got) == 1.0 + 2.0**-6  # the exact sum, representable in bfloat16
    in_bfloat16 = values[0]
    for v in values[1:]:
        in_bfloat16 = (in_bfloat16 + v).astype(topos.bfloat16)
    assert float(in_bfloat16) == 1.0  # what accumulating in the element itself would give


# ---- 2. a fusion pattern --------------------------------------------------------------------------


class SumOfSquares(Pattern):
    """``sum(x * x)``, as a squared-error loss records it, run as one kernel over one buffer.

    The executor squares ``x`` once into a buffer of the compute type and
    halves that buffer in place with the reference's pairwise tree (element
    ``i`` plus element ``i + n // 2``; an odd leftover moves to the end of the
    new half). The operations and their order are the composition's, so the
    bits are too; only the temporaries differ.
    """

    kind = "sum_of_squares"
    bit_identical = True

    def discover(self, view):
        found = []
        for n in sorted(view.wanted):
            if view.opcode(n) != "sum":
                continue
            (square,) = view.operands(n)
            if view.opcode(square) != "mul" or not view.interior_ok(square):
                continue  # an observed or shared product is a barrier
            left, right = view.operands(square)
            if left != right:
                continue
            found.append(Candidate(self.kind, n, (square, n), "sum of the squares of one tensor",
                                   view.nbytes(square), {"input": left}))
        return found

    def execute(self, candidate, value, network, kernel_of):
        x = value(candidate.details["input"])
        dtype = x.dtype
        work = compute_type(dtype)
        squares = round_to(np.multiply(x.astype(work), x.astype(work)), dtype)  # the mul node's bits
        buffer = np.array(squares, dtype=work).reshape(-1)
        n = buffer.size
        while n > 1:
            half = n // 2
            np.add(buffer[:half], buffer[half : 2 * half], out=buffer[:half])
            if n % 2:
                buffer[half] = buffer[2 * half]
            n = half + n % 2
        return round_to(buffer[0:1].reshape(()), dtype)


class LooseSumOfSquares(SumOfSquares):
    """The same matcher with an executor that does not promise the composition's bits."""

    kind = "loose_sum_of_squares"
    bit_identical = False


@pytest.fixture
def registered():
    """Register patterns for one test and take them out of the catalog afterwards."""
    added = []

    def register(pattern, **where):
        register_pattern(pattern, **where)
        added.append(pattern)
        return pattern

    yield register
    for pattern in added:
        CATALOG.remove(pattern)


class SquaredError(NamedTuple):
    network: object
    square: object  # the product error * error
    loss: object  # its sum
    adjoints: object  # d loss / d w, recorded


def squared_error(dtype) -> SquaredError:
    rng = generator("seams", "squared-error", np.dtype(dtype).name)

    def model(tape):
        x = tape.input(rng.uniform(-2, 2, (5, 7)).astype(dtype))
        w = tape.parameter(rng.uniform(-1, 1, (7, 3)).astype(dtype))
        error = (x @ w).tanh() - 0.25
        square = error * error
        loss = square.sum()
        return square, loss, tape.differentiate(loss, [w])

    network, (square, loss, adjoints) = Tape.record(model)
    return SquaredError(network, square, loss, adjoints)


@pytest.mark.parametrize("dtype", ELEMENTS, ids=ELEMENT_IDS)
def test_a_registered_pattern_is_elected_and_exact_plans_match_the_oracle_bitwise(registered, dtype):
    registered(SumOfSquares(), before="elementwise")
    network, square, loss, adjoints = squared_error(dtype)
    plan = network.entry(adjoints.roots(), numerics=Numerics.EXACT).lower()
    groups = [g for g in plan.fusions() if g.kind == "sum_of_squares"]
    assert [(g.root, g.nodes) for g in groups] == [(loss.index, (square.index, loss.index))]
    assert "sum_of_squares of 2 nodes" in plan.describe()
    parameters = network.parameters()
    oracle, planned = network.forward(parameters), plan.forward(parameters)
    for symbol in plan.results:
        assert planned[symbol].tobytes() == oracle[symbol].tobytes()


@pytest.mark.parametrize("length", [1, 2, 3, 7, 64, 97])
def test_the_in_place_tree_is_the_reference_tree_for_every_length(length):
    values = generator("seams", "tree", length).uniform(-1e3, 1e3, length).astype(np.float32)
    def model(tape):
        v = tape.input(values)
        return (v * v).sum()

    network, total = Tape.record(model)
    candidate = Candidate("sum_of_squares", total.index, (total.index - 1, total.index), "", 0, {"input": 0})
    fused = SumOfSquares().execute(candidate, lambda n: values, network, None)
    assert fused.tobytes() == network.forward(network.parameters())[total].tobytes()


def test_an_observed_square_is_a_barrier_to_the_pattern(registered):
    registered(SumOfSquares())
    graph = squared_error(topos.float32)
    plan = graph.network.entry([graph.loss], observe=[graph.square], numerics=Numerics.EXACT).lower()
    assert not [c for c in plan.candidates() if c.kind == "sum_of_squares"]


def test_a_pattern_that_changes_bits_serves_only_the_fast_posture(registered):
    registered(LooseSumOfSquares(), before="elementwise")
    graph = squared_error(topos.float32)
    kinds = {
        numerics: {g.kind for g in graph.network.entry([graph.loss], numerics=numerics).lower().fusions()}
        for numerics in Numerics
    }
    assert "loose_sum_of_squares" not in kinds[Numerics.EXACT]
    assert "loose_sum_of_squares" in kinds[Numerics.FAST]


def test_catalog_order_decides_which_pattern_claims_a_shared_node(registered):
    # tanh -> sub -> mul is also an elementwise chain; whichever pattern comes first claims the mul.
    registered(SumOfSquares())  # appended after the elementwise chains
    graph = squared_error(topos.float32)
    plan = graph.network.entry([graph.loss], numerics=Numerics.EXACT).lower()
    assert {c.kind for c in plan.candidates()} == {"elementwise", "sum_of_squares"}
    assert [g.kind for g in plan.fusions()] == ["elementwise"]


def test_a_kind_can_be_registered_once(registered):
    registered(SumOfSquares())
    with pytest.raises(ValueError, match="already in the catalog"):
        register_pattern(SumOfSquares())


def test_the_emission_sees_a_new_offer_and_lowers_its_nodes_one_by_one(registered):
    pytest.importorskip("iree.compiler")
    from topos.dialect import transform

    registered(SumOfSquares())
    graph = squared_error(topos.float32)
    plan = graph.network.entry([graph.loss]).lower()
    offers = transform(plan.emit_mlir(), "topos-fuse")
    assert 'kind = "sum_of_squares"' in offers
    elected = transform(plan.emit_mlir(), "topos-fuse,topos-elect")
    assert "topos.fusion_kind" not in elected  # the emission raises only the kinds it knows
    stablehlo = plan.emit_stablehlo()
    assert "topos." not in stablehlo.replace("topos.offers", "").replace("topos.fusions", "")
    assert "stablehlo.multiply" in stablehlo and "stablehlo.reduce" in stablehlo


# ---- 3. a pass ----------------------------------------------------------------------------------


@pytest.fixture
def pass_registry():
    pytest.importorskip("iree.compiler")
    from topos.dialect.passes import registry as passes

    before = set(passes._REGISTRY)
    yield passes
    for name in set(passes._REGISTRY) - before:
        del passes._REGISTRY[name]


def _register_opcode_census(passes):
    from iree.compiler import ir

    from topos.dialect.ir.ops import topos_operations

    @passes.register_pass("seams-opcode-census", "Count the ops of each opcode; refuse one opcode")
    def census(module, *, forbid=""):
        counts: dict[str, int] = {}
        for op in topos_operations(module):
            name = op.name.removeprefix("topos.")
            if name == forbid:
                raise passes.PassFailure.at(op, f"{name} is forbidden here")
            counts[name] = counts.get(name, 0) + 1
        main = next(op for op in module.body.operations if op.operation.name == "func.func")
        i64 = ir.IntegerType.get_signless(64)
        main.attributes["topos.census"] = ir.DictAttr.get(
            {name: ir.IntegerAttr.get(i64, n) for name, n in sorted(counts.items())}
        )

    return census


def test_a_registered_pass_runs_in_a_pipeline_beside_upstream_passes(pass_registry):
    from topos.dialect import emit_module

    _register_opcode_census(pass_registry)
    graph = squared_error(topos.float32)
    module = emit_module(graph.network, [graph.loss])
    pass_registry.run_pipeline(module, "topos-verify,seams-opcode-census,canonicalize,cse")
    text = module.operation.get_asm(enable_debug_info=False)
    assert "topos.census = {input = 1 : i64, leaf = 1 : i64, map = 1 : i64, matmul = 1 : i64, " \
           "mul = 1 : i64, parameter = 1 : i64, sub = 1 : i64, sum = 1 : i64}" in text
    listed = {p.name: p for p in pass_registry.registered_passes()}
    assert listed["seams-opcode-census"].options == (("forbid", ""),)


def test_a_pass_failure_points_at_the_recording_line(pass_registry):
    from topos.dialect import transform

    _register_opcode_census(pass_registry)

    def model(tape):
        x = tape.input(np.ones((2, 2), np.float32))
        return x.tanh().sum()

    line = line_here() - 2
    network, total = Tape.record(model)
    with pytest.raises(pass_registry.PassFailure) as caught:
        transform(network.entry([total]).lower().emit_mlir(), "seams-opcode-census{forbid=map}")
    (diagnostic,) = caught.value.diagnostics
    file, at, _ = diagnostic.position()
    assert (Path(file).name, at) == ("test_seams.py", line)
    assert "map is forbidden here" in str(caught.value)


def test_a_package_registers_passes_through_the_entry_point_group(pass_registry, tmp_path, monkeypatch):
    (tmp_path / "seams_plugin.py").write_text(
        "from topos.dialect.passes.registry import register_pass\n"
        "\n"
        "@register_pass('seams-plugin-mark', 'Mark @main as visited by the plugin')\n"
        "def mark(module):\n"
        "    from iree.compiler import ir\n"
        "    for op in module.body.operations:\n"
        "        op.operation.attributes['topos.plugin'] = ir.UnitAttr.get()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "seams_plugin", raising=False)
    plugin = importlib.metadata.EntryPoint("seams", "seams_plugin", pass_registry.ENTRY_POINT_GROUP)
    real = importlib.metadata.entry_points
    monkeypatch.setattr(
        importlib.metadata, "entry_points",
        lambda **selection: [plugin] if selection.get("group") == pass_registry.ENTRY_POINT_GROUP
        else real(**selection),
    )
    assert pass_registry.lookup("seams-plugin-mark") is None
    pass_registry.load_pass_modules()
    assert pass_registry.lookup("seams-plugin-mark") is not None
    from topos.dialect import transform

    graph = squared_error(topos.float32)
    assert "topos.plugin" in transform(graph.network.entry([graph.loss]).lower().emit_mlir(), "seams-plugin-mark")


# ---- 4. a backend or emission target ------------------------------------------------------------------


def evaluate_module(module, arguments):
    """A second backend: evaluate @main of a topos module op by op with the opcodes' reference kernels.

    It reads nothing but the module: arguments by position (parameters,
    then inputs), leaves from their ``value``, each op's opcode and
    attributes from its op class. Results come back in @main's order.
    """
    from iree.compiler import ir

    main = next(op for op in module.body.operations if op.operation.name == "func.func")
    block = main.regions[0].blocks[0]
    values = {}

    def read(value):
        if isinstance(value.owner, ir.Block):
            return arguments[ir.BlockArgument(value).arg_number]
        return values[value.get_name()]

    with np.errstate(all="ignore"):
        for op in block.operations:
            name = op.operation.name
            if name == "func.return":
                return [read(v) for v in op.operation.operands]
            if name == "topos.leaf":
                out = op.value
            elif name in ("topos.parameter", "topos.input"):
                out = read(op.operation.operands[0])
            else:
                operands = [read(v) for v in op.operation.operands]
                out = op.opcode.kernel(*operands, **op.opcode_attributes())
            values[op.result.get_name()] = np.asarray(out)
    raise AssertionError("@main has no return")


def _dialect_graphs():
    spec = importlib.util.spec_from_file_location("seams_dialect_graphs", ROOT / "tests/dialect/graphs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_new_backend_reads_the_emitted_module_and_matches_the_oracle_bitwise():
    pytest.importorskip("iree.compiler")
    from topos.dialect import emit_module

    network, roots, observes = _dialect_graphs().every_opcode()
    module = emit_module(network, list(roots), list(observes))
    parameters = network.parameters()
    arguments = [parameters[s] if network.node(s).opcode.name == "parameter" else network.payload(s)
                 for s in (*network.parameter_symbols(), *network.input_symbols())]
    results = evaluate_module(module, arguments)
    with np.errstate(all="ignore"):
        oracle = network.forward(parameters)
    assert len(results) == len(roots) + len(observes)
    for symbol, got in zip((*roots, *observes), results):
        assert got.tobytes() == oracle[symbol].tobytes(), f"{symbol!r} differs from the oracle"


def test_a_new_iree_target_row_is_reachable_by_name(tmp_path, monkeypatch):
    pytest.importorskip("iree.runtime")
    from topos.dialect.iree import targets

    monkeypatch.setenv("TOPOS_CACHE_DIR", str(tmp_path))
    generic = targets.Target(
        "llvm-cpu-generic",
        targets.TARGETS["llvm-cpu"].flags + ("--iree-llvmcpu-target-cpu=generic",),
        "local-task",
        supports_f64=False,
        note="any x86-64 or Arm CPU, no host-specific instructions",
    )
    monkeypatch.setitem(targets.TARGETS, generic.name, generic)

    def model(tape):
        a = tape.input(np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4))
        b = tape.parameter(np.linspace(1, 2, 12, dtype=np.float32).reshape(3, 4))
        return ((a + b) / b).maximum(-a).sqrt()  # IEEE-exact operations only: bits must agree

    network, out = Tape.record(model)
    compiled = network.entry([out]).lower().compile("llvm-cpu-generic")
    assert compiled.target is generic and compiled.driver == "local-task"
    parameters = network.parameters()
    assert compiled.forward(parameters)[out].tobytes() == network.forward(parameters)[out].tobytes()


# ---- 5. a payload replayed over the spec (the seam AD modes use) ----------------------------------------


class Interval(topos.Recordable):
    """Elementwise bounds [lo, hi] on a tensor, pushed through each opcode's reference kernel.

    Round-to-nearest is monotone, so an opcode that is monotone in an
    operand stays monotone in floating point: evaluating it at the
    endpoints bounds the *oracle's bits* at every point of the box, with
    no outward rounding. Opcodes without a rule below are refused.
    """

    __slots__ = ("hi", "lo")

    def __init__(self, lo, hi):
        self.lo, self.hi = np.asarray(lo), np.asarray(hi)

    @property
    def shape(self):
        return self.lo.shape

    @property
    def dtype(self):
        return self.lo.dtype

    def _constant(self, array):
        return Interval(array, array)

    def _express(self, opcode, operands, attributes):
        rule = INTERVAL_RULES.get("map:" + attributes["function"] if opcode.name == "map" else opcode.name)
        if rule is None:
            raise NotImplementedError(f"Interval has no bound rule for {opcode.name} {attributes}")
        return rule(opcode, operands, attributes)


def _increasing(opcode, operands, attributes):
    return Interval(opcode.express([o.lo for o in operands], attributes),
                    opcode.express([o.hi for o in operands], attributes))


def _sub(opcode, operands, attributes):
    a, b = operands
    return Interval(opcode.express([a.lo, b.hi]), opcode.express([a.hi, b.lo]))


def _neg(opcode, operands, attributes):
    (a,) = operands
    return Interval(opcode.express([a.hi]), opcode.express([a.lo]))


def _mul(opcode, operands, attributes):
    a, b = operands
    corners = [opcode.express([x, y]) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
    return Interval(np.minimum.reduce(corners), np.maximum.reduce(corners))


INTERVAL_RULES = {
    **{name: _increasing for name in ("add", "maximum", "sum", "sum_along", "broadcast", "broadcast_along",
                                       "reshape", "permute", "narrow", "pad", "map:sqrt")},
    "sub": _sub,
    "neg": _neg,
    "mul": _mul,
}


def replay(network, source):
    """Every node's payload: ``source(node)`` for sources, ``Opcode.express`` for the rest."""
    values = {}
    for node in network.nodes():
        if node.is_source:
            values[node.index] = source(node)
        else:
            values[node.index] = node.opcode.express([values[s.index] for s in node.operands], node.attributes)
    return values


def bounded_model(tape):
    x = tape.input(np.zeros((4, 3)))
    w = tape.parameter(generator("seams", "interval", "w").uniform(-1, 1, (4, 3)))
    h = (x * w - 0.25).relu()  # mul, leaf, sub, maximum
    z = (h * h + 1.0).sqrt()
    return x, (z - x.abs()).sum_along(1).broadcast_along(1, 2).sum()


@pytest.mark.parametrize("radius", [0.0, 0.5])
def test_an_interval_payload_bounds_the_oracle_over_a_box(radius):
    network, (x, loss) = Tape.record(bounded_model)
    parameters = network.parameters()
    centre = generator("seams", "interval", "x").uniform(-1, 1, (4, 3))

    def source(node):
        if node.symbol == x:
            return Interval(centre - radius, centre + radius)
        array = parameters[node.symbol] if node.opcode.name == "parameter" else network.payload(node.symbol)
        return Interval(array, array)

    bounds = replay(network, source)
    samples = [centre] + [centre + generator("seams", "box", k).uniform(-radius, radius, centre.shape)
                          for k in range(200)]
    for point in samples:
        run = network.forward(parameters, {x: point})
        for node in network.nodes():
            got, box = run[node.symbol], bounds[node.index]
            assert np.all(box.lo <= got) and np.all(got <= box.hi), f"node {node.index} escapes its bounds"
    if radius == 0.0:  # a point box replays the oracle's bits exactly
        run = network.forward(parameters, {x: centre})
        assert bounds[loss.index].lo.tobytes() == bounds[loss.index].hi.tobytes() == run[loss].tobytes()


def test_an_interval_payload_refuses_an_opcode_it_has_no_rule_for():
    network, _ = Tape.record(lambda tape: tape.input(np.ones(3)).exp().sum())

    def source(node):
        payload = network.payload(node.symbol)
        return Interval(payload, payload)

    with pytest.raises(NotImplementedError, match="no bound rule for map"):
        replay(network, source)
