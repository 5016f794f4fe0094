"""``topos-opt``: read topos IR, run passes, print the result (mlir-opt's conventions).

    topos-opt model.mlir --topos-verify
    topos-opt model.mlir -pass-pipeline='builtin.module(topos-verify,canonicalize,cse)' -o out.mlir
    cat model.mlir | topos-opt - --mlir-print-ir-after-change --mlir-timing
    topos-opt tests.mlir -split-input-file -verify-diagnostics
    topos-opt model.mlir --irdl-file=dialect/ir/topos.irdl.mlir
    topos-opt --list-passes | --show-dialects | --version

The command line reads as mlir-opt's: every long flag takes one dash or
two (``-pass-pipeline=...``, ``--mlir-timing``), ``-p`` is the short
``--pass-pipeline``, and every pass is a flag of its own (``--cse``,
``-topos-verify``, ``--canonicalize=max-iterations=3``): the topos passes
and every pass of the bundled MLIR that its pass manager can parse, a
pass restricted to one op (``func.func``) nested under it as mlir-opt's
implicit nesting does. The whole pipeline is checked before any pass
runs. Input is verified after parsing and after every pass.

The contract, as mlir-opt's: every run ends either in output and exit
status 0, or in diagnostics on stderr and exit status 1, never in a Python
traceback.

* About the input: ``file:line:col: error: message``, with the line and a
  caret below; bytes that are not UTF-8 are reported at their line, column
  and byte offset. (An op the input places at ``loc(unknown)`` is reported
  at ``<unknown>:0``, as mlir-opt does.)
* About the pipeline (unknown passes, options, option values):
  ``MLIR Textual PassPipeline Parser:1:<column>: error: ...``.
* About the command line (an output that cannot be written, a pass
  module that is missing, an IRDL file that cannot be read):
  ``topos-opt: error: ...``. A pass module that raises on import, or a
  pass that raises when run, is reported at the Python line that raised,
  with the exception on one line.
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

What the Python bindings cannot do, and what topos-opt does instead:

* Pass instrumentation. topos-opt runs one pipeline element at a time, so
  it instruments elements itself: IR dumps are headed ``// -----// IR Dump
  After <element> //----- //`` (mlir-opt names the C++ pass class, as in
  ``CSEPass: cse``, which the bindings do not expose) and always show the
  whole module; ``--mlir-timing`` rows are elements, verification included;
  ``--mlir-pass-statistics`` reports topos-opt's own counts of the ops each
  element added and removed, and under each upstream element the counters
  MLIR's pass manager keeps (``CSEPass num-cse'd``). Timing, statistics and
  ``--dump-pass-pipeline`` come once per input chunk, as in mlir-opt.
  ``--mlir-print-ir-after-change`` alone prints after each element that
  changed the IR; mlir-opt prints nothing unless ``-after-all`` is given too.
* Listing. The bindings cannot enumerate passes or dialects, nor load IRDL:
  ``--list-passes``, ``--show-dialects`` and ``--irdl-file`` ask the
  ``iree-opt`` that ships with the same compiler. With ``--irdl-file`` the
  input is parsed as usual, the file's dialects count as known, and the
  module is verified against the definitions by that ``iree-opt`` after
  parsing and after every pass; the IR stays in generic form.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import subprocess
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO

from iree.compiler import ir

from topos.base.files import write_atomically
from topos.dialect.ir.diagnostics import Diagnostic, DialectError, check_expected, format_diagnostic
from topos.dialect.passes.registry import (
    Captured,
    Pass,
    native_stderr,
    parse_options,
    python_pass,
    split_pipeline,
    upstream_pipeline,
)
from topos.dialect.pipeline import PASS_PIPELINE, pass_pipeline

SPLIT_MARKER = "// -----"
EXIT_FAILURE = 1
EXIT_INTERNAL = 2
TRACEBACK_VARIABLE = "TOPOS_OPT_TRACEBACK"  # set to 1 to see the Python traceback of an internal error

# Flags without a value: (flag, help).
_SWITCHES = (
    ("--list-passes", "list the passes (topos and upstream) and exit"),
    ("--show-dialects", "list the dialects topos-opt reads, one per line, and exit"),
    ("--version", "print the versions of topos-opt and of the bundled MLIR/IREE compiler, and exit"),
    ("--verify-diagnostics", "check diagnostics against expected-error/expected-warning comments"),
    ("--dump-pass-pipeline", "print the parsed pipeline (stderr), then run it"),
    ("--mlir-print-ir-before-all", "print the IR before each pass (stderr)"),
    ("--mlir-print-ir-after-all", "print the IR after each pass (stderr)"),
    ("--mlir-print-ir-after-change", "print the IR after each pass that changed it (stderr)"),
    ("--mlir-print-ir-after-failure", "print the IR after a pass that failed (stderr)"),
    ("--mlir-print-debuginfo", "print locations"),
    ("--mlir-print-op-generic", "print every op in generic form"),
    ("--mlir-timing", "report each pass's wall time (stderr)"),
    ("--mlir-pass-statistics", "report each pass's statistics (stderr)"),
    ("--mlir-disable-threading", "run MLIR on one thread"),
    ("--allow-unregistered-dialect", "accept ops of unknown dialects (topos ops are always accepted)"),
    ("--no-verify-each", "do not verify after parsing and after each pass"),
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(EXIT_FAILURE, f"{self.prog}: error: {message}\n")


def _parser(passes) -> _Parser:
    parser = _Parser(
        prog="topos-opt",
        description="Run passes over topos-dialect IR, like mlir-opt. Every long flag also takes one dash.",
        epilog="Every upstream pass of the bundled MLIR is a flag too (topos-opt --list-passes lists them).",
        allow_abbrev=False,  # as mlir-opt: a flag is spelled whole
    )
    parser.add_argument("input", nargs="?", default="-", help="input file, or - for stdin (default)")
    parser.add_argument("-o", dest="output", default="-", help="output file (default: stdout)")
    parser.add_argument(
        "-p", "--pass-pipeline", metavar="PIPELINE",
        help="passes to run, e.g. 'topos-verify,canonicalize,cse' or 'builtin.module(...)'",
    )
    parser.add_argument(
        "--split-input-file", nargs="?", const=SPLIT_MARKER, default=None, metavar="MARKER",
        help=f"process each chunk between '{SPLIT_MARKER}' lines separately (--split-input-file=MARKER for another)",
    )
    parser.add_argument("--irdl-file", metavar="FILE", help="verify the input against an IRDL dialect definition")
    parser.add_argument(
        "--load-pass-module", action="append", default=[], metavar="MODULE",
        help="import a Python module that registers passes",
    )
    for flag, description in _SWITCHES:
        parser.add_argument(flag, action="store_true", help=description)
    group = parser.add_argument_group("passes (each runs where it appears on the command line)")
    for registered in passes:
        options = " ".join(f"{o}={d}" if d else o for o, d in registered.options)
        suffix = f" [--{registered.name}='{options}']" if options else ""
        group.add_argument(f"--{registered.name}", action="store_true", help=registered.description + suffix)
    return parser


def _long_options(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings if flag.startswith("--")}


def _take_pass_flags(argv: list[str], is_pass: Callable[[str], bool]) -> tuple[list[str], list[str]]:
    """Pull pass flags and -p pipelines out of argv, keeping their command-line order."""
    rest, pipeline = [], []
    i = 0
    while i < len(argv):
        token = argv[i]
        flag, equals, value = token.partition("=")
        if flag in ("-p", "--pass-pipeline") and (equals or i + 1 < len(argv)):
            if not equals:
                i += 1
                value = argv[i]
            pipeline.append(value)
        elif token.startswith("-p") and len(token) > 2 and not token.startswith("--"):
            pipeline.append(token[2:])
        elif token.startswith("--") and is_pass(flag[2:]):
            pipeline.append(f"{flag[2:]}{{{value}}}" if value else flag[2:])
        else:
            rest.append(token)
        i += 1
    return rest, pipeline


def _long_spelling(token: str, is_long: Callable[[str], bool]) -> str:
    """A flag as mlir-opt reads it: ``-name`` is ``--name``; ``--split-input-file`` takes its marker after ``=``."""
    name = token.lstrip("-").partition("=")[0]
    if token.startswith("-") and not token.startswith("--") and len(name) > 1 and is_long(name):
        token = "-" + token
    return f"{token}={SPLIT_MARKER}" if token == "--split-input-file" else token


def _flag_readers(options: set[str], topos_passes: set[str]) -> tuple[Callable[[str], bool], Callable[[str], bool]]:
    """(is_pass, is_long): whether ``--name`` names a pass; whether it names a pass or a long option."""

    def is_pass(name: str) -> bool:
        if name in topos_passes:
            return True
        return f"--{name}" not in options and _runs_upstream(name)

    return is_pass, lambda name: f"--{name}" in options or is_pass(name)


def _runs_upstream(name: str) -> bool:
    """Whether the bundled pass manager parses ``name`` as a pass (in the current context)."""
    if re.fullmatch(r"[\w.-]+", name) is None:
        return False
    try:
        upstream_pipeline(name)
    except DialectError:
        return False
    return True


def _pre_scan_modules(argv: Sequence[str]) -> list[str]:
    modules = []
    for i, token in enumerate(argv):
        flag, equals, value = token.lstrip("-").partition("=")
        if token.startswith("-") and flag == "load-pass-module":
            if equals:
                modules.append(value)
            elif i + 1 < len(argv):
                modules.append(argv[i + 1])
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
    from topos.dialect.ir.context import new_context
    from topos.dialect.passes import registry as _passes

    try:
        _passes.load_pass_modules(_pre_scan_modules(argv))
    except _passes.PassModuleError as error:
        _report_all(error.diagnostics, {})
        return EXIT_FAILURE
    registered = _passes.registered_passes()
    parser = _parser(registered)
    context = new_context()
    with context:
        is_pass, is_long = _flag_readers(_long_options(parser), {p.name for p in registered} | {PASS_PIPELINE})
        rest, pipeline = _take_pass_flags([_long_spelling(token, is_long) for token in argv], is_pass)
        arguments, unknown = parser.parse_known_args(rest)
        if unknown and not unknown[0].startswith("-"):  # a second input (mlir-opt: too many positional arguments)
            place = argv.index(unknown[0]) if unknown[0] in argv else 0
            after = argv[place - 1] if place else ""
            marker = (" (--split-input-file takes its marker as --split-input-file=MARKER)"
                      if after.lstrip("-") == "split-input-file" else "")
            parser.error(
                f"too many positional arguments: {unknown[0]!r} after the input file {arguments.input!r}; "
                f"topos-opt reads one input file{marker}"
            )
        if unknown:
            parser.error(
                f"unknown option or pass {unknown[0]!r} (topos-opt --list-passes lists the passes)"
            )
        try:
            answer = _about(arguments, registered, context)
            if answer is not None:
                sys.stdout.write(answer)
                return 0
            run = _Run(arguments, pipeline, context)
        except DialectError as error:
            _report_all(error.diagnostics, {})
            return EXIT_FAILURE
        return _process(arguments, run, stdin)


def _process(arguments, run: _Run, stdin: IO | None) -> int:
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
    outputs, ok = run.all_chunks(source_name, text)
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


def _command_line_error(message: str) -> DialectError:
    return DialectError([Diagnostic("error", message)])


# ---- what topos-opt tells about itself ------------------------------------------------------


def _about(arguments, registered: Sequence[Pass], context: ir.Context) -> str | None:
    """The text --version, --list-passes or --show-dialects asks for; None for a run."""
    if arguments.version:
        return _version()
    if arguments.list_passes:
        return _list_passes(registered)
    if arguments.show_dialects:
        return _show_dialects(context)
    return None


def _version() -> str:
    from iree.compiler import version

    import topos

    revision = version.REVISIONS.get("IREE", "unknown")
    return (
        f"topos-opt {topos.__version__} (topos {topos.__version__})\n"
        f"MLIR/IREE compiler: iree-base-compiler {version.VERSION} (IREE revision {revision})\n"
    )


def _iree_opt(*arguments: str, stdin: str = "", needed_by: str) -> subprocess.CompletedProcess[str]:
    """Run the iree-opt that ships with the bindings' compiler (same MLIR) for what the bindings cannot do."""
    from iree.compiler.tools.binaries import find_tool

    try:
        command = [find_tool("iree-opt"), *arguments]
        return subprocess.run(command, input=stdin, capture_output=True, text=True, check=False)
    except (ValueError, OSError) as error:
        message = f"{needed_by} needs the iree-opt of iree-base-compiler, which did not run: {error}"
        raise _command_line_error(message) from None


