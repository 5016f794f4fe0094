"""Errors a user can meet, all under one base class so one ``except`` catches topos."""

from __future__ import annotations


class ToposError(Exception):
    """Base of every error topos raises on purpose."""


class ShapeError(ToposError, ValueError):
    """A recorded operation got operands whose shapes or element types do not fit."""


class FeedError(ToposError, ValueError):
    """A run was fed something that does not match the recorded input."""


class SymbolError(ToposError, LookupError):
    """A symbol was used where it does not belong (another tape, unknown, or undeclared)."""


class SealedError(ToposError, RuntimeError):
    """A value was used after its tape was sealed, or a sealed spec was asked to change."""


class DifferentiationError(ToposError, ValueError):
    """A derivative was asked for something reverse mode cannot differentiate."""


class RecordingError(ToposError, RuntimeError):
    """Something that records (a module, an optimizer) was used with no recording in progress, or on another one."""


class CheckpointError(ToposError, ValueError):
    """A checkpoint file could not be written or read, or does not fit the network it is loaded into."""
