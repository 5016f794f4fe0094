"""The topos MLIR dialect, its passes and the StableHLO lowering (imported as ``topos.dialect``).

Nothing here is imported by ``import topos``: the core stays pure NumPy and
loads MLIR only when a user asks for emission. Importing this package loads
the MLIR bindings and registers the op classes; it builds no IR.

    from topos.dialect import emit_text, parse_spec
    text = emit_text(network, [loss])          # topos IR, one op per node
    network2, roots, observes = parse_spec(text)
"""

from .context import configure, new_context
from .diagnostics import Diagnostic, DialectError, VerificationError
from .emit import emit_module, emit_text
from .ops import OP_CLASSES, ToposOp, op_class, verify_module
from .parse import parse_module, parse_spec
from .passes import PassFailure, register_pass, registered_passes, run_pipeline, transform

__all__ = [
    "OP_CLASSES",
    "Diagnostic",
    "DialectError",
    "PassFailure",
    "ToposOp",
    "VerificationError",
    "configure",
    "emit_module",
    "emit_text",
    "new_context",
    "op_class",
    "parse_module",
    "parse_spec",
    "register_pass",
    "registered_passes",
    "run_pipeline",
    "transform",
    "verify_module",
]
