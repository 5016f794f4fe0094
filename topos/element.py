"""Element types: the number formats a tensor can hold, and how each one computes.

The element type is a named seam. Each element names its *compute* type:
the format arithmetic happens in before the result is rounded once back to
the element. float32 and float64 compute in themselves; bfloat16 computes
and accumulates in float32 (products of two bfloat16 values are exact in
float32, and sums keep 16 more bits than the element holds).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .errors import ShapeError

float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
bfloat16 = np.dtype(ml_dtypes.bfloat16)

ELEMENTS: tuple[np.dtype, ...] = (float32, float64, bfloat16)
_SHORT = {float32: "f32", float64: "f64", bfloat16: "bf16"}
_COMPUTE: dict[np.dtype, np.dtype] = {float32: float32, float64: float64, bfloat16: float32}


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
    return _SHORT[np.dtype(dtype)]  # type: ignore[call-overload]


def compute_type(dtype: np.dtype) -> np.dtype:
    """The type arithmetic and accumulation use before rounding back to ``dtype``."""
    return _COMPUTE[dtype]


def round_to(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Round a compute-type result once to its element type (a no-op when they agree)."""
    if array.dtype == dtype:
        return array
    return array.astype(dtype)


def convert(value, dtype) -> np.ndarray:
    """``value`` (a number, a list, an array) as an array of element type ``dtype``, rounded once.

    Every conversion of a user's number into a tensor goes through here:
    feeds, Python scalars beside a Value, replaced slots, learning rates.
    NumPy's cast into bfloat16 (ml_dtypes) goes through float32 and so
    rounds twice (``1 + 2**-8 + 2**-30`` becomes 1.0, not ``1 + 2**-7``);
    a source wider than float32 is therefore widened exactly to float64
    and rounded once by ``refmath.round_once``.
    """
    dtype = np.dtype(dtype)
    array = np.asarray(value)
    if array.dtype == dtype:
        return array
    if dtype == bfloat16 and array.dtype not in (float32, bfloat16):
        from .refmath import round_once

        return round_once(array.astype(np.float64), dtype)
    return array.astype(dtype)


def host_array(value):
    """``value`` as a NumPy array when it is a torch tensor, a jax array or another DLPack exporter; else ``value``.

    The door foreign arrays come in by: feeds (``interpret.bind_feeds``,
    which every oracle run and compiled call uses), and parameter sources
    and reads through ``topos.interop.arrays``. Where the memory is on the
    host the result is a view of it, not a copy: a run copies its feeds
    itself, and IREE copies them to its device. A torch tensor is detached
    first (a feed is data; a gradient would never flow back into torch),
    moved to the CPU if it lives elsewhere, and bfloat16, which NumPy cannot
    hold, is read through a uint16 view as ml_dtypes.bfloat16, bit for bit.
    torch and jax are recognised through the modules already imported (a
    torch tensor exists only once torch is), so topos imports neither.
    """
    if isinstance(value, (np.ndarray, np.generic)):  # the common case, first: every step feeds arrays
        return value
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().resolve_conj().resolve_neg()
        if tensor.dtype == torch.bfloat16:
            return tensor.view(torch.uint16).numpy().view(bfloat16)
        return tensor.numpy()
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(value, getattr(jax, "Array", ())):
        return np.asarray(value)  # jax hands NumPy bfloat16 as ml_dtypes.bfloat16 itself
    if hasattr(value, "__dlpack__"):
        return np.from_dlpack(value)
    return value


@dataclass(frozen=True, init=False)
class Selection:
    """Indices into a table of ``extent`` rows, recorded as a leaf or fed as an input.

    Build one with ``topos.selection(indices, extent)`` and pass it to
    ``tape.leaf`` or ``tape.input``; a fed selection is a plain integer array.
    Constructing one directly validates it the same way.
    """

    indices: np.ndarray
    extent: int

    # Written out rather than generated: a generated __init__ has no source file, and an
    # error's site must be the user's line.
    def __init__(self, indices, extent: int):
        object.__setattr__(self, "indices", indices)
        object.__setattr__(self, "extent", extent)
        self._validate()

    def _validate(self):
        extent = self.extent
        if isinstance(extent, bool) or not isinstance(extent, (int, np.integer)) or extent < 1:
            raise ShapeError(f"selection extent must be a positive integer, got {extent!r}")
        array = integer_indices(self.indices)
        check_indices(array, int(extent))
        array.flags.writeable = False
        object.__setattr__(self, "indices", array)
        object.__setattr__(self, "extent", int(extent))


def selection(indices, extent: int) -> Selection:
    """Index payload for gather/scatter: integers, each in ``[0, extent)``."""
    return Selection(indices, extent)


def integer_indices(indices) -> np.ndarray:
    """A fresh int64 array of ``indices``, refusing anything that is not integers (floats, booleans)."""
    array = np.asarray(indices)
    if array.dtype.kind not in "iu":
        kind = "booleans (a mask, not indices)" if array.dtype.kind == "b" else f"{array.dtype} values"
        raise ShapeError(
            f"selection indices must be integers, got {kind}; convert deliberately, e.g. "
            "np.flatnonzero(mask) for a mask or np.round(x).astype(int) for whole floats"
        )
    if array.dtype.kind == "u" and array.size and int(array.max()) > np.iinfo(np.int64).max:
        raise ShapeError("selection indices do not fit in int64")
    return np.array(array, dtype=np.int64)


def check_indices(array: np.ndarray, extent: int) -> None:
    """Raise a ShapeError (a ValueError) naming the first index outside ``[0, extent)``."""
    if not array.size or (array.min() >= 0 and array.max() < extent):  # two reductions, no temporaries
        return
    bad = (array < 0) | (array >= extent)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ShapeError(
            f"selection index {int(array[where])} at position {where} is outside [0, {extent}); "
            f"a selection picks rows of a table of {extent} rows: filter or clip the indices, or declare "
            "the extent of the table they index"
        )
