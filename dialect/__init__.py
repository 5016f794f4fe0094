"""The topos MLIR dialect, its passes and the StableHLO lowering (imported as ``topos.dialect``).

Nothing here is imported by ``import topos``: the core stays pure NumPy and
loads MLIR only when a user asks for emission. Importing this package loads
nothing either: the first name used from it (``emit_text``, say) loads the
MLIR bindings and registers the op classes; it builds no IR. So a machine
with IREE's runtime and no compiler still imports ``topos.dialect.iree.compiled``
and runs modules compiled elsewhere (docs/compiling.md, "Compiled on one
machine, run on another").

    from topos.dialect import emit_text, parse_spec
    text = emit_text(network, [loss])          # topos IR, one op per node
    network2, roots, observes = parse_spec(text)
"""

import importlib

# Each public name -> the submodule that defines it.
_PUBLIC = {
    "configure": "ir.context", "new_context": "ir.context",
    "Diagnostic": "ir.diagnostics", "DialectError": "ir.diagnostics", "VerificationError": "ir.diagnostics",
    "emit_module": "ir.emit", "emit_text": "ir.emit",
    "OP_CLASSES": "ir.ops", "ToposOp": "ir.ops", "op_class": "ir.ops", "verify_module": "ir.ops",
    "parse_module": "ir.parse", "parse_spec": "ir.parse",
    "PassFailure": "passes.registry", "register_pass": "passes.registry", "registered_passes": "passes.registry",
    "run_pipeline": "passes.registry",
    "transform": "passes.registry",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    globals()[name] = value  # once: later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
