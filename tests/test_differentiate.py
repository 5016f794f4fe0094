"""Reverse mode, opcode by opcode: recorded gradients are the backward scan, bit for bit.

One table (``CASES``) names a small recording per opcode, per map function
and per composite; one helper (``record_case``) turns a row into a network
whose loss is ``sum(out * probe)`` with a non-uniform probe (so a rule that
permutes or drops cotangents cannot hide behind an all-ones seed), followed
by ``tape.differentiate``. Each row is then checked three ways:

* the recorded gradient nodes, run by the oracle, equal ``run.backward``
  bit for bit in float32, float64 and bfloat16;
* in float64, both agree with finite differences (``check_gradients``);
* the table covers every opcode and every map function.

Operand values are multiples of 1/64 in [-3, 3], so they are exact in all
three element types, and inputs to kinks (relu, abs, maximum, step) are
odd or even multiples chosen so that no element sits on a kink.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

import topos
from topos import DifferentiationError, SymbolError, Tape, concat, stack
from topos.gradcheck import check_gradients

DTYPES = (topos.float32, topos.float64, topos.bfloat16)
_GRID = 64  # operand values are multiples of 1/_GRID


# ---- operands: how each argument of a row is made ----------------------------------------


@dataclass(frozen=True)
class Operand:
    """One argument of a table row: a float tensor (parameter or input) or a selection leaf."""

    shape: tuple[int, ...] = ()
    low: float = -2.0
    high: float = 2.0
    parity: str = "any"  # "odd" or "even" multiples of 1/64: two parities never tie
    role: str = "parameter"  # "parameter", "input" or "selection"
    indices: tuple = ()
    extent: int = 0

    def make(self, rng: np.random.Generator, dtype) -> np.ndarray | topos.Selection:
        if self.role == "selection":
            return topos.selection(np.array(self.indices), self.extent)
        return grid(rng, self.shape, self.low, self.high, self.parity).astype(dtype)


def grid(rng, shape, low, high, parity="any") -> np.ndarray:
    """Uniform values on the 1/64 grid in [low, high] (exact in f64, f32 and bf16)."""
    ticks = np.floor(rng.uniform(low, high, shape) * _GRID)
    if parity == "odd":
        ticks = 2 * np.floor(ticks / 2) + 1
    elif parity == "even":
        ticks = 2 * np.floor(ticks / 2)
    return np.asarray(ticks / _GRID, dtype=np.float64)


def real(*shape, low=-2.0, high=2.0, parity="any", role="parameter") -> Operand:
    return Operand(tuple(shape), low, high, parity, role)


def positive(*shape, low=0.5, high=2.0, role="parameter") -> Operand:
    return Operand(tuple(shape), low, high, "any", role)


def chosen(indices, extent) -> Operand:
    return Operand(role="selection", indices=tuple(indices), extent=extent)


# ---- the table ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One row: ``build(*operand payloads)`` records the opcode or composite named ``name``."""

    name: str
    operands: tuple[Operand, ...]
    build: Callable
    smooth: bool = True  # False: the inputs sit on a kink on purpose (bitwise checks only)


def _map(function: str) -> Case:
    domains = {
        "log": positive(3, 4, low=0.25),
        "sqrt": positive(3, 4, low=0.25),
        "log1p": real(3, 4, low=-0.5),
        "sin": real(3, 4, low=-3.0, high=3.0),
        "cos": real(3, 4, low=-3.0, high=3.0),
    }
    return Case(f"map.{function}", (domains.get(function, real(3, 4)),), lambda x: x.map(function))


_REPEATED = chosen([0, 2, 2, 1, 0, 2], 4)

