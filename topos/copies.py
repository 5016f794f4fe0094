"""What topos hands out is the caller's own: a read-only copy, never a view of state topos keeps.

NumPy's ``writeable`` flag is advice, not protection: ``setflags(write=True)``
flips it back on an array that owns its data, and ``torch.from_numpy``
ignores it. So every reader that returns an array topos also keeps (a
spec payload, a run's value, a parameter slot, a gradient) returns a copy,
marked read-only so that an accidental write still fails loudly.
"""

from __future__ import annotations

import numpy as np


def own(array) -> np.ndarray:
    """A fresh read-only copy of ``array`` for the caller."""
    copy = np.array(array, copy=True)
    copy.flags.writeable = False
    return copy
