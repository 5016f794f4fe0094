"""The whole stack on one small graph: record it, read it, run it, differentiate it, train it.

The graph is Plate 1 of the vision: an input [1, 2] times a parameter
[2, 2], then tanh, square, sum. Each stage below is a different reading of
the same sealed spec, and each one is checked against the oracle:

  1. the spec (describe)           5. the plan (schedule, liveness, fusions)
  2. the oracle                    6. the topos MLIR module, then annotated by passes
  3. gradients, two readings       7. StableHLO
  4. training by hand              8. IREE: the plan and a whole training step compiled

Each stage is also drawn (topos.draw) into a folder, walkthrough-drawings/
unless --drawings names another: DOT text always, SVG when Graphviz's dot
is installed. docs/drawings/ holds the same files, and a test checks that
they are current.

Run: python examples/walkthrough.py [--drawings DIR]
"""

import argparse

import numpy as np

import topos
from topos import Numerics, Tape
from topos.views.drawing import graphviz_available, save_stage

import _training  # beside this file: a script's folder is on sys.path

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--drawings", type=_training.output_folder, default="walkthrough-drawings",
                    help="folder for the drawings of each stage")
drawings = parser.parse_args().drawings


def banner(title: str) -> None:
    print(f"\n=== {title} " + "=" * max(0, 60 - len(title)))


def drawn(stage: str, drawing: topos.Drawing) -> None:
    _training.run(lambda: save_stage(drawing, drawings, stage))  # Graphviz or a full disk can still refuse


# 1. Record. Shapes and element types are fixed here, at the recording line.
def plate(tape):
    w = tape.parameter(np.array([[0.5, -0.25], [0.75, 1.0]], dtype=np.float32))
    x = tape.input(np.array([[1.0, 2.0]], dtype=np.float32))
    h = (x @ w).tanh()
    loss = (h * h).sum()
    # The gradient is more graph: the same derivative rules, appended as nodes.
    adjoints = tape.differentiate(loss, [w])
    # An optimizer step in the graph, so one compiled function trains.
    updates = topos.sgd(tape, adjoints, 0.1)
    return w, x, loss, adjoints, updates


network, (w, x, loss, adjoints, updates) = Tape.record(plate)
forward_nodes = adjoints.target.index + 1

banner("the spec (describe)")
print(network.describe())
print(f"nodes 0..{forward_nodes - 1} are the forward graph; "
      f"nodes {forward_nodes}..{adjoints[w].index} were appended by differentiate (the chain rule "
      f"as nodes), and the rest by sgd (w - 0.1 * gradient)")
# Plate 1 of the vision: the forward graph, and the chain rule and the update appended in lighter shades.
drawn("record", topos.draw(network.entry([loss]).lower(), stage="network"))
drawn("differentiate", topos.draw(network, adjoints=adjoints, updates=updates))

# 2. Run the oracle. Parameters are the caller's state; the network never changes.
banner("the oracle")
parameters = network.parameters()
sample = np.array([[1.0, 2.0]], dtype=np.float32)
run = network.forward(parameters, {x: sample})
print("loss =", run[loss])
drawn("interpret", topos.draw(run, adjoints=adjoints, updates=updates))  # every value the oracle computed

# 3. Differentiate two ways, and check they agree bit for bit.
banner("gradients: backward scan == recorded nodes")
scanned = run.backward(loss)[w]
recorded = run[adjoints[w]]
print("backward scan   :", scanned.tolist())
print(f"recorded ({adjoints[w].index})   :", recorded.tolist())
assert np.array_equal(scanned.view(np.uint32), recorded.view(np.uint32))