def _list_passes(registered: Sequence[Pass]) -> str:
    described = {p.name: p for p in registered if p.upstream}
    try:
        bundled = _bundled_passes()
        upstream = [dataclasses.replace(p, description=described.get(p.name, p).description) for p in bundled]
        note = ""
    except DialectError as error:
        upstream, note = list(described.values()), f" ({error.diagnostics[0].message}; only these are listed)"
    pipeline = Pass(PASS_PIPELINE, "fuse, elect, raise, lower: the stages of topos.dialect.pipeline that "
                    "Plan.emit_stablehlo runs on the emitted module", None, (("kinds", ""), ("convolution", "columns")))
    sections = (
        ("Passes (topos-opt --<name>, or -p 'name{option=value},...'):", [p for p in registered if not p.upstream]),
        ("Pass pipelines (--<name>, or by name in -p):", [pipeline]),
        (f"Upstream MLIR passes of the bundled compiler (--<name>, or by name in -p){note}:", upstream),
    )
    lines = []
    for title, passes in sections:
        lines.append(title)
        width = min(max((len(p.name) for p in passes), default=0), 44) + 2
        for p in passes:
            lines.append(f"  --{p.name:<{width}}  {p.description}")
            lines.extend(f"      {option}={default}" if default else f"      {option}" for option, default in p.options)
    return "\n".join(lines) + "\n"


