"""Diagnostics and locations: how the dialect says what went wrong, and where.

Every failure the dialect reports (a parse error, a verifier verdict, a pass
failure) is a :class:`Diagnostic` carrying an MLIR location. A node's
location is ``loc("%<index> <opcode>"("<file>":<line>:0))``: the node's
name fused with the user's recording line, so an error found in the IR
points back to the Python line that recorded the node.
"""

from __future__ import annotations

import importlib
import os
import traceback
from collections.abc import Iterable
from dataclasses import dataclass

from iree.compiler import ir

from topos.errors import ToposError
from topos.provenance import UNKNOWN, Site

SEVERITIES = ("error", "warning", "remark", "note")


@dataclass(frozen=True)
class Diagnostic:
    """One message about the IR: a severity, the text, where it points, and attached notes."""

    severity: str
    message: str
    location: ir.Location | None = None
    notes: tuple[Diagnostic, ...] = ()

    @classmethod
    def error(cls, message: str, where: ir.Location | ir.Operation | ir.OpView | None = None):
        """An error at an op's location (or at a location, or nowhere)."""
        return cls("error", message, _location_of(where))

    @classmethod
    def from_mlir(cls, info) -> Diagnostic:
        """Convert the bindings' ``DiagnosticInfo`` (from an ``MLIRError``)."""
        severity = str(info.severity).rsplit(".", 1)[-1].lower()
        return cls(
            severity if severity in SEVERITIES else "error",
            info.message,
            info.location,
            tuple(cls.from_mlir(n) for n in info.notes),
        )

    def position(self) -> tuple[str, int, int] | None:
        """(file, line, column) of the innermost file location, or None when unknown."""
        return file_position(self.location) if self.location is not None else None

    def __str__(self) -> str:
        return format_diagnostic(self)


class DialectError(ToposError):
    """The IR could not be read, verified or transformed; ``diagnostics`` says where and why."""

    def __init__(self, diagnostics: Iterable[Diagnostic]):
        self.diagnostics = tuple(diagnostics)
        super().__init__("\n".join(str(d) for d in self.diagnostics))

    @classmethod
    def from_mlir(cls, error: ir.MLIRError, fallback: str = "") -> DialectError:
        found = [Diagnostic.from_mlir(d) for d in error.error_diagnostics]
        return cls(found or [Diagnostic("error", fallback or str(error))])


class VerificationError(DialectError):
    """A topos op breaks its opcode's rules (operand count, types, shapes or attributes)."""


def _location_of(where) -> ir.Location | None:
    if where is None or isinstance(where, ir.Location):
        return where
    return where.location


# ---- locations --------------------------------------------------------------------------


def node_location(index: int, opcode: str, site: Site, name: str | None = None, role: str = "") -> ir.Location:
    """The location of node ``index``: its label wrapped around the user's recording line.

    The label is ``%3 map``; a named source adds its name and role
    (``%1 parameter fc1.weight``, ``%9 parameter optim.step [state]``), so
    diagnostics name the parameter and ``parse_spec`` reads names back.
    """
    label = f"%{index} {opcode}" + (f" {name}" if name else "") + (f" [{role}]" if role else "")
    return ir.Location.name(label, childLoc=ir.Location.file(site.file, site.line, 0))


def source_label(label: str) -> tuple[str | None, str]:
    """(name, role) of a node label written by :func:`node_location`."""
    words = label.split(" ")
    role = words.pop()[1:-1] if len(words) > 2 and words[-1].startswith("[") else ""
    return (words[2] if len(words) > 2 else None), role


def downcast(location: ir.Location) -> ir.Location:
    """The specific location class (diagnostics hand back plain ``ir.Location`` objects)."""
    if type(location) is ir.Location:
        return ir.Location.from_attr(location.attr, context=location.context)
    return location


