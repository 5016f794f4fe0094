"""Jupyter cards: the HTML an object shows when it ends a notebook cell (its ``_repr_html_``).

Each card is a title, the facts a learner needs first (shapes, counts,
bytes, names, the numerics posture) and, where there is a graph, its
drawing as inline SVG. Every card is built from the public readers of its
subject, with ``card`` and the helpers below; every string that reaches the
HTML goes through ``html.escape`` here, because names, module paths and
recording sites are the user's own text. The HTML is inline-styled, with
explicit text and background colours so it reads in light and dark
themes, and carries no JavaScript.

A card never raises: a drawing that fails says why in a line, and a card
that fails says so in its place. A graph of more than ``SVG_MAX_BOXES``
boxes is not drawn (Graphviz would take seconds on it): the card says
how to draw it instead.
"""

from __future__ import annotations

import functools
import html
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from topos.base.element import short_name
from topos.spec.network import plural
from topos.views.drawing import Drawing, draw, graphviz_available

SVG_MAX_BOXES = 120  # above this a card shows how to draw the graph instead of drawing it
ROWS = 16  # rows a table shows before it says how many more there are

_INK, _PAPER, _QUIET = "#1b1b1b", "#fcfcfc", "#5a5a5a"
_CARD = (f"font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;font-size:13px;line-height:1.45;"
         f"color:{_INK};background:{_PAPER};border:1px solid #c8c8c8;border-radius:6px;"
         "padding:8px 12px;margin:4px 0;max-width:100%;overflow-x:auto")
_TITLE = f"font-weight:600;font-size:14px;margin:0 0 4px 0;color:{_INK};background:{_PAPER}"
_CELL = (f"text-align:left;vertical-align:top;padding:1px 12px 1px 0;color:{_INK};background:{_PAPER};"
         "border:none;font-weight:normal")
_LABEL = _CELL + f";color:{_QUIET}"
_TABLE = f"border-collapse:collapse;margin:2px 0;color:{_INK};background:{_PAPER};border:none"
_PRE = (f"font-family:Menlo,Consolas,'DejaVu Sans Mono',monospace;font-size:12px;color:{_INK};"
        "background:#eeeeee;padding:4px 6px;margin:4px 0;white-space:pre;overflow-x:auto;border-radius:4px")
_LINE = f"color:{_QUIET};background:{_PAPER};font-style:italic;margin:4px 0 0 0"
_GRAPHVIZ_MISSING = ("no drawing: Graphviz's dot program is not on PATH; install it with 'apt install graphviz' "
                     "(or 'brew install graphviz', 'conda install graphviz'); topos.draw(...).dot has the DOT text")


# ---- the scaffolding every card shares --------------------------------------------------------


def card(title: str, facts: Iterable[tuple[str, str]] = (), *parts: str) -> str:
    """One card: an escaped title, a table of escaped (label, value) facts, then ``parts``.

    ``parts`` are HTML made by the helpers below (``table``, ``pre``,
    ``folded``, ``line``, ``figure``), which escape their own text.
    """
    rows = "".join(f'<tr><th style="{_LABEL}">{_text(label)}</th><td style="{_CELL}">{_text(value)}</td></tr>'
                   for label, value in facts)
    body = f'<table style="{_TABLE}">{rows}</table>' if rows else ""
    return f'<div style="{_CARD}"><div style="{_TITLE}">{_text(title)}</div>{body}{"".join(parts)}</div>'


def table(header: Sequence[str], rows: Sequence[Sequence[str]], what: str = "rows") -> str:
    """A table of escaped cells; beyond ``ROWS`` rows it says how many more there are."""
    head = "".join(f'<th style="{_LABEL}">{_text(h)}</th>' for h in header)
    body = "".join("<tr>" + "".join(f'<td style="{_CELL}">{_text(c)}</td>' for c in row) + "</tr>"
                   for row in rows[:ROWS])
    more = line(f"... and {len(rows) - ROWS} more {what}") if len(rows) > ROWS else ""
    return f'<table style="{_TABLE}"><tr>{head}</tr>{body}</table>{more}'


def pre(text: str) -> str:
    return f'<pre style="{_PRE}">{_text(text)}</pre>'


