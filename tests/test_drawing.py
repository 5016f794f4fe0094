"""topos.draw: every stage drawn from its public readers, deterministic DOT, the committed pictures current.

The DOT text is checked everywhere; rendering (SVG/PNG) needs Graphviz's
``dot`` and skips with that reason where it is missing (CI installs it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import topos
from topos import DrawingError, Numerics, Tape
from topos.views.drawing import MAX_NODES, SHADES, save_stage, shades

from _plate import long_chain, plate

ROOT = Path(__file__).resolve().parents[1]
needs_dot = pytest.mark.skipif(shutil.which("dot") is None,
                               reason="Graphviz's dot is not installed (apt install graphviz)")


@pytest.fixture(scope="module")
def recorded():
    network, (w, x, loss, adjoints, updates) = Tape.record(plate)
    return network, w, x, loss, adjoints, updates


def boxes(dot: str) -> dict[str, str]:
    """Box id -> its attribute text, for every box line of the DOT (legend and summaries included)."""
    return dict(re.findall(r"^\s+(\w+) \[(label=.*)\];$", dot, flags=re.M))


def edges(dot: str) -> set[tuple[str, str]]:
    return set(re.findall(r"^\s+(\w+) -> (\w+);$", dot, flags=re.M))


# ---- the spec ---------------------------------------------------------------------------------


def test_a_network_draws_one_box_per_node_and_one_edge_per_operand(recorded):
    network, *_ = recorded
    drawing = topos.draw(network)
    drawn = boxes(drawing.dot)
    assert {f"n{node.index}" for node in network.nodes()} == set(drawn)
    expected = {(f"n{j.index}", f"n{node.index}") for node in network.nodes() for j in node.operands}
    assert edges(drawing.dot) == expected
    for node in network.nodes():
        label = drawn[f"n{node.index}"]
        assert f"%{node.index} {node.opcode.name}" in label
        assert str(list(node.shape)) in label
        assert f"tests/_plate.py:{node.site.line} in plate" in label  # the tooltip: the recording line
    assert "%0 parameter  w" in drawn["n0"] and "%1 input  x" in drawn["n1"]
    assert "value=1" in drawn["n6"]  # the seed leaf reads like describe's line
    assert drawing.nodes == len(network) and drawing.note == ""


def test_the_three_shades_are_read_off_the_closures(recorded):
    network, w, x, loss, adjoints, updates = recorded
    shade = shades(network, adjoints, updates)
    forward = {n for n, s in shade.items() if s == "forward"}
    derivative = {n for n, s in shade.items() if s == "derivative"}
    update = {n for n, s in shade.items() if s == "update"}
    # Counted independently: the forward graph ends at the loss, differentiate appended up to the
    # gradient, and sgd appended the rest.
    assert forward == set(range(loss.index + 1))
    assert derivative == set(range(loss.index + 1, adjoints[w].index + 1))
    assert update == set(range(adjoints[w].index + 1, len(network)))
    dot = topos.draw(network, adjoints=adjoints, updates=updates).dot
    drawn = boxes(dot)
    for n, s in shade.items():
        assert f'fillcolor="{SHADES[s]}"' in drawn[f"n{n}"]
    assert "appended by differentiate" in dot and "appended by the optimizer" in dot
    assert "legend" not in topos.draw(network).dot  # one shade needs no legend


def test_the_same_subject_draws_the_same_bytes(recorded):
    network, w, x, loss, adjoints, updates = recorded
    again, _ = Tape.record(plate)
    first = topos.draw(network, adjoints=adjoints, updates=updates)
    assert first.dot == topos.draw(network, adjoints=adjoints, updates=updates).dot
    assert first.digest() == topos.draw(again, adjoints=adjoints, updates=updates).digest()


def test_a_run_shows_its_values(recorded):
    network, w, x, loss, *_ = recorded
    run = network.forward(network.parameters(), {x: np.array([[1.0, 2.0]], np.float32)})
    drawn = boxes(topos.draw(run).dot)
    assert f"= [{float(run[loss]):.4g}]" in drawn[f"n{loss.index}"]
    assert "= [0.5, -0.25, 0.75, 1]" in drawn["n0"]
    declared = network.entry([loss]).interpret(network.parameters(), {x: np.array([[1.0, 2.0]], np.float32)})
    assert set(boxes(topos.draw(declared).dot)) == {f"n{loss.index}"}  # only what the run may read


def test_user_strings_are_escaped_in_the_dot_text():
    def quoted(tape):
        a = tape.input(np.float32(1.0), name='say"hi"\\there')
        return a * a

    network, _ = Tape.record(quoted)
    dot = topos.draw(network).dot
    assert 'say\\"hi\\"\\\\there' in dot
    if shutil.which("dot"):
        assert "say&quot;hi&quot;" in topos.draw(network).svg()


# ---- a plan -----------------------------------------------------------------------------------


def test_a_plan_shows_order_liveness_fusion_groups_and_the_peak(recorded):
    network, w, x, loss, adjoints, updates = recorded
    plan = network.entry(updates.roots(loss)).lower()
    drawing = topos.draw(plan, adjoints=adjoints, updates=updates)
    drawn = boxes(drawing.dot)
    liveness = plan.liveness()
    assert set(drawn) == {f"n{n}" for n in plan.schedule}
    for k, n in enumerate(plan.schedule):
        assert drawn[f"n{n}"].startswith(f'label="{k}. %{n} ')
        assert liveness[n] in drawn[f"n{n}"]
    assert plan.fusions(), "the walkthrough's training step elects elementwise groups"
    clusters = re.findall(r'subgraph cluster_g(\d+) \{\n\s+label="G\d+: (\w+) of (\d+) nodes"', drawing.dot)
    assert [(kind, int(count)) for _, kind, count in clusters] == [(g.kind, len(g.nodes)) for g in plan.fusions()]
    peak, at = plan.peak()
    assert f"peak: {peak} B live" in drawn[f"n{at}"] and "penwidth=2.5" in drawn[f"n{at}"]
    assert sum("peak:" in attributes for attributes in drawn.values()) == 1
    assert f"retain-all {plan.retain_all_bytes()} B" in drawing.dot


def test_liveness_is_the_one_reading_describe_prints(recorded):
    network, w, x, loss, adjoints, _ = recorded
    plan = network.entry(adjoints.roots(), numerics=Numerics.EXACT).lower()
    lines = plan.describe().splitlines()
    for line, n in zip(lines, plan.schedule):
        assert line.endswith(plan.liveness()[n])
    assert plan.liveness()[loss.index] == "kept (result 0)"


def test_the_live_bytes_curve_plots_the_plans_series(recorded):
    pytest.importorskip("matplotlib", reason="the examples extra (matplotlib) is not installed")
    network, w, x, loss, adjoints, _ = recorded
    plan = network.entry(adjoints.roots()).lower()
    figure = topos.plot_live_bytes(plan)
    ax = figure.axes[0]
    plotted = ax.lines[0].get_ydata()
    assert list(plotted) == [live for _, live in plan.live_series()]
    assert ax.lines[1].get_ydata()[0] == plan.peak()[0]
    import matplotlib.pyplot as plt

    assert plt.get_fignums() == []  # pyplot never saw it: a notebook shows it once, as the cell's value


# ---- MLIR modules -----------------------------------------------------------------------------


@pytest.mark.parametrize("stage", ["mlir", "stablehlo"])
def test_a_module_draws_one_box_per_op_each_linked_to_its_node(recorded, stage):
    network, w, x, loss, adjoints, _ = recorded
    plan = network.entry(adjoints.roots()).lower()
    text = plan.emit_mlir() if stage == "mlir" else plan.emit_stablehlo(debug_info=True)
    drawing = topos.draw(plan, stage=stage)
    drawn = boxes(drawing.dot)
    body = re.findall(r"^\s+(?:%\S+ = )?\"?((?:topos|stablehlo)\.\w+)", text, flags=re.M)
    ops = body + ["func.return"]  # printed as a bare `return`
    arguments = [key for key in drawn if key.startswith("a")]
    assert len(arguments) == 2
    assert len(drawn) - len(arguments) == len(ops)
    assert [re.search(r'label="([\w.]+)', drawn[key]).group(1) for key in drawn if key.startswith("o")] == ops
    linked = {int(m) for attributes in drawn.values() for m in re.findall(r"node %(\d+) ", attributes)}
    if stage == "mlir":  # one op per scheduled node
        assert linked == set(plan.schedule)
    else:  # StableHLO drops nothing it computes; constants fold and gradients share ops
        assert loss.index in linked and adjoints[w].index in linked
    assert all("examples" not in a and "walkthrough" not in a for a in drawn.values())
    assert "tests/_plate.py:" in drawing.dot  # tooltips carry the recording line
    assert topos.draw(text).dot == drawing.dot  # the same text draws the same, whoever hands it over


def test_mlir_that_does_not_parse_is_a_drawing_error():
    with pytest.raises(DrawingError, match="could not parse the MLIR text"):
        topos.draw("module { this is not mlir }")
    with pytest.raises(DrawingError, match="no func.func"):
        topos.draw("module {}")


# ---- a bisect report --------------------------------------------------------------------------


def test_a_bisect_report_highlights_the_first_divergence_and_its_inputs(recorded):
    network, w, x, loss, adjoints, _ = recorded
    entry = network.entry([loss])
    report = topos.bisect(entry, network.parameters(), {x: np.array([[1.0, 2.0]], np.float32)},
                          rewrite=lambda text: text.replace("stablehlo.tanh", "stablehlo.sine"))
    assert not report.ok
    drawing = topos.draw(report)
    drawn = boxes(drawing.dot)
    first = drawn[f"n{report.first.index}"]
    assert 'fillcolor="#f5b7b1"' in first and "local: " in first and "envelope: " in first
    for operand in report.first.operands:
        assert "input: min" in drawn[f"n{operand.index}"]
    assert report.summary() in drawing.dot
    assert drawing.title == f"bisect: divergence at %{report.first.index}"
    clean = topos.bisect(entry, network.parameters(), {x: np.array([[1.0, 2.0]], np.float32)})
    assert clean.ok and topos.draw(clean).title == "bisect: no divergence"


def test_a_report_without_its_network_asks_for_one(recorded):
    import dataclasses

    network, w, x, loss, *_ = recorded
    report = topos.bisect(network.entry([loss]), network.parameters(), {x: np.ones((1, 2), np.float32)})
    bare = dataclasses.replace(report, network=None)
    with pytest.raises(DrawingError, match="pass network="):
        topos.draw(bare)
    assert topos.draw(bare, network=network).dot == topos.draw(report).dot


def handmade_report(network, loss):
    """A BisectReport as bisect makes one, without compiling: every computed node checked, the tanh outside."""
    from topos.views.bisect import BisectReport, Divergence, NodeCheck, OperandSummary

    nodes = network.nodes()
    computed = [i for i in sorted(network.entry([loss]).closure()) if not nodes[i].is_source]
    tanh = next(i for i in computed if nodes[i].opcode.name == "map")
    (operand,) = {j.index for j in nodes[tanh].operands}
    inputs = (OperandSummary(operand, nodes[operand].opcode.name, nodes[operand].shape, "f32", -1.0, 1.0,
                             False, False),)
    first = Divergence(tanh, str(nodes[tanh]), nodes[tanh].site, inputs, "3 ulps", 5, "5 ulps", 5.0, "5 ulps")
    checks = tuple(NodeCheck(i, i != tanh, 5 if i == tanh else 0, "", 0.0, "") for i in computed)
    return BisectReport("llvm-cpu", checks, first, (loss.index,), network)


def test_a_report_is_drawn_only_on_the_network_it_was_made_from():
    import dataclasses

    network, (w, x, loss, *_) = Tape.record(plate)
    report = handmade_report(network, loss)
    small, _ = Tape.record(lambda t: t.input(np.ones(2, np.float32), name="x").sum())
    larger, _ = Tape.record(lambda t: long_chain(t, links=10))
    for other in (small, larger):  # fewer nodes than the report names, or more
        with pytest.raises(DrawingError, match="not the network this BisectReport was made from: it belongs to "
                                               "another recording; leave network= out"):
            topos.draw(report, network=other)
    with pytest.raises(DrawingError, match="network= takes the Network the BisectReport was made from, got int"):
        topos.draw(report, network=3)
    assert topos.draw(report, network=network).dot == topos.draw(report).dot
    continued = network.reopen()
    continued.input(np.ones(2, np.float32))
    assert topos.draw(report, network=continued.seal()).dot == topos.draw(report).dot  # the same nodes, and more

    bare = dataclasses.replace(report, network=None)  # no family to compare: the indices and opcodes must fit
    with pytest.raises(DrawingError, match=r"it has 2 nodes and the report names %5"):
        topos.draw(bare, network=small)
    with pytest.raises(DrawingError, match="the nodes at the report's indices are not the ones bisect checked"):
        topos.draw(bare, network=larger)
    assert topos.draw(bare, network=network).dot == topos.draw(report).dot


# ---- big graphs, bad input --------------------------------------------------------------------


def test_a_graph_too_large_to_read_is_a_summary_with_a_note():
    network, _ = Tape.record(long_chain)
    drawing = topos.draw(network)
    assert f"max_nodes={MAX_NODES}" in drawing.note and f"{len(network)} boxes" in drawing.note
    drawn = boxes(drawing.dot)
    assert len(drawn) == 4  # input, mul, map, sum: what Graphviz gets is four boxes, not 3002
    assert 'label="mul x 1500"' in drawn["s0"] or 'label="mul x 1500"' in drawn["s1"]
    plan = network.entry([network.symbol(len(network) - 1)]).lower()
    assert topos.draw(plan).note and topos.draw(plan, stage="mlir").note
    if shutil.which("dot"):
        assert topos.draw(network).svg().startswith("<?xml")
    every = topos.draw(network, max_nodes=len(network))
    assert every.note == "" and len(boxes(every.dot)) == len(network)
    assert "nslimit=2" in every.dot  # Graphviz's layout passes capped for a large drawing


def test_without_graphviz_rendering_names_the_package(recorded, monkeypatch, tmp_path):
    network, *_ = recorded
    monkeypatch.setattr(shutil, "which", lambda name: None)
    drawing = topos.draw(network)
    with pytest.raises(DrawingError, match="apt install graphviz"):
        drawing.svg()
    with pytest.raises(DrawingError, match="apt install graphviz"):
        drawing.save(tmp_path / "plate.png")
    assert drawing.save(tmp_path / "plate.dot").read_text() == drawing.dot  # DOT needs nothing
    assert save_stage(drawing, tmp_path / "stages", "record") == [tmp_path / "stages" / "record.dot"]
    assert "image/svg+xml" not in drawing._repr_mimebundle_()


def test_bad_subjects_stages_and_paths_are_named(recorded, tmp_path):
    network, w, x, loss, *_ = recorded
    with pytest.raises(DrawingError, match="cannot draw a dict"):
        topos.draw({})
    with pytest.raises(DrawingError, match="stage='llvm'"):
        topos.draw(network.entry([loss]), stage="llvm")
    with pytest.raises(DrawingError, match="name a .dot, .svg or .png file"):
        topos.draw(network).save(tmp_path / "plate.pdf")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(DrawingError, match=rf"cannot write the drawing .*: a file stands at {blocker}, where a "
                                           "folder should be"):
        topos.draw(network).save(blocker / "plate.dot")
    with pytest.raises(DrawingError, match=r"the path holds a NUL character .*remove it"):
        topos.draw(network).save(str(tmp_path / "pl\0ate.dot"))

    def still_open(tape):
        tape.input(np.float32(1.0))
        with pytest.raises(DrawingError, match="still open"):
            topos.draw(tape)
        return tape.input(np.float32(2.0))

    Tape.record(still_open)


@needs_dot
def test_svg_and_png_render_and_svgs_carry_their_dot_digest(recorded, tmp_path):
    network, w, x, loss, adjoints, updates = recorded
    drawing = topos.draw(network, adjoints=adjoints, updates=updates)
    svg = drawing.save(tmp_path / "plate.svg").read_text()
    assert f"<!-- topos.draw dot-sha256: {drawing.digest()} -->" in svg
    assert svg.count("<g id=\"node") == len(network) + 3  # every node and the three legend boxes
    assert drawing.save(tmp_path / "plate.png").read_bytes().startswith(b"\x89PNG")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind
    assert "image/svg+xml" in drawing._repr_mimebundle_()


# ---- the walkthrough's drawings and Plate 1 ---------------------------------------------------


def test_the_walkthrough_draws_every_stage_and_the_committed_drawings_are_current(tmp_path):
    """make demo writes the drawings; docs/drawings/ (Plate 1 among them) must be what it writes now.

    When this fails after a deliberate change, regenerate them with
    ``python examples/walkthrough.py --drawings docs/drawings`` from the
    repository root and commit the result.
    """
    folder = tmp_path / "drawings"
    done = subprocess.run([sys.executable, "examples/walkthrough.py", "--drawings", str(folder)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"in {folder.resolve()}/" in done.stdout
    stages = ["record", "interpret", "differentiate", "plan", "fuse", "dialect", "stablehlo", "iree", "deploy"]
    committed = ROOT / "docs" / "drawings"
    assert sorted(p.stem for p in committed.glob("*.dot")) == sorted(stages)
    for stage in stages:
        fresh = (folder / f"{stage}.dot").read_text()
        assert fresh == (committed / f"{stage}.dot").read_text(), (
            f"docs/drawings/{stage}.dot is stale: run python examples/walkthrough.py --drawings docs/drawings")
        import hashlib

        digest = hashlib.sha256(fresh.encode()).hexdigest()
        assert f"dot-sha256: {digest}" in (committed / f"{stage}.svg").read_text(), (
            f"docs/drawings/{stage}.svg was not rendered from its .dot: regenerate it as above")
    vision = (ROOT / "docs" / "vision.md").read_text()
    assert "![Plate 1" in vision and "(drawings/differentiate.svg)" in vision


def test_options_that_cannot_apply_are_refused_by_name(recorded):
    network, w, x, loss, adjoints, updates = recorded
    small, small_loss = Tape.record(lambda t: t.input(np.ones(2, np.float32), name="x").sum())
    run = network.forward(network.parameters(), {x: np.array([[1.0, 2.0]], np.float32)})
    for call, match in [
        (lambda: topos.draw(network, adjoints=[1, 2]), r"adjoints= takes what tape.differentiate .* got int"),
        (lambda: topos.draw(network, adjoints=updates), "adjoints= takes .* got Updates"),
        (lambda: topos.draw(network, updates=adjoints), "updates= takes .* got Adjoints"),
        (lambda: topos.draw(small, adjoints=adjoints), r"these Adjoints name node %\d+, but the network drawn has"),
        (lambda: topos.draw(network, max_nodes="10"), r"max_nodes must be an int >= 1 .* got '10'"),
        (lambda: topos.draw(network, max_nodes=0), "max_nodes must be an int >= 1"),
        (lambda: topos.draw(network, stage="mlir"), "stage='mlir' applies to a Plan, an Entry or a CompiledPlan"),
        (lambda: topos.draw(run, stage="stablehlo"), "a Run has one drawing"),
        (lambda: topos.draw(network, network=small), "network= names the network a BisectReport was made from"),
        (lambda: topos.plot_live_bytes(network), r"plot_live_bytes takes a Plan \(entry.lower\(\)\) or an Entry"),
        (lambda: topos.draw(network).save(123), "save takes a path"),
    ]:
        with pytest.raises(DrawingError, match=match):
            call()
    assert topos.draw(network.entry([loss]), stage="mlir").dot  # where a stage applies, it still draws
