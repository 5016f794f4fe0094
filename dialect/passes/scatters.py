"""Scatters in chunks, for a target that loses the updates of a large scatter (``Target.scatter_limit``).

IREE 3.13's ``vulkan`` target computes a scatter of many updates wrongly,
without a word. On Mesa's lavapipe, 2026-12-03: the small GPT's embedding
gradient (512 positions of 128 floats scattered into 65 rows) came back
with 1,028 of its 8,320 values wrong; a scatter of 504 positions of 128
was right and one of 511 lost every position from the 505th on; 1,000
positions of 64 lost some, 70,000 of one lost one, two of 40,000 lost
many; every scatter of up to 51,200 update elements tested was right.
Gathers of the same sizes were right.

So each scatter of more than the limit's update elements becomes a chain:
the first link scatters the first positions into the zeros, each next
link scatters the next positions into the result of the one before.
Positions keep their order, so a target that applies updates in
position order (llvm-cpu) would give the same bits; the link sizes
(``limit`` elements, a whole number of rows) were checked on lavapipe
against the oracle. A row wider than the limit is a TargetError before
lowering (``check_rows``): no chain helps it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from topos.base.errors import TargetError
from topos.dialect.passes.freeze import ops_of_main

if TYPE_CHECKING:
    from iree.compiler import ir


def check_rows(network, closure, target_name: str, limit: int) -> None:
    """TargetError when a scatter of ``closure`` has rows of more than ``limit`` elements."""

    for i in sorted(closure):
        if network.columns.opcodes[i].name == "scatter":
            row = math.prod(network.columns.specs[i].shape[1:])
            if row > limit:
                raise TargetError(
                    f"node %{i} scatters rows of {row} elements, and IREE 3.13 loses updates of scatters past "
                    f"{limit} elements on {target_name} (docs/compiling.md); compile this plan for llvm-cpu or cuda")


def split_scatters(module: ir.Module, limit: int) -> None:
    """Every scatter of ``module`` with more than ``limit`` update elements as a chain."""
    for op in ops_of_main(module, "stablehlo.scatter"):
        _split(op, limit)


def _split(scatter: ir.Operation, limit: int) -> None:
    """One scatter as lowering._scatter writes it (indices [positions, 1], updates [positions, ...])."""
    from iree.compiler import ir

    from topos.dialect.passes.builders import shape_of, slice_along

    into, indices, updates = scatter.operands
    positions, *row = shape_of(updates)
    step = max(1, limit // math.prod(row))
    if positions <= step:
        return
    with ir.InsertionPoint(scatter), scatter.location:
        current = into
        for start in range(0, positions, step):
            stop = min(start + step, positions)
            operands = (current, slice_along(indices, 0, start, stop), slice_along(updates, 0, start, stop))
            link = scatter.clone()  # after its slices: the insertion point is the original scatter
            for k, value in enumerate(operands):
                link.operands[k] = value
            current = link.result
    scatter.result.replace_all_uses_with(current)
    scatter.erase()


__all__ = ["check_rows", "split_scatters"]
