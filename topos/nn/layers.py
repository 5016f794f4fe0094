"""The layers: each a Module whose forward is one function form, with PyTorch's names and shapes.

Every layer takes ``dtype`` (float32 by default), ``init`` (an initializer
from ``topos.init``; the default draws what the PyTorch layer draws, with
topos's own generator) and ``generator`` (default: the recording's,
``Tape.current().generator``). A ``torch.nn`` state_dict of the same layer
loads by name (``topos.checkpoint``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from topos import ArgumentError, SelectionType, ShapeError, Tape, Value
from topos import init as initializers
from topos.base.arguments import element, initial, real, size, size_list, sizes
from topos.base.provenance import user_site
from topos.nn import functional as F
from topos.nn.activation import check_approximate
from topos.nn.module import Buffer, Module, Parameter, Sequential, training_reading


def _generator(owner: str, generator):
    if generator is None:
        return Tape.current().generator
    if not isinstance(generator, initializers.Generator):
        raise ArgumentError(
            f"{owner}: generator must be a topos.init.Generator (or None for the recording's), "
            f"got {type(generator).__name__}"
        )
    return generator


def _fan_in_uniform(fan_in: int):
    """PyTorch's default for linear and convolution weights and biases: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(fan_in)
    return initializers.uniform(-bound, bound)


def _eps(owner: str, eps) -> float:
    """A normalization's eps: a finite number >= 0 (PyTorch allows 0); a negative one gives NaN."""
    return real(owner, "eps", eps, low=0.0)


class Linear(Module):
    """``y = x @ weight.T + bias``; ``weight`` is ``[out_features, in_features]``, ``bias`` ``[out_features]``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, dtype=np.float32,
                 init=None, bias_init=None, generator=None):
        super().__init__()
        owner = type(self).__name__
        in_features, out_features = size(owner, "in_features", in_features), size(owner, "out_features", out_features)
        dtype = element(owner, dtype)
        g = _generator(owner, generator)
        self.in_features, self.out_features, self.dtype = in_features, out_features, dtype
        default = _fan_in_uniform(in_features)
        self.weight = Parameter(initial(f"{owner}.weight", init or default, g, (out_features, in_features), dtype))
        self.bias = (Parameter(initial(f"{owner}.bias", bias_init or default, g, (out_features,), dtype))
                     if bias else None)

    def forward(self, x):
        self.check_input(x, self.in_features, dtype=self.dtype)
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, bias={self.bias is not None}"


class Tanh(Module):
    """tanh, as a module for ``Sequential``."""

    def forward(self, x):
        return x.tanh()


class ReLU(Module):
    """max(x, 0), as a module."""

    def forward(self, x):
        return F.relu(x)


class GELU(Module):
    """GELU, exact or (``approximate="tanh"``) GPT-2's form, as a module."""

    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = check_approximate(type(self).__name__, approximate)

    def forward(self, x):
        return F.gelu(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class SiLU(Module):
    """x * sigmoid(x), as a module."""

    def forward(self, x):
        return F.silu(x)


_ACTIVATIONS = {"tanh": Tanh, "relu": ReLU, "gelu": GELU, "silu": SiLU}


class Mlp(Sequential):
    """Linear layers of ``sizes`` with an activation between them: ``Mlp([784, 128, 10])``.

    Laid out as PyTorch's ``nn.Sequential(Linear, Tanh, Linear, ...)``, so
    the names are ``0.weight``, ``0.bias``, ``2.weight``, ... ``activation``
    is ``"tanh"``, ``"relu"``, ``"gelu"`` or ``"silu"``; no activation follows
    the last layer. Other keywords go to every ``Linear``.
    """

    def __init__(self, sizes: Sequence[int], activation: str = "tanh", **linear_options):
        if not isinstance(activation, str) or activation not in _ACTIVATIONS:
            raise ArgumentError(f"Mlp: activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
        sizes = size_list("Mlp", "sizes", sizes)
        layers: list[Module] = []
        for position, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:])):
            if position:
                layers.append(_ACTIVATIONS[activation]())
            layers.append(Linear(fan_in, fan_out, **linear_options))
        super().__init__(*layers)