def folded(summary: str, inner: str) -> str:
    """``inner`` (HTML) behind a summary line the reader clicks to open (``<details>``, no script)."""
    return (f'<details style="margin:4px 0;color:{_INK};background:{_PAPER}">'
            f'<summary style="cursor:pointer;color:{_INK}">{_text(summary)}</summary>{inner}</details>')


def line(text: str) -> str:
    return f'<div style="{_LINE}">{_text(text)}</div>'


def figure(make: Callable[[int], Drawing], boxes: int, call: str) -> str:
    """The drawing ``make(max_nodes)`` returns, as inline SVG, or a line saying why there is none.

    ``boxes`` is how many boxes the drawing would have: above
    ``SVG_MAX_BOXES`` nothing is drawn, so a card of a large graph stays fast.
    """
    later = f"{boxes} nodes: call {call} to draw"
    if boxes > SVG_MAX_BOXES:
        return line(later)
    if not graphviz_available():
        return line(_GRAPHVIZ_MISSING)
    try:
        drawing = make(SVG_MAX_BOXES)
        if drawing.note:  # more boxes than counted: draw would give a summary
            return line(f"{drawing.note}; call {call} to draw")
        svg = drawing.svg()
    except Exception as error:  # a card never raises: the reason is the card's last line
        return line(f"no drawing: {error}")
    start = svg.find("<svg")  # drop the XML prolog and doctype: the SVG goes inside HTML
    if start < 0:
        return line("no drawing: Graphviz returned no SVG")
    svg = svg[start:].replace("<svg ", '<svg style="max-width:100%;height:auto" ', 1)
    return f'<div style="margin-top:6px;background:#ffffff;overflow:auto;max-height:640px">{svg}</div>'


def _never_raises(build: Callable[..., str]) -> Callable[..., str]:
    """A card builder that, should it fail, returns a card naming the failure instead."""

    @functools.wraps(build)
    def safe(subject, *args) -> str:
        try:
            return build(subject, *args)
        except Exception as error:
            return card(type(subject).__name__, [("display failed", f"{type(error).__name__}: {error}")],
                        line("the object is fine; only its card could not be built (print it instead)"))

    return safe


def _text(value) -> str:
    return html.escape(str(value), quote=True)


# ---- what cards say about shapes and sizes ----------------------------------------------------


def _spec(shape, dtype) -> str:
    return f"{list(shape)} {short_name(dtype)}"


def _nbytes(shape, dtype) -> int:
    itemsize = dtype.itemsize if isinstance(dtype, np.dtype) else 8  # a selection holds int64 indices
    return math.prod(shape) * itemsize


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def _by_kind(nodes) -> str:
    """``parameter 1, input 1, leaf 2, tanh 1``: sources first, then opcodes by count."""
    counts = Counter(node.opcode.name for node in nodes)
    sources = [k for k in ("parameter", "input", "leaf") if k in counts]
    others = sorted((k for k in counts if k not in sources), key=lambda k: (-counts[k], k))
    return ", ".join(f"{k} {counts[k]}" for k in sources + others)


def _slots(values) -> str:
    """Count, elements and bytes of (shape, dtype) pairs: ``2 (6 elements, 24 B)``."""
    pairs = list(values)
    elements = sum(math.prod(shape) for shape, _ in pairs)
    total = sum(_nbytes(shape, dtype) for shape, dtype in pairs)
    return f"{len(pairs)} ({elements:,} elements, {_bytes(total)})"


def _value(array) -> str:
    """A value at a glance: every element when there are at most four, else its range."""
    values = np.asarray(array)
    if values.dtype.kind in "iu":
        flat = values.reshape(-1)
        return str(flat.tolist()) if flat.size <= 4 else f"indices {flat.min()}..{flat.max()}"
    flat = values.astype(np.float64).reshape(-1)
    if values.ndim == 0:
        return f"{float(flat[0]):.6g}"
    if flat.size <= 4:
        return "[" + ", ".join(f"{v:.6g}" for v in flat) + "]"
    finite = flat[np.isfinite(flat)]
    span = f"min {finite.min():.4g}, max {finite.max():.4g}" if finite.size else "no finite element"
    return span + (", has NaN" if np.isnan(flat).any() else "") + (", has inf" if np.isinf(flat).any() else "")


