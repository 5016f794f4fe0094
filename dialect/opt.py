"""``topos-opt``: read topos IR, run passes, print the result (mlir-opt's conventions).

    topos-opt model.mlir --topos-verify
    topos-opt model.mlir -p 'topos-verify,canonicalize,cse' -o out.mlir
    cat model.mlir | topos-opt - --mlir-print-ir-after-all
    topos-opt tests.mlir --split-input-file --verify-diagnostics
    topos-opt --list-passes

Input is verified after parsing and after every pass. The contract, as
mlir-opt's: every run ends either in output and exit status 0, or in
diagnostics on stderr and exit status 1, never in a Python traceback.

* About the input: ``file:line:col: error: message``, with the line and a
  caret below; bytes that are not UTF-8 are reported at their line, column
  and byte offset. (An op the input places at ``loc(unknown)`` is reported
  at ``<unknown>:0``, as mlir-opt does.)
* About the pipeline (unknown passes, options, option values):
  ``MLIR Textual PassPipeline Parser:1:<column>: error: ...``.
* About the command line (an output that cannot be written, a pass
  module that is missing): ``topos-opt: error: ...``. A pass module that
  raises on import, or a pass that raises when run, is reported at the
  Python line that raised, with the exception on one line.
* Exit status 2, ``topos-opt: internal error``, is a bug of topos-opt
  itself; set ``TOPOS_OPT_TRACEBACK=1`` for its traceback.

Topos IR is ``func.func @main(...) { <topos ops> return ... }``. Top-level
ops other than one module are wrapped in a module, as mlir-opt does, but a
topos op must stand in the body of a func.func: one at the top level, or
in another op's region, is an error, and so is a body that ends in a topos
op (MLIR cannot know an unregistered op is no terminator). The passes that
read the spec back (topos-plan, -fuse, -elect, -raise, -differentiate)
need that function to be ``@main``, or the only function. With ``-o`` the
output file is written whole (a temporary file, then a rename) and only
when the run succeeds; an existing file is otherwise left as it was.
``--no-verify-each`` hands unverified IR to the passes, like mlir-opt's
``--mlir-very-unsafe-disable-verifier-on-parsing``: a pass may then fail
on IR the verifier would have refused.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO

from ..files import write_atomically
from .diagnostics import Diagnostic, DialectError, format_diagnostic

SPLIT_MARKER = "// -----"
EXIT_FAILURE = 1
EXIT_INTERNAL = 2
TRACEBACK_VARIABLE = "TOPOS_OPT_TRACEBACK"  # set to 1 to see the Python traceback of an internal error


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(EXIT_FAILURE, f"{self.prog}: error: {message}\n")


def _parser(passes) -> _Parser:
    parser = _Parser(
        prog="topos-opt",
        description="Run passes over topos-dialect IR, like mlir-opt.",
        epilog="Any upstream MLIR pass also runs by name inside -p/--pass-pipeline.",
    )
    parser.add_argument("input", nargs="?", default="-", help="input file, or - for stdin (default)")
    parser.add_argument("-o", dest="output", default="-", help="output file (default: stdout)")
    parser.add_argument(
        "-p", "--pass-pipeline", metavar="PIPELINE",
        help="passes to run, e.g. 'topos-verify,canonicalize,cse' or 'builtin.module(...)'",
    )
    parser.add_argument("--list-passes", action="store_true", help="list the registered passes and exit")
    parser.add_argument(
        "--split-input-file", nargs="?", const=SPLIT_MARKER, default=None, metavar="MARKER",
        help=f"process each chunk between '{SPLIT_MARKER}' lines separately",
    )
    parser.add_argument(
        "--verify-diagnostics", action="store_true",
        help="check diagnostics against expected-error/expected-warning comments",
    )
    parser.add_argument("--mlir-print-ir-after-all", action="store_true", help="print the IR after each pass (stderr)")
    parser.add_argument("--mlir-print-debuginfo", action="store_true", help="print locations")
    parser.add_argument("--mlir-print-op-generic", action="store_true", help="print every op in generic form")
    parser.add_argument(
        "--allow-unregistered-dialect", action="store_true",
        help="accept ops of unknown dialects (topos ops are always accepted)",
    )
    parser.add_argument("--no-verify-each", action="store_true", help="do not verify after parsing and after each pass")
    parser.add_argument(
        "--load-pass-module", action="append", default=[], metavar="MODULE",
        help="import a Python module that registers passes",
    )
    group = parser.add_argument_group("passes (each runs where it appears on the command line)")
    for registered in passes:
        options = " ".join(f"{o}={d}" if d else o for o, d in registered.options)
        suffix = f" [--{registered.name}='{options}']" if options else ""
        group.add_argument(f"--{registered.name}", action="store_true", help=registered.description + suffix)
    return parser


def _take_pass_flags(argv: list[str], names: set[str]) -> tuple[list[str], list[str]]:
    """Pull pass flags and -p pipelines out of argv, keeping their command-line order."""
    rest, pipeline = [], []
    i = 0
    while i < len(argv):
        token = argv[i]
        flag, _, value = token.partition("=")
        if token.startswith("--") and flag[2:] in names:
            pipeline.append(f"{flag[2:]}{{{value}}}" if value else flag[2:])
        elif token in ("-p", "--pass-pipeline") and i + 1 < len(argv):
            pipeline.append(argv[i + 1])
            i += 1
        elif flag == "--pass-pipeline":
            pipeline.append(value)
        elif token.startswith("-p") and len(token) > 2 and not token.startswith("--"):
            pipeline.append(token[2:])
        else:
            rest.append(token)
        i += 1
    return rest, pipeline


def _pre_scan_modules(argv: Sequence[str]) -> list[str]:
    modules = []
    for i, token in enumerate(argv):
        if token == "--load-pass-module" and i + 1 < len(argv):
            modules.append(argv[i + 1])
        elif token.startswith("--load-pass-module="):
            modules.append(token.split("=", 1)[1])
    return modules


def main(
    argv: Sequence[str] | None = None,
    *,
    stdin: IO | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
) -> int:
    """Entry point of the ``topos-opt`` console script; returns the exit status.

    ``stdin`` (bytes or text), ``stdout`` and ``stderr`` default to the
    process's streams; tests pass their own to run the tool in-process.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    out = sys.stdout if stdout is None else stdout
    err = sys.stderr if stderr is None else stderr
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        return _guarded(argv, stdin)


