"""Jupyter cards: every object a learner touches shows its key facts, its drawing when small, and escapes user text.

Each test computes the facts it looks for (a shape, a count, a name, a
value) from the recording itself, not from the card code, then reads them
in the card's text. The HTML is checked for what a notebook needs: an
inline ``<svg`` when Graphviz is installed and the graph is small, the
install hint when it is not, a note instead of a drawing for a large graph
(without running Graphviz), and user strings escaped.
"""

from __future__ import annotations

import dataclasses
import html
import inspect
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import topos
import topos.views.drawing
from topos import Numerics, Tape, nn
from topos.views import display as display_module
from topos.views.drawing import graphviz_available

from _plate import PLATE_FILE, W, X, long_chain, plate

ROOT = Path(__file__).resolve().parents[1]
ODD = '<b>&"'  # a name the validator allows (no whitespace, no leading %) that HTML must escape
ESCAPED = html.escape(ODD, quote=True)


def text(card: str) -> str:
    """The card as a reader sees it: tags dropped, entities decoded, whitespace collapsed."""
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", card)))


def assert_drawing(card: str) -> None:
    """An inline SVG when Graphviz's dot is installed, else the line saying how to install it."""
    if graphviz_available():
        assert "<svg" in card and "<?xml" not in card and "<!DOCTYPE" not in card
    else:
        assert "<svg" not in card and "apt install graphviz" in card


@pytest.fixture(scope="module")
def recorded():
    network, (w, x, loss, adjoints, updates) = Tape.record(plate)
    return network, w, x, loss, adjoints, updates


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    """Compiles of this module cache in a temporary folder, not the user's cache."""
    pytest.importorskip("iree.compiler", reason="CompiledPlan and BisectReport cards need the mlir extra")
    pytest.importorskip("iree.runtime", reason="CompiledPlan and BisectReport cards need the mlir extra")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TOPOS_CACHE_DIR", str(tmp_path_factory.mktemp("topos-cache")))
        yield


# ---- every class listed has a card, and it delegates to topos.views.display ---------------------------


def test_every_object_a_learner_touches_has_a_card():
    from topos.dialect.iree.compiled import CompiledPlan, CompiledRun, ResidentParameters
    from topos.readings.gradcheck import GradientReport
    from topos.spec.tape import Value

    classes = [Tape, Value, topos.Network, topos.Node, topos.Run, topos.Parameters, topos.Gradients, topos.Field,
               topos.Adjoints, topos.Entry, topos.Plan, CompiledPlan, CompiledRun, ResidentParameters,
               topos.BisectReport, GradientReport, topos.Updates, nn.Module, nn.Linear, nn.Sequential]
    for cls in classes:
        method = cls._repr_html_
        assert "display" in inspect.getsource(method), f"{cls.__name__}._repr_html_ builds no card"


# ---- recording ---------------------------------------------------------------------------------


def test_open_tape_card_shows_the_node_count_and_the_last_lines_recorded():
    cards = {}

    def fn(tape):
        w, x, loss, _, _ = plate(tape)
        cards["open"] = (tape._repr_html_(), len(tape), tape.describe().splitlines())
        return loss

    Tape.record(fn)
    tape_card, count, lines = cards["open"]
    seen = text(tape_card)
    assert "Tape (open, recording)" in seen
    assert f"nodes {count} " in seen and f"{count} nodes (1 parameter, 1 input" in seen
    assert lines[-2] in html.unescape(tape_card)  # the last node's describe line, verbatim
    assert "<svg" not in tape_card  # no drawing for an open tape

    sealed = Tape()
    with sealed:
        sealed.input(X)
    sealed.seal()
    assert "sealed" in text(sealed._repr_html_())


def test_value_card_shows_its_describe_line_shape_and_name():
    cards = {}

    def fn(tape):
        w, x, loss, _, _ = plate(tape)
        cards["w"], cards["loss"] = w._repr_html_(), loss._repr_html_()
        cards["lines"] = tape.describe().splitlines()
        cards["symbols"] = w.symbol.index, loss.symbol.index
        return loss

    Tape.record(fn)
    w_index, loss_index = cards["symbols"]
    seen = text(cards["w"])
    assert f"Value(%{w_index} parameter" in seen and "shape [2, 2] f32" in seen
    assert "name w" in seen and "trainable parameter" in seen and "open" in seen
    assert cards["lines"][w_index] in html.unescape(cards["w"])
    seen = text(cards["loss"])
    assert "shape [] f32" in seen and "trainable" not in seen
    assert cards["lines"][loss_index] in html.unescape(cards["loss"])


