"""Drawings of every stage: the spec, its derivative, a plan, the MLIR modules, a bisect report.

``draw(subject)`` returns a :class:`Drawing`, whose ``dot`` is Graphviz's
DOT text, always available; ``svg()``, ``png()`` and ``save(path)`` run
Graphviz's ``dot`` program when it is installed. Every drawing is built
from the public readers of its subject (``network.nodes()``,
``plan.liveness()``, the MLIR text a plan emits), so what it shows is what
a user can read in text too. The DOT text is deterministic: the same
subject gives the same bytes, which is what lets ``docs/plate-1.dot``
prove that the committed Plate 1 is current.

Graphviz takes seconds on thousands of boxes and the result cannot be
read, so a subject larger than ``max_nodes`` is drawn as a summary (one
box per opcode and shade, with counts) and says so in its note.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from topos.base.element import short_name
from topos.base.errors import ToposError
from topos.base.files import write_atomically
from topos.readings.differentiate import Adjoints
from topos.readings.plan.entry import Entry
from topos.readings.plan.plan import Plan
from topos.readings.update import Updates
from topos.spec.network import Network, leaf_summary
from topos.spec.run import Run
from topos.spec.tape import Tape

MAX_NODES = 400  # above this a drawing is a summary: Graphviz slows down and nobody can read it
_QUICK_LAYOUT = 100  # above this Graphviz's layout passes are capped

# The three shades of Plate 1: the forward graph, the chain rule appended by differentiate, and
# the optimizer's update appended by sgd/optim.
SHADES = {"forward": "#ffffff", "derivative": "#ffe0b3", "update": "#d5ecd4"}
_BORDER = {"forward": "#404040", "derivative": "#b36b00", "update": "#3c7a3a"}
_GRAPH = 'graph [fontname="Helvetica", fontsize=10, rankdir=TB, nodesep=0.25, ranksep=0.3];'
_NODE = 'node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10, margin="0.08,0.04"];'
_EDGE = 'edge [color="#606060", arrowsize=0.6];'


class DrawingError(ToposError):
    """A drawing could not be rendered: Graphviz's ``dot`` is missing or refused the text."""


class Drawing:
    """One stage as DOT text; ``svg()``/``png()``/``save()`` render it with Graphviz."""

    def __init__(self, dot: str, title: str, note: str = "", nodes: int = 0):
        self.dot = dot
        self.title = title
        self.note = note  # why the drawing is a summary, or empty
        self.nodes = nodes  # boxes drawn

    def svg(self) -> str:
        return _render(self.dot, "svg").decode("utf-8")

    def png(self) -> bytes:
        return _render(self.dot, "png")

    def save(self, path) -> Path:
        """Write ``.dot``, ``.svg`` or ``.png`` by the path's suffix (atomically) and return the path."""
        if not isinstance(path, (str, os.PathLike)):
            raise DrawingError(f"save takes a path (str or pathlib.Path), got {type(path).__name__}")
        if "\0" in os.fsdecode(path):  # the system ends a path at a NUL, so Python refuses it (a ValueError)
            raise DrawingError(f"cannot save a drawing to {os.fsdecode(path)!r}: the path holds a NUL character "
                               "('\\x00'); remove it from the name")
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix == ".dot":
            data = self.dot.encode("utf-8")
        elif suffix == ".svg":
            data = self.svg().replace("<svg ", f"<!-- topos.draw dot-sha256: {self.digest()} -->\n<svg ", 1).encode()
        elif suffix == ".png":
            data = self.png()
        else:
            raise DrawingError(f"cannot save a drawing as {path.name!r}: name a .dot, .svg or .png file")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(path, data)
        except OSError as error:
            blocking = next((p for p in path.parents if p.is_file()), None)  # mkdir's "File exists" names no file
            why = (f"a file stands at {blocking}, where a folder should be" if blocking is not None
                   else error.strerror or error)
            raise DrawingError(f"cannot write the drawing to {path}: {why}") from None
        return path

    def digest(self) -> str:
        """sha256 of the DOT text: the SVGs we commit carry it, so a test can tell a stale picture."""
        return hashlib.sha256(self.dot.encode("utf-8")).hexdigest()

    def __str__(self) -> str:
        return self.dot

    def __repr__(self) -> str:
        note = f", {self.note}" if self.note else ""
        return f"<Drawing {self.title!r}: {self.nodes} boxes{note}>"

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = {"text/plain": repr(self)}
        if graphviz_available():
            bundle["image/svg+xml"] = self.svg()
        return bundle