_LISTED_PASS = re.compile(r"^  --(\S+?)\s*-   (.*)$")  # a long name runs into the "-" that follows it
_LISTED_OPTION = re.compile(r"^    --([\w.-]+)(?:=(<\w+>))?")


def _bundled_passes() -> list[Pass]:
    """The passes ``iree-opt --list-passes`` names that the bindings' pass manager parses, with their options."""
    listed: list[tuple[str, str, list[tuple[str, str]]]] = []
    for line in _iree_opt("--list-passes", needed_by="--list-passes").stdout.splitlines():
        named, option = _LISTED_PASS.match(line), _LISTED_OPTION.match(line)
        if named:
            listed.append((named[1], named[2].strip(), []))
        elif option and listed:
            listed[-1][2].append((option[1], option[2] or ""))
    return [Pass(name, description, None, tuple(options)) for name, description, options in listed
            if _runs_upstream(name)]


def _show_dialects(context: ir.Context) -> str:
    listing = _iree_opt("--show-dialects", needed_by="--show-dialects").stdout.partition(":")[2]
    names = {name for name in re.split(r"[\s,]+", listing) if name and _loads(context, name)}
    return "Available Dialects:\n" + "".join(f"{name}\n" for name in sorted(names | {"topos"}))


def _loads(context: ir.Context, dialect: str) -> bool:
    try:
        context.dialects[dialect]
    except IndexError:
        return False
    return True


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


