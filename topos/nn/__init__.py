"""Neural-network facades: layers and functions built only from topos's public API (rule 5).

Anything here can be written by hand with the same opcodes and behaves
identically, down to the bits and the fusions a plan finds.
"""

from . import functional
from .functional import batch_norm, batch_norm_inference, conv2d, max_pool

__all__ = ["batch_norm", "batch_norm_inference", "conv2d", "functional", "max_pool"]