def _guarded(argv: list[str], stdin: IO | None) -> int:
    try:
        return _main(argv, stdin)
    except SystemExit as exit:  # argparse's verdict on the command line
        return exit.code if isinstance(exit.code, int) else EXIT_FAILURE
    except BrokenPipeError:
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
    except Exception as error:  # noqa: BLE001  (a bug in topos-opt itself: report it, no traceback)
        sys.stderr.write(f"topos-opt: internal error: {_first_line(error)}\n")
        if os.environ.get(TRACEBACK_VARIABLE):
            traceback.print_exc()
        else:
            sys.stderr.write(f"topos-opt: set {TRACEBACK_VARIABLE}=1 to see the Python traceback\n")
        return EXIT_INTERNAL


def _first_line(error: BaseException) -> str:
    # An exception raised inside an MLIR callback (a walk) arrives wrapped, its
    # traceback in the message; the line that names the cause is the last.
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if "Traceback (most recent call last)" in str(error):
        return lines[-1]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def _main(argv: list[str], stdin: IO | None) -> int:
    from . import passes as _passes

    try:
        _passes.load_pass_modules(_pre_scan_modules(argv))
    except _passes.PassModuleError as error:
        _report_all(error.diagnostics, {})
        return EXIT_FAILURE
    registered = _passes.registered_passes()
    parser = _parser(registered)
    rest, pipeline = _take_pass_flags(argv, {p.name for p in registered})
    arguments, unknown = parser.parse_known_args(rest)
    if unknown:
        parser.error(
            f"unknown option or pass {unknown[0]!r} (topos-opt --list-passes lists the passes)"
        )
    if arguments.list_passes:
        sys.stdout.write(_list_passes(registered))
        return 0
    source_name = "<stdin>" if arguments.input == "-" else _display(arguments.input)
    try:
        data = _read_stdin(stdin) if arguments.input == "-" else _read(arguments.input)
    except OSError as error:
        sys.stderr.write(f"topos-opt: error: could not open input file '{source_name}': {error.strerror}\n")
        return EXIT_FAILURE
    try:
        text = decode_source(data, source_name)
    except DialectError as error:
        shown = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
        _report_all(error.diagnostics, {source_name: shown})
        return EXIT_FAILURE
    run = _Run(arguments, source_name, text, pipeline)
    outputs, ok = run.all_chunks()
    separator = f"{SPLIT_MARKER}\n" if arguments.split_input_file else ""
    result = separator.join(outputs)
    if arguments.output == "-":
        sys.stdout.write(result)
        sys.stdout.flush()
        return 0 if ok else EXIT_FAILURE
    if not ok:
        return EXIT_FAILURE  # as mlir-opt: a failed run keeps no output file (an old one stays as it was)
    try:
        write_atomically(arguments.output, result)
    except OSError as error:
        reason = error.strerror or str(error)
        sys.stderr.write(f"topos-opt: error: could not write output file '{_display(arguments.output)}': {reason}\n")
        return EXIT_FAILURE
    return 0