def graphviz_available() -> bool:
    import shutil  # here, not when topos loads: only a drawing rendered with Graphviz needs it

    return shutil.which("dot") is not None


def save_stage(drawing: Drawing, folder, stem: str) -> list[Path]:
    """``stem.dot`` always, ``stem.svg`` too when Graphviz is installed: what the walkthrough writes."""
    written = [drawing.save(Path(folder) / f"{stem}.dot")]
    if graphviz_available():
        written.append(drawing.save(Path(folder) / f"{stem}.svg"))
    return written


def draw(subject, *, stage: str | None = None, adjoints=(), updates=(), network=None,
         max_nodes: int = MAX_NODES) -> Drawing:
    """A drawing of ``subject``.

    * a ``Network`` (or a ``Run``, or an open ``Tape``'s sealed network):
      one box per node; pass the ``adjoints`` that ``differentiate``
      returned and the ``updates`` of an optimizer to shade the nodes they
      appended;
    * a ``Plan`` or ``Entry``: schedule, liveness, fusion groups, the peak;
      ``stage="mlir"`` or ``"stablehlo"`` draws its emitted module instead,
      ``stage="network"`` its closure as a network;
    * a ``CompiledPlan``: its StableHLO (``stage="plan"`` for the plan);
    * MLIR text (topos dialect or StableHLO): one box per op, linked to
      its node by the op's location;
    * a ``BisectReport``: the checked nodes, the first divergent one
      highlighted with its error and its inputs.
    """
    if not isinstance(max_nodes, int) or isinstance(max_nodes, bool) or max_nodes < 1:
        raise DrawingError(f"max_nodes must be an int >= 1 (how many boxes before a summary), got {max_nodes!r}")
    _check_marks(adjoints, updates)
    plan_like = isinstance(subject, (Entry, Plan)) or (hasattr(subject, "plan") and hasattr(subject, "vmfb"))
    if stage is not None and not plan_like:
        raise DrawingError(f"stage={stage!r} applies to a Plan, an Entry or a CompiledPlan; a "
                           f"{type(subject).__name__} has one drawing: leave stage out")
    if network is not None and not _is_bisect_report(subject):
        raise DrawingError("network= names the network a BisectReport was made from; "
                           f"a {type(subject).__name__} carries its own: leave network out")
    if isinstance(subject, Entry):
        subject = subject.lower()
    if hasattr(subject, "plan") and hasattr(subject, "vmfb"):  # a CompiledPlan (MLIR side, not imported)
        subject = subject.plan
        stage = stage or "stablehlo"
    if isinstance(subject, Run):
        return network_drawing(subject.network, adjoints=adjoints, updates=updates, max_nodes=max_nodes,
                               run=subject, title="run")
    if isinstance(subject, Network):
        return network_drawing(subject, adjoints=adjoints, updates=updates, max_nodes=max_nodes)
    if isinstance(subject, Plan):
        stage = stage or "plan"
        if stage == "plan":
            return plan_drawing(subject, adjoints=adjoints, updates=updates, max_nodes=max_nodes)
        if stage == "network":
            return network_drawing(subject.network, adjoints=adjoints, updates=updates, max_nodes=max_nodes,
                                   only=subject.schedule)
        if stage == "mlir":
            return module_drawing(subject.emit_mlir(), max_nodes=max_nodes, title="topos MLIR module")
        if stage == "stablehlo":
            return module_drawing(subject.emit_stablehlo(debug_info=True), max_nodes=max_nodes,
                                  title="StableHLO module")
        raise DrawingError(f"stage={stage!r}: a plan draws as 'plan', 'network', 'mlir' or 'stablehlo'")
    if _is_bisect_report(subject):
        return bisect_drawing(subject, network=network, max_nodes=max_nodes)
    if isinstance(subject, str):
        return module_drawing(subject, max_nodes=max_nodes)
    if isinstance(subject, Tape):
        raise DrawingError("topos.draw draws a sealed spec, and this tape is still open: draw the Network "
                           "that Tape.record (or tape.seal()) returns")
    raise DrawingError(
        f"topos.draw cannot draw a {type(subject).__name__}: give a Network, Run, Entry, Plan, "
        "CompiledPlan, BisectReport or MLIR text")