@dataclass(frozen=True)
class _Element:
    """One pass of the pipeline: as written, where it starts in its text, and spelled out with its options."""

    text: str
    offset: int
    spelled: str


def _expanded(pipeline: Sequence[str]) -> Iterator[tuple[str, int]]:
    """The pipeline's elements, with ``topos-to-stablehlo`` spelled out as the passes of topos.dialect.pipeline."""
    for text in pipeline:
        for element, offset in split_pipeline(text):
            if re.split(r"[{(]", element, maxsplit=1)[0].strip() != PASS_PIPELINE:
                yield element, offset
                continue
            options = parse_options(element, offset)[1]
            unknown = sorted(set(options) - {"kinds", "convolution"})
            if unknown:
                raise _command_line_error(f"{PASS_PIPELINE} has no option {unknown[0]!r}; its options are kinds "
                                          "(the fusion kinds topos-elect raises) and convolution (columns or named)")
            spelled = pass_pipeline(options.get("kinds"), options.get("convolution", "columns"))
            yield from ((part, offset) for part, _ in split_pipeline(spelled))


def _validated(pipeline: Sequence[str]) -> tuple[_Element, ...]:
    """The pipeline's elements, each checked before any pass runs, as mlir-opt parses its pipeline first."""
    elements = []
    for element, offset in _expanded(pipeline):
        registered = python_pass(element)
        if registered is None:
            spelled = str(upstream_pipeline(element, offset)).removeprefix("builtin.module(")[:-1]
        else:
            given = parse_options(element, offset)[1]
            values = {**{option: default for option, default in registered.options if default}, **given}
            options = " ".join(f"{option}={value}" for option, value in values.items())
            spelled = f"{registered.name}{{{options}}}" if options else registered.name
        elements.append(_Element(element, offset, spelled))
    return tuple(elements)


