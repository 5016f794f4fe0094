"""Activations and the softmax family as function forms, each a composition of opcodes.

Axes may be negative here (``axis=-1`` is the last), as in PyTorch; the
opcodes themselves take the non-negative axis this resolves to.
"""

from __future__ import annotations

import math

import numpy as np

from topos import ArgumentError, Recordable, ShapeError
from topos.base.provenance import user_site

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def resolve_axis(x: Recordable, axis: int, what: str = "axis") -> int:
    """A non-negative axis of ``x``, or a ShapeError at the user's line."""
    rank = len(x.shape)
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise ArgumentError(f"{user_site()}: {what} must be an int, got {type(axis).__name__} {axis!r}")
    axis = int(axis)
    if not -rank <= axis < rank:
        raise ShapeError(
            f"{user_site()}: {what} {axis!r} is out of range for shape {list(x.shape)}; "
            f"use -{rank}..{rank - 1}" if rank else f"{user_site()}: a rank-0 tensor has no {what}"
        )
    return axis % rank


def relu(x: Recordable) -> Recordable:
    """max(x, 0)."""
    return x.relu()


def sigmoid(x: Recordable) -> Recordable:
    """1 / (1 + exp(-x))."""
    return 1.0 / ((-x).exp() + 1.0)


def silu(x: Recordable) -> Recordable:
    """x * sigmoid(x), spelled x / (1 + exp(-x)) (SiLU, also called swish)."""
    return x / ((-x).exp() + 1.0)


def check_approximate(owner: str, approximate: object) -> str:
    """GELU's ``approximate``: ``"none"`` or ``"tanh"``, else an ArgumentError."""
    if approximate not in ("none", "tanh"):
        raise ArgumentError(f"{owner}: approximate must be 'none' or 'tanh', got {approximate!r}")
    return approximate


def gelu(x: Recordable, approximate: str = "none") -> Recordable:
    """GELU: exact ``x * (1 + erf(x / sqrt 2)) / 2``, or with ``approximate="tanh"`` GPT-2's form.

    The tanh form is ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))``,
    with the cube spelled ``x * x * x``.
    """
    if check_approximate("gelu", approximate) == "none":
        return x.gelu()
    inner = (x + x * x * x * 0.044715) * _SQRT_2_OVER_PI
    return x * 0.5 * (inner.tanh() + 1.0)


def softmax(x: Recordable, axis: int = -1) -> Recordable:
    """exp(log_softmax(x)) along ``axis``."""
    return x.softmax(resolve_axis(x, axis))


def log_softmax(x: Recordable, axis: int = -1) -> Recordable:
    return x.log_softmax(resolve_axis(x, axis))


def dropout(x: Recordable, mask: Recordable) -> Recordable:
    """``x * mask``: the mask is fed (0 or 1/(1-p), from ``topos.init``); all ones means no dropout."""
    return x * mask


__all__ = ["check_approximate", "dropout", "gelu", "log_softmax", "relu", "resolve_axis", "sigmoid", "silu", "softmax"]
