"""Plans: a derived, stateless schedule of what to run, keep and free, plus elected fusions.

A plan holds no parameters and no buffers between runs: one plan serves
any parameter table, and it keeps serving the prefix it covers after the
network is reopened. Under Numerics.EXACT its runs reproduce the oracle's
bits; fusion never reorders float math.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from topos.base.arguments import flag
from topos.base.copies import is_splat, splat, splat_element
from topos.base.element import is_element
from topos.base.errors import PlanError, SymbolError
from topos.readings.interpret import bind_feeds, bind_parameters, evaluate_into, source_value
from topos.readings.plan.numerics import Numerics, kernel_for
from topos.readings.plan.patterns import Candidate, StructureView, discover, elect, pattern
from topos.readings.plan.tally import plan_tally
from topos.spec.network import describe_line, plural
from topos.spec.opcodes.base import spec_bytes
from topos.spec.run import Run


class Plan:
    """The schedule derived from an Entry: dead nodes dropped, liveness and fusions decided."""

    def __init__(self, entry):
        self.entry = entry
        network = self.network = entry.network
        self.numerics = entry.numerics
        wanted = entry.closure()
        readable = entry.kept()  # results, and under the backward posture what the rules read
        self._view = StructureView(network, wanted, readable)
        self._candidates = discover(self._view)
        self._fusions = elect(self._candidates, self._home_supports)
        self.schedule: tuple[int, ...] = tuple(sorted(wanted))
        group_of = {n: g for g in self._fusions for n in g.nodes}
        self._group_of = group_of
        # One step per unfused node, one per group (at its root).
        self._steps: tuple[int, ...] = tuple(
            n for n in self.schedule if n not in group_of or group_of[n].root == n
        )
        position = {n: n if n not in group_of else group_of[n].root for n in self.schedule}
        last: dict[int, int] = {}
        operands = network.columns.operands
        for n in self.schedule:
            rebuilt = group_of[n].recomputes if n in group_of else ()
            for j in operands[n]:
                reader = position[n]
                if j in group_of and group_of[j].root == reader and j != reader:
                    continue  # read inside its own group, not a live value
                if j in rebuilt:
                    continue  # the reader's group rebuilds it from the group's own inputs
                last[j] = max(last.get(j, -1), reader)
        for group in self._fusions:  # ... and reads those inputs at its root
            for r in group.recomputes:
                for j in operands[r]:
                    if j not in group.recomputes:
                        last[j] = max(last.get(j, -1), group.root)
        self._free_after: dict[int, list[int]] = {}
        for j, step in last.items():
            if j not in readable and not (j in group_of and group_of[j].root != j):
                self._free_after.setdefault(step, []).append(j)
        self._last_reader = last
        self._series = self._account()

    # -- election --------------------------------------------------------------------------
    def _home_supports(self, candidate: Candidate) -> bool:
        chosen = pattern(candidate.kind)
        if not self.numerics.accepts(chosen.fidelity):  # EXACT: only groups that keep the composition's bits
            return False
        return chosen.executes

    # -- running ---------------------------------------------------------------------------
    def forward(self, parameters, feeds=None) -> Run:
        """Run the plan -> a Run whose readable symbols are the entry's results."""
        return execute(self.network, self._steps, frozenset(self.entry._readable), parameters, feeds,
                       self.numerics, self._fusions, self._free_after, wanted=self.entry.closure(),
                       backward=self.entry.backward)

    # -- reading the plan --------------------------------------------------------------------
    @property
    def results(self) -> tuple:
        """The declared results in order: roots then observes."""
        return self.entry.results

    def nodes(self) -> tuple:
        """The scheduled nodes (the entry's closure) in execution order."""
        return tuple(self.network._node(n) for n in self.schedule)

    def candidates(self) -> tuple[Candidate, ...]:
        """Every fusion offer the catalog found (they may overlap)."""
        return self._candidates

    def fusions(self) -> tuple[Candidate, ...]:
        """The offers this plan's NumPy executor elected."""
        return self._fusions

    def live_series(self) -> tuple[tuple[int, int], ...]:
        """(node index, live bytes just after it is computed) for every executed step."""
        return self._series

    def peak(self) -> tuple[int, int]:
        """(peak live bytes, node index where it happens)."""
        node, peak = max(self._series, key=lambda s: s[1]) if self._series else (-1, 0)
        return peak, node

    def working_peak(self, uncounted: Iterable[int] = ()) -> int:
        """Peak live bytes of computed values that are not results: what a run holds beside what it
        hands out (before a compiler fuses any of it away). Nodes in ``uncounted`` (node indices or
        Symbols of this network) are left out too."""
        left_out = frozenset(self.entry._readable) | frozenset(self._nodes_of(uncounted, "uncounted"))
        return max((live for _, live in self._account(left_out)), default=0)

    def _nodes_of(self, items: Iterable, role: str) -> list[int]:
        """Node indices of ``items`` (ints or Symbols), each a node of this network: a typo is not silence."""
        if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
            raise PlanError(f"{role}= takes node indices or Symbols of this network (a list or set of them), got "
                            f"{type(items).__name__} {items!r}; wrap one in a list: [{items!r}]")
        nodes = []
        for item in items:
            if isinstance(item, (int, np.integer)) and not isinstance(item, bool):
                if not 0 <= item < len(self.network):
                    raise SymbolError(f"{role} names node {item}, but this network has nodes "
                                      f"0..{len(self.network) - 1}")
                nodes.append(int(item))
            else:
                nodes.append(self.network.check(item, role))
        return nodes

    def release_floor(self) -> int:
        """Bytes of computed values the plan keeps to the end of a run (the results, and under the
        backward posture what the derivative rules read): what the forward hands on, and the least
        a run holds once it is done."""
        columns = self.network.columns
        return sum(spec_bytes(columns.specs[n]) for n in self.entry.kept()
                   if not columns.opcodes[n].is_source)

    def retain_all_bytes(self) -> int:
        """Bytes a run holds if it frees nothing (the oracle's footprint for this closure)."""
        columns = self.network.columns
        return sum(spec_bytes(columns.specs[n]) for n in self.schedule
                   if not columns.opcodes[n].is_source)

    def _account(self, uncounted: frozenset[int] = frozenset()) -> tuple[tuple[int, int], ...]:
        columns = self.network.columns
        live, series = 0, []
        for step in self._steps:
            if not columns.opcodes[step].is_source and step not in uncounted:
                live += spec_bytes(columns.specs[step])
            series.append((step, live))
            for j in self._free_after.get(step, ()):
                if not columns.opcodes[j].is_source and j not in uncounted:
                    live -= spec_bytes(columns.specs[j])
        return tuple(series)

    def liveness(self) -> dict[int, str]:
        """Each scheduled node's fate, as describe and topos.draw print it.

        ``kept (result k)``, ``kept (read by the backward scan)`` under the
        backward posture, ``freed after N`` (the last step that reads it),
        ``fused into Gk`` (never materialised), or ``unread``; a group's root
        adds ``; Gk = kind of n nodes``.
        """
        results = {n: k for k, n in enumerate(self.entry._readable)}
        numbers = {g.root: k for k, g in enumerate(self._fusions)}
        labels = {}
        for n in self.schedule:
            group = self._group_of.get(n)
            if group is not None and group.root != n:
                label = f"fused into G{numbers[group.root]}"
            elif n in results:
                label = f"kept (result {results[n]})"
            elif n in self.entry.kept() and not self.network.columns.opcodes[n].is_source:
                label = "kept (read by the backward scan)"
            elif n in self._last_reader:
                label = f"freed after {self._last_reader[n]}"
            else:
                label = "unread"
            if group is not None and group.root == n:
                label += f"; G{numbers[n]} = {group.kind} of {len(group.nodes)} nodes"
            labels[n] = label
        return labels

    def describe(self) -> str:
        """Each scheduled node with its liveness label, then the plan's summary."""
        network, lines = self.network, []
        columns = network.columns
        liveness = self.liveness()
        for n in self.schedule:
            base = describe_line(n, columns.opcodes[n], columns.operands[n], columns.attributes[n], columns.specs[n],
                                 columns.payloads.get(n))
            lines.append(f"{base:<88}  {liveness[n]}")
        total = len(network)
        peak, at = self.peak()
        retain = self.retain_all_bytes()
        lines.append(
            f"plan: {len(self.schedule)} of {plural(total, 'node')} evaluated, "
            f"{plural(len(self.entry._readable), 'result')}, numerics {self.numerics.value}"
        )
        if self._fusions:
            fused = sum(len(g.nodes) for g in self._fusions)
            kinds = ", ".join(sorted({g.kind for g in self._fusions}))
            lines.append(f"fused: {plural(len(self._fusions), 'group')} covering {fused} nodes ({kinds})")
        lines.append(f"live bytes: peak {peak} at node {at}, retain-all {retain}")
        if self.entry.backward is not None:
            entry = self.entry
            alone = entry.without_backward().lower().peak()[0]
            kept = [n for n in entry.kept() if not network.columns.opcodes[n].is_source]
            lines.append(f"backward posture (target %{entry.backward.index}): keeps {plural(len(kept), 'value')} "
                         f"for the scan, release floor {self.release_floor()}; forward-only peak {alone}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Plan {len(self.schedule)} of {len(self.network)} nodes, {self.numerics.value}>"

    def tally(self):
        """Per scheduled node, who serves it: a reference kernel, a fast kernel or a fused group (topos.backends)."""
        return plan_tally(self)

    def digest(self) -> str:
        """sha256 of what this plan emits: its closure's structure and constants, and its results.

        Opcodes, operands, attributes, shapes and element types of the
        scheduled nodes, the bytes of every leaf, and the declared results
        in order: two plans with one digest emit the same StableHLO. Names,
        recording sites, input defaults, parameter values and the numerics
        posture are left out (none of them reaches the emitted module's
        ops). The compile cache keys on it, so a hit skips lowering.
        """
        import hashlib

        network, h = self.network, hashlib.sha256()
        names: dict = {}  # str(dtype) is slow in NumPy, and a plan has few element types
        columns = network.columns
        for n in self.schedule:
            spec = columns.specs[n]
            dtype = names.get(spec.dtype) or names.setdefault(spec.dtype, str(spec.dtype))
            h.update(repr((n, columns.opcodes[n].name, columns.operands[n], tuple(columns.attributes[n]),
                           spec.shape, dtype)).encode())
            if columns.opcodes[n].name == "leaf":
                h.update(network.leaf_digest(n))
        roots, observes = self.declared()
        h.update(repr(([s.index for s in roots], [s.index for s in observes])).encode())
        return h.hexdigest()

    def _repr_html_(self) -> str:
        from topos.views.display import plan_card  # the Jupyter card, loaded only when a notebook asks

        return plan_card(self)

    # -- emission: the pipeline of topos.dialect (imported only when asked for) --------------------
    def declared(self) -> tuple[list, list]:
        """Roots and observes as a module returns them: declared order, each symbol once."""
        network, seen = self.network, set()
        roots: list = []
        observes: list = []
        for group, symbols in ((roots, self.entry.roots), (observes, self.entry.observes)):
            for s in symbols:
                if s.index not in seen:
                    seen.add(s.index)
                    group.append(network.symbol(s.index))
        return roots, observes

    def parameter_nodes(self) -> tuple[int, ...]:
        """The parameters this plan's entry reads, in node order: a compiled module's arguments, or its globals."""
        network = self.network
        return tuple(i for i in sorted(self.entry.closure()) if network.columns.opcodes[i].name == "parameter")

    def emit_mlir(self, debug_info: bool = True) -> str:
        """This plan as topos-dialect MLIR text: one op per scheduled node, results in declared order."""
        flag("emit_mlir", "debug_info", debug_info)  # "no" is truthy: it would print every location
        from topos.dialect.ir.bindings import require_compiler

        require_compiler("emitting a plan as MLIR")
        from topos.dialect.pipeline import emit_mlir

        return emit_mlir(self, debug_info)

    def folded_constants(self) -> dict[int, np.ndarray]:
        """The oracle's values of the reductions that read only leaves, which emission folds.

        A sum (or matmul, scatter, logsumexp, ...) whose inputs derive from
        constants alone, such as the seed of a gradient or a lifted number,
        is computed here with the reference kernels and emitted as a leaf:
        its bits are the oracle's, and IREE 3.13 sums a splat of constants
        wrongly (docs/reliability.md, iree-splat-reduction). A gather from a
        constant table whose elements all have the same bits is a constant
        too, whatever the selection (the cotangent of a scatter of a summed
        loss is one): every row it can pick is the same row. So is any value
        of constants holding a NaN or an infinity (``log`` of a negative
        constant, ``0 / 0``, an overflowing product): LLVM folds math of such
        values inside IREE's dispatches under no-NaN assumptions, and
        ``exp(log(-1))`` came out as a neighbouring element's value; as a
        leaf, the lowering fences it (docs/reliability.md, iree-folded-nonfinite).
        """
        network = self.network
        columns = network.columns
        values: dict[int, np.ndarray] = {}
        constant: dict[int, bool] = {}

        def value_of(n: int) -> np.ndarray:
            missing, stack = set(), [n]
            while stack:  # the constant ancestors not yet valued; a valued node stops the walk
                j = stack.pop()
                if j not in values and j not in missing:
                    missing.add(j)
                    stack.extend(columns.operands[j])
            with np.errstate(all="ignore"):
                evaluate_into(values, network, sorted(missing), {}, {})
            return values[n]

        for n in self.schedule:
            opcode, operands = columns.opcodes[n], columns.operands[n]
            if opcode.name == "gather" and constant.get(operands[0], False):
                table = value_of(operands[0])
                constant[n] = _same_bits(table)
                if constant[n]:
                    values[n] = splat(splat_element(table), columns.specs[n].shape)
            else:
                constant[n] = opcode.name == "leaf" or (
                    not opcode.is_source and all(constant.get(j, False) for j in operands))
        folded = {n: value_of(n) for n in self.schedule if constant[n] and columns.opcodes[n].name in _FOLDED}
        for n in self.schedule:  # constants that are not finite: IREE folds math of them wrongly
            if constant[n] and n not in folded and columns.opcodes[n].name != "leaf" and _float(network, n):
                value = value_of(n)
                if not _finite(value):
                    folded[n] = value
        return {n: folded[n] for n in self.schedule if n in folded}  # in schedule order

    def emit_stablehlo(self, debug_info: bool = False, kinds=None, convolution: str = "columns") -> str:
        """This plan lowered by the pipeline (topos.dialect.pipeline) to verified StableHLO text, no topos ops left.

        With ``debug_info`` every op keeps its location: the node and the
        user's recording line. ``kinds`` names the fusion kinds raised to
        StableHLO (``topos-elect{kinds=...}``); None raises the default
        ones (``topos.dialect.passes.plan_passes.ELECTED_BY_DEFAULT``, every kind).
        ``convolution`` spells the raised convolutions
        (``topos-raise{convolution=...}``): "columns", the im2col matrix in
        one ``dot_general`` (what ``compile`` runs), or "named",
        ``stablehlo.convolution``.
        """
        flag("emit_stablehlo", "debug_info", debug_info)  # "no" is truthy: it would keep every location
        from topos.dialect.ir.bindings import require_compiler

        require_compiler("lowering a plan to StableHLO")
        from topos.dialect.pipeline import stablehlo

        lowered = stablehlo(self, kinds=kinds, convolution=convolution)
        return lowered.located if debug_info else lowered.plain

    def export(self, directory, target: str = "llvm-cpu", **options):
        """Write a self-contained IREE artifact of this plan into ``directory`` -> its Path.

        ``module.vmfb`` (what ``iree-run-module`` loads), the portable and the
        located StableHLO, ``flags.txt``, ``manifest.json``, the oracle's test
        vectors and ``check.sh``; options: ``parameters``, ``feeds``, ``cpu``
        (default "generic"), ``force``, ``data_tiling`` (see
        topos.dialect.iree.export and docs/deploy.md).
        """
        from topos.dialect.ir.bindings import require_compiler

        require_compiler("exporting a plan")
        from topos.dialect.iree.export import export_plan

        return export_plan(self, directory, target, **options)

    def compile(self, target: str = "llvm-cpu", driver: str | None = None, **options):
        """Compile this plan with IREE for ``target`` -> CompiledPlan (see topos.dialect.iree.compiled)."""
        from topos.dialect.iree.compiled import compile_plan

        return compile_plan(self, target, driver, **options)


# Reductions of constants are computed on the host (see Plan.folded_constants).
_FOLDED = frozenset({"sum", "sum_along", "matmul", "scatter", "fold", "logsumexp", "log_softmax"})


def _float(network, n: int) -> bool:
    return is_element(network.columns.specs[n].dtype)


def _finite(array: np.ndarray) -> bool:
    """True when no element is a NaN or an infinity (one element read for a splat)."""
    probe = splat_element(array) if is_splat(array) else array
    with np.errstate(invalid="ignore"):
        return bool(np.isfinite(np.asarray(probe, dtype=np.float64)).all())


def _same_bits(array: np.ndarray) -> bool:
    """True when every element of a non-empty array has the bits of the first (-0.0 is not 0.0)."""
    if array.size == 0:
        return False
    if not any(array.strides):
        return True
    rows = np.ascontiguousarray(array).reshape(array.size, 1).view(np.uint8)
    return bool((rows == rows[0]).all())


class Kernels:
    """``kernel_of(n)``: node n's kernel under one posture, made once; ``numerics`` names the posture.

    A group's executor gets this to run recorded nodes as the plan would,
    and reads ``numerics`` where the posture picks its own path (a weight
    gradient walks the reference's order under EXACT and calls BLAS per
    kernel tap under FAST).
    """

    def __init__(self, network, numerics: Numerics):
        self.network, self.numerics = network, numerics
        self._made: dict[int, object] = {}

    def __call__(self, n: int):
        if n not in self._made:
            network = self.network
            columns = network.columns
            self._made[n] = kernel_for(columns.opcodes[n], dict(columns.attributes[n]), self.numerics, (network, n))
        return self._made[n]


def execute(network, steps: Sequence[int], readable, parameters, feeds, numerics,
            fusions=(), free_after=None, wanted=None, backward=None) -> Run:
    """Evaluate ``steps`` in order, running elected groups at their roots and freeing dead values."""
    bound_parameters = bind_parameters(network, parameters, wanted if wanted is not None else set(steps))
    bound_feeds = bind_feeds(network, feeds)
    roots = {g.root: g for g in fusions}
    kernel_of = Kernels(network, numerics)
    values: dict[int, np.ndarray] = {}
    with np.errstate(all="ignore"):  # IEEE inf/nan results are semantics, not accidents
        _run_steps(values, network, steps, roots, kernel_of, bound_parameters, bound_feeds, free_after)
    return Run(network, values, readable=readable, backward=backward)


def _run_steps(values, network, steps, roots, kernel_of, bound_parameters, bound_feeds, free_after):
    operands = network.columns.operands
    for n in steps:
        if network.columns.opcodes[n].is_source:
            values[n] = source_value(network, n, bound_parameters, bound_feeds)
        else:
            group = roots.get(n)
            if group is not None:
                out = pattern(group.kind).execute(group, values.__getitem__, network, kernel_of)
            else:
                out = kernel_of(n)(*(values[j] for j in operands[n]))
            out = np.asarray(out)
            out.flags.writeable = False
            values[n] = out
        if free_after is not None:
            for j in free_after.get(n, ()):
                del values[j]
