"""What MLIR's verifier cannot check about topos IR: where the unregistered topos ops stand, and how big they are.

MLIR verifies the ops it knows; topos ops are unregistered, so each op's
own rules run in ``topos.dialect.ir.ops.verify_module`` and the structure
around them is checked here. Parsing and the ``topos-verify`` pass run both.
"""

from __future__ import annotations

from iree.compiler import ir

from topos.dialect.ir.diagnostics import Diagnostic
from topos.dialect.ir.ops import NODE
from topos.spec.opcodes.base import MAX_BYTES


def structural_problems(module) -> list[Diagnostic]:
    """What MLIR cannot check about unregistered topos ops: where they stand and how big they are.

    Topos IR is ``func.func @main(...) { <topos ops> return ... }``: a
    topos op outside a function body (for example a bare op at the top
    level, which parsing wraps in a module) is refused. MLIR's verifier
    cannot know an unregistered op is no terminator, so a function body
    that ends in a topos op, having lost its ``return``, is refused here.
    A tensor too big for a 64-bit byte count is refused before NumPy or
    the lowering overflow on it.
    """
    found: list[Diagnostic] = []

    def visit(operation):
        operation = operation.operation
        if operation.name == "func.func":
            for block in operation.regions[0].blocks:
                last = list(block.operations)[-1:]
                if last and last[0].operation.name.startswith("topos."):
                    found.append(Diagnostic.error(
                        f"block with no terminator: '{last[0].operation.name}' ends the body of a "
                        "func.func; end it with `return`", last[0],
                    ))
        elif operation.name.startswith("topos."):
            parent = operation.parent.name  # the walk starts at the module, so there is one
            if parent != "func.func":
                found.append(Diagnostic.error(
                    f"{_op_label(operation)}: topos ops belong in the body of a func.func, not in "
                    f"'{parent}' (topos IR is `func.func @main(...) {{ <topos ops> return ... }}`)", operation,
                ))
            for value in (*operation.operands, *operation.results):
                size = _byte_size(value.type)
                if size > MAX_BYTES:
                    found.append(Diagnostic.error(
                        f"{_op_label(operation)}: {value.type} would hold {size:.3g} bytes, more than "
                        "a 64-bit size can count (2**63 - 1)", operation,
                    ))
                    break
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


def _op_label(operation) -> str:
    node = operation.attributes[NODE] if NODE in operation.attributes else None
    index = node.value if isinstance(node, ir.IntegerAttr) else "?"
    return f"'{operation.name}' op node {index}"


def _byte_size(mlir_type: ir.Type) -> int:
    if not isinstance(mlir_type, ir.ShapedType) or not mlir_type.has_static_shape:
        return 0
    volume = 1
    for extent in mlir_type.shape:
        volume *= extent
    element = mlir_type.element_type
    width = element.width if isinstance(element, (ir.FloatType, ir.IntegerType)) else 64
    return volume * max(width // 8, 1)


__all__ = ["structural_problems"]