def _node_row(node) -> list[str]:
    return [f"%{node.index}", node.opcode.name, node.name or "", _spec(node.shape, node.dtype)]


def _ref(x) -> str:
    """A Node, a Value (open tape) or a Symbol (detached) as text: ``%3 parameter w [2, 2] f32``, ``%3``."""
    symbol = x.symbol if hasattr(x, "symbol") else x
    if not hasattr(x, "shape"):
        return repr(symbol)
    words = [repr(symbol), getattr(getattr(x, "opcode", None), "name", ""), getattr(x, "name", None) or ""]
    return " ".join([w for w in words if w] + [_spec(x.shape, x.dtype)])


def _symbols(xs) -> str:
    shown = ", ".join(_ref(x) for x in xs[:8])
    return (shown + (f", ... {len(xs) - 8} more" if len(xs) > 8 else "")) or "none"


# ---- the cards --------------------------------------------------------------------------------


@_never_raises
def tape_card(tape) -> str:
    """The node count, the describe summary and the last lines recorded."""
    lines = tape.describe().splitlines()
    if tape.sealed:
        return card("Tape (sealed)", [("nodes", str(len(tape))), ("recorded", lines[-1])],
                    line("this tape is sealed: display the Network that seal() returned"))
    last = lines[-7:-1]
    facts = [("nodes", str(len(tape))), ("recorded", lines[-1])]
    return card("Tape (open, recording)", facts,
                pre("\n".join(last)) if last else line("nothing recorded yet"),
                line(f"the last {len(last)} of {len(lines) - 1} nodes; tape.describe() prints every one"))


@_never_raises
def network_card(network) -> str:
    """Nodes by kind, parameters and inputs with names and shapes, the sinks, and the drawing."""
    nodes = network.nodes()
    slots = [n for n in nodes if n.opcode.name == "parameter"]
    inputs = [n for n in nodes if n.opcode.name == "input"]
    trainable = sum(n.trainable for n in slots)
    sinks = [n for n, readers in zip(nodes, network.consumers()) if not readers]
    facts = [
        ("nodes", f"{len(nodes)}: {_by_kind(nodes)}"),
        ("parameters", f"{_slots((n.shape, n.dtype) for n in slots)}: {trainable} trainable, "
                       f"{len(slots) - trainable} state"),
        ("inputs", _slots((n.shape, n.dtype) for n in inputs)),
        ("sinks", ", ".join(f"%{n.index} {n.opcode.name} {_spec(n.shape, n.dtype)}" for n in sinks[:6])
         + (f", ... {len(sinks) - 6} more" if len(sinks) > 6 else "")),
    ]
    sources = [[f"%{n.index}", n.name or "", f"{n.role} {n.opcode.name}".strip(), _spec(n.shape, n.dtype)]
               for n in slots + inputs]
    parts = [table(["node", "name", "kind", "shape"], sources, "sources")] if sources else []
    parts.append(figure(lambda m: draw(network, max_nodes=m), len(nodes), "topos.draw(network)"))
    return card("Network", facts, *parts)


@_never_raises
def node_card(node) -> str:
    """Its describe line, shape, name, operands, attributes and recording site."""
    facts = [("shape", _spec(node.shape, node.dtype))]
    if node.name is not None:
        facts.append(("name", node.name))
    if node.role:
        facts.append(("role", node.role))
    facts.append(("operands", ", ".join(f"%{s.index}" for s in node.operands) or "none (a source)"))
    if node.attributes:
        facts.append(("attributes", ", ".join(f"{k}={v}" for k, v in node.attributes.items())))
    facts.append(("recorded at", str(node.site)))
    return card(f"Node %{node.index} {node.opcode.name}", facts, pre(str(node)))


