"""Whether this machine has IREE's compiler (the MLIR bindings of iree-base-compiler), and the one refusal when not.

Running a compiled module needs only iree-base-runtime; emitting, lowering
and compiling need iree-base-compiler. Nothing here imports the bindings
when it loads, so a machine with the runtime alone imports it and is told
what it lacks when it asks for what needs them.
"""

from __future__ import annotations

from topos.base.errors import TargetError


def compiler_missing() -> str | None:
    """Why IREE's compiler cannot be imported in this process (iree-base-compiler is not installed), or None."""
    try:
        import iree.compiler.api  # noqa: F401
    except ImportError as error:
        return str(error)
    return None


def require_compiler(needed_by: str, fix: str = "") -> None:
    """Raise a TargetError saying ``needed_by`` needs IREE's compiler, when this machine has only its runtime.

    Running a compiled module needs only iree-base-runtime; lowering and
    compiling need the MLIR bindings and the compiler of iree-base-compiler.
    ``fix`` replaces the default way out.
    """
    if (missing := compiler_missing()) is None:
        return
    raise TargetError(
        f"{needed_by} needs IREE's compiler, which is not installed here ({missing}): "
        + (fix or "pip install iree-base-compiler (the topos[mlir] extra installs both halves of IREE). "
                  "A machine with only iree-base-runtime runs the modules compiled elsewhere: compile them "
                  "there into a cache directory (compile(..., cache=DIR)), copy DIR here and compile with "
                  "the same cache= (docs/deploy.md)")
    )


__all__ = ["compiler_missing", "require_compiler"]