def test_network_card_counts_nodes_by_kind_and_names_each_source(recorded):
    network, w, x, *_ = recorded
    card = network._repr_html_()
    seen = text(card)
    kinds = [node.opcode.name for node in network.nodes()]
    assert f"{len(kinds)}: parameter 1, input 1, leaf {kinds.count('leaf')}" in seen
    assert f"mul {kinds.count('mul')}" in seen
    assert f"1 ({W.size} elements, {W.nbytes} B): 1 trainable, 0 state" in seen
    assert "%0 w parameter [2, 2] f32" in seen and "%1 x input [1, 2] f32" in seen
    assert f"%{recorded[3].index} sum [] f32" in seen  # the loss is a sink
    assert_drawing(card)


def test_node_card_shows_its_describe_line_site_and_operands(recorded):
    network, w, x, loss, *_ = recorded
    matmul = next(n for n in network.nodes() if n.opcode.name == "matmul")
    card = matmul._repr_html_()
    seen = text(card)
    assert str(matmul) in html.unescape(card)  # the describe line, verbatim
    assert f"Node %{matmul.index} matmul" in seen
    assert f"operands %{x.index}, %{w.index}" in seen
    assert "shape [1, 2] f32" in seen
    lines = Path(PLATE_FILE).read_text().splitlines()
    line = next(k + 1 for k, text_ in enumerate(lines) if "h = (x @ w).tanh()" in text_)
    assert f"_plate.py:{line} in plate" in seen


def test_run_card_shows_the_results_and_their_values(recorded):
    network, w, x, loss, *_ = recorded
    run = network.forward(network.parameters(), {x: X})
    card = run._repr_html_()
    seen = text(card)
    expected = float(np.sum(np.tanh(X.astype(np.float64) @ W) ** 2))
    assert f"{len(network)} of {len(network)} nodes (every node)" in seen
    assert f"%{loss.index} sum [] f32 {float(run[loss]):.6g}" in seen
    assert float(run[loss]) == pytest.approx(expected, rel=1e-6)
    assert_drawing(card)

    declared = network.entry([loss]).interpret(network.parameters(), {x: X})
    seen = text(declared._repr_html_())
    assert f"1 of {len(network)} nodes" in seen and "declared results" in seen


def test_parameters_card_counts_slots_elements_and_bytes_and_names_each_slot():
    def fn(tape):
        w = tape.parameter(W, name="fc.weight")
        tape.parameter(np.zeros(3, np.float64), name="optim.count", trainable=False)
        return (w * w).sum()

    network, _ = Tape.record(fn)
    seen = text(network.parameters()._repr_html_())
    elements, nbytes = W.size + 3, W.nbytes + 3 * 8
    assert f"2 ({elements} elements, {nbytes} B): 1 trainable, 1 state" in seen
    assert "fc.weight trainable [2, 2] f32 [0.5, -0.25, 0.75, 1]" in seen
    assert "optim.count state [3] f64" in seen
    assert "f32 (1 slot), f64 (1 slot)" in seen


def test_gradients_card_shows_the_target_and_each_slot_gradient(recorded):
    network, w, x, loss, *_ = recorded
    gradients = network.forward(network.parameters(), {x: X}).backward(loss)
    assert isinstance(gradients, topos.Field)
    seen = text(gradients._repr_html_())
    norm = np.linalg.norm(np.asarray(gradients[w], np.float64))
    assert f"of %{loss.index} sum [] f32" in seen
    assert "1 of 1 reached" in seen
    assert f"%{w.index} w [2, 2] f32 yes {norm:.6g}" in seen


