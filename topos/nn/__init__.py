"""Neural-network facades: layers and functions built only from topos's public API (rule 5).

Anything here can be written by hand with the same opcodes and behaves
identically, down to the bits and the fusions a plan finds. Modules are
built during a recording and called on its Values; their parameter names
and shapes are those of the equivalent ``torch.nn`` module.
"""

from topos.nn import functional
from topos.nn.functional import batch_norm, batch_norm_inference, conv2d, max_pool
from topos.nn.layers import (
    GELU,
    BatchNorm,
    Conv2d,
    Dropout,
    Embedding,
    Flatten,
    LayerNorm,
    Linear,
    MaxPool2d,
    Mlp,
    MultiHeadAttention,
    ReLU,
    RMSNorm,
    RmsNorm,
    SiLU,
    Tanh,
)
from topos.nn.module import Buffer, Module, ModuleList, Parameter, Sequential, inference, training_reading

__all__ = [
    "BatchNorm", "Buffer", "Conv2d", "Dropout", "Embedding", "Flatten", "GELU", "LayerNorm", "Linear", "MaxPool2d",
    "Mlp", "Module", "ModuleList", "MultiHeadAttention", "Parameter", "RMSNorm", "ReLU", "RmsNorm", "Sequential",
    "SiLU", "Tanh", "batch_norm", "batch_norm_inference", "conv2d", "functional", "inference", "max_pool",
    "training_reading",
]
