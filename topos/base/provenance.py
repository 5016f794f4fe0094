"""Where the user recorded a node: captured once, carried by every later stage."""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from types import FrameType

# topos/ and, in a checkout, dialect/ beside it (an installed wheel nests it in topos/): every frame
# in either is topos's own, whichever layer's folder it is in.
_TOPOS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGE_ROOTS = (_TOPOS + os.sep, os.path.join(os.path.dirname(_TOPOS), "dialect") + os.sep)


@functools.cache
def _standard_library() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the standard library's folders, site-packages'), read when first needed: sysconfig costs every
    ``import topos`` a few milliseconds. The standard library is skipped too: copy.deepcopy(network) or
    a functools.partial is called from the user's line, and that line is the one to name."""
    import sysconfig

    paths = sysconfig.get_paths()
    return (tuple(os.path.abspath(paths[key]) + os.sep for key in ("stdlib", "platstdlib")),
            tuple(os.path.abspath(paths[key]) + os.sep for key in ("purelib", "platlib")))


@dataclass(frozen=True)
class Site:
    """A user's source location: file, line and enclosing function."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


UNKNOWN = Site("<unknown>", 0, "<unknown>")


@functools.cache
def is_internal(filename: str) -> bool:
    """Whether a frame of ``filename`` is topos's own (or the standard library's): not the user's line."""
    path = os.path.abspath(filename)
    if path.startswith(_PACKAGE_ROOTS):
        return True
    standard_library, site_packages = _standard_library()
    return path.startswith(standard_library) and not path.startswith(site_packages)


def user_site() -> Site:
    """The innermost stack frame outside topos itself: the line the user wrote."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and is_internal(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return UNKNOWN
    return Site(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