@_never_raises
def value_card(value) -> str:
    """A recorded value: its describe line, shape, name and kind, and what to do with it next."""
    tape = value.tape
    index = value.symbol.index
    facts = [("shape", _spec(value.shape, value.dtype))]
    if value.name is not None:
        facts.append(("name", value.name))
    if value.trainable:
        facts.append(("kind", "trainable parameter"))
    facts.append(("tape", f"{'sealed' if tape.sealed else 'open'}, {len(tape)} nodes"))
    return card(repr(value), facts, pre(tape.describe().splitlines()[index]),
                line("return it from the recording function: Tape.record hands back its Symbol, which reads "
                     "runs (run[symbol]) and names its Node (network.node(symbol))"))


@_never_raises
def run_card(run) -> str:
    """What the run can be read for, its results' values, and the drawing of them."""
    network = run.network
    nodes = network.nodes()
    readable = [n for n in nodes if n.symbol in run]
    everything = len(readable) == len(nodes)
    if everything:  # an oracle run of the whole spec: its results are the nodes nobody reads
        readers = network.consumers()
        shown = [n for n in readable if not readers[n.index]]
    else:
        shown = readable
    facts = [("readable", f"{len(readable)} of {len(nodes)} nodes" + (" (every node)" if everything else "")),
             ("values", _slots((n.shape, n.dtype) for n in readable))]
    rows = [[*_node_row(n), _value(run[n.symbol])] for n in shown]
    title = "results (nodes no other node reads)" if everything else "declared results"
    return card("Run", facts, line(title), table(["node", "opcode", "name", "shape", "value"], rows, "results"),
                figure(lambda m: draw(run, max_nodes=m), len(readable), "topos.draw(run)"))


@_never_raises
def parameters_card(parameters) -> str:
    """Slots (trainable and state), elements, bytes, element types, and each slot's name and shape."""
    rows: list[list[str]] = []
    specs: list[tuple] = []
    trainable = 0
    for (symbol, array), name in zip(parameters.items(), parameters.names()):
        kind = "trainable" if parameters.trainable(symbol) else "state"
        trainable += kind == "trainable"
        specs.append((array.shape, array.dtype))
        rows.append([name, kind, _spec(array.shape, array.dtype), _value(array) if len(rows) < ROWS else ""])
    types = Counter(short_name(d) for _, d in specs)
    facts = [("slots", f"{_slots(specs)}: {trainable} trainable, {len(specs) - trainable} state"),
             ("element types", ", ".join(f"{t} ({plural(n, 'slot')})" for t, n in types.items()) or "none")]
    return card("Parameters", facts, table(["name", "kind", "shape", "value"], rows, "slots"))


@_never_raises
def gradients_card(gradients) -> str:
    """The target, how many nodes a cotangent reached, and each parameter slot's gradient."""
    network, target = gradients.network, gradients.target
    target = None if target is None else target.index
    nodes = network.nodes()
    reached = sum(gradients.reached(n.symbol) for n in nodes)
    slots = [n for n in nodes if n.opcode.name == "parameter"]
    of = "a sum of fields" if target is None else _ref(nodes[target])
    facts = [("of", of), ("reached", f"{reached} of {len(nodes)} nodes"),
             ("parameter slots", f"{sum(gradients.reached(n.symbol) for n in slots)} of {len(slots)} reached")]
    rows = []
    for n in slots[:ROWS]:
        g = np.asarray(gradients[n.symbol]).astype(np.float64)
        rows.append([f"%{n.index}", n.name or "", _spec(n.shape, n.dtype),
                     "yes" if gradients.reached(n.symbol) else "no (zeros)", f"{np.linalg.norm(g):.6g}"])
    rows += [[f"%{n.index}", n.name or "", _spec(n.shape, n.dtype), "", ""] for n in slots[ROWS:]]
    return card("Gradients", facts, table(["node", "name", "shape", "reached", "L2 norm"], rows, "slots"))


@_never_raises
def adjoints_card(adjoints) -> str:
    """The target and each (wrt, gradient) pair differentiate recorded."""
    pairs = adjoints.pairs()
    recording = hasattr(adjoints.target, "shape")
    facts = [("target", _ref(adjoints.target)), ("gradients", str(len(pairs))),
             ("entries", "Values (the tape is open)" if recording else "Symbols (detached)")]
    return card("Adjoints", facts, table(["wrt", "gradient"], [[_ref(w), _ref(g)] for w, g in pairs], "pairs"),
                line("topos.draw(network, adjoints=adjoints) shades the nodes differentiate appended"))


