"""Indexing: gather rows of a table by a selection, and scatter-add them back."""

from __future__ import annotations

import numpy as np

from topos.base.element import compute_type, round_to
from topos.spec.opcodes.base import Opcode, Refusal, Spec, element_operand, register, selection_operand


@register
class Gather(Opcode):
    """Rows of ``table`` picked by ``selection``: shape selection.shape + table.shape[1:]."""

    name = "gather"
    arity = 2
    READS = frozenset({1})  # the rule scatters by the selection (the table's shape is in its spec)

    def infer(self, table: Spec, selection: Spec) -> Spec:
        element_operand(table, "table")
        extent = selection_operand(selection)
        if len(table.shape) < 1 or table.shape[0] != extent:
            raise Refusal(
                f"table {list(table.shape)} has {table.shape[0] if table.shape else 0} rows "
                f"but the selection indexes {extent}",
                "the selection's extent must equal the table's first axis",
            )
        return Spec(selection.shape + table.shape[1:], table.dtype)

    def kernel(self, table, selection):
        return np.take(table, selection, axis=0)

    def rule(self, table, selection, out, g):
        return g.scatter(selection, table.shape[0]), None


@register
class Scatter(Opcode):
    """Gather's adjoint: add each row of ``values`` into row ``selection[i]`` of ``extent`` zero rows.

    Rows land in ascending position order, so repeated indices accumulate
    in a fixed order (in the compute type, rounded once). ``extent`` repeats
    the selection's extent so the kernel can run on plain arrays.
    """

    name = "scatter"
    arity = 2
    attribute_names = ("extent",)
    READS = frozenset({1})  # the rule gathers by the selection

    def infer(self, values: Spec, selection: Spec, extent) -> Spec:
        element_operand(values, "values")
        declared = selection_operand(selection)
        if extent != declared:
            raise Refusal(f"extent {extent} differs from the selection's extent {declared}")
        rank = len(selection.shape)
        if values.shape[:rank] != selection.shape:
            raise Refusal(
                f"values {list(values.shape)} should start with the selection's shape "
                f"{list(selection.shape)}",
                "scatter takes what gather with this selection produced",
            )
        return Spec((extent,) + values.shape[rank:], values.dtype)

    def kernel(self, values, selection, extent):
        rows = values.reshape((-1,) + values.shape[selection.ndim :])
        rows = rows.astype(compute_type(values.dtype), copy=False)
        flat = selection.reshape(-1)
        out = np.zeros((extent,) + rows.shape[1:], dtype=rows.dtype)
        # Peel one occurrence of every index per round: within a round the
        # targets are distinct, and rounds go in ascending position order.
        order = np.argsort(flat, kind="stable")
        ordered = flat[order]
        rank_in_group = np.arange(len(flat)) - np.searchsorted(ordered, ordered, side="left")
        for r in range(int(rank_in_group.max(initial=-1)) + 1):
            pick = order[rank_in_group == r]
            out[flat[pick]] += rows[pick]
        return round_to(out, values.dtype)

    def rule(self, values, selection, out, g, extent):
        return g.gather(selection), None
