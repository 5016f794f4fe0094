"""Losses: cross-entropy over class labels or probability targets, and mean squared error.

Class labels are a selection (``topos.selection`` or an input declared
with ``extent=``). The label's one-hot row is picked by ``gather`` from a
recorded identity table, so the loss stays a composition of opcodes and
its gradient is the usual ``softmax - one_hot`` without a special rule.
"""

from __future__ import annotations

import numpy as np

from topos import ArgumentError, Recordable, SelectionType, ShapeError
from topos.base.arguments import size
from topos.base.provenance import user_site

_REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(reduction: str) -> None:
    if reduction not in _REDUCTIONS:
        raise ArgumentError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")


def cross_entropy(logits: Recordable, target: Recordable, reduction: str = "mean",
                  ignore_index: int | None = None) -> Recordable:
    """Cross-entropy of ``[N, C]`` logits against labels or probabilities.

    ``target`` is either a selection of ``N`` class labels, or a float
    tensor ``[N, C]`` of one-hot rows or probabilities. ``reduction`` is
    ``"mean"`` (over the rows that count), ``"sum"`` or ``"none"`` (one loss
    per row). With labels, ``ignore_index`` names a label whose rows add
    nothing and are not counted; the selection's extent is ``C``, or ``C + 1``
    when ``ignore_index`` is ``C`` (an index just past the classes).
    """
    _check_reduction(reduction)
    if ignore_index is not None:
        ignore_index = size("cross_entropy", "ignore_index", ignore_index, least=0)
    site = user_site()
    if logits.ndim != 2:
        raise ShapeError(
            f"{site}: cross_entropy: logits {list(logits.shape)} must be [rows, classes]; "
            "reshape them first, e.g. logits.reshape((-1, classes)) and targets to match"
        )
    rows, classes = logits.shape
    log_probabilities = logits.log_softmax(1)
    if isinstance(target.dtype, SelectionType):
        weights, picked = _label_rows(logits, target, classes, ignore_index, site)
    else:
        if ignore_index is not None:
            raise ShapeError(f"{site}: cross_entropy: ignore_index applies to class labels, not probability targets")
        if tuple(target.shape) != (rows, classes) or target.dtype != logits.dtype:
            raise ShapeError(
                f"{site}: cross_entropy: probability targets {list(target.shape)} {target.dtype} should be "
                f"{[rows, classes]} {logits.dtype} like the logits; for class labels pass a selection"
            )
        weights, picked = None, target
    products = log_probabilities * picked
    if reduction == "none":
        return -products.sum_along(1)
    total = -products.sum()
    if reduction == "sum":
        return total
    return total / weights.sum() if weights is not None else total / float(rows)


def _label_rows(logits, target, classes: int, ignore_index, site):
    """(row weights or None, one-hot rows) for a selection of labels."""
    extent = target.dtype.extent
    rows = logits.shape[0]
    if tuple(target.shape) != (rows,):
        raise ShapeError(
            f"{site}: cross_entropy: labels {list(target.shape)} should be [{rows}], one per row of the logits"
        )
    allowed = (classes,) if ignore_index is None or ignore_index < classes else (classes + 1,)
    if extent not in allowed or (ignore_index is not None and not 0 <= ignore_index < extent):
        raise ShapeError(
            f"{site}: cross_entropy: labels index {extent} values but the logits have {classes} classes; "
            + ("declare the labels with extent=classes" if ignore_index is None else
               f"ignore_index {ignore_index} must be a label: a class, or {classes} with extent {classes + 1}")
        )
    table = np.eye(extent, classes, dtype=logits.dtype)
    if ignore_index is None:
        return None, logits.tape.leaf(table).gather(target)
    table[ignore_index] = 0
    counted = np.ones(extent, dtype=logits.dtype)
    counted[ignore_index] = 0
    return logits.tape.leaf(counted).gather(target), logits.tape.leaf(table).gather(target)


def mse_loss(prediction: Recordable, target: Recordable, reduction: str = "mean") -> Recordable:
    """Squared error ``(prediction - target) ** 2`` spelled as a product, reduced by ``reduction``."""
    _check_reduction(reduction)
    if tuple(prediction.shape) != tuple(target.shape):
        raise ShapeError(
            f"{user_site()}: mse_loss: prediction {list(prediction.shape)} and target "
            f"{list(target.shape)} differ; they must have the same shape"
        )
    error = prediction - target
    squared = error * error
    if reduction == "none":
        return squared
    return squared.sum() if reduction == "sum" else squared.mean()


__all__ = ["cross_entropy", "mse_loss"]
