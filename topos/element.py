"""Element types: the number formats a tensor can hold, and how each one computes.

The element type is a named seam. Each element names its *compute* type:
the format arithmetic happens in before the result is rounded once back to
the element. float32 and float64 compute in themselves; bfloat16 computes
and accumulates in float32 (products of two bfloat16 values are exact in
float32, and sums keep 16 more bits than the element holds).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
bfloat16 = np.dtype(ml_dtypes.bfloat16)

ELEMENTS: tuple[np.dtype, ...] = (float32, float64, bfloat16)
_SHORT = {float32: "f32", float64: "f64", bfloat16: "bf16"}
_COMPUTE = {float32: float32, float64: float64, bfloat16: float32}


@dataclass(frozen=True)
class SelectionType:
    """The type of an index payload: integers in ``[0, extent)`` that pick rows of a table."""

    extent: int

    def __str__(self) -> str:
        return f"index<{self.extent}>"


Element = "np.dtype | SelectionType"


def is_element(dtype: object) -> bool:
    """True when ``dtype`` is one of the floating element types."""
    return isinstance(dtype, np.dtype) and dtype in _SHORT


def short_name(dtype: object) -> str:
    """The spelling used in describe lines and MLIR types: f32, f64, bf16, index<n>."""
    if isinstance(dtype, SelectionType):
        return str(dtype)
    return _SHORT[np.dtype(dtype)]


def compute_type(dtype: np.dtype) -> np.dtype:
    """The type arithmetic and accumulation use before rounding back to ``dtype``."""
    return _COMPUTE[dtype]


def round_to(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Round a compute-type result once to its element type (a no-op when they agree)."""
    if array.dtype == dtype:
        return array
    return array.astype(dtype)


@dataclass(frozen=True)
class Selection:
    """Indices into a table of ``extent`` rows, recorded as a leaf or fed as an input.

    Build one with ``topos.selection(indices, extent)`` and pass it to
    ``tape.leaf`` or ``tape.input``; a fed selection is a plain integer array.
    """

    indices: np.ndarray
    extent: int


def selection(indices, extent: int) -> Selection:
    """Index payload for gather/scatter: ``indices`` must lie in ``[0, extent)``."""
    array = np.array(indices, dtype=np.int64)
    if not isinstance(extent, (int, np.integer)) or extent < 1:
        raise ValueError(f"selection extent must be a positive integer, got {extent!r}")
    check_indices(array, int(extent))
    array.flags.writeable = False
    return Selection(array, int(extent))


def check_indices(array: np.ndarray, extent: int) -> None:
    """Raise ValueError naming the first index outside ``[0, extent)``."""
    bad = (array < 0) | (array >= extent)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"selection index {int(array[where])} at position {where} is outside [0, {extent})"
        )
