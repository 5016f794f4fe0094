"""The one place an ``ir.Context`` for topos IR is made ready.

Two facts from reference/iree-mlir-notes.md §7 decide what "ready" means:

* topos ops are unregistered, so a context that parses or builds them must
  allow unregistered dialects;
* dialects must be loaded *before* IR is built or passes run. A Python
  builder does not load its dialect, and with unregistered dialects allowed
  a ``func.func`` built in a context without ``func`` loaded silently
  becomes an unregistered op (and IREE later crashes on it). A pass that
  creates ``stablehlo`` ops in a context without ``stablehlo`` loaded
  produced corrupted op names.

Every other module takes a context from here instead of calling
``ir.Context()`` itself. Mixing contexts is undefined behaviour that the
bindings do not detect, so a pipeline keeps one context from emission to
compilation: pass the same one along (``emit_module(..., context=...)``).
"""

from __future__ import annotations

from iree.compiler import ir

# Loaded eagerly: the function shell (func), and the lowering targets
# (stablehlo, chlo). Loading is a few milliseconds; the crash it prevents
# is silent.
EAGER_DIALECTS: tuple[str, ...] = ("func", "stablehlo", "chlo")


def configure(context: ir.Context) -> ir.Context:
    """Make an existing context (for example an IREE ``Session().context``) ready for topos IR."""
    context.allow_unregistered_dialects = True
    for name in EAGER_DIALECTS:
        context.dialects[name]  # the lookup loads the dialect
    return context


def new_context() -> ir.Context:
    """A fresh context that accepts topos ops, with func, stablehlo and chlo loaded."""
    return configure(ir.Context())


def is_configured(context: ir.Context) -> bool:
    """True when ``context`` accepts topos ops and has the eager dialects loaded."""
    return context.allow_unregistered_dialects and all(
        context.is_dialect_loaded(name) for name in EAGER_DIALECTS
    )


__all__ = ["EAGER_DIALECTS", "configure", "is_configured", "new_context"]