CASES: tuple[Case, ...] = (
    # elementwise opcodes
    Case("add", (real(3, 4), real(3, 4, role="input")), lambda a, b: a + b),
    Case("sub", (real(3, 4), real(3, 4, role="input")), lambda a, b: a - b),
    Case("mul", (real(3, 4), real(3, 4)), lambda a, b: a * b),
    Case("div", (real(3, 4), positive(3, 4)), lambda a, b: a / b),
    Case("pow", (positive(3, 4), real(3, 4)), lambda a, b: a**b),
    Case("maximum", (real(3, 4, parity="odd"), real(3, 4, parity="even")), lambda a, b: a.maximum(b)),
    Case("step", (real(3, 4, parity="odd"), real(3, 4, parity="even")), lambda x, t: x.step(t) * x),
    Case("neg", (real(3, 4),), lambda x: -x),
    *(_map(function) for function in topos.MAP_FUNCTIONS),
    # linear algebra and reductions
    Case("matmul", (real(3, 4), real(4, 2)), lambda a, b: a @ b),
    Case("sum", (real(3, 4),), lambda x: x.sum()),
    Case("sum_along", (real(3, 4, 2),), lambda x: x.sum_along(1)),
    # shape
    Case("broadcast", (real(1, 1),), lambda x: x.broadcast((3, 4))),
    Case("broadcast_along", (real(3, 2),), lambda x: x.broadcast_along(1, 4)),
    Case("reshape", (real(3, 4),), lambda x: x.reshape((2, 6))),
    Case("permute", (real(2, 3, 4),), lambda x: x.permute((2, 0, 1))),
    Case("narrow", (real(5, 3),), lambda x: x.narrow(0, 1, 3)),
    Case("pad", (real(3, 2),), lambda x: x.pad(1, 1, 5)),
    Case("unfold", (real(6, 2),), lambda x: x.unfold(0, 3)),
    Case("fold", (real(3, 3, 2),), lambda x: x.fold(0, 3, 2, 1, 7)),
    # indexing (repeated indices accumulate)
    Case("gather", (real(4, 3), _REPEATED), lambda t, s: t.gather(s)),
    Case("scatter", (real(6, 3), _REPEATED), lambda v, s: v.scatter(s)),
    # stable log-domain
    Case("log_softmax", (real(3, 5, low=-3.0, high=3.0),), lambda x: x.log_softmax(1)),
    Case("logsumexp", (real(3, 5, low=-3.0, high=3.0),), lambda x: x.logsumexp(0)),
    # composites
    Case("relu", (real(3, 4, parity="odd"),), lambda x: x.relu()),
    Case("abs", (real(3, 4, parity="odd"),), lambda x: x.abs()),
    Case("softplus", (real(3, 4, low=-3.0, high=3.0, parity="odd"),), lambda x: x.softplus()),
    Case("gelu", (real(3, 4),), lambda x: x.gelu()),
    Case("softmax", (real(3, 5),), lambda x: x.softmax(1)),
    Case("mean", (real(3, 4),), lambda x: x.mean()),
    Case("mean_along", (real(3, 4),), lambda x: x.mean_along(0)),
    Case("transpose", (real(3, 4),), lambda x: x.T),
    Case("squeeze_unsqueeze", (real(3, 1),), lambda x: x.squeeze(1).unsqueeze(0)),
    Case("broadcast_to", (real(3, 1),), lambda x: x.broadcast_to((2, 3, 4))),
    Case("broadcast_to_scalar", (real(),), lambda x: x.broadcast_to((2, 3))),
    Case("concat", (real(3, 2), real(3, 1), real(3, 3)), lambda a, b, c: concat([a, b, c], 1)),
    Case("stack", (real(3, 2), real(3, 2)), lambda a, b: stack([a, b], 0)),
    Case("batched_matmul", (real(2, 3, 4), real(2, 4, 2)), lambda a, b: a @ b),
    Case("gather_scatter", (real(4, 3), _REPEATED), lambda t, s: t.gather(s).scatter(s)),
    Case("unfold_step_dilation", (real(9, 2),), lambda x: x.unfold(0, 3, step=2, dilation=2)),
    Case("fold_step_dilation", (real(2, 3, 2),), lambda x: x.fold(0, 3, 3, 2, 9)),
    Case("fan_out", (real(3, 4),), lambda x: x.tanh() * x + x.exp() - x),
    Case("same_operand_twice", (real(3, 4),), lambda x: x * x),
    Case(
        "composed_loss",  # tanh layer, bias, log_softmax cross-entropy picked by a selection
        (real(4, 5, role="input"), real(5, 3), real(1, 3), chosen([2, 3, 7, 11], 12)),
        lambda x, w, b, picks: -((x @ w).tanh() + b.broadcast_to((4, 3)))
        .log_softmax(1)
        .reshape((12, 1))
        .gather(picks)
        .mean(),
    ),
    # on a kink on purpose: the rule's choice (ties go left) must still be identical bitwise
    Case("maximum_ties", (real(3, 4), real(3, 4)), lambda a, b: a.maximum(a * 1.0) + b.maximum(b), smooth=False),
    Case("relu_at_zero", (real(3, 4),), lambda x: (x - x).relu() + x, smooth=False),
)
