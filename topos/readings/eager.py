"""Eager: the recordable vocabulary over arrays, so evaluation is one more reading of the same rules.

A tape ``Value`` records a node when an opcode is expressed on it; an
``Eager`` array runs the opcode's kernel instead (the reference kernel, or
the one ``topos.posture`` picks). The derivative rules are written once
against the recordable vocabulary, so the backward scan runs them on
``Eager`` arrays and ``differentiate`` runs the same bodies on Values.

The opcode layer knows no reading: as JAX's evaluation is one more trace,
this module installs itself in ``topos.spec.opcodes.base`` when it loads,
and from then on ``Opcode.express`` and ``Opcode.vjp`` take plain arrays.
"""

from __future__ import annotations

import numpy as np

import topos.readings.plan.numerics as numerics
from topos.spec.opcodes.base import ArrayReading, Spec, evaluate_arrays_with
from topos.spec.recordable import Recordable


class Eager(Recordable):
    """An array payload: expressing an opcode runs its reference kernel.

    It is held to the tape's shape rules (``Opcode.checked``): operands a
    recording would refuse (two shapes, two element types) are refused
    here too, so an expression that runs eagerly also records.
    """

    __slots__ = ("array", "dtype")

    def __init__(self, array, dtype=None):
        if not isinstance(array, np.ndarray) or array.flags.writeable:
            array = np.array(array)  # a list, a number or the caller's writable array: our own frozen copy
            array.flags.writeable = False
        self.array = array
        self.dtype = array.dtype if dtype is None else dtype

    @property
    def shape(self):
        return self.array.shape

    def _express(self, opcode, operands, attributes):
        specs = [Spec(o.shape, o.dtype) for o in operands]
        if not any(isinstance(s.dtype, np.dtype) and s.dtype.kind in "iu" for s in specs):
            opcode.checked(specs, attributes)  # raw indices (opcode.vjp on arrays) carry no extent to check
        arrays = [o.array for o in operands]
        with np.errstate(all="ignore"):  # IEEE inf/nan results are semantics, not accidents
            out = np.asarray(direct_kernel(opcode, attributes)(*arrays))
        out.flags.writeable = False
        return Eager(out)

    def _constant(self, array):
        array.flags.writeable = False
        return Eager(array)

    def __repr__(self) -> str:
        return f"Eager({self.array!r})"


def eager(x) -> Eager:
    return x if isinstance(x, Eager) else Eager(np.asarray(x))


def uneager(x) -> np.ndarray:
    return x.array if isinstance(x, Eager) else x


def direct_kernel(opcode, attributes):
    """The kernel a direct payload call runs: the reference, unless ``topos.posture`` says otherwise."""
    chosen = numerics.current_posture()
    if chosen is numerics.Numerics.EXACT and not numerics.REGISTERED:
        return lambda *arrays: opcode.kernel(*arrays, **attributes)
    return numerics.kernel_for(opcode, dict(attributes), chosen)


# Loading this module is what lets Opcode.express and Opcode.vjp take plain arrays (import topos loads it).
evaluate_arrays_with(ArrayReading(direct_kernel, eager, uneager))


__all__ = ["Eager", "direct_kernel", "eager", "uneager"]
