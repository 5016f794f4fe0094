"""The fixed graphs whose oracle bits are pinned (rule 3's proof).

Inputs come from integer arithmetic, not a random generator, so the
payloads themselves cannot drift between NumPy versions.
"""

import hashlib

import numpy as np

import topos
from topos import Tape

DTYPES = {"float32": topos.float32, "float64": topos.float64, "bfloat16": topos.bfloat16}


def _grid(shape, salt: int, dtype) -> np.ndarray:
    n = int(np.prod(shape))
    k = np.arange(n, dtype=np.int64)
    values = ((k * 7919 + salt * 104729) % 2003 - 1001) / 337.0
    return values.reshape(shape).astype(dtype)


def graph(dtype):
    """matmul -> tanh -> log_softmax -> sum, plus exp/log/pow/sin/erf side branches."""

    def model(tape):
        x = tape.input(_grid((16, 24), 1, dtype))
        w = tape.parameter(_grid((24, 12), 2, dtype) * np.asarray(0.125, dtype))
        h = (x @ w).tanh()
        scores = h.log_softmax(1)
        loss = -scores.sum()
        side = (h.exp() + (h * h + 1.0).log() + h.sin().erf() + h.abs() ** 1.5).sum_along(0)
        return loss, side

    return Tape.record(model)


def digests() -> dict[str, str]:
    """SHA-256 of every node's bits, per element type."""
    out = {}
    for name, dtype in DTYPES.items():
        network, _ = graph(dtype)
        run = network.forward(network.parameters())
        h = hashlib.sha256()
        for node in network.nodes():
            h.update(np.ascontiguousarray(run[node.symbol]).tobytes())
        out[name] = h.hexdigest()
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(digests()))
