"""The pass registry: named passes over topos IR, runnable from Python and ``topos-opt``.

A pass is a Python function that takes the module (a ``builtin.module``
op) and its options as keyword arguments, changes the module in place, and
raises :class:`PassFailure` to report errors at op locations::

    @register_pass("topos-count", "Annotate each op with its position")
    def count(module, *, start="0"):
        ...

Options arrive as strings, spelled as in MLIR pipelines:
``topos-count{start=5}``; a pass raises :class:`OptionError` for a value
it cannot use, and the error points at the pass in the pipeline.
:func:`run_pipeline` runs a list of such elements, mixing registered
Python passes and upstream MLIR passes (``canonicalize``, ``cse``,
``func.func(cse)``) by name.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from iree.compiler import ir, passmanager

from topos.base.errors import ArgumentError
from topos.dialect.ir.diagnostics import Diagnostic, DialectError, one_line, python_location
from topos.dialect.ir.ops import verify_module
from topos.dialect.ir.verify import structural_problems

PIPELINE_PARSER = "MLIR Textual PassPipeline Parser"  # the "file" pipeline diagnostics point into


class PassModuleError(DialectError):
    """A module named to register passes could not be imported: it is missing, or it raised."""

    @classmethod
    def of(cls, module: str, error: BaseException) -> PassModuleError:
        # A module that is simply not there has no line to point at; one
        # that raised is reported where it raised, so its author can look.
        missing = isinstance(error, ModuleNotFoundError) and error.name == module
        where = None if missing else python_location(error, _current_context() or ir.Context(), (__file__,))
        return cls([Diagnostic("error", f"cannot load pass module '{module}': {one_line(error)}", where)])


class PassFailure(DialectError):
    """A pass could not do its job; ``diagnostics`` point at the ops responsible."""

    @classmethod
    def at(cls, where, message: str) -> PassFailure:
        """One error at an op (or a location)."""
        return cls([Diagnostic.error(message, where)])


class OptionError(ValueError):
    """A pass option has a value the pass cannot use; reported in the pipeline text, at the pass."""


@dataclass(frozen=True)
class Pass:
    """A registered pass: its name, a one-line description, and how to run it."""

    name: str
    description: str
    run: Callable[..., None] | None  # None for an upstream MLIR pass run by name
    options: tuple[tuple[str, str], ...] = ()  # (option, default) for a Python pass

    @property
    def upstream(self) -> bool:
        return self.run is None


_REGISTRY: dict[str, Pass] = {}


def register_pass(name: str, description: str) -> Callable[[Callable], Callable]:
    """Decorator: register ``fn(module, **options)`` as the pass ``name``.

    Keyword parameters with defaults become the pass's options. The
    function is returned unchanged, so it stays callable directly.
    """

    def decorate(fn: Callable) -> Callable:
        if name in _REGISTRY and _REGISTRY[name].run is not fn:
            raise ValueError(f"a pass named {name!r} is already registered")
        options = tuple(
            (p.name, "" if p.default is inspect.Parameter.empty else str(p.default))
            for p in list(inspect.signature(fn).parameters.values())[1:]
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        )
        _REGISTRY[name] = Pass(name, description, fn, options)
        return fn

    return decorate


def register_upstream_pass(name: str, description: str) -> None:
    """List an upstream MLIR pass so ``topos-opt`` offers a ``--name`` flag for it."""
    _REGISTRY.setdefault(name, Pass(name, description, None))


def registered_passes() -> tuple[Pass, ...]:
    """Every registered pass, Python passes first, each group by name."""
    return tuple(sorted(_REGISTRY.values(), key=lambda p: (p.upstream, p.name)))


def lookup(name: str) -> Pass | None:
    return _REGISTRY.get(name)


def python_pass(element: str) -> Pass | None:
    """The registered Python pass a pipeline element (``name`` or ``name{options}``) names; None for upstream."""
    registered = _REGISTRY.get(re.split(r"[{(]", element, maxsplit=1)[0].strip())
    return None if registered is None or registered.upstream else registered


# Modules that register passes when imported. A module that does not exist
# yet is skipped; one that fails to import is a bug and is reported.
PASS_MODULES: tuple[str, ...] = (
    "topos.dialect.passes.lowering", "topos.dialect.passes.plan_passes", "topos.dialect.passes.raising",
)
ENTRY_POINT_GROUP = "topos.passes"  # third-party packages register passes here


def load_pass_modules(extra: Iterable[str] = ()) -> None:
    """Import every module that registers passes (the dialect's own, entry points, ``extra``)."""
    for module in PASS_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as error:
            if error.name != module:
                raise
    from importlib.metadata import entry_points

    # Entry points and ``extra`` are other people's code: one that fails to
    # import is a PassModuleError (a diagnostic), not a bug of topos.
    # (SystemExit too: a module that calls sys.exit() on import has not loaded.)
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            entry.load()
        except (Exception, SystemExit) as error:
            raise PassModuleError.of(entry.value, error) from error
    for module in extra:
        try:
            importlib.import_module(module)
        except (Exception, SystemExit) as error:
            raise PassModuleError.of(module, error) from error


# ---- pipelines ---------------------------------------------------------------------------


def split_pipeline(pipeline: str) -> list[tuple[str, int]]:
    """Top-level elements of a textual pipeline with their offsets: ``"a,b{x=1}"`` -> a, b{x=1}.

    A pipeline wrapped in ``builtin.module(...)`` is unwrapped, so mlir-opt
    spellings work unchanged.
    """
    text = pipeline.strip()
    base = len(pipeline) - len(pipeline.lstrip())
    anchor = "builtin.module("
    if text.startswith(anchor) and text.endswith(")") and _balanced_end(text, len(anchor) - 1) == len(text) - 1:
        text, base = text[len(anchor) : -1], base + len(anchor)
    elements, depth, start = [], 0, 0
    for i, character in enumerate(text + ","):
        if character in "({":
            depth += 1
        elif character in ")}":
            depth -= 1
        elif character == "," and depth == 0:
            element = text[start:i]
            stripped = element.strip()
            column = base + start + len(element) - len(element.lstrip())
            if stripped:
                elements.append((stripped, column))
            elif text.strip():  # "a,", ",a", "a,,b": an empty pass name, which MLIR's parser refuses too
                raise _pipeline_error(pipeline, column, "'' does not refer to a registered pass or pass pipeline "
                                      "(an empty pass name: drop the extra ',')")
            start = i + 1
    if depth != 0:
        raise _pipeline_error(pipeline, len(pipeline), f"unbalanced brackets in the pass pipeline {pipeline!r}")
    return elements


def _balanced_end(text: str, opening: int) -> int:
    depth = 0
    for i in range(opening, len(text)):
        if text[i] in "({":
            depth += 1
        elif text[i] in ")}":
            depth -= 1
            if depth == 0:
                return i
    return -1


def parse_options(element: str, offset: int = 0) -> tuple[str, dict[str, str]]:
    """``name{a=1 b="x y"}`` -> ("name", {"a": "1", "b": "x y"})."""
    if "{" not in element:
        return element, {}
    name, _, rest = element.partition("{")
    if not rest.endswith("}"):
        raise _pipeline_error(element, offset + len(element), f"expected '}}' after the options of {name!r}")
    body, options, i = rest[:-1], {}, 0
    while i < len(body):
        if body[i].isspace():
            i += 1
            continue
        key_end = i
        while key_end < len(body) and body[key_end] not in "= ":
            key_end += 1
        key = body[i:key_end]
        if key_end >= len(body) or body[key_end] != "=":
            options[key] = "true"  # a bare flag, as MLIR's option parser allows
            i = key_end
            continue
        j = key_end + 1
        if j < len(body) and body[j] in "\"'{":
            closing = {"{": "}"}.get(body[j], body[j])
            end = body.find(closing, j + 1)
            if end < 0:
                raise _pipeline_error(element, offset, f"unterminated value for option {key!r}")
            options[key] = body[j + 1 : end]
            i = end + 1
        else:
            end = j
            while end < len(body) and not body[end].isspace():
                end += 1
            options[key] = body[j:end]
            i = end
    return name.strip(), options


def _pipeline_error(pipeline: str, offset: int, message: str) -> DialectError:
    # A diagnostic about the pipeline text points into it, as MLIR's own
    # pipeline parser does; any context can hold that location.
    context = _current_context() or ir.Context()
    location = ir.Location.file(PIPELINE_PARSER, 1, offset + 1, context=context)
    return PassFailure([Diagnostic("error", message, location)])


def _current_context() -> ir.Context | None:
    try:
        return ir.Context.current
    except ValueError:
        return None


def run_pipeline(
    module,
    pipeline: str | Sequence[str],
    *,
    verify_each: bool = True,
    after_each: Callable[[str, object], None] | None = None,
    upstream_statistics: bool = False,
) -> None:
    """Run passes on ``module`` in order; raise PassFailure (with locations) when one fails.

    ``pipeline`` is a textual pipeline (``"topos-verify,canonicalize,cse"``,
    ``"builtin.module(cse)"``) or a list of its elements. Registered Python
    passes and upstream MLIR passes mix freely. With ``verify_each`` the
    module is verified (MLIR's verifier and the topos op verifiers) after
    every pass, as mlir-opt does. ``after_each(element, module)`` is called
    after every pass (``--mlir-print-ir-after-all``). With
    ``upstream_statistics`` MLIR's pass manager prints the statistics of
    each upstream pass to the process's stderr (file descriptor 2), as
    ``mlir-opt --mlir-pass-statistics --mlir-pass-statistics-display=list``.
    """
    _check_module(module, "run_pipeline")
    if not isinstance(pipeline, str) and not (
        isinstance(pipeline, Sequence) and all(isinstance(text, str) for text in pipeline)
    ):
        raise ArgumentError(
            f"run_pipeline takes the pipeline as text ('topos-verify,cse') or a list of such texts, "
            f"not {_kind(pipeline)}"
        )
    with module.context:
        if isinstance(pipeline, str):
            elements = split_pipeline(pipeline)
        else:
            elements = [element for text in pipeline for element in split_pipeline(text)]
        for element, offset in elements:
            _run_element(module, element, offset, upstream_statistics)
            if verify_each:
                verify_or_raise(module, after=element)
            if after_each is not None:
                after_each(element, module)


def _check_module(module, function: str) -> None:
    """Refuse anything but a parsed or emitted module, naming what was given and where IR text goes."""
    if isinstance(module, (ir.Module, ir.Operation, ir.OpView)):
        return
    hint = (" (IR text: transform(text, pipeline) parses, runs and prints it, or parse_module(text) "
            "gives the module)") if isinstance(module, (str, bytes)) else ""
    raise ArgumentError(
        f"{function} takes a module (ir.Module, from emit_module or parse_module), not {_kind(module)}{hint}"
    )


def _kind(value) -> str:
    if value is None or isinstance(value, bytes):
        return "None" if value is None else "bytes"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _run_element(module, element: str, offset: int, statistics: bool = False) -> None:
    registered = python_pass(element)
    if registered is not None:
        _, options = parse_options(element, offset)
        _run_python_pass(module, registered, options, element, offset)
        return
    manager = upstream_pipeline(element, offset)
    if statistics:
        manager.enable_statistics(passmanager.PassDisplayMode.LIST)
    try:
        manager.run(module.operation)
    except ir.MLIRError as error:
        raise PassFailure.from_mlir(error, f"pass '{element}' failed") from None


_RESTRICTED = re.compile(r"restricted to '([\w.]+)' on a PassManager intended to run on 'builtin.module'")


def upstream_pipeline(element: str, offset: int = 0) -> passmanager.PassManager:
    """The pass manager that runs one upstream pipeline element on a module; a bad element raises PassFailure.

    A pass restricted to one kind of op (``chlo-legalize-to-stablehlo`` runs
    on ``func.func``) is nested under that op, as mlir-opt's implicit nesting
    does. Errors point at ``offset``, the element's place in the pipeline text.
    """
    text = f"builtin.module({element})"
    for _ in range(2):
        try:
            with _llvm_option_errors(element) as said:
                return passmanager.PassManager.parse(text)
        except ValueError as error:
            message = str(error)
            restricted = _RESTRICTED.search(message)
            if restricted is None:
                break
            text = f"builtin.module({restricted.group(1)}({element}))"
    raise _upstream_pipeline_error(element, offset, message, said.text)


class Captured:
    """Text a native library wrote on file descriptor 2 (native_stderr fills it in)."""

    text = ""


@contextlib.contextmanager
def _llvm_option_errors(element: str) -> Iterator[Captured]:
    """What LLVM's option parser writes on file descriptor 2 while a pipeline with options is parsed.

    A bad option value (``canonicalize{max-iterations=banana}``) is told
    there, as ``<program>: for the --max-iterations option: ...``, before
    the pipeline error; it is captured to become part of that error's one
    line. Anything said while the parse succeeds is passed on unchanged.
    """
    if "{" not in element:  # no options, nothing for LLVM's option parser to say
        yield Captured()
        return
    with native_stderr() as said:
        yield said
    sys.stderr.write(said.text)  # reached only when the parse succeeded


@contextlib.contextmanager
def native_stderr(said: Captured | None = None) -> Iterator[Captured]:
    """What native code (MLIR, LLVM) writes on file descriptor 2 within the block, in ``.text`` after it.

    Python's ``sys.stderr`` does not see those writes; the descriptor itself
    is pointed at a temporary file and restored, whatever the block raises.
    """
    said = Captured() if said is None else said
    sys.stderr.flush()
    with tempfile.TemporaryFile() as captured:
        saved = os.dup(2)
        os.dup2(captured.fileno(), 2)
        try:
            yield said
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            said.text = captured.read().decode("utf-8", errors="replace")


def _run_python_pass(module, registered: Pass, options: dict[str, str], element: str, offset: int) -> None:
    assert registered.run is not None  # only Python passes come here
    known = {option for option, _ in registered.options}
    accepts_any = any(
        p.kind is p.VAR_KEYWORD for p in inspect.signature(registered.run).parameters.values()
    )
    unknown = sorted(set(options) - known)
    if unknown and not accepts_any:
        raise _pipeline_error(
            element,
            offset,
            f"pass '{registered.name}' has no option '{unknown[0]}'"
            + (f" (its options: {', '.join(sorted(known))})" if known else " (it takes no options)"),
        )
    with ir.Location.unknown():
        try:
            registered.run(module, **options)
        except DialectError:
            raise
        except OptionError as error:
            raise _pipeline_error(element, offset, f"pass '{registered.name}': {error}") from None
        except ir.MLIRError as error:
            raise PassFailure.from_mlir(error, f"pass '{registered.name}' failed") from error
        except (Exception, SystemExit) as error:  # a bug in the pass: report it where it raised, cause chained
            message = f"pass '{registered.name}' crashed: {one_line(error)}"
            raise PassFailure([Diagnostic.error(message, python_location(error))]) from error


def _upstream_pipeline_error(element: str, offset: int, text: str, said: str = "") -> DialectError:
    first = text.strip().splitlines()[0] if text.strip() else "invalid pass pipeline"
    message = first.split("error: ", 1)[-1]
    # LLVM's own line names the option and the value it refused: "<program>: for the --x option: ...".
    told = [line.strip().partition(": for the ")[2] for line in said.splitlines() if ": for the " in line]
    if told:
        message += f": for the {told[0]}"
    if "does not refer to a registered pass" in message:
        python = [p.name for p in registered_passes() if not p.upstream]
        message += f" (topos passes: {', '.join(python)})"
    elif "no such option" in text:
        message = " ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    return _pipeline_error(element, offset, message)


def transform(text: str, pipeline: str, *, debug_info: bool = False) -> str:
    """Parse topos IR text, run ``pipeline`` on it, and return the printed result (a Python mlir-opt)."""
    from topos.dialect.ir.context import new_context
    from topos.dialect.ir.parse import parse_module

    if not isinstance(text, str):
        raise ArgumentError(f"transform takes topos IR text (a str), not {_kind(text)}"
                            + ("; decode them first: data.decode('utf-8')" if isinstance(text, bytes) else ""))
    load_pass_modules()
    with new_context():
        module = parse_module(text)
        run_pipeline(module, pipeline)
        return module.operation.get_asm(enable_debug_info=debug_info)


def verify_or_raise(module, after: str | None = None) -> None:
    """MLIR's verifier, where topos ops stand, then every topos op's verifier; PassFailure on any problem."""
    try:
        module.operation.verify()
    except ir.MLIRError as error:
        raise PassFailure.from_mlir(error) from None
    problems = structural_problems(module) or verify_module(module)
    if problems:
        raise PassFailure(problems)


# ---- the passes this module owns -----------------------------------------------------------


@register_pass(
    "topos-verify",
    "Check every topos op against its opcode: operand count, types, attributes, shape rule",
)
def verify_pass(module) -> None:
    """Report every topos op that the core's shape rules reject, at the op's location."""
    verify_or_raise(module)


register_upstream_pass("canonicalize", "Upstream MLIR canonicalizer (leaves topos ops alone)")
register_upstream_pass("cse", "Upstream MLIR common subexpression elimination (registered ops only)")
register_upstream_pass("symbol-dce", "Upstream MLIR dead symbol elimination")
register_upstream_pass("inline", "Upstream MLIR inliner")


__all__ = [
    "ENTRY_POINT_GROUP", "PASS_MODULES", "OptionError", "Pass", "PassFailure", "PassModuleError",
    "load_pass_modules", "lookup",
    "parse_options", "python_pass", "register_pass", "register_upstream_pass", "registered_passes",
    "run_pipeline", "split_pipeline", "transform", "upstream_pipeline", "verify_or_raise",
]