# ---- the spec ---------------------------------------------------------------------------------


def shades(network, adjoints=(), updates=()) -> dict[int, str]:
    """Each node's shade: ``forward``, ``derivative`` (appended by differentiate) or ``update``.

    Read off the closures, not off recording order: the derivative is what
    the gradients need beyond the target's closure; the update is what the
    next values need beyond both. Nothing is recorded on the spec for this.
    """
    operands = [node.operands for node in network.nodes()]

    def closure(symbols) -> set[int]:
        seen: set[int] = set()
        stack = [_index(s) for s in symbols]
        while stack:
            i = stack.pop()
            if i not in seen:
                seen.add(i)
                stack.extend(j.index for j in operands[i])
        return seen

    adjoint_list = _as_list(adjoints)
    update_list = _as_list(updates)
    for marks in (*adjoint_list, *update_list):
        symbols = [marks.target, *marks.gradients] if hasattr(marks, "gradients") else [
            s for pair in marks.pairs() for s in pair]
        beyond = [_index(s) for s in symbols if _index(s) >= len(operands)]
        if beyond:  # marks of another recording are read by node index: the same spec shades the same
            raise DrawingError(f"these {type(marks).__name__} name node %{beyond[0]}, but the network drawn has "
                               f"{len(operands)} nodes: pass the ones recorded with it")
    targets = closure([a.target for a in adjoint_list])
    gradients = closure([g for a in adjoint_list for g in a.gradients]) - targets
    nexts = closure([new for u in update_list for _, new in u.pairs()]) - targets - gradients
    shade = {i: "forward" for i in range(len(operands))}
    shade.update({i: "derivative" for i in gradients})
    shade.update({i: "update" for i in nexts})
    return shade


def network_drawing(network, *, adjoints=(), updates=(), max_nodes: int = MAX_NODES,
                    only: Iterable[int] | None = None, title: str = "network", run=None) -> Drawing:
    """One box per node (index, opcode, attributes or name, shape); with a ``run``, its values too."""
    nodes = network.nodes()
    if run is not None and only is None:
        only = [node.index for node in nodes if node.symbol in run]
    shown = sorted(only) if only is not None else list(range(len(nodes)))
    shade = shades(network, adjoints, updates)
    if len(shown) > max_nodes:
        return _summary(title, [(nodes[i].opcode.name, shade[i]) for i in shown], max_nodes)
    lines = _header(title, len(shown))
    keep = set(shown)
    for i in shown:
        node = nodes[i]
        label = _node_label(node, network)
        if run is not None:
            label.append(_value_summary(run[node.symbol]))
        lines.append(_box(f"n{i}", label, shade[i], tooltip=_site(node.site)))
    for i in shown:
        lines.extend(f"  n{j.index} -> n{i};" for j in nodes[i].operands if j.index in keep)
    present = sorted({shade[i] for i in shown}, key=list(SHADES).index)
    if len(present) > 1:
        lines.append(_legend(present))
    lines.append("}")
    return Drawing("\n".join(lines) + "\n", title, nodes=len(shown))


def _node_label(node, network=None) -> list[str]:
    head = f"%{node.index} {node.opcode.name}"
    attributes = _attributes(node.attributes)
    if node.opcode.name == "leaf" and network is not None:
        attributes = leaf_summary(network.payload(node.symbol))
    if node.name is not None:
        head += f"  {node.name}"
    elif attributes:
        head += f"  {attributes}"
    if node.role:
        head += f" ({node.role})"
    return [head, f"{list(node.shape)} {short_name(node.dtype)}"]


def _value_summary(array) -> str:
    """A run's value in a box: every element when there are at most four, else its range."""
    import numpy as np

    values = np.asarray(array)
    if values.dtype.kind in "iu":
        flat = values.reshape(-1)
        return "= " + _short_list(flat.tolist()) if flat.size <= 4 else f"indices {flat.min()}..{flat.max()}"
    flat = values.astype(np.float64).reshape(-1)
    if flat.size <= 4:
        return "= " + _short_list([float(f"{v:.4g}") for v in flat])
    return f"min {flat.min():.4g}  max {flat.max():.4g}"


def _short_list(values) -> str:
    return "[" + ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values) + "]"


