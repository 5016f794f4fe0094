"""The whole stack on one small graph: record it, read it, run it, differentiate it, train it.

The graph is Plate 1 of the vision: an input [1, 2] times a parameter
[2, 2], then tanh, square, sum. Each stage below is a different reading of
the same sealed spec, and each one is checked against the oracle.

Run: python examples/walkthrough.py
"""

import numpy as np

from topos import Tape


def banner(title: str) -> None:
    print(f"\n=== {title} " + "=" * max(0, 60 - len(title)))


# 1. Record. Shapes and element types are fixed here, at the recording line.
def plate(tape):
    w = tape.parameter(np.array([[0.5, -0.25], [0.75, 1.0]], dtype=np.float32))
    x = tape.input(np.array([[1.0, 2.0]], dtype=np.float32))
    h = (x @ w).tanh()
    loss = (h * h).sum()
    # The gradient is more graph: the same derivative rules, appended as nodes.
    adjoints = tape.differentiate(loss, [w])
    return w, x, loss, adjoints


network, (w, x, loss, adjoints) = Tape.record(plate)
forward_nodes = adjoints.target.index + 1

banner("the spec (describe)")
print(network.describe())
print(f"nodes 0..{forward_nodes - 1} are the forward graph; "
      f"{len(network) - forward_nodes} more were appended by differentiate: the chain rule as nodes")

# 2. Run the oracle. Parameters are the caller's state; the network never changes.
banner("the oracle")
parameters = network.parameters()
sample = np.array([[1.0, 2.0]], dtype=np.float32)
run = network.forward(parameters, {x: sample})
print("loss =", run[loss])

# 3. Differentiate two ways, and check they agree bit for bit.
banner("gradients: backward scan == recorded nodes")
scanned = run.backward(loss)[w]
recorded = run[adjoints[w]]
print("backward scan   :", scanned.tolist())
print("recorded (%d)   :" % adjoints[w].index, recorded.tolist())
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
