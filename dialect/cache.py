"""The compile cache: vmfb files on disk, keyed by the StableHLO text, the target and the flags.

Entries are written atomically (a temporary file, then rename), so
concurrent processes never see half a file; each entry carries a SHA-256
of its payload, so a corrupt entry is detected, removed and rebuilt.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

_MAGIC = b"TOPOSVMFB1\n"


def default_directory() -> Path:
    """$TOPOS_CACHE_DIR, else $XDG_CACHE_HOME/topos, else ~/.cache/topos."""
    explicit = os.environ.get("TOPOS_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "topos"


def key(text: str, target: str, flags, compiler_version: str) -> str:
    h = hashlib.sha256()
    for part in (compiler_version, target, "\0".join(flags), text):
        h.update(part.encode())
        h.update(b"\0\0")
    return h.hexdigest()


class CompileCache:
    """A directory of compiled modules."""

    def __init__(self, directory: str | os.PathLike | None = None):
        self.directory = Path(directory) if directory is not None else default_directory()

    def path(self, entry_key: str) -> Path:
        return self.directory / f"{entry_key}.vmfb"

    def load(self, entry_key: str) -> bytes | None:
        """The cached module, or None when absent or corrupt (a corrupt file is removed)."""
        path = self.path(entry_key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        header = len(_MAGIC) + 32
        payload = data[header:]
        if data[: len(_MAGIC)] != _MAGIC or hashlib.sha256(payload).digest() != data[len(_MAGIC):header]:
            path.unlink(missing_ok=True)
            return None
        return payload

    def store(self, entry_key: str, payload: bytes) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        target = self.path(entry_key)
        fd, temporary = tempfile.mkstemp(dir=self.directory, prefix=".partial-", suffix=".vmfb")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(_MAGIC + hashlib.sha256(payload).digest() + payload)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        return target
