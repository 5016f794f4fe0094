"""Where the user recorded a node: captured once, carried by every later stage."""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass

_PACKAGE_ROOTS = tuple(
    os.path.dirname(os.path.abspath(p)) + os.sep
    for p in (__file__, os.path.join(os.path.dirname(__file__), "..", "dialect", "x"))
)


@dataclass(frozen=True)
class Site:
    """A user's source location: file, line and enclosing function."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


UNKNOWN = Site("<unknown>", 0, "<unknown>")


@functools.lru_cache(maxsize=None)
def _is_internal(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_PACKAGE_ROOTS)


def user_site() -> Site:
    """The innermost stack frame outside topos itself: the line the user wrote."""
    frame = sys._getframe(1)
    while frame is not None and _is_internal(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return UNKNOWN
    return Site(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