class Embedding(Module):
    """Rows of ``weight`` (``[num_embeddings, embedding_dim]``, N(0, 1) like PyTorch) picked by a selection."""

    def __init__(self, num_embeddings: int, embedding_dim: int, *, dtype=np.float32, init=None,
                 generator=None):
        super().__init__()
        owner = type(self).__name__
        num_embeddings = size(owner, "num_embeddings", num_embeddings)
        embedding_dim = size(owner, "embedding_dim", embedding_dim)
        dtype = element(owner, dtype)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = Parameter(initial(f"{owner}.weight", init or initializers.normal(0.0, 1.0),
                                        _generator(owner, generator), (num_embeddings, embedding_dim), dtype))

    def forward(self, indices):
        if not isinstance(indices, Value) or not isinstance(indices.dtype, SelectionType):
            raise ShapeError(
                f"{user_site()}: {self._label()} takes a selection of indices (tape.input(..., extent="
                f"{self.num_embeddings}) or topos.selection), got {getattr(indices, 'dtype', type(indices).__name__)}"
            )
        if indices.dtype.extent != self.num_embeddings:
            raise ShapeError(
                f"{user_site()}: {self._label()} has {self.num_embeddings} rows but the selection indexes "
                f"{indices.dtype.extent}; declare the selection with extent={self.num_embeddings}"
            )
        return F.embedding(self.weight, indices)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class Conv2d(Module):
    """2-D convolution of NCHW inputs; ``weight`` ``[out, in, kh, kw]``, ``bias`` ``[out]``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 bias: bool = True, *, dtype=np.float32, init=None, bias_init=None, generator=None):
        super().__init__()
        owner = type(self).__name__
        in_channels, out_channels = size(owner, "in_channels", in_channels), size(owner, "out_channels", out_channels)
        kh, kw = sizes(owner, "kernel_size", kernel_size, 2)
        sizes(owner, "stride", stride, 2)
        sizes(owner, "padding", padding, 2, least=0)
        dtype = element(owner, dtype)
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, (kh, kw)
        self.stride, self.padding, self.dtype = stride, padding, dtype
        g = _generator(owner, generator)
        default = _fan_in_uniform(in_channels * kh * kw)
        self.weight = Parameter(initial(f"{owner}.weight", init or default, g, (out_channels, in_channels, kh, kw),
                                        dtype))
        self.bias = (Parameter(initial(f"{owner}.bias", bias_init or default, g, (out_channels,), dtype))
                     if bias else None)

    def forward(self, x):
        self.check_input(x, self.in_channels, axis=1, rank=(4,), what="channels", dtype=self.dtype)
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}")


class MaxPool2d(Module):
    """Max-pooling of NCHW inputs over ``kernel_size`` windows (``stride`` defaults to the window)."""

    def __init__(self, kernel_size: int, stride: int | None = None):
        super().__init__()
        owner = type(self).__name__
        self.kernel_size = size(owner, "kernel_size", kernel_size)
        self.stride = None if stride is None else size(owner, "stride", stride)

    def forward(self, x):
        return F.max_pool(x, self.kernel_size, self.stride)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}"


class Flatten(Module):
    """Every axis after the first into one: ``[N, C, H, W]`` -> ``[N, C*H*W]``."""

    def forward(self, x):
        self.check_input(x, None)
        if x.ndim < 2:
            raise ShapeError(
                f"{self._label()} takes an input of rank 2 or more ([batch, ...]) and keeps the first axis, "
                f"got {list(x.shape)}; reshape it to [1, ...] for a batch of one, or leave out the Flatten"
            )
        return x.reshape((x.shape[0], -1))


def _affine(owner: str, features: int, dtype, weight: bool, bias: bool, init, bias_init, generator):
    """A normalization's scale (ones by default) and shift (zeros) as Parameters, or None where absent."""
    g = _generator(owner, generator)
    scale = (Parameter(initial(f"{owner}.weight", init or initializers.ones(), g, (features,), dtype))
             if weight else None)
    shift = (Parameter(initial(f"{owner}.bias", bias_init or initializers.zeros(), g, (features,), dtype))
             if bias else None)
    return scale, shift


def _channels_last_rows(x):
    """[N, C, ...] as [rows, C] rows (and how to undo it): batch norm normalizes each channel."""
    if x.ndim == 2:
        return x, lambda y: y
    order = (0,) + tuple(range(2, x.ndim)) + (1,)
    moved = x.permute(order)
    inverse = tuple(order.index(axis) for axis in range(x.ndim))
    return moved.reshape((-1, x.shape[1])), lambda y: y.reshape(moved.shape).permute(inverse)