def test_adjoints_and_updates_cards_pair_each_slot_with_what_was_recorded(recorded):
    network, w, x, loss, adjoints, updates = recorded
    seen = text(adjoints._repr_html_())
    assert f"target %{loss.index}" in seen and "Symbols (detached)" in seen
    assert f"%{w.index} %{adjoints[w].index}" in seen
    seen = text(updates._repr_html_())
    assert "pairs 1" in seen and f"%{w.index} %{updates[w].index}" in seen

    cards = {}

    def fn(tape):
        w, x, loss, adjoints, updates = plate(tape)
        cards["adjoints"], cards["updates"] = adjoints._repr_html_(), updates._repr_html_()
        return loss

    Tape.record(fn)
    seen = text(cards["adjoints"])
    assert "Values (the tape is open)" in seen and "%0 w [2, 2] f32" in seen
    assert "%0 w [2, 2] f32" in text(cards["updates"])


# ---- plans -------------------------------------------------------------------------------------


def closure_size(network, roots) -> int:
    seen, stack = set(), [r.index for r in roots]
    nodes = network.nodes()
    while stack:
        i = stack.pop()
        if i not in seen:
            seen.add(i)
            stack.extend(o.index for o in nodes[i].operands)
    return len(seen)


def test_entry_card_shows_roots_posture_and_closure(recorded):
    network, w, x, loss, adjoints, _ = recorded
    entry = network.entry([loss], observe=[adjoints[w]], numerics=Numerics.EXACT)
    card = entry._repr_html_()
    seen = text(card)
    assert f"roots %{loss.index} sum [] f32" in seen
    assert f"observes %{adjoints[w].index} matmul [2, 2] f32" in seen
    assert "numerics exact" in seen
    assert f"{closure_size(network, [loss, adjoints[w]])} of {len(network)} nodes" in seen
    assert_drawing(card)


def test_plan_card_shows_schedule_fusions_and_live_bytes(recorded):
    network, w, x, loss, adjoints, _ = recorded
    plan = network.entry(adjoints.roots(), numerics=Numerics.EXACT).lower()
    card = plan._repr_html_()
    seen = text(card)
    peak, at = plan.peak()
    assert f"{closure_size(network, adjoints.roots())} of {len(network)} nodes" in seen
    assert f"peak {peak} B at %{at}" in seen
    assert f"retain-all {plan.retain_all_bytes()} B" in seen
    for group in plan.fusions():
        assert group.kind in seen and " ".join(f"%{n}" for n in group.nodes) in seen
    assert "numerics exact" in seen
    assert_drawing(card)


def test_compiled_plan_card_shows_target_driver_and_module_and_draws_the_plan(recorded, compile_cache):
    network, w, x, loss, *_ = recorded
    compiled = network.entry([loss]).lower().compile("llvm-cpu")
    card = compiled._repr_html_()
    seen = text(card)
    assert "CompiledPlan for llvm-cpu" in seen and f"driver {compiled.driver}" in seen
    assert f"{len(compiled.vmfb) / 1024:.1f} KiB" in seen
    assert "2 arguments, 1 result" in seen  # w and x in, the loss out
    assert_drawing(card)
    if graphviz_available():
        assert "nodes scheduled" in card and "stablehlo." not in card  # the plan's drawing, not the module's


def test_compiled_run_and_resident_state_cards_show_results_and_slots(recorded, compile_cache):
    network, w, x, loss, adjoints, updates = recorded
    compiled = network.entry(updates.roots(loss)).lower().compile("llvm-cpu")
    state = compiled.resident(network.parameters())
    state, run = compiled.step(state, {x: X}, updates)
    seen = text(run._repr_html_())
    expected = float(np.sum(np.tanh(X.astype(np.float64) @ W) ** 2))
    assert "CompiledRun" in seen and f"llvm-cpu (driver {compiled.driver})" in seen
    assert f"%{loss.index} sum [] f32 {float(run[loss]):.6g}" in seen
    assert float(run[loss]) == pytest.approx(expected, rel=1e-6)
    assert f"results {len(compiled.results)} (" in seen
    seen = text(state._repr_html_())
    assert "ResidentParameters" in seen and f"driver {state.driver}" in seen and state.driver == compiled.driver
    assert "w [2, 2] f32" in seen and "slots 1 (4 elements, 16 B)" in seen

    def spare(tape):
        tape.parameter(np.zeros(3, np.float32), name="spare")  # a slot no entry reads
        w = tape.parameter(W, name="w")
        return (w * w).sum()

    other, total = Tape.record(spare)
    state = other.entry([total]).lower().compile("llvm-cpu").resident(other.parameters())
    seen = text(state._repr_html_())
    assert "spare not read by the module: kept on the host" in seen and "w [2, 2] f32" in seen


