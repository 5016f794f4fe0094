"""Reading topos IR back into a spec: the inverse of ``dialect/ir/emit.py``.

The ops are replayed in order on a fresh tape, each through its opcode, so
the core's recorder (not this module) decides what a valid node is. When
the module holds a whole network, the rebuilt network's ``describe()`` is
the original's and emitting it again gives the same text. Sites come back
from the op locations (file and line; locations carry no function name).

Parameters and inputs carry no payload in IR: they come back as zeros of
their shape and element type (a selection input as index 0), which fixes
the spec but not an initial value.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
from iree.compiler import ir
from iree.compiler.dialects import builtin

from topos.base.copies import splat
from topos.base.element import selection
from topos.base.errors import ArgumentError, ToposError
from topos.dialect.ir import context as _context
from topos.dialect.ir.diagnostics import (
    Diagnostic,
    DialectError,
    VerificationError,
    core_message,
    name_of,
    site_of,
    source_label,
)
from topos.dialect.ir.emit import FUNCTION_NAME, OBSERVE
from topos.dialect.ir.ops import DIALECT, LeafOp, ToposOp, verify_module
from topos.dialect.ir.verify import structural_problems
from topos.spec.network import Network
from topos.spec.symbol import Symbol
from topos.spec.tape import Tape


def parse_module(text: str, *, context: ir.Context | None = None, source_name: str = "<string>"):
    """Parse topos IR text into a ``builtin.module`` op (a syntax error raises DialectError).

    Locations of ops without an explicit ``loc(...)`` name ``source_name``.
    Top-level ops other than one module are wrapped in a module, as
    mlir-opt does.
    """
    if not isinstance(text, str):
        raise ArgumentError(f"parse_module takes topos IR text (a str), not {_given(text)}")
    context = _context.configure(context) if context is not None else _context.new_context()
    with context:
        try:
            parsed = ir.Operation.parse(text, source_name=source_name)
        except ir.MLIRError as error:
            if not any("single top-level operation" in d.message for d in error.error_diagnostics):
                raise DialectError.from_mlir(error) from None
            return _parse_several(text, source_name)
        if parsed.operation.name == "builtin.module":
            return parsed
        module = builtin.ModuleOp(loc=parsed.location)
        ir.InsertionPoint(module.body).insert(parsed.operation)
        return module


def _parse_several(text: str, source_name: str):
    # Module.parse wraps several top-level ops in a module but names the
    # buffer "-"; print with locations, rename, and parse once more.
    try:
        wrapped = ir.Module.parse(text)
    except ir.MLIRError as error:
        raise DialectError.from_mlir(error) from None
    printed = wrapped.operation.get_asm(enable_debug_info=True)
    quoted = '"' + source_name.replace("\\", "\\\\").replace('"', '\\22') + '"'
    renamed = re.sub(r'loc\("-":', lambda _: f"loc({quoted}:", printed)
    try:
        return ir.Operation.parse(renamed, source_name=source_name)
    except ir.MLIRError as error:
        raise DialectError.from_mlir(error) from None


def parse_spec(
    source: str | ir.Module, *, context: ir.Context | None = None
) -> tuple[Network, tuple[Symbol, ...], tuple[Symbol, ...]]:
    """Rebuild ``(network, roots, observes)`` from topos IR (text or a parsed module)."""
    if not isinstance(source, (str, ir.Module, ir.Operation, ir.OpView)):
        raise ArgumentError(f"parse_spec takes topos IR text (a str) or a module (parse_module's, "
                            f"emit_module's), not {_given(source)}")
    module = parse_module(source, context=context) if isinstance(source, str) else source
    with module.context, ir.Location.unknown():
        problems = structural_problems(module) or verify_module(module)
        if problems:
            raise VerificationError(problems)
        function = main_function(module)
        return _replay(function)


def _given(value) -> str:
    """What a caller passed, and for bytes how to make the text asked for."""
    if isinstance(value, (bytes, bytearray)):
        return f"{type(value).__name__}; decode them first: data.decode('utf-8')"
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def main_function(module: ir.Module) -> ir.OpView:
    """The ``func.func`` holding the spec: the one named @main, else the module's only function.

    A DialectError when there is no such function, more than one, or it is a declaration.
    """
    functions = [op for op in module.body.operations if op.operation.name == "func.func"]
    named = [f for f in functions if ir.StringAttr(f.attributes["sym_name"]).value == FUNCTION_NAME]
    chosen = named or functions
    if len(chosen) != 1:
        message = f"expected one func.func @{FUNCTION_NAME} holding the spec, found {len(functions)} functions"
        raise DialectError([Diagnostic.error(message, module.operation)])
    if not list(chosen[0].regions[0].blocks):
        raise DialectError([Diagnostic.error("the spec function is a declaration; it needs a body", chosen[0])])
    return chosen[0]


def _replay(function) -> tuple[Network, tuple[Symbol, ...], tuple[Symbol, ...]]:
    blocks = list(function.regions[0].blocks)
    if len(blocks) != 1:
        raise DialectError([Diagnostic.error("the spec function must have exactly one block", function)])
    tape = Tape()
    recorded: dict[ir.Value, Any] = {}
    terminator = None
    for operation in blocks[0].operations:
        name = operation.operation.name
        if name == "func.return":
            terminator = operation
            continue
        if not name.startswith(DIALECT + "."):
            raise DialectError(
                [Diagnostic.error(f"'{name}' is not a topos op; only topos IR reads back into a spec", operation)]
            )
        view: ToposOp = operation.operation.opview
        try:
            value = _record(tape, view, recorded)
        except DialectError:
            raise
        except ToposError as error:  # the recorder refuses what the op verifier let through
            raise DialectError([view.diagnostic(f"cannot be recorded: {core_message(error)}")]) from error
        except MemoryError:  # a leaf that does not fit in memory (sources come back as one stored zero)
            message = f"{view.operation.results[0].type} does not fit in memory"
            raise DialectError([view.diagnostic(message)]) from None
        tape.locate(value, site_of(view.location))  # the recording site is the op's, not ours
        recorded[view.operation.results[0]] = value
    if terminator is None:
        raise DialectError([Diagnostic.error("the spec function has no return", function)])
    results = []
    for position, returned in enumerate(terminator.operation.operands):
        if returned not in recorded:
            raise DialectError(
                [Diagnostic.error(f"result #{position} is not computed by a topos op", terminator)]
            )
        results.append(recorded[returned])
    observed = _observed_results(function, len(results))
    network = tape.seal()
    symbols = [v.symbol for v in results]
    roots = tuple(s for s, o in zip(symbols, observed) if not o)
    observes = tuple(s for s, o in zip(symbols, observed) if o)
    if observed != sorted(observed):
        raise DialectError(
            [Diagnostic.error("observes must follow the roots in the function results", function)]
        )
    return network, roots, observes


def _record(tape: Tape, view: ToposOp, recorded: dict):
    name = view.opcode.name
    if name == "leaf":
        leaf: LeafOp = view
        payload: Any = leaf.value
        if leaf.extent is not None:
            payload = selection(payload, leaf.extent)
        return tape.leaf(payload)
    if name in ("parameter", "input"):
        spec = view.spec
        default: Any
        if view.extent is not None:
            default = selection(np.zeros(spec.shape, dtype=np.int64), view.extent)
        else:  # one stored zero: GPT-2 124M's parameters read back in 2 ms, not 0.4 s of copies
            default = splat(np.zeros((), dtype=spec.dtype), spec.shape)
        label = name_of(view.location)
        source, role = source_label(label) if label else (None, "")
        if name == "parameter":
            return tape.parameter(default, name=source, trainable=role != "state")
        return tape.input(default, name=source, required=role == "required")
    operands = []
    for position, value in enumerate(view.operation.operands):
        if value not in recorded:
            message = (
                f"'{view.operation.name}' op node {view.node}: operand #{position} is not the result "
                "of an earlier topos op, so it names no node of the spec"
            )
            raise DialectError([Diagnostic.error(message, view)])
        operands.append(recorded[value])
    return view.opcode.express(operands, view.opcode_attributes())


def _observed_results(function, count: int) -> list[bool]:
    if "res_attrs" not in function.attributes:
        return [False] * count
    dictionaries = ir.ArrayAttr(function.attributes["res_attrs"])
    return [OBSERVE in ir.DictAttr(d) for d in dictionaries]


__all__ = ["main_function", "parse_module", "parse_spec"]
