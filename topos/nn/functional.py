"""The function forms of topos.nn: every layer's mathematics as a plain composition of opcodes.

This module holds convolution, max-pooling and batch normalization, and
gathers the rest under one name (``import topos.nn.functional as F``):
activations and softmax (``activation.py``), linear, embedding and the
row normalizations (``normalization.py``), attention (``attention.py``)
and the losses (``loss.py``).

Each function here is a plain composition of opcodes (rule 5): a
hand-written recording of the same opcodes in the same order behaves
identically, and a plan's fusion catalog recognizes either by structure
alone. The exact recording order is part of each function's contract,
because the catalog's patterns (``topos.readings.plan.patterns``) and the bits of
every result depend on it:

* ``conv2d``: optional zero pads (height, then width) -> ``unfold`` of the
  height axis (2) -> ``unfold`` of the width axis, which the first unfold
  moved to axis 4 -> ``permute [0, 2, 4, 1, 3, 5]`` -> ``reshape`` to the
  im2col matrix ``[B*OH*OW, C*kh*kw]`` -> ``matmul`` with the weight laid
  out as ``[C*kh*kw, F]`` -> back to ``[B, F, OH, OW]`` -> ``+ bias``.
  The matmul's k axis therefore runs over (channel, kernel row, kernel
  column), channel slowest.
* ``max_pool``: the same two unfolds -> ``permute [0, 1, 2, 4, 3, 5]`` ->
  ``reshape`` to ``[B, C, OH, OW, size*size]`` -> one ``narrow`` per lane ->
  a left fold of ``maximum`` in lane order (row-major over the window, so
  ties go to the earliest lane) -> ``reshape`` to ``[B, C, OH, OW]``.
* ``batch_norm`` / ``batch_norm_inference``: the textbook formula over
  ``[batch, features]``, statistics broadcast along axis 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import topos.base.arguments as arguments
from topos import Recordable, ShapeError


def _windows(x: Recordable, size: tuple[int, int], stride: tuple[int, int]) -> Recordable:
    """Sliding windows of an NCHW tensor: [B, C, OH, kh, OW, kw]."""
    rows = x.unfold(2, size[0], stride[0])  # [B, C, OH, kh, W]
    return rows.unfold(4, size[1], stride[1])  # [B, C, OH, kh, OW, kw]


def conv2d(
    x: Recordable,
    weight: Recordable,
    bias: Recordable | None = None,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
) -> Recordable:
    """2-D convolution (cross-correlation, as in PyTorch) of NCHW ``x`` by ``[F, C, kh, kw]`` ``weight``.

    ``stride`` and ``padding`` are ints or (height, width) pairs; padding
    adds zeros on both sides. ``bias`` has shape ``[F]``. The result is ``[B, F, OH, OW]`` with
    ``OH = (H + 2*pad_h - kh) // stride_h + 1`` (likewise OW).
    """
    if len(x.shape) != 4 or len(weight.shape) != 4:
        raise ShapeError(
            f"conv2d: input {list(x.shape)} and weight {list(weight.shape)} must both be rank 4 "
            "(input [batch, channels, height, width], weight [filters, channels, kh, kw])"
        )
    batch, channels, height, width = x.shape
    filters, weight_channels, kh, kw = weight.shape
    if weight_channels != channels:
        raise ShapeError(
            f"conv2d: weight {list(weight.shape)} expects {weight_channels} input channels, "
            f"input {list(x.shape)} has {channels}; the weight is [filters, channels, kh, kw]"
        )
    if bias is not None and tuple(bias.shape) != (filters,):
        raise ShapeError(f"conv2d: bias {list(bias.shape)} should be [{filters}], one per filter")
    sh, sw = arguments.sizes("conv2d", "stride", stride, 2)
    ph, pw = arguments.sizes("conv2d", "padding", padding, 2, least=0)
    _check_window("conv2d", x, (kh, kw), (ph, pw), f"the kernel {kh} x {kw} (weight {list(weight.shape)})")
    if ph:
        x = x.pad(2, ph, height + 2 * ph)
    if pw:
        x = x.pad(3, pw, width + 2 * pw)
    windows = _windows(x, (kh, kw), (sh, sw))
    oh, ow = windows.shape[2], windows.shape[4]
    columns = windows.permute((0, 2, 4, 1, 3, 5)).reshape((batch * oh * ow, channels * kh * kw))
    kernel = weight.reshape((filters, channels * kh * kw)).permute((1, 0))
    out = (columns @ kernel).reshape((batch, oh, ow, filters)).permute((0, 3, 1, 2))
    if bias is not None:
        out = out + bias.broadcast_along(1, oh).broadcast_along(2, ow).broadcast_along(0, batch)
    return out


def max_pool(x: Recordable, size: int, stride: int | None = None) -> Recordable:
    """Max-pooling of NCHW ``x`` over ``size x size`` windows (stride defaults to size, no padding).

    Within a window the earliest element in row-major order wins ties, as
    ``maximum`` gives ties to its left operand.
    """
    if len(x.shape) != 4:
        raise ShapeError(f"max_pool: input {list(x.shape)} must be rank 4 [batch, channels, height, width]")
    size = arguments.size("max_pool", "size", size)
    step = size if stride is None else arguments.size("max_pool", "stride", stride)
    _check_window("max_pool", x, (size, size), (0, 0), f"the window {size} x {size}")
    windows = _windows(x, (size, size), (step, step))
    batch, channels, oh, _, ow, _ = windows.shape
    lanes = windows.permute((0, 1, 2, 4, 3, 5)).reshape((batch, channels, oh, ow, size * size))
    best = lanes.narrow(4, 0, 1)
    for lane in range(1, size * size):
        best = best.maximum(lanes.narrow(4, lane, 1))
    return best.reshape((batch, channels, oh, ow))


def _check_window(name: str, x: Recordable, window: tuple[int, int], padding: tuple[int, int], what: str) -> None:
    """A window larger than the (padded) image leaves no output position: say so in the layer's terms."""
    height, width = x.shape[2] + 2 * padding[0], x.shape[3] + 2 * padding[1]
    if window[0] > height or window[1] > width:
        padded = f" padded to {height} x {width}" if any(padding) else ""
        raise ShapeError(
            f"{name}: {what} is larger than the image {x.shape[2]} x {x.shape[3]}{padded} of input "
            f"{list(x.shape)}; use a smaller kernel, pad the input, or feed larger images"
        )


