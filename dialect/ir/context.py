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

import importlib.util
import sys
import types

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
        _python_module(name)
    return context


def _python_module(namespace: str) -> None:
    """Give a dialect IREE ships no Python module for (stablehlo, chlo) an empty one.

    Each time the bindings wrap an op of a namespace as an OpView they
    import ``iree.compiler.dialects.<namespace>`` and remember only an
    import that worked, so for stablehlo every wrap searched sys.path again:
    3,669 failed imports, 0.2 s, in one emission of GPT-2 124M's forward. An
    empty module is what the search ends in anyway: ops keep the generic
    OpView. A release that ships the module is imported as it is.
    """
    name = f"iree.compiler.dialects.{namespace}"
    if name not in sys.modules and importlib.util.find_spec(name) is None:
        sys.modules[name] = types.ModuleType(name, f"no Python module ships for {namespace}: generic OpViews")


def new_context() -> ir.Context:
    """A fresh context that accepts topos ops, with func, stablehlo and chlo loaded."""
    return configure(ir.Context())


def is_configured(context: ir.Context) -> bool:
    """True when ``context`` accepts topos ops and has the eager dialects loaded."""
    return context.allow_unregistered_dialects and all(
        context.is_dialect_loaded(name) for name in EAGER_DIALECTS
    )


__all__ = ["EAGER_DIALECTS", "configure", "is_configured", "new_context"]
