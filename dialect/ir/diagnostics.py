"""Diagnostics and locations: how the dialect says what went wrong, and where.

Every failure the dialect reports (a parse error, a verifier verdict, a pass
failure) is a :class:`Diagnostic` carrying an MLIR location. A node's
location is ``loc("%<index> <opcode>"("<file>":<line>:0))``: the node's
name fused with the user's recording line, so an error found in the IR
points back to the Python line that recorded the node. A test file says
which diagnostics it expects in ``// expected-error {{...}}`` comments,
read here and matched by ``topos-opt --verify-diagnostics``.
"""

from __future__ import annotations

import importlib
import os
import re
import traceback
from collections.abc import Iterable
from dataclasses import dataclass

from iree.compiler import ir

from topos.base.errors import ToposError
from topos.base.provenance import UNKNOWN, Site

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
    from topos.base.provenance import user_site

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


# ---- what a test expects: topos-opt --verify-diagnostics ---------------------------------------

_EXPECTED = re.compile(r"expected-(error|warning|remark|note)\s*(?:@(above|below|[+-]?\d+))?\s*\{\{(.*?)\}\}")
# Where an expectation starts: "expected-<severity>" followed by "@" or "{{" (prose that merely
# names expected-error is left alone, as mlir-opt leaves it).
_EXPECTATION_START = re.compile(r"expected-(error|warning|remark|note)(-re)?(?=\s*(?:@|\{\{))")
_LINE_SPECIFIER = re.compile(r"@(above|below|[+-]?\d+)(?![\w+-])")


@dataclass
class _Expectation:
    severity: str
    line: int  # the line the diagnostic must point at
    message: str
    comment_line: int
    column: int
    seen: bool = False


def expectations(text: str) -> list[_Expectation]:
    """The ``// expected-<severity> [@+N|@-N|@N|@above|@below] {{message}}`` comments of a text."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for match in _EXPECTED.finditer(line):
            severity, where, message = match.groups()
            target = number
            if where == "above":
                target = number - 1
            elif where == "below":
                target = number + 1
            elif where and where[0] in "+-":
                target = number + int(where)
            elif where:
                target = int(where)
            found.append(_Expectation(severity, target, message, number, match.start() + 1))
    return found


def malformed_expectations(text: str) -> list[tuple[int, int, str]]:
    """(line, column, problem) of each expected-* comment that cannot be read.

    mlir-opt skips such a comment without a word, so a typo passes a test
    that checks nothing; topos-opt refuses it instead.
    """
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        read = [match.span() for match in _EXPECTED.finditer(line)]
        for start in _EXPECTATION_START.finditer(line):
            if any(begin <= start.start() < end for begin, end in read):
                continue  # a well-formed expectation, or words inside one's message
            severity, regex = start.group(1), start.group(2)
            rest = line[start.end():].lstrip()
            specifier = _LINE_SPECIFIER.match(rest) if rest.startswith("@") else None
            if regex:
                problem = (f"expected-{severity}-re is not supported by topos-opt; write "
                           f"expected-{severity} {{{{text}}}}, which matches a diagnostic containing the text")
            elif rest.startswith("@") and specifier is None:
                given = rest.split()[0].split("{{")[0]
                problem = (f"'{given}' is no line of expected-{severity}; write @+N, @-N, @N, @above or @below "
                           f"before the {{{{message}}}}")
            elif not rest[specifier.end() if specifier else 0:].lstrip().startswith("{{"):
                problem = f"expected '{{{{' to start the message of expected-{severity}, as in {{{{message}}}}"
            else:
                problem = (f"found start of the expected-{severity} message with no end '}}}}'; "
                           f"close it on the same line: {{{{message}}}}")
            found.append((number, start.start() + 1, problem))
    return found


def check_expected(text: str, diagnostics: list[Diagnostic], source_name: str) -> list[Diagnostic]:
    """Mismatches between produced diagnostics and expected-* comments, as error diagnostics.

    An expected-* comment that cannot be read is an error of its own, and
    the others are not checked until it is fixed.
    """
    malformed = malformed_expectations(text)
    if malformed:
        with ir.Context():
            return [Diagnostic("error", problem, ir.Location.file(source_name, line, column))
                    for line, column, problem in malformed]
    wanted = expectations(text)
    check_notes = any(e.severity == "note" for e in wanted)
    produced = []
    for d in diagnostics:
        produced.append(d)
        if check_notes:
            produced.extend(d.notes)
    failures: list[Diagnostic] = []
    for d in produced:
        position = d.position()
        match = None
        if position is not None and position[0] in (source_name, "-"):
            line = position[1]
            match = next(
                (e for e in wanted
                 if not e.seen and e.severity == d.severity and e.line == line and e.message in d.message),
                None,
            )
        if match is not None:
            match.seen = True
        else:
            failures.append(Diagnostic("error", f"unexpected {d.severity}: {d.message}", d.location))
    with ir.Context():
        for e in wanted:
            if not e.seen:
                where = ir.Location.file(source_name, e.comment_line, e.column)
                failures.append(Diagnostic("error", f'expected {e.severity} "{e.message}" was not produced', where))
    return failures


__all__ = [
    "check_expected", "expectations", "malformed_expectations",
    "Diagnostic", "DialectError", "VerificationError", "core_message", "downcast", "file_position",
    "format_diagnostic", "name_of", "node_location", "one_line", "python_location", "site_of", "source_label",
]