def _display(path: str) -> str:
    # A file name need not be UTF-8; MLIR locations and diagnostics take text.
    return os.fsencode(path).decode("utf-8", errors="backslashreplace")


def _read(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def _read_stdin(stdin: IO | None) -> bytes | str:
    stream = stdin if stdin is not None else sys.stdin
    return getattr(stream, "buffer", stream).read()  # bytes where the stream has them


def decode_source(data: bytes | str, source_name: str) -> str:
    """The input as text; bytes that are not UTF-8 raise DialectError at their line, column and offset."""
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        offset = error.start
        line = data.count(b"\n", 0, offset) + 1
        column = offset - (data.rfind(b"\n", 0, offset) + 1) + 1  # in bytes, as MLIR counts columns
        from iree.compiler import ir

        with ir.Context():
            where = ir.Location.file(source_name, line, column)
        message = (
            f"invalid UTF-8 byte 0x{data[offset]:02x} at byte offset {offset} ({error.reason}); "
            "topos IR is UTF-8 text"
        )
        raise DialectError([Diagnostic("error", message, where)]) from None



def _report_all(diagnostics, sources: dict[str, str]) -> None:
    for diagnostic in diagnostics:
        sys.stderr.write(_format(diagnostic, sources, {}) + "\n")


def _format(diagnostic: Diagnostic, sources: dict[str, str], rename: dict[str, str]) -> str:
    # A diagnostic about the command line (a pass module that will not load)
    # has no place in the input; it reads like argparse's errors.
    if diagnostic.location is None:
        return f"topos-opt: {diagnostic.severity}: {diagnostic.message}"
    return format_diagnostic(diagnostic, sources, rename)


def _list_passes(registered) -> str:
    lines = ["Passes (topos-opt --<name>, or -p 'name{option=value},...'):"]
    width = max((len(p.name) for p in registered), default=0) + 4
    for upstream in (False, True):
        if upstream:
            lines.append("Upstream MLIR passes (any other upstream pass runs by name in -p):")
        for p in registered:
            if p.upstream == upstream:
                lines.append(f"  --{p.name:<{width}}{p.description}")
                for option, default in p.options:
                    lines.append(f"      {option}={default}" if default else f"      {option}")
    return "\n".join(lines) + "\n"


# ---- processing ---------------------------------------------------------------------------


def split_chunks(text: str, marker: str) -> list[tuple[str, int]]:
    """Chunks between marker lines, each with the number of lines before it in the file."""
    chunks: list[tuple[str, int]] = []
    current: list[str] = []
    first = line_number = 0
    for line_number, line in enumerate(text.splitlines(keepends=True)):
        if line.strip() == marker:
            chunks.append(("".join(current), first))
            current, first = [], line_number + 1
        else:
            current.append(line)
    chunks.append(("".join(current), first))
    return chunks


class _Run:
    """One invocation: one context, the chunks of one input, one pipeline."""

    def __init__(self, arguments, source_name: str, text: str, pipeline: list[str]):
        from . import context

        self.arguments = arguments
        self.source_name = source_name
        self.text = text
        self.pipeline = pipeline
        self.context = context.new_context()

    def all_chunks(self) -> tuple[list[str], bool]:
        marker = self.arguments.split_input_file
        chunks = split_chunks(self.text, marker) if marker else [(self.text, 0)]
        outputs, ok = [], True
        for chunk, lines_before in chunks:
            # Blank lines in front keep line numbers those of the whole file.
            padded = "\n" * lines_before + chunk
            output, diagnostics = self.one_chunk(padded)
            if self.arguments.verify_diagnostics:
                failures = check_expected(padded, diagnostics, self.source_name)
                self._report(failures)
                ok = ok and not failures
            else:
                self._report(diagnostics)
                ok = ok and not any(d.severity == "error" for d in diagnostics)
            if output is not None:
                outputs.append(output)
        return outputs, ok

    def one_chunk(self, text: str) -> tuple[str | None, list[Diagnostic]]:
        from .parse import parse_module
        from .passes import run_pipeline, verify_or_raise

        arguments = self.arguments
        try:
            module = parse_module(text, context=self.context, source_name=self.source_name)
            with self.context:
                if not arguments.allow_unregistered_dialect:
                    foreign = _foreign_ops(module, self.context)
                    if foreign:
                        return None, foreign
                if not arguments.no_verify_each:
                    verify_or_raise(module)
                after = self._print_after if arguments.mlir_print_ir_after_all else None
                run_pipeline(module, self.pipeline, verify_each=not arguments.no_verify_each, after_each=after)
        except DialectError as error:
            return None, list(error.diagnostics)
        return self._print(module), []

    def _print(self, module) -> str:
        return module.operation.get_asm(
            enable_debug_info=self.arguments.mlir_print_debuginfo,
            print_generic_op_form=self.arguments.mlir_print_op_generic,
        )

    def _print_after(self, element: str, module) -> None:
        sys.stderr.write(f"// -----// IR Dump After {element} //----- //\n{self._print(module)}\n")

    def _report(self, diagnostics: list[Diagnostic]) -> None:
        for diagnostic in diagnostics:
            sys.stderr.write(_format(diagnostic, {self.source_name: self.text}, {"-": self.source_name}) + "\n")


def _foreign_ops(module, context) -> list[Diagnostic]:
    """Ops of dialects that are neither topos nor registered (mlir-opt rejects them too)."""
    found: list[Diagnostic] = []
    from iree.compiler import ir

    def visit(operation):
        name = operation.name
        dialect = name.split(".", 1)[0]
        if dialect != "topos" and not context.is_registered_operation(name):
            found.append(
                Diagnostic.error(
                    f"unregistered operation '{name}' found in dialect ('{dialect}') that does not "
                    "allow unknown operations (pass --allow-unregistered-dialect to accept it)",
                    operation,
                )
            )
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


# ---- --verify-diagnostics -----------------------------------------------------------------

_EXPECTED = re.compile(r"expected-(error|warning|remark|note)\s*(?:@(above|below|[+-]?\d+))?\s*\{\{(.*?)\}\}")


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


def check_expected(text: str, diagnostics: list[Diagnostic], source_name: str) -> list[Diagnostic]:
    """Mismatches between produced diagnostics and expected-* comments, as error diagnostics."""
    from iree.compiler import ir

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


__all__ = ["check_expected", "expectations", "main", "split_chunks"]


if __name__ == "__main__":
    sys.exit(main())
