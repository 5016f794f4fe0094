"""Elementwise chains: consecutive elementwise nodes, each read only by the next, run in place.

The chain computes exactly the same operations in the same order; the
IEEE-exact links write into the previous link's buffer instead of a new
one, so the interior temporaries never exist. The bits cannot change.
"""

from __future__ import annotations

import math

import numpy as np

from topos.base.element import float32, float64
from topos.readings.plan.patterns.base import Candidate, Pattern, StructureView

ELEMENTWISE = {"add", "sub", "mul", "div", "pow", "maximum", "step", "neg", "map"}
# Links whose reference kernel is one IEEE ufunc in the element type, so
# writing into an operand's buffer is the same computation.
_IN_PLACE = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "neg": np.negative}


class ElementwiseChain(Pattern):
    kind = "elementwise"

    def discover(self, view: StructureView) -> list[Candidate]:
        following: dict[int, int] = {}
        for n in sorted(view.wanted):
            if view.opcode(n) not in ELEMENTWISE or not view.interior_ok(n):
                continue
            (reader,) = view.consumers[n]
            if view.opcode(reader) in ELEMENTWISE and view.spec(reader) == view.spec(n):
                following[n] = reader
        heads = sorted(set(following) - set(following.values()))
        found = []
        for head in heads:
            chain = [head]
            while chain[-1] in following:
                chain.append(following[chain[-1]])
            saved = sum(view.nbytes(n) for n in chain[1:] if self._in_place(view, n, chain))
            found.append(
                Candidate(
                    self.kind,
                    chain[-1],
                    tuple(chain),
                    f"{len(chain)} elementwise nodes, each read only by the next",
                    saved,
                    {"links": tuple(view.opcode(n) for n in chain)},
                )
            )
        return found

    @staticmethod
    def _in_place(view, n, chain) -> bool:
        dtype = view.spec(n).dtype
        previous = chain[chain.index(n) - 1]
        return (
            view.opcode(n) in _IN_PLACE
            and dtype in (float32, float64)
            and previous in view.operands(n)
            and math.prod(view.spec(n).shape) > 1
        )

    def execute(self, candidate: Candidate, value, network, kernel_of):
        buffers: dict[int, np.ndarray] = {}
        owned = None  # the buffer this chain allocated and may overwrite
        for n in candidate.nodes:
            opcode = network.columns.opcodes[n]
            operands = network.columns.operands[n]
            arrays = [buffers[j] if j in buffers else value(j) for j in operands]
            ufunc = _IN_PLACE.get(opcode.name)
            spec = network.columns.specs[n]
            # Not on one element: NumPy runs a one-element np.add(a, b, out=a) as a reduction, and
            # NaN + NaN then keeps b's NaN where np.add(a, b) keeps a's (and it saves nothing there).
            if owned is not None and ufunc is not None and spec.dtype in (float32, float64) and owned.size > 1 and any(
                a is owned for a in arrays
            ):
                ufunc(*arrays, out=owned)
                result = owned
            else:
                result = np.asarray(kernel_of(n)(*arrays))
                if not result.flags.writeable or result.base is not None:
                    result = np.array(result)
                owned = result
            buffers.clear()
            buffers[n] = result
        return buffers[candidate.root]