def _attributes(attributes) -> str:
    parts = []
    for key, value in attributes.items():
        text = "[" + ", ".join(map(str, value)) + "]" if isinstance(value, tuple) else str(value)
        parts.append(text if key == "function" else f"{key}={text}")
    text = " ".join(parts)
    return text if len(text) <= 40 else text[:37] + "..."


# ---- a plan -----------------------------------------------------------------------------------


def plan_drawing(plan, *, adjoints=(), updates=(), max_nodes: int = MAX_NODES) -> Drawing:
    """Schedule order, each node's liveness, elected fusion groups as clusters, the peak node marked."""
    network = plan.network
    nodes = network.nodes()
    schedule = plan.schedule
    shade = shades(network, adjoints, updates)
    if len(schedule) > max_nodes:
        return _summary("plan", [(nodes[i].opcode.name, shade[i]) for i in schedule], max_nodes)
    liveness = plan.liveness()
    peak, at = plan.peak()
    order = {n: k for k, n in enumerate(schedule)}
    group_of = {n: k for k, g in enumerate(plan.fusions()) for n in g.nodes}
    lines = _header("plan", len(schedule))
    boxes = {}
    for n in schedule:
        node = nodes[n]
        head, kind = _node_label(node, network)
        label = [f"{order[n]}. {head}", kind, liveness[n]]
        extra = ""
        if n == at:
            label.append(f"peak: {_bytes(peak)} live")
            extra = ', penwidth=2.5, color="#c0392b"'
        boxes[n] = _box(f"n{n}", label, shade[n], tooltip=_site(node.site), extra=extra)
    for k, group in enumerate(plan.fusions()):
        lines.append(f"  subgraph cluster_g{k} {{")
        lines.append(f'    label="{_escape(f"G{k}: {group.kind} of {len(group.nodes)} nodes")}"; '
                     'style="dashed,rounded"; color="#2e6da4"; fontcolor="#2e6da4";')
        lines.extend("  " + boxes[n] for n in group.nodes if n in boxes)
        lines.append("  }")
    lines.extend(boxes[n] for n in schedule if n not in group_of)
    wanted = set(schedule)
    for n in schedule:
        lines.extend(f"  n{j.index} -> n{n};" for j in nodes[n].operands if j.index in wanted)
    retain = plan.retain_all_bytes()
    caption = (f"{len(schedule)} of {len(nodes)} nodes scheduled, {plan.numerics.value}; "
               f"peak {_bytes(peak)} at %{at}, retain-all {_bytes(retain)}")
    lines.append(f'  label="{_escape(caption)}"; labelloc=b;')
    lines.append("}")
    return Drawing("\n".join(lines) + "\n", "plan", nodes=len(schedule))


def plot_live_bytes(plan, ax=None):
    """The plan's live bytes after each executed step, as a matplotlib Figure (needs matplotlib).

    ``plan`` is a Plan, or an Entry (lowered here).

    Built without pyplot, so nothing global changes and a notebook shows
    the figure once (as the cell's value); pass ``ax`` to draw into axes
    of your own instead.
    """
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise DrawingError("plot_live_bytes needs matplotlib: pip install 'topos[examples]' "
                           "(or pip install matplotlib)") from None
    if isinstance(plan, Entry):
        plan = plan.lower()
    if not isinstance(plan, Plan):
        raise DrawingError(f"plot_live_bytes takes a Plan (entry.lower()) or an Entry, got {type(plan).__name__}")
    series = plan.live_series()
    if ax is None:
        ax = Figure(figsize=(6, 2.6), layout="constrained").subplots()
    ax.step(range(len(series)), [live for _, live in series], where="post", color="#2e6da4")
    peak, at = plan.peak()
    if series:
        where = [n for n, _ in series].index(at)
        ax.plot([where], [peak], "o", color="#c0392b")
        ax.annotate(f"peak {_bytes(peak)} at step {where} (%{at})", (where, peak), textcoords="offset points",
                    xytext=(6, -12), fontsize=8)
    ax.axhline(plan.retain_all_bytes(), color="#999999", linestyle=":", linewidth=1)
    ax.set_xlabel("executed step (a fusion group is one step)")
    ax.set_ylabel("live bytes")
    ax.set_title("live bytes (dotted: retain-all)", fontsize=9)
    return ax.figure


# ---- MLIR modules -----------------------------------------------------------------------------