class BatchNorm(Module):
    """Batch normalization over the channel axis 1 of ``[N, C]``, ``[N, C, L]`` or ``[N, C, H, W]``.

    Two readings over one set of slots: ``bn(x)`` (training) normalizes by
    the batch's statistics and records the next running statistics
    (``running = (1 - momentum) * running + momentum * batch``, the
    variance unbiased as in PyTorch), which ``module.state_updates()`` hands
    to the training entry; ``bn(x, training=False)``, or any call inside a
    ``with nn.inference():`` block (so a whole ``Sequential`` reads this way),
    normalizes by ``running_mean`` and ``running_var``, both state slots. PyTorch's
    ``num_batches_tracked`` counter is not kept (``momentum`` is fixed).
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = True, *,
                 dtype=np.float32, init=None, bias_init=None, generator=None):
        super().__init__()
        owner = type(self).__name__
        num_features, eps, dtype = size(owner, "num_features", num_features), _eps(owner, eps), element(owner, dtype)
        momentum = real(owner, "momentum", momentum, low=0.0, high=1.0)
        self.num_features, self.eps, self.momentum, self.dtype = num_features, eps, momentum, dtype
        self.weight, self.bias = _affine(owner, num_features, dtype, affine, affine, init, bias_init, generator)
        self.running_mean = Buffer(np.zeros(num_features, dtype))
        self.running_var = Buffer(np.ones(num_features, dtype))

    def forward(self, x, training: bool | None = None):
        training = training_reading(training)
        self.check_input(x, self.num_features, axis=1, rank=(2, 3, 4), what="channels", dtype=self.dtype)
        rows, restore = _channels_last_rows(x)
        scale = self.weight if self.weight is not None else rows.tape.leaf(np.ones(self.num_features, self.dtype))
        shift = self.bias if self.bias is not None else rows.tape.leaf(np.zeros(self.num_features, self.dtype))
        if not training:
            return restore(F.batch_norm_inference(rows, self.running_mean, self.running_var, scale, shift, self.eps))
        count = rows.shape[0]
        if count == 1:  # the batch variance of one value is 0: the output would be zeros, running_var pulled to 0
            raise ShapeError(
                f"{self._label()} in training needs more than one value per channel, but the input "
                f"{list(x.shape)} has one; train on a batch of 2 or more, or read it for inference "
                "(training=False, or inside `with nn.inference():`)"
            )
        out, mean, variance = F.batch_norm(rows, scale, shift, self.eps)
        unbiased = variance * (count / (count - 1))
        keep = 1.0 - self.momentum
        self.record_update(self.running_mean, self.running_mean * keep + mean * self.momentum)
        self.record_update(self.running_var, self.running_var * keep + unbiased * self.momentum)
        return restore(out)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"


class LayerNorm(Module):
    """Normalization over the last axis with ``weight`` (ones) and ``bias`` (zeros) of ``[normalized_shape]``."""

    def __init__(self, normalized_shape: int, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, *, dtype=np.float32, init=None, bias_init=None, generator=None):
        super().__init__()
        owner = type(self).__name__
        if isinstance(normalized_shape, (tuple, list)):
            if len(normalized_shape) != 1:
                raise ArgumentError(
                    f"{owner} normalizes the last axis; normalized_shape {tuple(normalized_shape)} has "
                    f"{len(normalized_shape)} extents, give one (the size of the last axis)"
                )
            normalized_shape = normalized_shape[0]
        normalized_shape = size(owner, "normalized_shape", normalized_shape)
        eps, dtype = _eps(owner, eps), element(owner, dtype)
        self.normalized_shape, self.eps, self.dtype = normalized_shape, eps, dtype
        self.weight, self.bias = _affine(owner, normalized_shape, dtype, elementwise_affine,
                                         elementwise_affine and bias, init, bias_init, generator)

    def forward(self, x):
        self.check_input(x, self.normalized_shape, dtype=self.dtype)
        return F.layer_norm(x, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class RmsNorm(Module):
    """Root-mean-square normalization over the last axis with a ``weight`` (ones); PyTorch's ``nn.RMSNorm``."""

    def __init__(self, normalized_shape: int, eps: float | None = None, elementwise_affine: bool = True, *,
                 dtype=np.float32, init=None, generator=None):
        super().__init__()
        owner = type(self).__name__
        normalized_shape = size(owner, "normalized_shape", normalized_shape)
        eps, dtype = None if eps is None else _eps(owner, eps), element(owner, dtype)
        self.normalized_shape, self.eps, self.dtype = normalized_shape, eps, dtype
        self.weight, _ = _affine(owner, normalized_shape, dtype, elementwise_affine, False, init, None, generator)

    def forward(self, x):
        self.check_input(x, self.normalized_shape, dtype=self.dtype)
        return F.rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


RMSNorm = RmsNorm


