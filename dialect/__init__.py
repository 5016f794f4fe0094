"""The topos MLIR dialect, its passes and the StableHLO lowering (imported as ``topos.dialect``).

Nothing here is imported by ``import topos``: the core stays pure NumPy and
loads MLIR only when a user asks for emission. Importing this package loads
nothing either: the first name used from it (``emit_text``, say) loads the
MLIR bindings and registers the op classes; it builds no IR. So a machine
with IREE's runtime and no compiler still imports ``topos.dialect.compiled``
and runs modules compiled elsewhere (docs/compiling.md, "Compiled on one
machine, run on another").

    from topos.dialect import emit_text, parse_spec
    text = emit_text(network, [loss])          # topos IR, one op per node
    network2, roots, observes = parse_spec(text)
"""

import importlib

# Each public name -> the submodule that defines it.
_PUBLIC = {
    "configure": "context", "new_context": "context",
    "Diagnostic": "diagnostics", "DialectError": "diagnostics", "VerificationError": "diagnostics",
    "emit_module": "emit", "emit_text": "emit",
    "OP_CLASSES": "ops", "ToposOp": "ops", "op_class": "ops", "verify_module": "ops",
    "parse_module": "parse", "parse_spec": "parse",
    "PassFailure": "passes", "register_pass": "passes", "registered_passes": "passes", "run_pipeline": "passes",
    "transform": "passes",
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
