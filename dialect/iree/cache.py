"""The compile cache: vmfb files on disk, keyed by the plan's digest, topos's code, the target, the flags and IREE.

Entries are written atomically (a temporary file, then rename), so
concurrent processes never see half a file. Each entry carries its own
key and a SHA-256 of key and payload together, so a corrupt entry, or an
entry under another entry's name (a renamed or swapped file), is
detected, removed and rebuilt; it is never served. A directory that
cannot hold the cache (a regular file, under a regular file, not
writable) is a CacheError naming the path and the way out, raised before
anything is compiled.
"""

from __future__ import annotations

import functools
import hashlib
import os
import stat
import tempfile
from pathlib import Path

from topos.base.errors import AtTheUsersLine
from topos.base.files import replacing
from topos.dialect.iree.targets import cpu_of, host_isa

_MAGIC = b"TOPOSVMFB2\n"
_KEY_BYTES = 64  # a key is a SHA-256 in hex


class CacheError(AtTheUsersLine, OSError):
    """The compile cache's directory cannot be used, or ``cache=`` is not something that names one."""


def default_directory() -> Path:
    """$TOPOS_CACHE_DIR, else $XDG_CACHE_HOME/topos, else ~/.cache/topos."""
    return _default_directory()[0]


def _default_directory() -> tuple[Path, str]:
    """The default directory and where it came from, for error messages."""
    explicit = os.environ.get("TOPOS_CACHE_DIR")
    if explicit:
        return Path(explicit), "$TOPOS_CACHE_DIR"
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "topos", "$XDG_CACHE_HOME/topos"
    return Path(os.path.expanduser("~")) / ".cache" / "topos", "the default ~/.cache/topos"


def key(text: str, target: str, flags, compiler_version: str) -> str:
    h = hashlib.sha256()
    for part in (compiler_version, target, "\0".join(flags), text):
        h.update(part.encode())
        h.update(b"\0\0")
    return h.hexdigest()


@functools.cache
def code_digest() -> str:
    """sha256 of topos's own source (the core and the MLIR side), read once per process.

    A cache keyed on a plan's digest, before any lowering runs, must not
    serve a module that an older lowering built: a changed line anywhere
    in topos changes this digest and so every key (about 5 ms for the ~110
    files, once). Each file is named by its place in the package, so an
    editable checkout (dialect/ beside topos/) and an installed wheel
    (topos/dialect/ inside topos/) of the same source digest alike: a
    cache filled on one machine serves another (docs/deploy.md).
    """
    import topos.base.errors as any_core_module

    here = Path(__file__).resolve()  # <dialect>/iree/cache.py
    core, dialect = Path(any_core_module.__file__).resolve().parents[1], here.parents[1]
    files: dict[str, Path] = {}
    for package, root in (("topos", core), ("topos/dialect", dialect)):
        for path in root.rglob("*.py"):
            if root == core and dialect in path.parents:
                continue  # an installed wheel nests the dialect in the core: counted once, under its own name
            files[f"{package}/{path.relative_to(root).as_posix()}"] = path
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name].read_bytes())
    return h.hexdigest()


def plan_key(plan, target: str, flags, compiler_version: str, frozen: bool = False,
             transients: bool = False) -> str:
    """The cache key of ``plan``'s module, known before lowering: its digest, topos's code, target, flags.

    ``frozen``: the module reads its parameters as globals (``compile(frozen=...)``), another
    module than the one taking them as arguments; their values are not in it, so not in the key.
    ``transients``: its first argument is the storage of its transients (``with_transient_storage``).
    A module for llvm-cpu's ``cpu="host"`` is keyed on what this machine's CPU executes
    (``targets.host_isa``): a cache copied to another machine serves it only to the same instruction set.
    """
    kinds = f"{' frozen' if frozen else ''}{' transients' if transients else ''}"
    if cpu_of(flags) == "host":  # "host" names whichever machine compiles: key on what that CPU executes
        kinds += f" host {host_isa()}"
    return key(f"plan {plan.digest()} code {code_digest()}{kinds}", target, flags, compiler_version)