def _pipeline_dump(elements: Sequence[_Element]) -> str:
    """The pipeline as ``mlir-opt --dump-pass-pipeline`` prints it."""
    lines = _nested_lines("builtin.module(" + ",".join(e.spelled for e in elements) + ")", "")
    return f"Pass Manager with {len(elements)} passes:\n" + "\n".join(lines) + "\n\n"


def _nested_lines(element: str, indent: str) -> list[str]:
    anchor, parenthesis, inner = element.partition("(")
    if not parenthesis or "{" in anchor:  # a pass (its options may hold parentheses)
        return [indent + element]
    children = [_nested_lines(child, indent + "  ") for child, _ in split_pipeline(inner[:-1])]
    for child in children[:-1]:
        child[-1] += ","
    return [f"{indent}{anchor}(", *(line for child in children for line in child), f"{indent})"]


class _Run:
    """One invocation: one context, one checked pipeline, and the chunks of one input."""

    def __init__(self, arguments, pipeline: Sequence[str], context: ir.Context):
        self.arguments = arguments
        self.context = context
        if arguments.mlir_disable_threading:
            context.enable_multithreading(False)
        with context:
            self.elements = _validated(pipeline)
            self.irdl = _Irdl.load(arguments.irdl_file) if arguments.irdl_file else None

    def all_chunks(self, source_name: str, text: str) -> tuple[list[str], bool]:
        marker = self.arguments.split_input_file
        chunks = split_chunks(text, marker) if marker else [(text, 0)]
        outputs, ok = [], True
        for chunk, lines_before in chunks:
            # Blank lines in front keep line numbers those of the whole file.
            padded = "\n" * lines_before + chunk
            watch = _Watch(self.arguments)
            output, diagnostics = self.one_chunk(padded, source_name, watch)
            if self.arguments.verify_diagnostics:
                failures = check_expected(padded, diagnostics, source_name)
                self._report(failures, source_name, text)
                ok = ok and not failures
            else:
                self._report(diagnostics, source_name, text)
                ok = ok and not any(d.severity == "error" for d in diagnostics)
            watch.report()  # after the chunk's diagnostics, as mlir-opt reports at the end
            if output is not None:
                outputs.append(output)
        return outputs, ok

    def one_chunk(self, text: str, source_name: str, watch: _Watch) -> tuple[str | None, list[Diagnostic]]:
        try:
            return self._processed(text, source_name, watch), []
        except DialectError as error:
            return None, list(error.diagnostics)

    def _processed(self, text: str, source_name: str, watch: _Watch) -> str:
        from topos.dialect.ir.parse import parse_module

        with watch.timed("Parser"):
            module = parse_module(text, context=self.context, source_name=source_name)
            with self.context:
                foreign = [] if self.arguments.allow_unregistered_dialect else _foreign_ops(module, self.irdl)
                if foreign:
                    raise DialectError(foreign)
                self._verify(module)
        with self.context:
            if self.arguments.dump_pass_pipeline:
                sys.stderr.write(_pipeline_dump(self.elements))
            for element in self.elements:
                self._run_element(module, element, watch)
        with watch.timed("Output"):
            return self._print(module)

    def _run_element(self, module, element: _Element, watch: _Watch) -> None:
        from topos.dialect.passes.registry import run_pipeline

        arguments = self.arguments
        if arguments.mlir_print_ir_before_all:
            self._dump(f"Before {element.text}", module)
        watches_changes = arguments.mlir_print_ir_after_change or arguments.mlir_pass_statistics
        before = _fingerprint(module) if watches_changes else None
        try:
            with watch.timed(element.text), watch.native_statistics(element.text):
                # Blanks in front keep the element's column in its pipeline text, where option errors point.
                run_pipeline(
                    module, " " * element.offset + element.text,
                    verify_each=False, upstream_statistics=arguments.mlir_pass_statistics,
                )
                self._verify(module)
        except DialectError:
            if arguments.mlir_print_ir_after_failure:
                self._dump(f"After {element.text} Failed", module)
            raise
        changed = True
        if before is not None:
            after = _fingerprint(module)
            watch.count_changes(element.text, before, after)
            changed = after.text != before.text
        # As in mlir-opt, -after-change narrows -after-all to the passes that changed the IR; alone, it implies it.
        show = changed if arguments.mlir_print_ir_after_change else arguments.mlir_print_ir_after_all
        if show:
            self._dump(f"After {element.text}", module)

    def _verify(self, module) -> None:
        from topos.dialect.passes.registry import PassFailure, verify_or_raise

        if self.arguments.no_verify_each:
            return
        # IRDL's verdict is MLIR's own verifier's, so it comes before the topos verifiers, as in mlir-opt.
        problems = self.irdl.problems(module) if self.irdl else []
        if problems:
            raise PassFailure(problems)
        verify_or_raise(module)

    def _print(self, module) -> str:
        return module.operation.get_asm(
            enable_debug_info=self.arguments.mlir_print_debuginfo,
            print_generic_op_form=self.arguments.mlir_print_op_generic,
        )

    def _dump(self, title: str, module) -> None:
        sys.stderr.write(f"// -----// IR Dump {title} //----- //\n{self._print(module)}\n")

    def _report(self, diagnostics: list[Diagnostic], source_name: str, text: str) -> None:
        for diagnostic in diagnostics:
            sys.stderr.write(_format(diagnostic, {source_name: text}, {"-": source_name}) + "\n")


