"""Errors a user can meet, all under one base class so one ``except`` catches topos."""

from __future__ import annotations

from topos.base.provenance import UNKNOWN, user_site


class ToposError(Exception):
    """Base of every error topos raises on purpose."""


class AtTheUsersLine(ToposError):
    """An error of the core: its message starts with the user's line, the call that failed.

    The site is the innermost frame outside topos (``provenance.user_site``);
    a message that already starts with it (record-time errors name it
    themselves) is left as it is.
    """

    def __init__(self, *args):
        self.bare = args[0] if args and isinstance(args[0], str) else ""  # for a message that nests this one
        if args and isinstance(args[0], str):
            site = user_site()
            if site is not UNKNOWN and not args[0].startswith(str(site)):
                args = (f"{site}: {args[0]}", *args[1:])
        super().__init__(*args)


class ShapeError(AtTheUsersLine, ValueError):
    """A recorded operation got operands whose shapes or element types do not fit."""


class FeedError(AtTheUsersLine, ValueError):
    """A run was fed something that does not match the recorded input."""


class SymbolError(AtTheUsersLine, LookupError):
    """A symbol was used where it does not belong (another tape, unknown, or undeclared)."""


class SealedError(AtTheUsersLine, RuntimeError):
    """A value was used after its tape was sealed, or a sealed spec was asked to change."""


class DifferentiationError(AtTheUsersLine, ValueError):
    """A derivative was asked for something its mode cannot give (a non-scalar loss, a tangent on a leaf, ...)."""


class RecordingError(AtTheUsersLine, RuntimeError):
    """Something that records (a module, an optimizer) was used with no recording in progress, or on another one."""


class CheckpointError(AtTheUsersLine, ValueError):
    """A checkpoint file could not be written or read, or does not fit the network it is loaded into."""


class ArgumentError(AtTheUsersLine, ValueError, TypeError):
    """A layer, optimizer, initializer or function was given an argument it does not take.

    A size below 1, a rate that is not a finite number, an unknown mode, a
    value of the wrong type. Both a ``ValueError`` and a ``TypeError``, as
    the built-in checks it replaces were one or the other.
    """


class PlanError(AtTheUsersLine, ValueError):
    """A plan was asked for what it does not have, such as a fusion kind the pattern catalog does not define."""


class TargetError(AtTheUsersLine, ValueError):
    """An unknown target, or a target this machine cannot compile or run."""
