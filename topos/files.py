"""Writing files in full or not at all: what every writer in topos uses (drawings, topos-opt -o)."""

from __future__ import annotations

import errno
import os
import stat
import tempfile


def write_atomically(path, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8, or bytes) to ``path`` in full or not at all.

    A temporary file beside it, then a rename.

    A path that is not a regular file (``/dev/null``, a pipe) is written
    directly: renaming over it would replace the device with a file.
    """
    payload = data.encode("utf-8") if isinstance(data, str) else data
    target = os.path.realpath(path)  # through a symlink, as opening the path would write
    if os.path.isdir(target):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    if os.path.exists(target) and not os.path.isfile(target):
        with open(target, "wb") as handle:
            handle.write(payload)
        return
    if os.path.exists(target):
        mode = stat.S_IMODE(os.stat(target).st_mode)
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask  # what open() would have created; mkstemp makes 0600
    try:
        folder = os.path.dirname(target) or "."
        descriptor, temporary = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(target)}.")
    except PermissionError:
        if not os.access(target, os.W_OK):
            raise
        # A writable file in a folder we may not add to: writing it in place is the only way.
        with open(target, "wb") as handle:
            handle.write(payload)
        return
    try:
        with open(descriptor, "wb") as handle:
            handle.write(payload)
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        os.unlink(temporary)
        raise