_NODE_LOCATION = re.compile(r'"%(\d+) (\w+[^"]*)"')  # "%2 matmul", "%0 parameter w"
_FILE_LOCATION = re.compile(r'"([^"]+)":(\d+):\d+')


def module_drawing(text: str, *, max_nodes: int = MAX_NODES, title: str | None = None) -> Drawing:
    """One box per op of the module's ``main`` function, operands as edges, each op named by its node."""
    from topos.dialect.ir.context import new_context

    try:
        from iree.compiler import ir
    except ImportError:  # pragma: no cover - the mlir extra is missing
        raise DrawingError("drawing MLIR needs the mlir extra: pip install 'topos[mlir]'") from None
    with new_context():
        try:
            module = ir.Module.parse(text)
        except Exception as error:  # the bindings raise MLIRError with the diagnostics
            raise DrawingError(f"topos.draw could not parse the MLIR text: {error}") from None
        functions = [op for op in module.body.operations if op.operation.name == "func.func"]
        if not functions:
            raise DrawingError("topos.draw found no func.func in the MLIR module")
        main = next((f for f in functions if ir.StringAttr(f.attributes["sym_name"]).value == "main"),
                    functions[0])
        block = main.regions[0].blocks[0]
        rows = _module_rows(block)
    dialects = {name.split(".")[0] for _, name, *_ in rows if "." in name}
    if title is None:
        title = ("topos MLIR module" if "topos" in dialects else
                 "StableHLO module" if "stablehlo" in dialects else "MLIR module")
    if len(rows) > max_nodes:
        return _summary(title, [(name, "forward") for _, name, *_ in rows], max_nodes)
    lines = _header(title, len(rows))
    for key, name, types, location, _ in rows:
        node = _NODE_LOCATION.search(location)
        label = [name, types]
        if node is not None:
            label.append(f"node %{node.group(1)} {node.group(2)}")
        site = _FILE_LOCATION.search(location)
        tooltip = f"{_relative(site.group(1))}:{site.group(2)}" if site else ""
        colour = "#eef4fb" if name.startswith(("stablehlo.", "chlo.")) else (
            "#f3f3f3" if name in ("argument", "func.return") else "#ffffff")
        lines.append(_box(key, label, colour, tooltip=tooltip, raw_fill=True))
    for key, _, _, _, operands in rows:
        lines.extend(f"  {source} -> {key};" for source in operands)
    lines.append("}")
    return Drawing("\n".join(lines) + "\n", title, nodes=len(rows))


def _module_rows(block) -> list[tuple[str, str, str, str, list[str]]]:
    """(key, op name, result types, location, operand keys) for the block's arguments and ops."""
    rows: list[tuple[str, str, str, str, list[str]]] = []
    key_of: dict[tuple[str, int], str] = {}
    for k, argument in enumerate(block.arguments):
        key_of[("arg", k)] = f"a{k}"
        rows.append((f"a{k}", "argument", f"%arg{k}: {_type(argument.type)}", str(argument.location), []))
    for k, op in enumerate(block.operations):
        op = op.operation
        operands = []
        for value in op.operands:
            owner = value.owner
            if hasattr(owner, "arguments") and not hasattr(owner, "name"):  # a block argument
                operands.append(key_of[("arg", _argument_position(block, value))])
            else:
                operands.append(key_of.get(("op", _op_key(owner)), ""))
        key_of[("op", _op_key(op))] = f"o{k}"
        name = op.name
        inner = sorted({inner.operation.name for region in op.regions for b in region.blocks
                        for inner in b.operations} - {"stablehlo.return"})
        if inner:
            name += " { " + ", ".join(inner) + " }"
        types = ", ".join(_type(r.type) for r in op.results) or "-"
        rows.append((f"o{k}", name, types, str(op.location), [o for o in operands if o]))
    return rows


def _argument_position(block, value) -> int:
    for k, argument in enumerate(block.arguments):
        if argument == value:
            return k
    raise DrawingError("an operand is an argument of another block")  # pragma: no cover


def _op_key(op) -> int:
    return hash(op.operation if hasattr(op, "operation") else op)


def _type(t) -> str:
    return str(t).replace("tensor<", "<")


# ---- a bisect report --------------------------------------------------------------------------


def _is_bisect_report(subject) -> bool:
    """A topos.views.bisect.BisectReport, known by its fields: bisect draws with this module, not the reverse."""
    return all(hasattr(subject, name) for name in ("target", "checks", "first", "roots"))


