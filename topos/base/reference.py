"""Reference reductions and products: one documented order, no BLAS, no FMA.

NumPy's ``sum`` and ``@`` choose their association order by build, SIMD
width and thread count, so their last bits move between machines. The
oracle instead fixes the order here, using only elementwise ufuncs whose
results are IEEE-exact:

* ``pairwise_sum`` halves the axis repeatedly: element ``i`` is added to
  element ``i + h`` (``h = n // 2``); an odd leftover rides along unchanged
  to the next level. The tree depends only on the extent.
* ``matmul`` accumulates ``k`` in ascending order, one multiply then one
  add per step (two roundings, never a fused multiply-add).
Fold and scatter state their own orders beside their kernels (lane by
lane; rows in ascending position). All of these work in the element's compute type (float32 for bfloat16) and
leave the final rounding to the caller.
"""

from __future__ import annotations

import numpy as np


def pairwise_sum(x: np.ndarray, axis: int) -> np.ndarray:
    """Sum ``x`` along ``axis`` with the fixed halving tree; the axis is removed."""
    x = np.moveaxis(x, axis, 0)
    n = x.shape[0]
    if n == 0:
        return np.zeros(x.shape[1:], dtype=x.dtype)
    while n > 1:
        half = n // 2
        paired = x[:half] + x[half : 2 * half]
        x = np.concatenate([paired, x[2 * half :]]) if n % 2 else paired
        n = x.shape[0]
    return x[0:1].reshape(x.shape[1:]).copy()


def full_sum(x: np.ndarray) -> np.ndarray:
    """Sum every element in row-major order through the halving tree (rank 0 result)."""
    return pairwise_sum(x.reshape(-1), 0)


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` over the last two axes, accumulating k in ascending order."""
    k = a.shape[-1]
    out = a[..., :, 0:1] * b[..., 0:1, :]
    product = np.empty_like(out)
    for j in range(1, k):
        np.multiply(a[..., :, j : j + 1], b[..., j : j + 1, :], out=product)
        np.add(out, product, out=out)
    return out
