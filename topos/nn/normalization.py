"""Affine maps, embeddings and the per-row normalizations, as function forms over Values.

Weights use PyTorch's layouts (a linear weight is ``[out_features,
in_features]``), so checkpoints move between the two by name alone.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from topos import Recordable, ShapeError
from topos.base.arguments import broadcasts, real
from topos.base.provenance import user_site


def linear(x: Recordable, weight: Recordable, bias: Recordable | None = None) -> Recordable:
    """``x @ weight.T + bias`` over the last axis of ``x`` (``weight`` is ``[out, in]``).

    A rank-2 ``x`` is ``[rows, in]``; any other rank is flattened to rows
    and back, so ``[batch, time, in]`` gives ``[batch, time, out]``.
    """
    if weight.ndim != 2:
        raise ShapeError(
            f"{user_site()}: linear: weight {list(weight.shape)} must be rank 2, [out_features, in_features]"
        )
    out_features, in_features = weight.shape
    if x.ndim == 0 or x.shape[-1] != in_features:
        raise ShapeError(
            f"{user_site()}: linear: input {list(x.shape)} should end in {in_features} features for "
            f"weight {list(weight.shape)} ([out_features, in_features])"
        )
    lead = x.shape[:-1]
    rows = int(np.prod(lead)) if lead else 1
    flat = x if x.ndim == 2 else x.reshape((rows, in_features))
    y = flat @ weight.permute((1, 0))
    if bias is not None:
        y = y + bias.broadcast_along(0, rows)
    return y if x.ndim == 2 else y.reshape(lead + (out_features,))


def embedding(weight: Recordable, indices: Recordable) -> Recordable:
    """Rows of ``weight`` picked by ``indices`` (a selection): shape ``indices.shape + [dim]``."""
    return weight.gather(indices)


def _check_affine(name: str, x: Recordable, **vectors: Recordable | None) -> None:
    """The scale and shift hold one value per element of the normalized (last) axis (or broadcast to ``x``)."""
    for role, v in vectors.items():
        if v is not None and not broadcasts(tuple(v.shape), tuple(x.shape)):
            raise ShapeError(
                f"{name}: {role} {list(v.shape)} should be [{x.shape[-1]}], one per element of the last axis "
                f"of {list(x.shape)}"
            )


def _last_axis_mean(x: Recordable) -> Recordable:
    axis = x.ndim - 1
    return x.mean_along(axis).broadcast_along(axis, x.shape[axis])


def layer_norm(x: Recordable, weight: Recordable | None = None, bias: Recordable | None = None,
               eps: float = 1e-5) -> Recordable:
    """Normalize over the last axis: ``(x - mean) / sqrt(var + eps) * weight + bias`` (biased variance)."""
    eps = real("layer_norm", "eps", eps, low=0.0)
    _check_affine("layer_norm", x, weight=weight, bias=bias)
    centered = x - _last_axis_mean(x)
    y = centered / (_last_axis_mean(centered * centered) + eps).sqrt()
    if weight is not None:
        y = y * weight.broadcast_to(x.shape)
    if bias is not None:
        y = y + bias.broadcast_to(x.shape)
    return y


def rms_norm(x: Recordable, weight: Recordable | None = None, eps: float | None = None) -> Recordable:
    """``x / sqrt(mean(x * x) + eps) * weight`` over the last axis.

    ``eps`` defaults to the machine epsilon of the element type, as
    ``torch.nn.RMSNorm`` does.
    """
    square = x * x  # first: a selection is refused here, by the opcode, before finfo would choke on it
    eps = float(ml_dtypes.finfo(x.dtype).eps) if eps is None else real("rms_norm", "eps", eps, low=0.0)
    _check_affine("rms_norm", x, weight=weight)
    y = x / (_last_axis_mean(square) + eps).sqrt()
    return y if weight is None else y * weight.broadcast_to(x.shape)


__all__ = ["embedding", "layer_norm", "linear", "rms_norm"]