class Dropout(Module):
    """Inverted dropout by a fed mask: each call records an input ``<path>.mask`` of ones by default.

    No random numbers in the graph and no train/eval flag: feed masks
    from ``generator.dropout_mask(shape, p)`` (or ``model.dropout_feeds(generator)``)
    when training, and feed nothing to evaluate.
    """

    def __init__(self, p: float = 0.5):
        super().__init__()
        self.p = real(type(self).__name__, "p", p, low=0.0, high=1.0, high_open=True)

    def forward(self, x):
        self.check_input(x, None)
        if isinstance(x.dtype, SelectionType):
            raise ShapeError(
                f"{user_site()}: {self._label()} masks float values, but the input {list(x.shape)} is {x.dtype}, "
                "a selection (indices); drop out the values the indices pick (an embedding's output) instead"
            )
        key = "mask" if not self._inputs else f"mask.{len(self._inputs)}"
        mask = self.record_input(key, np.ones(x.shape, x.dtype))
        return F.dropout(x, mask)

    def masks(self) -> list[Value]:
        """The mask inputs this module recorded, one per call."""
        return list(self._inputs.values())

    def mask_feeds(self, generator) -> dict:
        initializers.checked_generator(f"{self._label()}.mask_feeds", generator)
        return {mask.symbol: generator.dropout_mask(mask.shape, self.p, mask.dtype) for mask in self.masks()}

    @property
    def mask(self) -> Value:
        """The mask input of the module's one call."""
        masks = self.masks()
        if len(masks) != 1:
            raise ShapeError(f"{self._label()} was called {len(masks)} times; read .masks() for each call's mask")
        return masks[0]

    def extra_repr(self) -> str:
        return f"p={self.p}"


class MultiHeadAttention(Module):
    """Multi-head attention as PyTorch's ``nn.MultiheadAttention(batch_first=True)``.

    Slots: ``in_proj_weight`` ``[3E, E]`` (xavier uniform), ``in_proj_bias``
    ``[3E]`` (zeros), ``out_proj.weight`` ``[E, E]``, ``out_proj.bias``
    (zeros). ``mha(query)`` is self-attention; ``mha(query, key, value)``
    attends from query ``[B, L, E]`` to key/value ``[B, S, E]``. ``mask`` is
    additive ``[L, S]``; ``causal=True`` adds the causal mask. Returns
    ``[B, L, E]`` (no attention weights).
    """

    def __init__(self, embed_dim: int, num_heads: int, bias: bool = True, *, dtype=np.float32, init=None,
                 generator=None):
        super().__init__()
        owner = type(self).__name__
        embed_dim, num_heads = size(owner, "embed_dim", embed_dim), size(owner, "num_heads", num_heads)
        if embed_dim % num_heads:
            raise ArgumentError(
                f"{owner}: embed_dim {embed_dim} is not divisible by {num_heads} heads; pick num_heads "
                f"among the divisors of {embed_dim}"
            )
        dtype = element(owner, dtype)
        g = _generator(owner, generator)
        self.embed_dim, self.num_heads, self.dtype = embed_dim, num_heads, dtype
        self.in_proj_weight = Parameter(initial(f"{owner}.in_proj_weight", init or initializers.xavier_uniform(), g,
                                                (3 * embed_dim, embed_dim), dtype))
        self.in_proj_bias = Parameter(np.zeros(3 * embed_dim, dtype)) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias, dtype=dtype, generator=g,
                               bias_init=initializers.zeros())

    def forward(self, query, key=None, value=None, mask=None, causal: bool = False):
        e, h = self.embed_dim, self.num_heads
        self.check_input(query, e, rank=(3,), dtype=self.dtype)
        key = query if key is None else key
        value = key if value is None else value
        for other in (key, value):
            self.check_input(other, e, rank=(3,), dtype=self.dtype)
        if query is key and key is value:  # self-attention: one projection for q, k and v
            qkv = F.linear(query, self.in_proj_weight, self.in_proj_bias)
            q, k, v = (qkv.narrow(2, i * e, e) for i in range(3))
        else:
            q, k, v = (F.linear(x, self.in_proj_weight.narrow(0, i * e, e),
                                None if self.in_proj_bias is None else self.in_proj_bias.narrow(0, i * e, e))
                       for i, x in enumerate((query, key, value)))

        def heads(x):
            batch, length, _ = x.shape
            return x.reshape((batch, length, h, e // h)).permute((0, 2, 1, 3))

        attended = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), mask, causal)
        batch, length = query.shape[0], query.shape[1]
        return self.out_proj(attended.permute((0, 2, 1, 3)).reshape((batch, length, e)))

    def extra_repr(self) -> str:
        return f"{self.embed_dim}, num_heads={self.num_heads}"


__all__ = [
    "BatchNorm", "Conv2d", "Dropout", "Embedding", "Flatten", "GELU", "LayerNorm", "Linear", "MaxPool2d", "Mlp",
    "MultiHeadAttention", "RMSNorm", "ReLU", "RmsNorm", "SiLU", "Tanh",
]
