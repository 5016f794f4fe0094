"""Entries and plans: declared reads, liveness and memory, fusion offers, postures."""

from .entry import Entry
from .numerics import Envelope, Numerics, envelope_for
from .patterns import CATALOG, Candidate, discover, elect
from .plan import Plan

__all__ = ["CATALOG", "Candidate", "Entry", "Envelope", "Numerics", "Plan", "discover", "elect", "envelope_for"]