def test_gradient_report_card_gives_the_verdict_and_each_entry():
    def model(tape):
        w = tape.parameter(np.array([0.5, -1.5]), name="w")
        return w, (w * w).tanh().sum()

    network, (w, loss) = Tape.record(model)
    report = topos.check_gradients(network, network.parameters(), {}, loss)
    seen = text(report._repr_html_())
    assert report.ok and "gradient check: ok" in seen and "every entry within both tolerances" in seen
    entry = report.entries[0]
    assert f"{entry.error:.2e}" in seen and f"{entry.largest:.3e}" in seen and "parameter [2]" in seen
    assert entry.name == "w" and f"{entry.symbol!r} w" in seen and f"{entry.symbol!r} w" in str(report)
    failing = topos.check_gradients(network, network.parameters(), {}, loss, tolerance=1e-30, rule_tolerance=1e-30)
    seen = text(failing._repr_html_())
    assert not failing.ok and "gradient check: FAILED" in seen and "FAIL" in seen


def test_bisect_card_says_ok_or_names_the_first_divergence(recorded, compile_cache, monkeypatch):
    network, w, x, loss, *_ = recorded
    entry = network.entry([loss])
    checked = sum(1 for n in network.nodes() if not n.is_source and n.index <= loss.index)
    report = topos.bisect(entry, network.parameters(), {x: X})
    card = report._repr_html_()
    seen = text(card)
    assert "bisect on llvm-cpu: ok" in seen and f"checked {checked}" in seen and "outside none" in seen
    assert_drawing(card)

    bad = topos.bisect(entry, network.parameters(), {x: X},
                       rewrite=lambda t: t.replace("stablehlo.tanh", "stablehlo.sine"))
    tanh = next(n for n in network.nodes() if n.attributes.get("function") == "tanh")
    seen = text(bad._repr_html_())
    assert f"divergence at %{tanh.index}" in seen
    assert "_plate.py" in seen and "envelope" in seen  # the user's line and the envelope it left

    # A drawing that cannot be made says why, and the card still comes (Graphviz installed or not).
    monkeypatch.setattr(topos.views.display, "graphviz_available", lambda: True)
    seen = text(dataclasses.replace(report, network=None)._repr_html_())
    assert "bisect on llvm-cpu: ok" in seen and "no drawing: this BisectReport carries no network" in seen


# ---- modules -----------------------------------------------------------------------------------


def test_module_card_shows_parameters_buffers_and_paths():
    built = {}

    def fn(tape):
        model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
        norm = nn.BatchNorm(4)
        built["model"], built["norm"] = model, norm
        return model(tape.input(np.ones((2, 3), np.float32))).sum()

    Tape.record(fn)
    model, norm = built["model"], built["norm"]
    shapes = [(4, 3), (4,), (2, 4), (2,)]
    elements = sum(math.prod(s) for s in shapes)
    seen = text(model._repr_html_())
    assert f"parameters 4 ({elements} elements, {4 * elements} B)" in seen
    assert "2.weight parameter [2, 4] f32" in seen and "children: 0, 1, 2" in seen
    assert "Linear(4, 2, bias=True)" in seen  # the module tree
    seen = text(model[2]._repr_html_())
    assert "Linear(4, 2, bias=True)" in seen and "path 2" in seen and "2.bias parameter [2] f32" in seen
    seen = text(norm._repr_html_())
    assert "buffers 2 (8 elements, 32 B)" in seen and "running_var buffer [4] f32" in seen


# ---- escaping ----------------------------------------------------------------------------------