def bisect_drawing(report, *, network=None, max_nodes: int = MAX_NODES) -> Drawing:
    """The checked nodes: within the envelope pale, outside orange, the first divergence red with its inputs."""
    network = _report_network(report, network)
    nodes = network.nodes()
    checked = {c.index: c for c in report.checks}
    first = report.first
    inputs = {o.index: o for o in first.operands} if first is not None else {}
    shown = sorted(set(checked) | set(inputs) | {j.index for c in checked for j in nodes[c].operands})
    if len(shown) > max_nodes:
        return _summary("bisect", [(nodes[i].opcode.name, "forward") for i in shown], max_nodes)
    title = "bisect: no divergence" if first is None else f"bisect: divergence at %{first.index}"
    lines = _header(title, len(shown))
    for i in shown:
        node = nodes[i]
        label = _node_label(node, network)
        check = checked.get(i)
        extra, colour = "", "#f3f3f3"  # a source, or a node outside the check
        if first is not None and i == first.index:
            label += [f"local: {first.local_detail}", f"envelope: {first.envelope}",
                      f"recorded at {_site(first.site)}"]
            colour, extra = "#f5b7b1", ', penwidth=2.5, color="#c0392b"'
        elif check is not None and not check.local_ok:
            label.append(f"outside: {check.local_detail}")
            colour = "#fad7a0"
        elif check is not None:
            colour = "#e8f6e8"
        if i in inputs:
            operand = inputs[i]
            span = "all NaN" if operand.minimum is None else f"min {operand.minimum:.4g} max {operand.maximum:.4g}"
            label.append(f"input: {span}" + (" NaN" if operand.has_nan else "") + (" inf" if operand.has_inf else ""))
            extra = extra or ', penwidth=2, color="#d4ac0d"'
        lines.append(_box(f"n{i}", label, colour, tooltip=_site(node.site), extra=extra, raw_fill=True))
    keep = set(shown)
    for i in shown:
        lines.extend(f"  n{j.index} -> n{i};" for j in nodes[i].operands if j.index in keep)
    lines.append(f'  label="{_escape(f"{report.summary()}")}"; labelloc=b;')
    lines.append("}")
    return Drawing("\n".join(lines) + "\n", title, nodes=len(shown))


def _report_network(report, network):
    """The network to draw ``report`` on: its own, or ``network`` when that is the one it was made from.

    Nodes are drawn by the report's indices, so another network would be drawn with the report's
    verdicts on its own nodes (or fail on an index it lacks).
    """
    if network is None:
        if report.network is None:
            raise DrawingError("this BisectReport carries no network: pass network= to topos.draw")
        return report.network
    if not isinstance(network, Network):
        raise DrawingError(f"network= takes the Network the BisectReport was made from, got "
                           f"{type(network).__name__}")
    nodes = network.nodes()
    checked = {c.index for c in report.checks}
    operands = {o.index: o.opcode for o in report.first.operands} if report.first is not None else {}
    beyond = max(checked | set(operands), default=-1)
    # The networks of one family are prefixes of one recording (each length is reopened at most
    # once), so one of the report's family that holds every index it names holds the nodes it checked.
    if report.network is not None and network.family is not report.network.family:
        mismatch = "it belongs to another recording"
    elif beyond >= len(nodes):
        mismatch = f"it has {len(nodes)} nodes and the report names %{beyond}"
    elif any(nodes[i].is_source for i in checked) or any(nodes[i].opcode.name != opcode
                                                          for i, opcode in operands.items()):
        mismatch = "the nodes at the report's indices are not the ones bisect checked"  # a report without its network
    else:
        return network
    raise DrawingError(f"network= is not the network this BisectReport was made from: {mismatch}; leave network= "
                       "out (a report from bisect carries its own), or pass the network of the entry bisect checked")


# ---- DOT text ---------------------------------------------------------------------------------


def _header(title: str, boxes: int = 0) -> list[str]:
    lines = [f'digraph "{_escape(title)}" {{', "  " + _GRAPH, "  " + _NODE, "  " + _EDGE]
    if boxes > _QUICK_LAYOUT:
        # Graphviz's network simplex passes grow much faster than the graph: a 546-node GPT step
        # took over 120 s with the defaults and 8 s with these limits (benchmarks/drawing.py).
        lines.append("  graph [nslimit=2, nslimit1=2, mclimit=0.5];")
    return lines


