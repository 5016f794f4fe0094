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
give each tensor a fresh, writable array that owns its memory. Nothing here
unpickles.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from collections.abc import Iterator, Mapping
from typing import NamedTuple, Union

import ml_dtypes
import numpy as np

from topos.errors import CheckpointError
from topos.files import replacing

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


def _check_path(path: object) -> None:
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise CheckpointError(f"the checkpoint path is a {type(path).__name__} ({path!r}); "
                              "pass a str or a pathlib.Path")


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
    _check_path(path)
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
            raise _error(path, f"tensor {name!r} is a {type(array).__name__}", "convert it with numpy.asarray")
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


def read(path: _Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file, in the order its data lies, each a fresh array of its own."""
    with _reading(path) as file:
        tensors = {}
        for entry in _parse(path, file)[0]:
            try:
                array = np.empty(entry.shape, _DTYPES[entry.code])
            except ValueError:  # a zero-size shape whose other sizes numpy cannot index
                problem = f"numpy cannot hold tensor {entry.name!r} of shape {list(entry.shape)}"
                raise _error(path, problem, "save it with a smaller shape") from None
            if file.readinto(array.reshape(-1).view(np.uint8).data) != entry.end - entry.begin:
                raise _error(path, "the file got shorter while it was read", "read it once its writer is done")
            if sys.byteorder == "big" and array.dtype.itemsize > 1:
                array.view(f"u{array.dtype.itemsize}").byteswap(inplace=True)
            tensors[entry.name] = array
    return tensors


def header(path: _Path) -> dict[str, TensorHeader]:
    """Each tensor's dtype and shape, reading and checking only the header (cheap for big files)."""
    with _reading(path) as file:
        entries, _ = _parse(path, file)
    return {entry.name: TensorHeader(_DTYPES[entry.code], entry.shape) for entry in entries}


def read_metadata(path: _Path) -> dict[str, str]:
    """The file's free-form ``__metadata__`` strings (empty when it has none)."""
    with _reading(path) as file:
        return _parse(path, file)[1]


@contextlib.contextmanager
def _reading(path: _Path) -> Iterator[io.BufferedReader]:
    """The file opened for reading, the operating system's complaints turned into CheckpointErrors."""
    _check_path(path)
    try:
        with open(path, "rb") as file:
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
        keys = [key for key, _ in pairs]
        repeated = next((key for key in keys if keys.count(key) > 1), None)
        if repeated is not None:
            raise _error(path, f"the header repeats the key {repeated!r}")
        return dict(pairs)

    try:
        parsed = json.loads(text, object_pairs_hook=refuse_repeats)
    except json.JSONDecodeError as failure:
        raise _error(path, f"the header is not valid JSON ({failure.msg} at character {failure.pos})") from None
    except RecursionError:
        raise _error(path, "the header is not valid JSON (nested too deeply)") from None
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
