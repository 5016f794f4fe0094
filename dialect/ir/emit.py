"""Emission: a sealed spec (or the part of it an export declares) as topos IR.

The module has one function, ``@main``. Its arguments are the parameters
of the emitted set, then its inputs, each in recording order; its results
are the declared roots, then the observes (marked ``{topos.observe}``), in
declared order. Each node becomes exactly one op carrying its node index
and its recording site as location, so a line of the module maps to a line
of ``network.describe()`` and back (``dialect/ir/parse.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from iree.compiler import ir
from iree.compiler.dialects import func

from topos.base.arguments import flag
from topos.base.element import Selection, SelectionType
from topos.base.errors import ArgumentError, SymbolError
from topos.dialect.ir import context as _context
from topos.dialect.ir.diagnostics import node_location
from topos.dialect.ir.ops import InputOp, LeafOp, ParameterOp, op_class, tensor_type
from topos.spec.network import Network
from topos.spec.opcodes import Spec
from topos.spec.symbol import Symbol

MODULE_NAME = "topos"
FUNCTION_NAME = "main"
OBSERVE = "topos.observe"  # result attribute marking an observe (roots carry none)


def _symbols(value: Symbol | Iterable[Symbol] | None) -> tuple[Symbol, ...]:
    if value is None:
        return ()
    if isinstance(value, Symbol):
        return (value,)
    return tuple(value)


def ancestors(network: Network, wanted: Sequence[Symbol], nodes=None) -> list[int]:
    """Node indices the wanted symbols depend on (themselves included), in recording order."""
    operands = [tuple(s.index for s in node.operands) for node in (nodes or network.nodes())]
    keep = [False] * len(operands)
    stack = [network.check(s, "root") for s in wanted]
    while stack:
        index = stack.pop()
        if keep[index]:
            continue
        keep[index] = True
        stack.extend(j for j in operands[index] if not keep[j])
    return [i for i, kept in enumerate(keep) if kept]


def emit_module(
    network: Network,
    roots: Symbol | Iterable[Symbol],
    observes: Symbol | Iterable[Symbol] = (),
    *,
    context: ir.Context | None = None,
    constants: Mapping[int, np.ndarray] | None = None,
) -> ir.Module:
    """The ancestor closure of ``roots`` and ``observes`` as a topos-dialect module.

    Pass ``context`` to build in a context you already use (for example an
    IREE compiler session's); it is configured for topos IR first.
    ``constants`` (node index -> value) emits those nodes as leaves holding
    the value: the path to StableHLO folds constant subgraphs this way
    (``Plan.folded_constants``); the module is then no longer the spec.
    """
    if not isinstance(network, Network):
        given = "None" if network is None else f"a {type(network).__name__}"
        raise ArgumentError(f"emit_module takes the sealed Network first (Tape.record's, or tape.seal()'s), "
                            f"not {given}")
    roots, observes = _symbols(roots), _symbols(observes)
    if not roots and not observes:
        raise SymbolError("emit_module needs at least one root or observe to export; pass the symbols to "
                          "emit, as in emit_module(network, [loss])")
    context = _context.configure(context) if context is not None else _context.new_context()
    nodes = network.nodes()
    chosen = [nodes[i] for i in ancestors(network, roots + observes, nodes)]
    parameters = [n for n in chosen if n.opcode.name == "parameter"]
    inputs = [n for n in chosen if n.opcode.name == "input"]
    types: dict[tuple, ir.Type] = {}

    def type_of(node) -> ir.Type:
        key = (node.shape, node.dtype)
        if key not in types:
            types[key] = tensor_type(Spec(node.shape, node.dtype))
        return types[key]

    with context, ir.Location.unknown():
        module = ir.Module.create()
        module.operation.attributes["sym_name"] = ir.StringAttr.get(MODULE_NAME)
        wanted = roots + observes
        result_types = [type_of(nodes[s.index]) for s in wanted]
        with ir.InsertionPoint(module.body):
            function = func.FuncOp(
                FUNCTION_NAME,
                ir.FunctionType.get([type_of(n) for n in parameters + inputs], result_types),
            )
            if observes:
                function.attributes["res_attrs"] = ir.ArrayAttr.get(
                    [ir.DictAttr.get({})] * len(roots)
                    + [ir.DictAttr.get({OBSERVE: ir.UnitAttr.get()})] * len(observes)
                )
            # An argument's location is its source node's, so a complaint about
            # an argument (from IREE, say) names the recording line too.
            block = function.add_entry_block(
                arg_locs=[node_location(n.index, n.opcode.name, n.site, n.name, n.role)
                          for n in parameters + inputs]
            )
        arguments = {n.index: block.arguments[i] for i, n in enumerate(parameters + inputs)}
        values: dict[int, ir.Value] = {}
        with ir.InsertionPoint(block):
            for node in chosen:
                if constants and node.index in constants:
                    location = node_location(node.index, node.opcode.name, node.site)
                    values[node.index] = LeafOp(constants[node.index], node=node.index, loc=location).result
                    continue
                values[node.index] = _emit_node(network, node, values, arguments, type_of(node))
            func.ReturnOp([values[s.index] for s in wanted])
    return module


def _emit_node(network, node, values, arguments, result_type) -> ir.Value:
    location = node_location(node.index, node.opcode.name, node.site, node.name, node.role)
    extent = node.dtype.extent if isinstance(node.dtype, SelectionType) else None
    name = node.opcode.name
    if name == "leaf":
        payload = network.payload(node.symbol)
        if extent is not None:
            payload = Selection(payload, extent)
        return LeafOp(payload, node=node.index, loc=location).result
    if name in ("parameter", "input"):
        builder = ParameterOp if name == "parameter" else InputOp
        return builder(arguments[node.index], node=node.index, extent=extent, loc=location).result
    operands = [values[s.index] for s in node.operands]
    return op_class(name)(
        *operands, node=node.index, result_type=result_type, loc=location, **node.attributes
    ).result


def emit_text(
    network: Network,
    roots: Symbol | Iterable[Symbol],
    observes: Symbol | Iterable[Symbol] = (),
    *,
    debug_info: bool = True,
) -> str:
    """The emitted module as text; with ``debug_info`` (the default) every op's location is printed.

    With locations the text is the whole spec: ``parse_spec`` reads it back
    to an identical network.
    """
    flag("emit_text", "debug_info", debug_info)  # checked before emitting: MLIR's binding would refuse it after
    module = emit_module(network, roots, observes)
    return module.operation.get_asm(enable_debug_info=debug_info)


__all__ = ["FUNCTION_NAME", "MODULE_NAME", "OBSERVE", "ancestors", "emit_module", "emit_text"]
