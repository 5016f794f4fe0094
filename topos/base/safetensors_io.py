"""Safetensors files: named arrays written and read back bit for bit, bfloat16 and float8 included.

The format (Hugging Face safetensors): an 8-byte little-endian header
length N, then N bytes of UTF-8 JSON giving each tensor's dtype, shape and
byte range, then the data, little-endian and in C order, covered by the
tensors exactly. The reader refuses what the reference reader refuses
(``huggingface/safetensors``, ``safetensors/src/tensor.rs``) and, stricter,
a key repeated in the JSON. The writer lays tensors out as the reference
writer does, largest alignment first and then by name, so every tensor
starts aligned to its element size and, with at most one metadata entry,
our bytes equal ``safetensors.numpy.save_file``'s.

Writes are atomic: a temporary file beside the target is written, synced
and renamed onto it, so a crash leaves the old file or the new one. Reads
give each tensor a fresh, writable array that owns its memory, and can
take only some tensors by name. Only a regular file (or a symlink to one)
is read: the header is checked against its size, which a pipe or a device
does not have. Nothing here unpickles.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import stat
import sys
from collections.abc import Collection, Iterator, Mapping
from typing import NamedTuple, Union

import ml_dtypes
import numpy as np

from topos.base.errors import CheckpointError
from topos.base.files import replacing

_Path = Union[str, "os.PathLike[str]"]

MAX_HEADER_BYTES = 100_000_000  # the reference reader refuses longer headers

_DTYPES: dict[str, np.dtype] = {
    code: np.dtype(kind)
    for code, kind in (
        ("F64", np.float64), ("F32", np.float32), ("F16", np.float16), ("BF16", ml_dtypes.bfloat16),
        ("F8_E4M3", ml_dtypes.float8_e4m3fn), ("F8_E5M2", ml_dtypes.float8_e5m2),
        ("I64", np.int64), ("I32", np.int32), ("I16", np.int16), ("I8", np.int8),
        ("U64", np.uint64), ("U32", np.uint32), ("U16", np.uint16), ("U8", np.uint8), ("BOOL", np.bool_),
    )
}  # fmt: skip
# The reference writer lays tensors out by this rank (its Dtype enum, in increasing alignment), highest first.
_REFERENCE_ORDER = (
    "BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64",
)
_RANK = {code: rank for rank, code in enumerate(_REFERENCE_ORDER)}
_NUMPY_NAMES = ", ".join(map(str, _DTYPES.values()))

_DAMAGED = "the file is damaged or is not a safetensors file: write it again or restore a copy"

# Files people mistake for checkpoints, told apart by their first bytes.
_LOOKALIKES = (
    (b"\x93NUMPY", "a NumPy .npy file (numpy.load reads it)"),
    (b"PK\x03\x04", "a zip archive, such as a torch .pt or a NumPy .npz file"),
    (b"\x80", "a Python pickle, which topos never loads"),
)


class TensorHeader(NamedTuple):
    """One tensor as a file's header describes it: what ``read`` returns for it, less the data."""

    dtype: np.dtype
    shape: tuple[int, ...]


class _Entry(NamedTuple):
    name: str
    code: str
    shape: tuple[int, ...]
    begin: int
    end: int


def _check_path(path: object) -> str:
    """``path`` as a str or PathLike of str: bytes decoded as the file system encodes names, NUL refused."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if isinstance(path, bytes):
        path = os.fsdecode(path)  # the messages and files.replacing join str: one type from here on
    if not isinstance(path, str):
        raise CheckpointError(f"the checkpoint path is a {type(path).__name__} ({path!r}); "
                              "pass a str or a pathlib.Path")
    if "\0" in path:
        raise CheckpointError(f"the checkpoint path {path!r} holds a NUL character, which no file name can; "
                              "remove it from the path")
    return path


def _error(path: _Path, problem: str, fix: str = _DAMAGED) -> CheckpointError:
    return CheckpointError(f"{os.fspath(path)}: {problem}; {fix}")


def _is_text(value: object) -> bool:
    """Whether value is a str that UTF-8 can encode (a lone surrogate cannot)."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# ---------------------------------------------------------------- writing


