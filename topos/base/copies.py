"""What topos hands out is the caller's own: a read-only copy, never a view of state topos keeps.

NumPy's ``writeable`` flag is advice, not protection: ``setflags(write=True)``
flips it back on an array that owns its data, and ``torch.from_numpy``
ignores it. So every reader that returns an array topos also keeps (a
spec payload, a run's value, a parameter slot, a gradient) returns a copy,
marked read-only so that an accidental write still fails loudly.
"""

from __future__ import annotations

import numpy as np


def is_splat(array) -> bool:
    """True for an array of more than one element that stores one (every stride 0: ``np.broadcast_to``'s)."""
    return isinstance(array, np.ndarray) and array.size > 1 and not any(array.strides)


def splat_element(array: np.ndarray) -> np.ndarray:
    """The one stored element of a splat as a rank-0 array of its dtype (read without expanding the view)."""
    return np.array(array[(0,) * array.ndim])


def splat(value, shape) -> np.ndarray:
    """A read-only array of ``shape`` holding the one element of ``value``, stored once.

    A lifted number (``x * 0.044715``) is a leaf of ``x``'s shape; stored
    whole, GPT-2 124M's forward held 91 MiB of such copies. NumPy reads the
    stride-0 view like any array, and the MLIR emission writes it as
    ``dense<v>`` without looking at more than one element.
    """
    return np.broadcast_to(np.array(value).reshape(()), tuple(shape))  # read-only: NumPy refuses writes to it


def own(array) -> np.ndarray:
    """A fresh read-only copy of ``array`` for the caller."""
    copy = np.array(array, copy=True)
    copy.flags.writeable = False
    return copy


def own_stored(array) -> np.ndarray:
    """``own``, but a splat stays a splat: a fresh one-element array broadcast, not the full tensor it spells."""
    return splat(splat_element(array), array.shape) if is_splat(array) else own(array)