@_never_raises
def updates_card(updates) -> str:
    """Each (slot, next value) pair an optimizer or module recorded."""
    pairs = updates.pairs()
    return card("Updates", [("pairs", str(len(pairs)))],
                table(["slot", "next value"], [[_ref(p), _ref(n)] for p, n in pairs], "pairs"),
                line("network.entry(updates.roots(loss)) computes the loss and every next value in one run"))


@_never_raises
def entry_card(entry) -> str:
    """Roots, observes, numerics posture, the closure's size, and the drawing of its plan."""
    network = entry.network
    closure = entry.closure()
    facts = [("roots", _symbols([network.node(s) for s in entry.roots])),
             ("observes", _symbols([network.node(s) for s in entry.observes])),
             ("numerics", entry.numerics.value),
             ("closure", f"{len(closure)} of {len(network)} nodes")]
    return card("Entry", facts, figure(lambda m: draw(entry, max_nodes=m), len(closure), "topos.draw(entry)"))


@_never_raises
def plan_card(plan) -> str:
    """Schedule by kind, results, numerics, fusions, peak and retain-all bytes, and the drawing."""
    network = plan.network
    scheduled = plan.nodes()
    peak, at = plan.peak()
    retain = plan.retain_all_bytes()
    fusions = plan.fusions()
    fused = sum(len(g.nodes) for g in fusions)
    facts = [("scheduled", f"{len(scheduled)} of {len(network)} nodes: {_by_kind(scheduled)}"),
             ("results", _symbols([network.node(s) for s in plan.results])),
             ("numerics", plan.numerics.value),
             ("fusions", f"{plural(len(fusions), 'group')} covering {fused} nodes "
                         f"({', '.join(sorted({g.kind for g in fusions}))})" if fusions else "none elected"),
             ("live bytes", f"peak {_bytes(peak)} at %{at}, retain-all {_bytes(retain)}"
                            + (f" ({retain / peak:.2g}x the peak)" if peak else ""))]
    parts = [table(["group", "kind", "nodes", "reason"],
                   [[f"G{k}", g.kind, " ".join(f"%{n}" for n in g.nodes), g.reason] for k, g in enumerate(fusions)],
                   "groups")] if fusions else []
    parts.append(figure(lambda m: draw(plan, max_nodes=m), len(scheduled), "topos.draw(plan)"))
    return card("Plan", facts, *parts)


@_never_raises
def compiled_card(compiled) -> str:
    """Target, driver, module size, how it was built, its signature and plan, and the plan's drawing.

    The drawing is the plan's (``stage="plan"``), not the StableHLO
    module's: drawing a module parses it with the MLIR bindings, which is
    slow and loads the MLIR side for a picture.
    """
    plan = compiled.plan
    timings = ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in compiled.timings.items())
    facts = [("target", compiled.target.name), ("driver", compiled.driver),
             ("module", f"{_bytes(len(compiled.vmfb))}, {'a cache hit' if compiled.cache_hit else 'compiled'}"),
             ("timings", timings or "none"),
             ("signature", f"{plural(len(compiled.arguments), 'argument')}, {plural(len(compiled.results), 'result')}"),
             ("plan", f"{len(plan.schedule)} of {len(plan.network)} nodes, numerics {plan.numerics.value}")]
    return card(f"CompiledPlan for {compiled.target.name}", facts, folded("IREE flags", pre(" ".join(compiled.flags))),
                figure(lambda m: draw(compiled, stage="plan", max_nodes=m), len(plan.schedule),
                       'topos.draw(compiled, stage="plan")'))


@_never_raises
def compiled_run_card(run) -> str:
    """One compiled call's results: each one's node, shape and value (read back from the device)."""
    compiled, network = run.compiled, run.network
    nodes = [network.node(network.symbol(i)) for i in compiled.results]
    rows = [[*_node_row(n), _value(run[n.symbol]) if k < ROWS else ""] for k, n in enumerate(nodes)]
    facts = [("target", f"{compiled.target.name} (driver {compiled.driver})"),
             ("results", _slots((n.shape, n.dtype) for n in nodes))]
    return card("CompiledRun", facts, table(["node", "opcode", "name", "shape", "value"], rows, "results"),
                line("run[symbol] copies one result to the host; run.device(symbol) keeps it on the device"))