def _foreign_ops(module, irdl: _Irdl | None) -> list[Diagnostic]:
    """Ops of dialects that are neither topos, registered nor defined by --irdl-file (mlir-opt rejects them too)."""
    found: list[Diagnostic] = []
    known = {"topos", *(irdl.dialects if irdl else ())}

    def visit(operation):
        name = operation.name
        dialect = name.split(".", 1)[0]
        if dialect not in known and not module.context.is_registered_operation(name):
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


# ---- --mlir-timing, --mlir-pass-statistics --------------------------------------------------


@dataclass(frozen=True)
class _Fingerprint:
    """The module as text (for --mlir-print-ir-after-change) and its ops by name, attributes and types."""

    text: str
    ops: Counter[str]


def _fingerprint(module) -> _Fingerprint:
    ops: Counter[str] = Counter()

    def visit(operation):
        attributes = " ".join(f"{name}={operation.attributes[name]}" for name in operation.attributes)
        operands = ", ".join(str(value.type) for value in operation.operands)
        results = ", ".join(str(value.type) for value in operation.results)
        ops[f"{operation.name} {{{attributes}}} ({operands}) -> ({results})"] += 1
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit, ir.WalkOrder.PRE_ORDER)
    return _Fingerprint(module.operation.get_asm(enable_debug_info=True, print_generic_op_form=True), ops)


_BANNER = "===" + "-" * 73 + "==="
_OWN_STATISTICS = (
    ("ops-added", "Operations after the pass that were not before (by name, attributes and types)"),
    ("ops-removed", "Operations before the pass that are not after (an op changed in place counts in both)"),
)
_NATIVE_STATISTIC = re.compile(r"^\s+\(S\)\s+(\d+)\s+(\S+)\s+-\s+(.*)$")


