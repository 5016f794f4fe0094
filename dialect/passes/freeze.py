"""Frozen parameters: ``@main``'s parameter arguments become module globals IREE loads by name.

``compile(frozen=parameters)`` and ``export(frozen=True)`` run this on the
lowered StableHLO. Each parameter argument of ``@main`` becomes

    util.global private @frozen_k = #flow.parameter.named<"topos"::"key"> : tensor<...>

read at the top of ``@main`` with ``util.global.load immutable``, and the
argument is removed. The values are not in the module: the runtime serves
them by key (``iree.runtime.ParameterIndex`` in a CompiledPlan, an IRPA
file for ``iree-run-module --parameters=topos=parameters.irpa`` in an
export), so one module runs any checkpoint of the same network.

Why: a global is a value IREE knows at load time. With data tiling, the
packing of a weight into the microkernel's layout is hoisted into the
module's initializer and runs once, when the module loads, instead of on
every call (GPT-2 124M's 154 MB tied embedding is packed in 58 ms; see
docs/performance.md, "Frozen parameters").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from iree.compiler import ir

SCOPE = "topos"  # the parameter scope the globals name; the runtime's provider and --parameters use it
GLOBAL_PREFIX = "frozen_"
# Loaded before parsing: the ops this rewrite creates, beside the ones the StableHLO holds.
_DIALECTS = ("util", "flow")


def key_of(network, i: int) -> str:
    """The key parameter node ``i`` is served under: its recorded name, or ``%i``.

    ``%i`` for an unnamed parameter, and for a name holding ``"`` or ``\\``:
    IREE prints a parameter key without escaping, so such a key would not
    parse back. No name starts with ``%`` (``tape.check_name``), so the two
    kinds never collide; the export's manifest lists every key.
    """
    name = network.columns.names.get(i)
    return f"%{i}" if name is None or '"' in name or "\\" in name else name


def as_bytes(array: np.ndarray) -> np.ndarray:
    """A parameter's bytes as IREE's parameter index and archives take them (a bfloat16 array has no buffer format)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def freeze_parameters(located: str, keys: Sequence[str]) -> tuple[str, str]:
    """``@main``'s first ``len(keys)`` arguments as globals named by ``keys`` -> (plain text, located text).

    ``located`` is the StableHLO with locations (what IREE compiles); each
    global and its load keep the location of the argument they replace, so
    a diagnostic still names the parameter and its recording line.
    """
    from iree.compiler import ir  # here, not above: a CompiledPlan runs where only IREE's runtime is installed

    from topos.dialect.ir.context import new_context

    unprintable = [key for key in keys if '"' in key or "\\" in key]
    if unprintable:  # key_of never makes one
        raise ValueError(f"parameter keys {unprintable} hold a quote or a backslash, which IREE prints unescaped")
    with new_context() as context:
        for name in _DIALECTS:
            context.dialects[name]  # the lookup loads the dialect
        module = ir.Module.parse(located)
        main = main_of(module)
        block = main.regions[0].blocks[0]
        signature = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
        frozen = len(keys)
        top = ir.InsertionPoint.at_block_begin(block)
        for k, key in enumerate(keys):
            argument = block.arguments[k]
            symbol = f"{GLOBAL_PREFIX}{k}"
            with argument.location:
                written = str(argument.type)
                ir.Operation.create("util.global", attributes={
                    "sym_name": ir.StringAttr.get(symbol),
                    "sym_visibility": ir.StringAttr.get("private"),
                    "type": ir.TypeAttr.get(argument.type),
                    "initial_value": ir.Attribute.parse(f'#flow.parameter.named<"{SCOPE}"::"{key}"> : {written}'),
                }, ip=ir.InsertionPoint(main))
                load = ir.Operation.create("util.global.load", results=[argument.type], attributes={
                    "global": ir.FlatSymbolRefAttr.get(symbol), "is_immutable": ir.UnitAttr.get()})
            top.insert(load)
            argument.replace_all_uses_with(load.result)
        for k in reversed(range(frozen)):
            block.erase_argument(k)
        main.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get(list(signature.inputs)[frozen:], list(signature.results)))
        if "arg_attrs" in main.attributes:
            main.attributes["arg_attrs"] = ir.ArrayAttr.get(list(ir.ArrayAttr(main.attributes["arg_attrs"]))[frozen:])
        module.operation.verify()
        return str(module), module.operation.get_asm(enable_debug_info=True)


def main_of(module: ir.Module) -> ir.Operation:
    """The module's @main function op."""
    from iree.compiler import ir

    for op in module.body.operations:
        if "sym_name" in op.attributes and ir.StringAttr(op.attributes["sym_name"]).value == "main":
            return op.operation
    raise ValueError("the StableHLO module has no @main")  # emission always writes one


def ops_of_main(module: ir.Module, name: str | None = None) -> list[ir.Operation]:
    """The ops of ``module``'s @main (each ``name`` op, if given), listed before any is rewritten."""
    block = main_of(module).regions[0].blocks[0]
    return [op.operation for op in block.operations if name is None or op.operation.name == name]


def rewrite_module(located: str, stages) -> tuple[str, str, dict[str, float]]:
    """``located`` parsed once, each ``(stage, rewrite)`` of ``stages`` applied to the module in turn, verified
    and printed once -> (plain text, located text, seconds per stage)."""
    import time

    from iree.compiler import ir  # here, not above: a CompiledPlan runs where only IREE's runtime is installed

    from topos.dialect.ir.context import new_context

    times: dict[str, float] = {}
    started = time.perf_counter()
    with new_context():
        module = ir.Module.parse(located)
        for stage, rewrite in stages:
            began = time.perf_counter()
            rewrite(module)
            times[stage] = time.perf_counter() - began
        module.operation.verify()
        plain, located = str(module), module.operation.get_asm(enable_debug_info=True)
    times["parse and print"] = time.perf_counter() - started - sum(times.values())
    return plain, located, times


__all__ = ["GLOBAL_PREFIX", "SCOPE", "as_bytes", "freeze_parameters", "key_of", "main_of", "ops_of_main",
           "rewrite_module"]
