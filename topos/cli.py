"""The ``topos`` command.

``topos bisect FILE.py[:FUNCTION]`` names the line where a compiled run
diverges. FUNCTION (default ``bisect_case``) takes no arguments and
returns ``(entry, parameters, feeds)``; feeds may be left out or None.
Exit status: 0 when every node is within its envelope, 1 when a
divergence was found, 2 when no verdict could be reached (a usage error,
a file or function that cannot be loaded, a case that raises, a module
IREE refuses).

``topos export FILE.py[:FUNCTION] -o DIR`` writes the self-contained IREE
artifact of the case's entry (``plan.export``; FUNCTION default
``export_case``, same return convention; the parameters and feeds become
the test vectors; ``--frozen`` writes the parameters to ``parameters.irpa``
for the module to read as globals). Exit status 0 when written, 2 when refused.

User mistakes get a one-paragraph message, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

DEFAULT_FUNCTION = "bisect_case"
EXPORT_FUNCTION = "export_case"


class _Refusal(Exception):
    """A user mistake: printed as ``topos bisect: error: ...`` with exit status 2."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``topos`` command with ``argv`` (default ``sys.argv[1:]``) and return its exit status."""
    parser = _parser()
    arguments = parser.parse_args(argv)  # argparse prints usage and exits 2 on its own mistakes
    if arguments.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return _bisect(arguments) if arguments.command == "bisect" else _export(arguments)
    except _Refusal as refusal:
        print(f"topos {arguments.command}: error: {refusal}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="topos", description="topos command-line tools.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    bisect = commands.add_parser(
        "bisect",
        help="name the first node whose compiled value leaves its envelope",
        description=(
            "Compile a case with every node observed, run it once, and name the first node "
            "(recording order) whose compiled value is outside its envelope of the reference "
            "kernel applied to its compiled inputs. Exit 0: no divergence; 1: divergence found; "
            "2: no verdict (usage error, or the case could not be loaded, compiled or run)."
        ),
    )
    bisect.add_argument(
        "case", metavar="FILE.py[:FUNCTION]",
        help=f"a Python file and the function in it that returns (entry, parameters, feeds) "
             f"(default function: {DEFAULT_FUNCTION})",
    )
    bisect.add_argument("--target", default="llvm-cpu", help="IREE target (default: llvm-cpu)")
    bisect.add_argument(
        "--replace", nargs=2, action="append", default=[], metavar=("OLD", "NEW"),
        help="inject a fault: replace every OLD with NEW in the StableHLO text before IREE "
             "compiles it (repeatable; OLD must occur)",
    )
    bisect.add_argument("--print-stablehlo", action="store_true",
                        help="print the StableHLO text IREE compiled (after --replace) before the report")
    export = commands.add_parser(
        "export",
        help="write a self-contained IREE artifact (module.vmfb, StableHLO, flags, manifest, test vectors, check.sh)",
        description=(
            "Compile a case's entry for a target and write a folder that IREE runs without topos: "
            "module.vmfb, module.stablehlo.mlir and module.located.mlir, flags.txt, manifest.json, the "
            "oracle's test vectors (inputs/, expected/) and check.sh. Exit 0: written; 2: refused."
        ),
    )
    export.add_argument(
        "case", metavar="FILE.py[:FUNCTION]",
        help=f"a Python file and the function in it that returns (entry, parameters, feeds) "
             f"(default function: {EXPORT_FUNCTION})",
    )
    export.add_argument("-o", "--output", required=True, metavar="DIR", help="the folder to write")
    export.add_argument("--target", default="llvm-cpu",
                        help="IREE target: llvm-cpu (default), cuda, vulkan-spirv, metal-spirv, rocm")
    export.add_argument("--cpu", default=None,
                        help="llvm-cpu only: generic (default, portable), host (this machine) or an LLVM CPU name")
    export.add_argument("--force", action="store_true", help="replace DIR when it exists and is not empty")
    export.add_argument("--frozen", action="store_true",
                        help="the parameters as module globals, their values in parameters.irpa (not inputs)")
    return parser


def _export(arguments) -> int:
    path, function = _split_case(arguments.case, EXPORT_FUNCTION)
    _check_export_arguments(arguments)
    case = _load_function(path, function)
    entry, parameters, feeds = _call_case(case, path, function)
    from topos.base.errors import ToposError

    try:
        folder = entry.lower().export(arguments.output, arguments.target, parameters=parameters, feeds=feeds,
                                      cpu=arguments.cpu, force=arguments.force, frozen=arguments.frozen)
    except ToposError as error:
        raise _Refusal(_for_export(_message(error, path))) from None
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    print(f"exported {len(files)} files to {folder}: {', '.join(files)}")
    print(f"check it without topos: sh {folder / 'check.sh'}")
    return 0


def _check_export_arguments(arguments) -> None:
    """What the command line alone shows to be wrong, refused before the case runs or anything is written."""
    from topos.base.errors import ToposError
    from topos.dialect.iree.targets import target

    try:
        chosen = target(arguments.target)
    except ToposError as error:
        raise _Refusal(f"{type(error).__name__}: {_bare(error)}") from None
    if arguments.cpu is not None and chosen.name != "llvm-cpu":
        raise _Refusal(f"--cpu applies to llvm-cpu only; drop it for {arguments.target}")
    # Replacing (--force) a folder the shell stands in would pull the current directory from under it.
    folder = Path(arguments.output)
    here = Path.cwd().resolve()
    if folder.exists() and (folder.resolve() == here or folder.resolve() in here.parents):
        relation = "is" if folder.resolve() == here else "contains"
        raise _Refusal(f"-o {arguments.output} {relation} the current directory ({here}), which export cannot "
                       "replace; name a new folder, such as -o artifact")


# check_cpu's advice names both defaults in the library's spelling (cpu='generic'); the command's is --cpu.
_CPU_ADVICE = re.compile(r"Use cpu='host' \(this machine's CPU: compile's default\) or cpu='generic' "
                         r"\(any (\S+) machine: export's default\)")


def _for_export(message: str) -> str:
    """The library's advice in the command's own spelling (--cpu NAME) and with export's default."""
    return _CPU_ADVICE.sub(r"Use --cpu generic (any \1 machine, export's default) or --cpu host "
                           r"(this machine's CPU)", message)


def _message(error: BaseException, path: Path) -> str:
    """``Type: message``, naming the place only where it is a line of the case file.

    A topos error names the innermost line outside topos; once the case has
    returned, that is the ``topos`` script's own line, which says nothing to
    the user, so it is left out.
    """
    text = str(error)
    bare = _bare(error)
    if bare != text:
        # What AtTheUsersLine put in front: "FILE:LINE in FUNCTION: ".
        site = re.fullmatch(r"(.*):\d+ in .*: ", text[: len(text) - len(bare)])
        if site is None or os.path.realpath(site.group(1)) != os.path.realpath(path):
            text = bare
    return f"{type(error).__name__}: {text}"


def _bare(error: BaseException) -> str:
    """The message of a topos error without the place AtTheUsersLine puts in front of it."""
    from topos.base.errors import AtTheUsersLine

    text = str(error)
    bare = getattr(error, "bare", "") if isinstance(error, AtTheUsersLine) else ""
    return bare if bare and text.endswith(bare) else text


def _bisect(arguments) -> int:
    path, function = _split_case(arguments.case)
    case = _load_function(path, function)
    entry, parameters, feeds = _call_case(case, path, function)
    compiled_text: list[str] = []

    def rewrite(text: str) -> str:
        for old, new in arguments.replace:
            if old not in text:
                raise _Refusal(f"--replace: {old!r} does not occur in the StableHLO text; "
                               f"see it with --print-stablehlo")
            text = text.replace(old, new)
        compiled_text.append(text)
        return text

    from topos.base.errors import ToposError
    from topos.views.bisect import bisect

    try:
        report = bisect(entry, parameters, feeds, arguments.target, rewrite=rewrite)
    except ToposError as error:
        raise _Refusal(_message(error, path)) from None
    if arguments.print_stablehlo and compiled_text:
        print(compiled_text[-1])
    print(report)
    return 0 if report.ok else 1


def _split_case(case: str, default: str = DEFAULT_FUNCTION) -> tuple[Path, str]:
    """``FILE.py:FUNCTION`` -> (path, function); a colon that names no identifier belongs to the path."""
    head, colon, tail = case.rpartition(":")
    if colon and tail.isidentifier():
        if not head:
            raise _Refusal(f"{case!r}: nothing before the colon; write FILE.py:FUNCTION")
        return Path(head), tail
    if colon and not tail:
        raise _Refusal(f"{case!r}: nothing after the colon; write FILE.py:FUNCTION or just FILE.py")
    return Path(case), default


def _load_function(path: Path, function: str):
    if not path.exists():
        raise _Refusal(f"no such file: {path}")
    if not path.is_file():
        raise _Refusal(f"{path} is not a file; give a Python file that defines {function}()")
    name = "_topos_case_" + "".join(c if c.isalnum() else "_" for c in path.stem)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise _Refusal(f"{path} cannot be imported as Python (is it a .py file?)")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.resolve().parent))  # so the case can import its neighbours
    try:
        spec.loader.exec_module(module)
    except SyntaxError as error:
        raise _Refusal(f"{error.filename}:{error.lineno}: SyntaxError: {error.msg}") from None
    except SystemExit as error:  # the user's module ended the process while loading: report, go on
        raise _Refusal(f"{path} called {_exit_call(error)} while being imported; a case file defines "
                       f"{function}() and does not exit{_line_in(error, path)}") from None
    except Exception as error:  # noqa: BLE001  (the user's module raised while loading)
        raise _Refusal(f"importing {path} raised {_where(error, path)}") from None
    case = getattr(module, function, None)
    if case is None:
        defined = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                         and getattr(v, "__module__", None) == name)
        hint = f"; it defines {', '.join(defined)}" if defined else ""
        raise _Refusal(f"{path} has no function {function!r}{hint}; "
                       f"name one with {path}:FUNCTION")
    if not callable(case):
        raise _Refusal(f"{path}:{function} is a {type(case).__name__}, not a function")
    return case