def write(path: _Path, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> None:
    """Write named arrays to a safetensors file atomically: the file is then the old one or the new one.

    Through ``files.replacing``: a symlink's target is replaced, the file
    keeps its permissions, and ``/dev/null`` or a pipe is written in place.
    """
    path = _check_path(path)
    rows = _layout(path, tensors)
    header = _header(path, rows, metadata)
    try:
        with replacing(path) as file:
            file.write(len(header).to_bytes(8, "little"))
            file.write(header)
            for _, _, array in rows:
                file.write(_little_endian_bytes(array))
    except OSError as failure:
        raise _write_error(path, failure) from None


def _write_error(path: _Path, failure: OSError) -> CheckpointError:
    """The CheckpointError for an OSError of ``replacing``, naming the folder or the file that refused."""
    where = failure.filename if isinstance(failure.filename, str) else None
    if isinstance(failure, IsADirectoryError):
        return _error(path, "this is a folder, not a file", "name a file inside it")
    if where is not None and where == os.path.dirname(os.path.realpath(path)):
        if isinstance(failure, FileNotFoundError) and not os.path.isdir(where):
            return _error(path, f"the folder {where} does not exist", "create it first")
        if isinstance(failure, NotADirectoryError):
            return _error(path, f"{where} is not a folder (a file stands in its way)", "choose another path")
        if isinstance(failure, PermissionError):
            return _error(path, f"cannot create files in {where} (permission denied)", "choose a writable folder")
        return _error(path, f"cannot create a file in {where} ({failure.strerror})", "choose another folder")
    if isinstance(failure, PermissionError):
        return _error(path, f"cannot write it ({failure.strerror})", "make it writable or choose another path")
    problem = f"writing failed ({failure.strerror or failure})"
    return _error(path, problem, "check the disk has room and the folder is writable")


def _layout(path: _Path, tensors: Mapping[str, np.ndarray]) -> list[tuple[str, str, np.ndarray]]:
    """Check names and arrays; return (name, dtype code, array) in the reference writer's order."""
    if not isinstance(tensors, Mapping):
        raise _error(path, f"tensors is a {type(tensors).__name__}", "pass a dict of names to arrays")
    rows = []
    for name, array in tensors.items():
        if not _is_text(name) or not name or name == "__metadata__":
            fix = "use a non-empty string other than '__metadata__'"
            raise _error(path, f"tensor name {name!r} is not allowed", fix)
        if not isinstance(array, (np.ndarray, np.generic)):
            # numpy.asarray fails on a bfloat16 or requires-grad torch tensor; host_array reads both bit for bit
            fix = ("convert it with topos.base.element.host_array, or save it with topos.checkpoint.save, which does"
                   if hasattr(array, "__dlpack__") else "convert it with numpy.asarray")
            raise _error(path, f"tensor {name!r} is a {type(array).__name__}", fix)
        array = np.asarray(array)
        code = next((code for code, dtype in _DTYPES.items() if array.dtype.newbyteorder("=") == dtype), None)
        if code is None:
            raise _error(path, f"tensor {name!r} has dtype {array.dtype}", f"cast it to one of {_NUMPY_NAMES}")
        rows.append((name, code, array))
    rows.sort(key=lambda row: (-_RANK[row[1]], row[0]))
    return rows


def _header(path: _Path, rows: list[tuple[str, str, np.ndarray]], metadata: Mapping[str, str] | None) -> bytes:
    """The JSON header, padded with spaces so that the data starts 8-byte aligned."""
    entries: dict[str, object] = {}
    if metadata is not None:
        if not isinstance(metadata, Mapping) or not all(map(_is_text, [*metadata.keys(), *metadata.values()])):
            raise _error(path, "metadata must map strings to strings", "convert keys and values with str()")
        entries["__metadata__"] = dict(sorted(metadata.items()))  # sorted: the same metadata, the same bytes
    offset = 0
    for name, code, array in rows:
        entries[name] = {"dtype": code, "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    text = json.dumps(entries, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    if len(text) > MAX_HEADER_BYTES:
        problem = f"the header would be {len(text)} bytes, over the {MAX_HEADER_BYTES} that readers accept"
        raise _error(path, problem, "split the tensors over several files")
    return text


def _little_endian_bytes(array: np.ndarray) -> memoryview:
    """The array's elements as little-endian bytes in C order (a view when the array already is so)."""
    array = np.ascontiguousarray(array)
    order = array.dtype.byteorder
    if order == ">" or (order == "=" and sys.byteorder == "big"):
        array = array.view(f"u{array.dtype.itemsize}").byteswap()
    return array.reshape(-1).view(np.uint8).data


# ---------------------------------------------------------------- reading


def read(path: _Path, names: Collection[str] | None = None) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file (or only ``names``), in the order its data lies, each a fresh array.

    With ``names``, the other tensors are skipped unread, so a caller that
    checked ``header(path)`` first reads only what it needs.
    """
    path = _check_path(path)
    with _reading(path) as file:
        entries = _parse(path, file)[0]
        if names is not None:
            if isinstance(names, str):
                raise _error(path, f"names={names!r} is one string", f"pass a list of names: names=[{names!r}]")
            if not isinstance(names, Collection) or not all(isinstance(name, str) for name in names):
                raise _error(path, f"names={names!r} is not a collection of tensor names", "pass a list of str")
            wanted = set(names)
            absent = wanted - {entry.name for entry in entries}
            if absent:
                raise _error(path, "the file holds no tensor " + ", ".join(map(repr, sorted(absent))),
                             "read header(path) for the names it holds")
            entries = [entry for entry in entries if entry.name in wanted]
        data = file.tell()
        tensors = {}
        for entry in entries:
            array = _empty(path, entry)
            file.seek(data + entry.begin)
            if file.readinto(array.reshape(-1).view(np.uint8).data) != entry.end - entry.begin:
                raise _error(path, "the file got shorter while it was read", "read it once its writer is done")
            if sys.byteorder == "big" and array.dtype.itemsize > 1:
                array.view(f"u{array.dtype.itemsize}").byteswap(inplace=True)
            tensors[entry.name] = array
    return tensors


def _empty(path: _Path, entry: _Entry) -> np.ndarray:
    """A fresh array for the entry's data; CheckpointError where NumPy cannot make one."""
    try:
        return np.empty(entry.shape, _DTYPES[entry.code])
    except ValueError:  # a zero-size shape whose other sizes numpy cannot index
        problem = f"numpy cannot hold tensor {entry.name!r} of shape {list(entry.shape)}"
        raise _error(path, problem, "save it with a smaller shape") from None
    except MemoryError:
        problem = (f"tensor {entry.name!r} ({list(entry.shape)} {entry.code}, {entry.end - entry.begin:,} bytes) "
                   "does not fit in memory")
        fix = "free memory, read only the tensors needed (read(path, names)), or use a machine with more memory"
        raise _error(path, problem, fix) from None


def header(path: _Path) -> dict[str, TensorHeader]:
    """Each tensor's dtype and shape, reading and checking only the header (cheap for big files)."""
    path = _check_path(path)
    with _reading(path) as file:
        entries, _ = _parse(path, file)
    return {entry.name: TensorHeader(_DTYPES[entry.code], entry.shape) for entry in entries}


def read_metadata(path: _Path) -> dict[str, str]:
    """The file's free-form ``__metadata__`` strings (empty when it has none)."""
    path = _check_path(path)
    with _reading(path) as file:
        return _parse(path, file)[1]


# What a path that is not a regular file is, for the message that refuses it.
_NOT_FILES = ((stat.S_ISFIFO, "a pipe"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
              (stat.S_ISSOCK, "a socket"))


@contextlib.contextmanager
def _reading(path: str) -> Iterator[io.BufferedReader]:
    """The regular file at ``path`` opened for reading, the operating system's complaints turned into CheckpointErrors.

    Anything else is refused: the reader takes the size from the file system
    and seeks, which a pipe or a device cannot give, and opening a pipe
    would wait for a writer forever (so the open does not block, and the
    check is on what was opened, not on a name that could change meanwhile).
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0))
        try:
            mode = os.fstat(descriptor).st_mode
            file = os.fdopen(descriptor, "rb")
        except BaseException:
            os.close(descriptor)
            raise
        with file:
            if stat.S_ISDIR(mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
            if not stat.S_ISREG(mode):
                kind = next((kind for test, kind in _NOT_FILES if test(mode)), "a special file")
                fix = "save the checkpoint to a file and read that"
                raise _error(path, f"this is {kind}, not a safetensors file", fix)
            yield file
    except FileNotFoundError:
        raise _error(path, "no such file", "check the path") from None
    except IsADirectoryError:
        raise _error(path, "this is a folder, not a safetensors file", "name a file inside it") from None
    except PermissionError:
        raise _error(path, "permission denied", "make the file readable") from None
    except OSError as failure:
        raise _error(path, f"reading failed ({failure.strerror or failure})", "check the disk") from None


def _parse(path: _Path, file: io.BufferedReader) -> tuple[list[_Entry], dict[str, str]]:
    """Read and check the header, leaving file at the data; return the tensors in data order and the metadata."""
    size = os.fstat(file.fileno()).st_size
    prefix = file.read(8)
    if len(prefix) < 8:
        raise _error(path, f"the file is {size} bytes, too short to hold the 8-byte header length")
    length = int.from_bytes(prefix, "little")
    if length > MAX_HEADER_BYTES:
        lookalike = next((kind for magic, kind in _LOOKALIKES if prefix.startswith(magic)), None)
        if lookalike:
            raise _error(path, f"this is {lookalike}, not a safetensors file", "pass a .safetensors file")
        raise _error(path, f"the header length {length} is over the {MAX_HEADER_BYTES}-byte limit")
    if 8 + length > size:
        raise _error(path, f"the header length {length} runs past the end of the {size}-byte file (truncated?)")
    try:
        text = file.read(length).decode("utf-8")
    except UnicodeDecodeError:
        raise _error(path, "the header is not UTF-8 text") from None

    def refuse_repeats(pairs: list[tuple[str, object]]) -> dict[str, object]:
        table = dict(pairs)
        if len(table) < len(pairs):  # linear: a header may hold tens of thousands of tensors
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    raise _error(path, f"the header repeats the key {key!r}")
                seen.add(key)
        return table

    try:
        parsed = json.loads(text, object_pairs_hook=refuse_repeats)
    except CheckpointError:  # a repeated key, refused above: a ValueError too, so not one of the cases below
        raise
    except json.JSONDecodeError as failure:
        raise _error(path, f"the header is not valid JSON ({failure.msg} at character {failure.pos})") from None
    except RecursionError:
        raise _error(path, "the header is not valid JSON (nested too deeply)") from None
    except ValueError:  # Python refuses to convert an integer of over sys.get_int_max_str_digits() digits
        problem = f"the header holds a number of over {sys.get_int_max_str_digits()} digits, which no size needs"
        raise _error(path, problem) from None
    if not isinstance(parsed, dict):
        raise _error(path, "the header is not a JSON object")
    metadata = parsed.pop("__metadata__", None)
    metadata = {} if metadata is None else metadata  # the reference reads null as no metadata
    if not isinstance(metadata, dict) or not all(map(_is_text, [*metadata.keys(), *metadata.values()])):
        raise _error(path, "__metadata__ is not an object of strings")
    # Sorted by offsets, as the reference does, so any order of keys in the JSON reads the same.
    entries = sorted((_entry(path, name, info) for name, info in parsed.items()), key=lambda e: (e.begin, e.end))
    end = 0
    for entry in entries:
        where = f"tensor {entry.name!r} has data_offsets [{entry.begin}, {entry.end}]"
        if entry.end < entry.begin:
            raise _error(path, f"{where}, which end before they begin")
        if entry.begin < end:
            raise _error(path, f"{where}, overlapping the tensor before it")
        if entry.begin > end:
            raise _error(path, f"{where}, leaving a hole of {entry.begin - end} bytes before it")
        count = _byte_count(path, entry)
        if entry.end - entry.begin != count:
            needs = f"shape {list(entry.shape)} of {entry.code} needs {count}"
            raise _error(path, f"{where}, {entry.end - entry.begin} bytes, but {needs}")
        end = entry.end
    held = size - 8 - length
    if held > end:
        raise _error(path, f"{held - end} trailing bytes follow the last tensor")
    if held < end:
        raise _error(path, f"the data is truncated: the header describes {end} bytes but the file holds {held}")
    return entries, metadata


def _entry(path: _Path, name: str, info: object) -> _Entry:
    """One tensor's header entry, checked for form: a known dtype, a shape and two unsigned 64-bit offsets."""
    if not _is_text(name):
        raise _error(path, f"tensor name {name!r} is not valid Unicode")
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
        raise _error(path, f"tensor {name!r} is not an object with dtype, shape and data_offsets")
    code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(code, str) or code not in _DTYPES:
        problem = f"tensor {name!r} has dtype {code!r}, which topos does not read"
        raise _error(path, problem, f"save it as one of {', '.join(_DTYPES)}")
    if not isinstance(shape, list) or not all(map(_is_index, shape)):
        raise _error(path, f"tensor {name!r} has shape {shape!r}, not a list of sizes")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_is_index, offsets)):
        raise _error(path, f"tensor {name!r} has data_offsets {offsets!r}, not a pair of byte offsets")
    return _Entry(name, code, tuple(shape), offsets[0], offsets[1])


def _byte_count(path: _Path, entry: _Entry) -> int:
    """The bytes the entry's shape and dtype need, refused where the reference's 64-bit arithmetic overflows."""
    count = 1
    for size in entry.shape:  # left to right as the reference multiplies: a later 0 does not undo an overflow
        count *= size
        if count >= 2**64:
            break
    nbytes = count * _DTYPES[entry.code].itemsize
    if nbytes * 8 >= 2**64:  # the reference counts bits
        raise _error(path, f"tensor {entry.name!r} has shape {list(entry.shape)}, whose size overflows 64 bits")
    return nbytes


def _is_index(value: object) -> bool:
    return type(value) is int and 0 <= value < 2**64