def _digest(entry_key: str, payload: bytes) -> bytes:
    return hashlib.sha256(entry_key.encode() + b"\n" + payload).digest()


class CompileCache:
    """A directory of compiled modules."""

    def __init__(self, directory: str | os.PathLike | None = None):
        if directory is None:
            self.directory, self._origin = _default_directory()
        else:
            self.directory, self._origin = Path(directory), "the directory given"
        self._ready = False

    def path(self, entry_key: str) -> Path:
        return self.directory / f"{entry_key}.vmfb"

    def check(self) -> None:
        """Make sure the directory exists and takes files, or raise a CacheError that names it (once per cache)."""
        if self._ready:
            return
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise self._error("it is a regular file, not a directory") from None
        except NotADirectoryError:
            above = next((p for p in self.directory.parents if p.is_file()), self.directory.parent)
            raise self._error(f"{above} above it is a regular file, not a directory") from None
        except OSError as error:
            raise self._error("it cannot be created", error) from None
        try:
            fd, probe = tempfile.mkstemp(dir=self.directory, prefix=".probe-")
            os.close(fd)
            os.unlink(probe)
        except OSError as error:
            raise self._error("it does not take new files", error) from None
        self._ready = True

    def load(self, entry_key: str) -> bytes | None:
        """The cached module, or None when absent, corrupt or another key's (a bad file is removed)."""
        path = self.path(entry_key)
        try:
            if not stat.S_ISREG(path.lstat().st_mode):  # a link or a device is none of ours: /dev/zero never ends
                self.evict(entry_key)
                return None
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:
            raise self._error(f"its entry {path.name} cannot be read", error) from None
        start = len(_MAGIC)
        stored_key = data[start:start + _KEY_BYTES]
        digest = data[start + _KEY_BYTES + 1:start + _KEY_BYTES + 33]
        payload = data[start + _KEY_BYTES + 33:]
        if (data[:start] != _MAGIC or stored_key != entry_key.encode()
                or data[start + _KEY_BYTES:start + _KEY_BYTES + 1] != b"\n"
                or digest != _digest(entry_key, payload)):
            self.evict(entry_key)
            return None
        return payload

    def evict(self, entry_key: str) -> None:
        """Remove an entry (a module that fails its checksum, or that IREE's runtime will not load)."""
        try:
            self.path(entry_key).unlink(missing_ok=True)
        except OSError:  # the rebuilt entry replaces it, or store says why it cannot
            pass

    def store(self, entry_key: str, payload: bytes) -> Path:
        self.check()
        target = self.path(entry_key)
        try:
            with replacing(target) as handle:
                handle.write(_MAGIC + entry_key.encode() + b"\n" + _digest(entry_key, payload) + payload)
        except OSError as error:
            raise self._error(f"its entry {target.name} cannot be written", error) from None
        return target

    def _error(self, problem: str, error: OSError | None = None) -> CacheError:
        reason = f" ({error.strerror or error})" if error is not None else ""
        return CacheError(
            f"the compile cache at {self.directory} ({self._origin}) cannot be used: {problem}{reason}. "
            "Set TOPOS_CACHE_DIR to a writable directory, pass cache=CompileCache(directory) "
            "or a directory path, or compile with cache=False"
        )


def cache_for(cache) -> CompileCache | None:
    """The CompileCache that ``compile(..., cache=...)`` names: True, False/None, a directory, or a CompileCache."""
    if cache is True:
        return CompileCache()
    if cache is False or cache is None:
        return None
    if isinstance(cache, CompileCache):
        return cache
    if isinstance(cache, (str, os.PathLike)):
        if not os.fspath(cache):  # Path("") is the working directory: entries would land beside the user's files
            raise CacheError("cache='' is an empty path: pass a directory path, True (the default directory) "
                             "or False (no cache)")
        return CompileCache(cache)
    raise CacheError(
        f"cache={cache!r} ({type(cache).__name__}): pass True (the default directory), False (no cache), "
        "a directory path or a CompileCache"
    )