@_never_raises
def resident_card(state) -> str:
    """Device-resident parameters: each slot's name, shape and where it lives."""
    rows, specs = [], []
    for name in state.names():
        try:
            array = state.device(name)
        except LookupError:  # a slot the module never reads stays in the host table it came from
            rows.append([name, "not read by the module: kept on the host"])
            continue
        specs.append((array.shape, np.dtype(array.dtype)))
        rows.append([name, _spec(array.shape, np.dtype(array.dtype))])
    facts = [("slots", _slots(specs)), ("on", f"the IREE device of driver {state.driver}")]
    return card("ResidentParameters", facts, table(["name", "shape"], rows, "slots"),
                line("state.to_host() copies them back into a Parameters table; compiled.step(state, ...) "
                     "trains them where they are"))


@_never_raises
def gradient_report_card(report) -> str:
    """check_gradients' verdict, tolerances and each checked parameter's or input's errors."""
    worst = report.worst
    facts = [("verdict", "ok: every entry within both tolerances" if report.ok else "FAILED"),
             ("target", repr(report.target)),
             ("tolerances", f"{report.tolerance:.0e} ({short_name(report.dtype)}), "
                            f"float64 rule {report.rule_tolerance:.0e}")]
    if worst is not None:
        facts.append(("worst", f"{worst.label} {worst.kind} {list(worst.shape)}, recorded at {worst.site}"))
    title = f"gradient check: {'ok' if report.ok else 'FAILED'}"
    return card(title, facts, table(list(report.HEADER), report.rows(), "entries"))


@_never_raises
def bisect_card(report) -> str:
    """ok or the first divergence (its line, site, envelope and errors), the summary, and the drawing."""
    first = report.first
    title = f"bisect on {report.target}: " + ("ok" if first is None else f"divergence at %{first.index}")
    facts = [("verdict", "every node within its envelope" if first is None else "diverged"),
             ("checked", str(report.checked)),
             ("outside", ", ".join(f"%{i}" for i in report.outside) or "none"),
             ("summary", report.summary())]
    worst = report.worst_global()
    if worst is not None:
        facts.append(("furthest from the oracle", f"%{worst.index}: {worst.global_detail}"))
    parts = [pre(str(first))] if first is not None else []
    parts.append(figure(lambda m: draw(report, max_nodes=m), report.checked, "topos.draw(report)"))
    return card(title, facts, *parts)


@_never_raises
def module_card(module) -> str:
    """Type and path, parameters and buffers (recorded names, shapes, bytes), children, the tree."""
    parameters, buffers = module.named_parameters(), module.named_buffers()
    children = [key for key, _ in module.named_children()]
    facts = [("path", module.path or "(the outermost module)"),
             ("parameters", _slots((v.shape, v.dtype) for _, v in parameters)),
             ("buffers", _slots((v.shape, v.dtype) for _, v in buffers)),
             ("submodules", f"{sum(1 for _ in module.modules()) - 1}; children: {', '.join(children) or 'none'}")]
    rows = [[value.name or path, kind, _spec(value.shape, value.dtype)]
            for kind, named in (("parameter", parameters), ("buffer", buffers)) for path, value in named]
    parts = [table(["name", "kind", "shape"], rows, "slots")] if rows else []
    if children:
        parts.append(folded("module tree", pre(repr(module))))
    return card(f"{type(module).__name__}({module.extra_repr()})", facts, *parts)


__all__ = [
    "ROWS", "SVG_MAX_BOXES", "adjoints_card", "bisect_card", "card", "compiled_card", "compiled_run_card",
    "entry_card", "figure", "folded", "gradient_report_card", "gradients_card", "line", "module_card",
    "network_card", "node_card", "parameters_card", "plan_card", "pre", "resident_card", "run_card", "table",
    "tape_card", "updates_card", "value_card",
]