def _along_batch(v: Recordable, batch: int) -> Recordable:
    return v.broadcast_along(0, batch)


def _check_features(name: str, x: Recordable, **vectors: Recordable) -> None:
    if len(x.shape) != 2:
        raise ShapeError(f"{name}: input {list(x.shape)} must be rank 2 [batch, features]")
    for role, v in vectors.items():
        if tuple(v.shape) != (x.shape[1],):
            raise ShapeError(
                f"{name}: {role} {list(v.shape)} should be [{x.shape[1]}], one per feature of {list(x.shape)}"
            )


def batch_norm(
    x: Recordable, scale: Recordable, shift: Recordable, eps: float = 1e-5
) -> tuple[Recordable, Recordable, Recordable]:
    """Batch normalization with batch statistics (training form) -> (output, mean, variance).

    Over ``[batch, features]``: ``(x - mean) / sqrt(variance + eps) * scale + shift``
    with the biased variance (divided by the batch size). The statistics are
    returned so a caller can keep running averages or declare them as results.
    """
    eps = arguments.real("batch_norm", "eps", eps, low=0.0)
    _check_features("batch_norm", x, scale=scale, shift=shift)
    batch = x.shape[0]
    mean = x.mean_along(0)
    centered = x - _along_batch(mean, batch)
    variance = (centered * centered).mean_along(0)
    deviation = (variance + eps).sqrt()
    normalized = centered / _along_batch(deviation, batch)
    out = normalized * _along_batch(scale, batch) + _along_batch(shift, batch)
    return out, mean, variance


def batch_norm_inference(
    x: Recordable,
    mean: Recordable,
    variance: Recordable,
    scale: Recordable,
    shift: Recordable,
    eps: float = 1e-5,
) -> Recordable:
    """Batch normalization with supplied statistics (inference form) over ``[batch, features]``."""
    eps = arguments.real("batch_norm_inference", "eps", eps, low=0.0)
    _check_features("batch_norm_inference", x, mean=mean, variance=variance, scale=scale, shift=shift)
    batch = x.shape[0]
    centered = x - _along_batch(mean, batch)
    normalized = centered / _along_batch((variance + eps).sqrt(), batch)
    return normalized * _along_batch(scale, batch) + _along_batch(shift, batch)


from topos.nn.activation import dropout, gelu, log_softmax, relu, sigmoid, silu, softmax  # noqa: E402
from topos.nn.attention import causal_mask, scaled_dot_product_attention  # noqa: E402
from topos.nn.loss import cross_entropy, mse_loss  # noqa: E402
from topos.nn.normalization import embedding, layer_norm, linear, rms_norm  # noqa: E402

__all__ = [
    "batch_norm", "batch_norm_inference", "causal_mask", "conv2d", "cross_entropy", "dropout", "embedding",
    "gelu", "layer_norm", "linear", "log_softmax", "max_pool", "mse_loss", "relu", "rms_norm",
    "scaled_dot_product_attention", "sigmoid", "silu", "softmax",
]
