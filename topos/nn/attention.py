"""Scaled dot-product attention and the causal mask, composed from matmul, permute and softmax."""

from __future__ import annotations

import math
from typing import cast

import numpy as np

from topos import ELEMENTS, ArgumentError, Recordable, ShapeError, Value
from topos.base.arguments import broadcasts, flag, real, size
from topos.base.element import convert
from topos.base.provenance import user_site

MASKED = -1e9  # added to a masked score: exp() of it is exactly 0 next to any score of ordinary size


def causal_mask(length: int, source_length: int | None = None, dtype=np.float32) -> np.ndarray:
    """An additive mask ``[length, source_length]``: 0 where query i may see key j (j <= i), MASKED above.

    A read-only array; add it to attention scores (``scaled_dot_product_attention``
    takes it as ``mask``). Top-left aligned like PyTorch's ``is_causal``.
    """
    length = size("causal_mask", "length", length)
    columns = length if source_length is None else size("causal_mask", "source_length", source_length)
    mask = np.array(convert(np.triu(np.full((length, columns), MASKED, dtype=np.float64), k=1), dtype))
    mask.flags.writeable = False
    return mask


def _additive(mask: object) -> np.ndarray:
    """An array mask as the additive one attention adds: a boolean one (True: may attend) made 0 or MASKED."""
    array = np.asarray(mask)
    if array.dtype == np.bool_:
        return np.where(array, 0.0, MASKED)
    if array.dtype.kind not in "iuf" and array.dtype not in ELEMENTS:
        raise ArgumentError(
            f"scaled_dot_product_attention: mask must be a Value or an array of numbers (additive: 0 to attend, "
            f"MASKED to block) or of bools (True to attend), got {type(mask).__name__} {mask!r}"
        )
    return array


def _swap_last(x: Recordable) -> Recordable:
    order = list(range(x.ndim))
    order[-2], order[-1] = order[-1], order[-2]
    return x.permute(order)


def scaled_dot_product_attention(query: Recordable, key: Recordable, value: Recordable, mask=None,
                                 causal: bool = False, scale: float | None = None) -> Recordable:
    """``softmax(query @ key.T * scale + mask) @ value`` over the last two axes.

    ``query`` is ``[..., L, E]``, ``key`` ``[..., S, E]``, ``value`` ``[..., S, Ev]``
    with identical leading axes (batch, heads). ``mask`` is additive: an
    array or a Value of shape ``[L, S]`` (or the scores' full shape). A
    boolean array means what it means to PyTorch: True where a query may
    attend, so it becomes 0 there and MASKED elsewhere. ``causal=True``
    adds :func:`causal_mask`. ``scale`` defaults to ``1 / sqrt(E)``.
    """
    causal = flag("scaled_dot_product_attention", "causal", causal)
    if query.ndim < 2 or key.ndim != query.ndim or value.ndim != query.ndim:
        raise ShapeError(
            f"{user_site()}: scaled_dot_product_attention: query {list(query.shape)}, key "
            f"{list(key.shape)} and value {list(value.shape)} must share their rank (>= 2)"
        )
    if key.shape[-1] != query.shape[-1] or key.shape[-2] != value.shape[-2]:
        raise ShapeError(
            f"{user_site()}: scaled_dot_product_attention: query {list(query.shape)} and key "
            f"{list(key.shape)} must agree on the last axis, key and value {list(value.shape)} on the "
            "second to last"
        )
    length, source = query.shape[-2], key.shape[-2]
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else real("scaled_dot_product_attention", "scale", scale)
    scores = (query @ _swap_last(key)) * scale
    masks = [] if mask is None else [mask]
    if causal:
        masks.append(causal_mask(length, source, query.dtype))
    for m in masks:
        if not isinstance(m, Recordable):
            m = cast(Value, query).tape.leaf(convert(_additive(m), query.dtype))
        if not broadcasts(tuple(m.shape), tuple(scores.shape)):
            raise ShapeError(
                f"{user_site()}: scaled_dot_product_attention: mask {list(m.shape)} does not broadcast to the scores "
                f"{list(scores.shape)}; pass [L, S] = [{length}, {source}] (query length by key length) or the "
                "scores' shape"
            )
        scores = scores + m.broadcast_to(scores.shape)
    return scores.softmax(scores.ndim - 1) @ value


__all__ = ["MASKED", "causal_mask", "scaled_dot_product_attention"]