# 4. Train a few steps by hand with each route; the states stay bit-identical.
banner("training: 5 SGD steps, two routes")
learning_rate = np.float32(0.1)
by_scan, by_record = parameters, parameters
for step in range(5):
    run_scan = network.forward(by_scan, {x: sample})
    by_scan = by_scan.step(run_scan.backward(loss).parameters(by_scan),
                           lambda p, g: p - g * learning_rate)
    run_record = network.forward(by_record, {x: sample})
    by_record = by_record.step(run_record.recorded_gradients(adjoints, by_record),
                               lambda p, g: p - g * learning_rate)
    print(f"step {step}: loss {float(run_scan[loss]):.6f}")
assert np.array_equal(by_scan[w], by_record[w])
final = network.forward(by_scan, {x: sample})[loss]
assert final < run[loss], "training should reduce the loss"
print("both routes reach the same parameters, bit for bit:", by_scan[w].tolist())

# 5. Plan: a derived schedule of what to run, keep and free. It holds no state.
banner("the plan (exact posture)")
plan = network.entry(adjoints.roots(), numerics=Numerics.EXACT).lower()
print(plan.describe())
for group in plan.fusions():
    print(f"fusion offer taken: {group.kind} rooted at %{group.root}, nodes {list(group.nodes)}: {group.reason}")
planned = plan.forward(parameters, {x: sample})
oracle = network.forward(parameters, {x: sample})
assert np.array_equal(planned[loss], oracle[loss]) and np.array_equal(planned[adjoints[w]], oracle[adjoints[w]])
print("exact plan == oracle, bit for bit")
drawn("plan", topos.draw(plan, adjoints=adjoints))

# 6. The same plan as a module of the topos dialect (one op per node, with its recording line).
banner("the topos MLIR module")
print(plan.emit_mlir(debug_info=False))
drawn("dialect", topos.draw(plan, stage="mlir"))

# 6b. Passes annotate it with what the plan decided: liveness, fusion offers, the election.
banner("the annotated module (topos-plan, topos-fuse, topos-elect)")
from topos.dialect import transform  # noqa: E402  (the MLIR side loads only when asked for)

print(transform(plan.emit_mlir(), "topos-plan,topos-fuse,topos-elect{kinds=elementwise}"))

# 7. Python passes lower it to StableHLO.
banner("StableHLO")
print(plan.emit_stablehlo())
drawn("stablehlo", topos.draw(plan, stage="stablehlo"))

# 8. IREE compiles the StableHLO; results are checked against the oracle within the envelope.
banner("IREE (llvm-cpu)")
compiled = plan.compile("llvm-cpu")
print(compiled.describe())
fast = compiled.forward(parameters, {x: sample})
assert np.allclose(fast[loss], oracle[loss], rtol=1e-5)
assert np.allclose(fast[adjoints[w]], oracle[adjoints[w]], rtol=1e-5)
print("compiled plan agrees with the oracle:", float(fast[loss]), "vs", float(oracle[loss]))
# bisect grades every node of the compiled plan against the reference kernel on its compiled inputs.
report = topos.bisect(plan.entry, parameters, {x: sample})
print(report.summary())
drawn("iree", topos.draw(report))

step_plan = network.entry(updates.roots(loss)).lower()
drawn("fuse", topos.draw(step_plan, adjoints=adjoints, updates=updates))
trainer = step_plan.compile("llvm-cpu")
state = trainer.resident(parameters)  # parameters stay on the device between steps
for _ in range(5):
    state, step_run = trainer.step(state, {x: sample}, updates)
on_device = state.to_host()[w]
assert np.allclose(on_device, by_scan[w], rtol=1e-5, atol=1e-6)
print("5 compiled training steps (one IREE call each) match the oracle's 5 steps:", on_device.tolist())
drawn("deploy", topos.draw(trainer))

banner("drawings")
kinds = "DOT and SVG" if graphviz_available() else "DOT (install Graphviz's dot for SVG: apt install graphviz)"
print(f"each stage drawn ({kinds}) in {drawings.resolve()}/: record, interpret, differentiate, plan, "
      "dialect, stablehlo, iree, fuse, deploy")