def _box(key: str, label: Sequence[str], shade: str, *, tooltip: str = "", extra: str = "",
         raw_fill: bool = False) -> str:
    fill = shade if raw_fill else SHADES[shade]
    border = "" if raw_fill else f', color="{_BORDER[shade]}"'
    text = "\\n".join(_escape(line) for line in label)
    tip = f', tooltip="{_escape(tooltip)}"' if tooltip else ""
    return f'  {key} [label="{text}", fillcolor="{fill}"{border}{tip}{extra}];'


def _legend(present: Sequence[str]) -> str:
    said = {"forward": "forward graph", "derivative": "appended by differentiate",
            "update": "appended by the optimizer"}
    boxes = " ".join(
        f'legend_{s} [label="{said[s]}", fillcolor="{SHADES[s]}", color="{_BORDER[s]}"];' for s in present)
    chain = " -> ".join(f"legend_{s}" for s in present)
    return f'  subgraph cluster_legend {{ label=""; style=invis; {boxes} {chain} [style=invis]; }}'


def _summary(title: str, rows: Sequence[tuple[str, str]], max_nodes: int) -> Drawing:
    note = (f"{len(rows)} boxes is more than max_nodes={max_nodes}: drawn as a summary by opcode "
            f"(pass max_nodes={len(rows)} to draw every one, or draw a smaller entry)")
    counts = Counter(rows)
    lines = _header(title + " (summary)")
    for k, ((name, shade), count) in enumerate(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))):
        lines.append(_box(f"s{k}", [f"{name} x {count}"], shade if shade in SHADES else "forward"))
    lines.append(f'  label="{_escape(note)}"; labelloc=t;')
    lines.append("}")
    return Drawing("\n".join(lines) + "\n", title, note=note, nodes=len(counts))


def _escape(text: str) -> str:
    """A user's string inside a double-quoted DOT id: backslashes, quotes and newlines escaped."""
    return str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _site(site) -> str:
    return f"{_relative(site.file)}:{site.line} in {site.function}"


def _relative(path: str) -> str:
    """Paths under the working directory print relative, so a drawing does not depend on the checkout."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return path
    return path if relative.startswith("..") else relative


def _bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    return f"{n / 1024:.1f} KiB" if n < 1024 ** 2 else f"{n / 1024 ** 2:.1f} MiB"


def _check_marks(adjoints, updates) -> None:
    """``adjoints`` are what differentiate/vjp returned, ``updates`` an optimizer's Updates (one or a list)."""
    for role, items, kind, source in (("adjoints", adjoints, Adjoints, "tape.differentiate (or vjp) returned"),
                                      ("updates", updates, Updates, "an optimizer's record (or topos.sgd) returned")):
        for item in _as_list(items):
            if not isinstance(item, kind):
                raise DrawingError(f"{role}= takes what {source}, one or a list; got {type(item).__name__}")


def _index(symbol) -> int:
    return symbol.index if hasattr(symbol, "index") else symbol.symbol.index


def _as_list(x) -> list:
    if x is None:
        return []
    if isinstance(x, (list, tuple)):
        return list(x)
    return [x]


def _render(dot_text: str, fmt: str) -> bytes:
    import shutil
    import subprocess

    program = shutil.which("dot")
    if program is None:
        raise DrawingError(
            "rendering a drawing needs Graphviz's dot program, which is not on PATH: install it with "
            "'apt install graphviz' (Debian/Ubuntu), 'brew install graphviz' (macOS) or "
            "'conda install graphviz'; the DOT text is available without it as drawing.dot")
    try:
        done = subprocess.run([program, f"-T{fmt}"], input=dot_text.encode("utf-8"), capture_output=True,
                              timeout=120, check=False)
    except subprocess.TimeoutExpired:
        raise DrawingError("Graphviz took more than 120 s on this drawing; draw with a smaller "
                           "max_nodes to get a summary") from None
    if done.returncode != 0:
        raise DrawingError(f"Graphviz refused the drawing: {done.stderr.decode('utf-8', 'replace').strip()}")
    return done.stdout


__all__ = ["MAX_NODES", "SHADES", "Drawing", "DrawingError", "draw", "graphviz_available", "plot_live_bytes",
           "save_stage", "shades"]