def test_user_strings_are_escaped_in_every_card():
    """A name, a module path and a recording file carry <b>&" into the cards; none reaches the HTML raw."""
    cards = {}

    def fn(tape):
        w, x, loss, adjoints, updates = plate(tape, name=ODD)
        # A recording line in a file whose name the user chose: its site goes into the node card.
        scope = {"w": w}
        exec(compile("y = w * 3.0", f"{ODD}recorded.py", "exec"), scope)
        parent = nn.Sequential(nn.Tanh())
        setattr(parent, ODD, nn.Linear(2, 2))
        cards["tape"], cards["module"], cards["child"] = (tape._repr_html_(), parent._repr_html_(),
                                                          getattr(parent, ODD)._repr_html_())
        cards["adjoints"], cards["value"] = adjoints._repr_html_(), w._repr_html_()
        return loss, scope["y"], adjoints

    network, (loss, y, adjoints) = Tape.record(fn)
    parameters = network.parameters()
    run = network.forward(parameters)
    plan = network.entry(adjoints.roots()).lower()
    cards.update(network=network._repr_html_(), node=network.node(network.named(ODD))._repr_html_(),
                 site=network.node(y)._repr_html_(), parameters=parameters._repr_html_(), run=run._repr_html_(),
                 gradients=run.backward(loss)._repr_html_(), entry=plan.entry._repr_html_(), plan=plan._repr_html_(),
                 report=topos.check_gradients(network, parameters, {}, loss)._repr_html_())
    for which in ("tape", "value", "network", "node", "site", "parameters", "gradients", "module", "child",
                  "report"):
        assert ESCAPED in cards[which], which
    assert f"{ESCAPED}recorded.py:1 in &lt;module&gt;" in cards["site"]
    assert f"{ESCAPED}.weight" in cards["module"] and f"path {ODD}" in text(cards["child"])
    for which, card in cards.items():
        assert "<b>" not in card and "<b" not in card, f"raw user text in the {which} card"
        assert ODD not in card, which


# ---- drawings: large graphs, no Graphviz, failures ----------------------------------------------


def test_a_large_network_gets_the_note_not_a_drawing_and_graphviz_never_runs(monkeypatch):
    network, loss = Tape.record(lambda tape: long_chain(tape, 300))
    assert len(network) > 500
    renders = []
    original = subprocess.run  # the drawing module imports subprocess when it renders
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: renders.append(a) or original(*a, **k))
    plan = network.entry([loss]).lower()
    cards = {"network": network._repr_html_(), "run": network.forward(network.parameters())._repr_html_(),
             "entry": plan.entry._repr_html_(), "plan": plan._repr_html_()}
    for which, card in cards.items():
        assert "<svg" not in card, which
        assert f"call topos.draw({which}) to draw" in card, which
    assert f"{len(network)} nodes: call topos.draw(network) to draw" in text(cards["network"])
    assert renders == [], "Graphviz ran for a card of a large graph"


def test_without_graphviz_a_card_says_how_to_install_it(recorded, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no dot on PATH
    assert not graphviz_available()
    network = recorded[0]
    for card in (network._repr_html_(), network.entry([recorded[3]]).lower()._repr_html_()):
        assert "<svg" not in card
        assert "apt install graphviz" in text(card) and "not on PATH" in text(card)


def test_a_card_never_raises(recorded, monkeypatch):
    network = recorded[0]

    def broken(*args, **kwargs):
        raise RuntimeError("Graphviz exploded")

    monkeypatch.setattr(topos.views.drawing, "_render", broken)
    monkeypatch.setattr(topos.views.display, "graphviz_available", lambda: True)  # the same without Graphviz
    seen = text(network._repr_html_())
    assert "no drawing: Graphviz exploded" in seen and "parameter 1" in seen

    monkeypatch.setattr(display_module, "_by_kind", broken)
    seen = text(network._repr_html_())
    assert "Network" in seen and "display failed" in seen and "RuntimeError: Graphviz exploded" in seen


def test_cards_of_host_objects_leave_the_mlir_side_unloaded():
    code = ("import sys, numpy as np, topos\n"
            "network, loss = topos.Tape.record(lambda t: (t.parameter(np.ones(2, np.float32)) * 2.0).sum())\n"
            "plan = network.entry([loss]).lower()\n"
            "for o in (network, plan, plan.entry, network.parameters(), network.forward(network.parameters())):\n"
            "    o._repr_html_()\n"
            "print(sorted(m for m in sys.modules if m.startswith(('iree', 'topos.dialect'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "[]"