def file_position(location: ir.Location) -> tuple[str, int, int] | None:
    """(file, line, column) of the first file location inside ``location``."""
    location = downcast(location)
    if isinstance(location, ir.FileLineColLoc):
        return location.filename, location.start_line, location.start_col
    if isinstance(location, ir.NameLoc):
        return file_position(location.child_loc)
    if isinstance(location, ir.CallSiteLoc):
        return file_position(location.callee) or file_position(location.caller)
    if isinstance(location, ir.FusedLoc):
        for inner in location.locations:
            found = file_position(inner)
            if found:
                return found
    return None


def site_of(location: ir.Location) -> Site:
    """The recording site a location names (the function name is not carried by locations)."""
    found = file_position(location)
    if found is None:
        return UNKNOWN
    file, line, _ = found
    return Site(file, line, UNKNOWN.function)


def name_of(location: ir.Location) -> str | None:
    """The node name (``%3 map``) a node location carries, if any."""
    location = downcast(location)
    return location.name_str if isinstance(location, ir.NameLoc) else None


_IMPORTLIB = os.path.dirname(importlib.__file__) + os.sep


def python_location(
    error: BaseException, context: ir.Context | None = None, ignore: tuple[str, ...] = ()
) -> ir.Location | None:
    """Where a Python exception was raised (its innermost frame), as a file location.

    For a SyntaxError, the offending line and column. None when the
    exception carries no frame outside Python's import machinery and the
    files in ``ignore`` (the caller's own).
    """
    if isinstance(error, SyntaxError) and error.filename and error.lineno:
        return ir.Location.file(error.filename, error.lineno, error.offset or 0, context=context)
    frames = [
        frame for frame in traceback.extract_tb(error.__traceback__)
        # <frozen importlib._bootstrap> and importlib/ are Python's; a module's own lines are not.
        if not frame.filename.startswith(("<", _IMPORTLIB)) and frame.filename not in ignore
    ]
    if not frames:
        return None
    return ir.Location.file(frames[-1].filename, frames[-1].lineno or 0, 0, context=context)


def one_line(error: BaseException) -> str:
    """``Type: message`` of an exception on one line, as a diagnostic's message needs."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def core_message(error: ToposError) -> str:
    """A core error's message on one line, without the call site it starts with.

    The core names the innermost frame outside topos; for IR that a pass
    reads back that is the tool's own caller, not a line of the IR.
    """
    from topos.provenance import user_site

    text, prefix = str(error), f"{user_site()}: "
    return " ".join((text[len(prefix):] if text.startswith(prefix) else text).split())


# ---- printing ---------------------------------------------------------------------------


def format_diagnostic(
    diagnostic: Diagnostic, sources: dict[str, str] | None = None, rename: dict[str, str] | None = None
) -> str:
    """``file:line:col: severity: message`` as mlir-opt prints it.

    ``sources`` maps a file name to its text, so the offending line and a
    caret are shown under the message like mlir-opt does; ``rename`` maps a
    buffer name the parser used (``-``) to the name the user knows.
    """
    lines = [_format_one(diagnostic, sources or {}, rename or {})]
    for note in diagnostic.notes:
        lines.append(_format_one(note, sources or {}, rename or {}))
    return "\n".join(lines)


def _format_one(d: Diagnostic, sources: dict[str, str], rename: dict[str, str]) -> str:
    found = d.position()
    if found is None:
        return f"<unknown>:0: {d.severity}: {d.message}"
    file, line, column = found
    file = rename.get(file, file)
    head = f"{file}:{line}:{column}: {d.severity}: {d.message}"
    text = sources.get(file)
    if text is None or line < 1:
        return head
    source_lines = text.splitlines()
    if line > len(source_lines):
        return head
    source = source_lines[line - 1]
    return f"{head}\n{source}\n{' ' * max(column - 1, 0)}^"


__all__ = [
    "Diagnostic", "DialectError", "VerificationError", "core_message", "downcast", "file_position",
    "format_diagnostic", "name_of", "node_location", "one_line", "python_location", "site_of", "source_label",
]