def _call_case(case, path: Path, function: str):
    from topos.readings.plan.entry import Entry

    try:
        returned = case()
    except SystemExit as error:  # the user's function ended the process: report, go on
        raise _Refusal(f"{path} called {_exit_call(error)} while {function}() ran; {function}() returns "
                       f"(entry, parameters, feeds) and does not exit{_line_in(error, path)}") from None
    except Exception as error:  # noqa: BLE001  (the user's function raised: report, do not crash)
        raise _Refusal(f"{function}() in {path} raised {_where(error, path)}") from None
    if not isinstance(returned, (tuple, list)) or len(returned) not in (2, 3):
        raise _Refusal(f"{function}() must return (entry, parameters, feeds) or (entry, parameters); "
                       f"it returned {_kind(returned)}")
    entry, parameters, feeds = (*returned, None) if len(returned) == 2 else returned
    if not isinstance(entry, Entry):
        raise _Refusal(f"{function}() returned {_kind(entry)} where an Entry belongs first; "
                       f"build one with network.entry([roots])")
    return entry, parameters, feeds


def _where(error: BaseException, path: Path) -> str:
    """``Type: message`` and the innermost line of the user's file the exception passed through."""
    return f"{type(error).__name__}: {error}{_line_in(error, path)}"


def _line_in(error: BaseException, path: Path) -> str:
    """``at FILE:LINE in FUNCTION: code`` on a line of its own: the innermost line of ``path`` in the traceback."""
    target = os.path.realpath(path)
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if os.path.realpath(f.filename) == target]
    if not frames:
        return ""
    last = frames[-1]
    return f"\n  at {last.filename}:{last.lineno} in {last.name}: {(last.line or '').strip()}"


def _exit_call(error: SystemExit) -> str:
    return "sys.exit()" if error.code is None else f"sys.exit({error.code!r})"


def _kind(value) -> str:
    name = type(value).__name__
    article = "an" if name[:1].lower() in "aeiou" else "a"
    if isinstance(value, (tuple, list)):
        return f"{article} {name} of {len(value)}"
    return f"{article} {name}"


if __name__ == "__main__":
    sys.exit(main())