class _Watch:
    """What --mlir-timing and --mlir-pass-statistics record over one chunk, and their reports (stderr)."""

    def __init__(self, arguments):
        self.timing, self.statistics = arguments.mlir_timing, arguments.mlir_pass_statistics
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}  # a row for the parser, each element, the output
        # Per element: (group, statistic, description) -> value; group "" is topos-opt's own count.
        self.counts: dict[str, Counter[tuple[str, str, str]]] = {}

    @contextlib.contextmanager
    def timed(self, row: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[row] = self.seconds.get(row, 0.0) + time.perf_counter() - start

    def count_changes(self, element: str, before: _Fingerprint, after: _Fingerprint) -> None:
        if self.statistics:
            counts = self.counts.setdefault(element, Counter())
            for (name, description), ops in zip(_OWN_STATISTICS, (after.ops - before.ops, before.ops - after.ops)):
                counts["", name, description] += sum(ops.values())

    @contextlib.contextmanager
    def native_statistics(self, element: str) -> Iterator[None]:
        """Read the report MLIR's pass manager prints on file descriptor 2 while an upstream pass runs."""
        if not self.statistics:
            yield
            return
        said = Captured()
        try:
            with native_stderr(said):
                yield
        finally:  # a pass that failed still reports what it counted
            self._read_native(element, said.text)

    def _read_native(self, element: str, report: str) -> None:
        counts, group = self.counts.setdefault(element, Counter()), ""
        for line in report.splitlines():
            statistic = _NATIVE_STATISTIC.match(line)
            if not line.strip() or line == _BANNER or line.endswith("... Pass statistics report ..."):
                continue
            if statistic:
                counts[group, statistic[2], statistic[3]] += int(statistic[1])
            elif line.startswith("  "):
                group = line.strip()  # the pass the statistics below belong to: CSEPass
            else:
                sys.stderr.write(line + "\n")  # not the report: something else MLIR said

    def report(self) -> None:
        if self.statistics:
            sys.stderr.write(self._statistics_report())
        if self.timing:
            sys.stderr.write(self._timing_report())

    def _statistics_report(self) -> str:
        lines = [_BANNER, "                         ... Pass statistics report ...", _BANNER]
        for element, counts in self.counts.items():
            lines.append(element)
            for group in sorted(dict.fromkeys(group for group, _, _ in counts), key=bool):  # topos-opt's first
                indent = "    " if group else "  "
                if group:
                    lines.append(f"  {group}")
                entries = [(name, text, value) for (g, name, text), value in counts.items() if g == group]
                width = max(len(str(value)) for _, _, value in entries)
                lines.extend(f"{indent}(S) {value:>{width}} {name} - {text}" for name, text, value in entries)
        return "\n".join(lines) + "\n\n"

    def _timing_report(self) -> str:
        total = time.perf_counter() - self.started
        rows = [*self.seconds.items(), ("Rest", max(total - sum(self.seconds.values()), 0.0)), ("Total", total)]
        lines = [
            _BANNER, "                         ... Execution time report ...", _BANNER,
            f"  Total Execution Time: {total:.4f} seconds", "", "  ----Wall Time----  ----Name----",
        ]
        lines.extend(f"  {seconds:8.4f} ({100 * seconds / max(total, 1e-9):5.1f}%)  {row}" for row, seconds in rows)
        return "\n".join(lines) + "\n"


# ---- --irdl-file ----------------------------------------------------------------------------

_TOOL_DIAGNOSTIC = re.compile(r"^(.*?):(\d+)(?::(\d+))?: (error|warning|remark|note): (.*)$")


@dataclass(frozen=True)
class _Irdl:
    """An IRDL file: the dialects it defines, and a check of a module against them by the bundled iree-opt."""

    path: str
    dialects: frozenset[str]

    @classmethod
    def load(cls, path: str) -> _Irdl:
        try:
            text = _read(path).decode("utf-8", errors="replace")
        except OSError as error:
            raise _command_line_error(f"could not open IRDL file '{_display(path)}': {error.strerror}") from None
        irdl = cls(path, frozenset(re.findall(r"irdl\.dialect\s+@([\w$.]+)", text)))
        problems = irdl._check("")  # the definitions alone: a file MLIR refuses is reported at its own lines
        if problems:
            raise DialectError(problems)
        return irdl

    def problems(self, module) -> list[Diagnostic]:
        # Printed with locations, so what iree-opt reports points into the user's input.
        return self._check(module.operation.get_asm(enable_debug_info=True, print_generic_op_form=True))

    def _check(self, text: str) -> list[Diagnostic]:
        arguments = (f"--irdl-file={self.path}", "--allow-unregistered-dialect", "-o", os.devnull, "-")
        result = _iree_opt(*arguments, stdin=text, needed_by="--irdl-file")
        if result.returncode == 0:
            return []
        found = _tool_diagnostics(result.stderr)
        return found or [Diagnostic("error", f"iree-opt --irdl-file failed: {result.stderr.strip()}")]


def _tool_diagnostics(stderr: str) -> list[Diagnostic]:
    """iree-opt's diagnostics as topos-opt's own (each note joins the diagnostic before it)."""
    found: list[Diagnostic] = []
    for line in stderr.splitlines():
        match = _TOOL_DIAGNOSTIC.match(line)
        if match is None:
            continue  # the quoted source line and the caret under a message
        file, line_number, column, severity, message = match.groups()
        where = ir.Location.file(file, int(line_number), int(column or 0))
        if file == "<unknown>":
            where = ir.Location.unknown()
        diagnostic = Diagnostic(severity, message, where)
        if severity == "note" and found:
            found[-1] = dataclasses.replace(found[-1], notes=(*found[-1].notes, diagnostic))
        else:
            found.append(diagnostic)
    return found


__all__ = ["main", "split_chunks"]


if __name__ == "__main__":
    sys.exit(main())
