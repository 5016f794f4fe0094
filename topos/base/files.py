"""Writing files in full or not at all: what every writer in topos uses.

Checkpoints (``topos.checkpoint``), the compile cache, drawings and
``topos-opt -o`` all write through ``replacing``, so a crash, a full disk
or Ctrl-C in the middle of a write leaves the old file as it was.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from typing import BinaryIO


@contextlib.contextmanager
def replacing(path) -> Iterator[BinaryIO]:
    """A binary handle whose bytes become the file at ``path`` in full or not at all.

    The bytes go to a fresh hidden file beside the target, reach the disk
    (``fsync``), and are renamed over it; on any failure, Ctrl-C included,
    the temporary file is removed and the old file stays as it was.

    - A symlink is followed: its target is replaced and the link stays.
    - The new file keeps the old one's permissions, or gets what a plain
      ``open`` would give (0666 less the umask).
    - An existing file this process may not write is refused, as ``open``
      would refuse it.
    - A path that is not a regular file (``/dev/null``, a pipe) is written
      directly: renaming over it would replace the device with a file.

    Raises ``OSError``: ``IsADirectoryError`` (``path`` is a folder);
    ``PermissionError``, ``FileNotFoundError`` or ``NotADirectoryError``
    whose ``filename`` is the folder when the folder takes no new file
    (read-only, missing, or a file stands in its way), and the target when
    the target refuses; or the write's own error (a full disk).
    """
    target = os.path.realpath(path)  # through a symlink, as opening the path would write
    if os.path.isdir(target):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
    old_mode = None
    if os.path.exists(target):
        if not os.path.isfile(target):
            with open(target, "wb") as handle:
                yield handle
            return
        if not os.access(target, os.W_OK):
            raise PermissionError(errno.EACCES, "the file is read-only", target)
        old_mode = stat.S_IMODE(os.stat(target).st_mode)
    folder = os.path.dirname(target)
    temporary = os.path.join(folder, f".{os.path.basename(target)}.{os.urandom(8).hex()}.tmp")
    try:
        # 0666 as open() asks, so the umask applies; O_EXCL: never another writer's file.
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    except OSError as failure:
        raise type(failure)(failure.errno, failure.strerror, folder) from None  # the folder is what refused
    try:
        with os.fdopen(descriptor, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        if old_mode is not None:
            os.chmod(temporary, old_mode)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    _sync_folder(folder)


def write_atomically(path, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8, or bytes) to ``path`` in full or not at all (``replacing``)."""
    with replacing(path) as handle:
        handle.write(data.encode("utf-8") if isinstance(data, str) else data)


def _sync_folder(folder: str) -> None:
    """Make the rename itself durable; systems that cannot open a folder (Windows) skip this."""
    with contextlib.suppress(OSError):
        descriptor = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
