"""The safetensors codec: exact round trips, agreement with the reference, atomic writes, clear refusals."""

from __future__ import annotations

import errno
import json
import os
import pickle
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from topos.base import safetensors_io
from topos.base.safetensors_io import CheckpointError

from conftest import generator

CODES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2",
         "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL")
DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
}  # fmt: skip
# What safetensors.numpy can hold (numpy has no bfloat16 or float8 of its own).
NUMPY_CODES = tuple(code for code in CODES if code not in ("BF16", "F8_E4M3", "F8_E5M2"))


def sample(code: str, shape: tuple[int, ...] = (3, 5)) -> np.ndarray:
    """An array of random bit patterns (NaNs, infinities, subnormals and -0 included for floats)."""
    dtype = np.dtype(DTYPES[code])
    if code == "BOOL":
        return generator(code, shape).integers(0, 2, shape).astype(np.bool_)
    raw = generator(code, shape).integers(0, 256, (*shape, dtype.itemsize), dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal dtype, shape and bytes: the only equality that holds for NaN payloads and -0."""
    return (
        got.dtype == want.dtype
        and got.shape == want.shape
        and np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()
    )


def raw_file(path, header: object, data: bytes = b"", *, length: int | None = None) -> str:
    """A hand-made file: header (a dict or JSON text) padded to 8 bytes, then data."""
    text = (header if isinstance(header, str) else json.dumps(header)).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes((len(text) if length is None else length).to_bytes(8, "little") + text + data)
    return str(path)


def on_disk(path) -> tuple[dict, bytes]:
    """The header JSON and the data section of a file, read by hand rather than by the module under test."""
    blob = Path(path).read_bytes()
    length = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8 : 8 + length]), blob[8 + length :]


def tensor(dtype: str, shape: list[int], begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("code", CODES)
def test_every_dtype_round_trips_bit_for_bit(tmp_path, code):
    want = {"matrix": sample(code), "scalar": sample(code, ()), "empty": sample(code, (0, 4))}
    path = tmp_path / "model.safetensors"
    safetensors_io.write(path, want)
    got = safetensors_io.read(path)
    assert got.keys() == want.keys()
    for name, array in want.items():
        assert same_bits(got[name], array), name
        assert got[name].base is None and got[name].flags.writeable and got[name].flags.c_contiguous
    assert on_disk(path)[0]["matrix"]["dtype"] == code


def test_bfloat16_and_float8_keep_every_bit_pattern(tmp_path):
    every = np.arange(2**16, dtype=np.uint16)
    want = {
        "bf16": every.view(ml_dtypes.bfloat16),
        "e4m3": every.astype(np.uint8)[:256].view(ml_dtypes.float8_e4m3fn),
        "e5m2": every.astype(np.uint8)[:256].view(ml_dtypes.float8_e5m2),
    }
    safetensors_io.write(tmp_path / "m.safetensors", want)
    got = safetensors_io.read(tmp_path / "m.safetensors")
    for name, array in want.items():
        np.testing.assert_array_equal(got[name].view(np.uint8), array.view(np.uint8))


def test_non_contiguous_fortran_and_big_endian_arrays_are_stored_little_endian_c_order(tmp_path):
    base = sample("F32", (6, 8))
    want = {
        "strided": base[::2, ::-3],
        "fortran": np.asfortranarray(base),
        "big_f32": base.astype(">f4"),
        "big_i64": np.arange(-3, 9, dtype=">i8").reshape(3, 4),
        "transposed_bf16": sample("BF16", (4, 4)).T,
    }
    path = tmp_path / "m.safetensors"
    safetensors_io.write(path, want)
    got = safetensors_io.read(path)
    for name, array in want.items():
        np.testing.assert_array_equal(got[name], array)
        assert got[name].dtype.byteorder in "=|" and got[name].flags.c_contiguous
    header, data = on_disk(path)
    begin, end = header["big_i64"]["data_offsets"]
    assert data[begin:end] == np.arange(-3, 9, dtype="<i8").tobytes()
    begin, end = header["strided"]["data_offsets"]
    assert data[begin:end] == np.ascontiguousarray(base[::2, ::-3]).astype("<f4").tobytes()


def test_metadata_round_trips_and_is_empty_when_absent(tmp_path):
    metadata = {"format": "pt", "step": "12", "note": "ünïcode ✓"}
    safetensors_io.write(tmp_path / "a.safetensors", {"w": sample("F32")}, metadata)
    safetensors_io.write(tmp_path / "b.safetensors", {"w": sample("F32")})
    assert safetensors_io.read_metadata(tmp_path / "a.safetensors") == metadata
    assert safetensors_io.read_metadata(tmp_path / "b.safetensors") == {}


def test_header_matches_what_read_returns(tmp_path):
    want = {code: sample(code, (2, i + 1)) for i, code in enumerate(CODES)}
    path = tmp_path / "m.safetensors"
    safetensors_io.write(path, want)
    got = safetensors_io.read(path)
    described = safetensors_io.header(path)
    assert described == {name: (array.dtype, array.shape) for name, array in want.items()}
    assert list(described) == list(got)


def test_an_empty_dict_makes_a_readable_file(tmp_path):
    safetensors_io.write(tmp_path / "m.safetensors", {})
    assert (tmp_path / "m.safetensors").read_bytes() == b"\x08" + b"\0" * 7 + b"{}      "
    assert safetensors_io.read(tmp_path / "m.safetensors") == {}


# ---------------------------------------------------------------- layout and determinism


def test_same_tensors_give_identical_bytes_whatever_the_dict_order(tmp_path):
    tensors = {code: sample(code) for code in CODES}
    metadata = {"b": "2", "a": "1"}
    safetensors_io.write(tmp_path / "a.safetensors", tensors, metadata)
    safetensors_io.write(tmp_path / "b.safetensors", dict(reversed(tensors.items())), dict(reversed(metadata.items())))
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()


def test_layout_is_the_reference_order_so_every_tensor_is_aligned(tmp_path):
    tensors = {f"{code.lower()}_{i}": sample(code, (i + 1,)) for i, code in enumerate(CODES)}
    path = tmp_path / "m.safetensors"
    safetensors_io.write(path, tensors)
    assert int.from_bytes(path.read_bytes()[:8], "little") % 8 == 0
    entries = sorted(on_disk(path)[0].items(), key=lambda item: item[1]["data_offsets"])
    sizes = [np.dtype(DTYPES[info["dtype"]]).itemsize for _, info in entries]
    assert sizes == sorted(sizes, reverse=True)
    assert all(info["data_offsets"][0] % size == 0 for (_, info), size in zip(entries, sizes))
    # The reference's own order among same-size dtypes: U64, I64, F64 and so on down to BOOL.
    assert [info["dtype"] for _, info in entries][:3] == ["U64", "I64", "F64"]
    assert [info["dtype"] for _, info in entries][-3:] == ["I8", "U8", "BOOL"]
    assert list(safetensors_io.read(path)) == [name for name, _ in entries]  # read gives the data's order


# ---------------------------------------------------------------- interop with the reference implementation


def test_reference_numpy_loader_reads_our_files(tmp_path):
    reference = pytest.importorskip("safetensors.numpy")
    want = {code: sample(code) for code in NUMPY_CODES} | {"scalar": sample("F32", ()), "empty": sample("I8", (0,))}
    safetensors_io.write(tmp_path / "m.safetensors", want)
    got = reference.load_file(tmp_path / "m.safetensors")
    assert got.keys() == want.keys()
    assert all(same_bits(got[name], want[name]) for name in want)


def test_our_bytes_equal_the_reference_numpy_writer(tmp_path):
    reference = pytest.importorskip("safetensors.numpy")
    tensors = {"w": sample("F32", (3, 4)), "b": sample("I64", (5,)), "h": sample("F16", (3,)),
               "ünï": sample("BOOL", ())}
    safetensors_io.write(tmp_path / "ours.safetensors", tensors, {"format": "np"})
    reference.save_file(tensors, tmp_path / "theirs.safetensors", metadata={"format": "np"})
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "theirs.safetensors").read_bytes()


def test_files_from_the_reference_numpy_writer_read_back_bit_for_bit(tmp_path):
    reference = pytest.importorskip("safetensors.numpy")
    want = {code: sample(code, (4, 3)) for code in NUMPY_CODES} | {"scalar": sample("F64", ())}
    reference.save_file(want, tmp_path / "m.safetensors", metadata={"by": "reference"})
    got = safetensors_io.read(tmp_path / "m.safetensors")
    assert all(same_bits(got[name], want[name]) for name in want)
    assert safetensors_io.read_metadata(tmp_path / "m.safetensors") == {"by": "reference"}


def torch_bytes(value) -> bytes:
    import torch

    return value.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def test_reference_torch_loader_reads_our_files_bfloat16_included(tmp_path):
    pytest.importorskip("safetensors")
    torch = pytest.importorskip("torch")
    reference = pytest.importorskip("safetensors.torch")
    torch_dtypes = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F8_E4M3": torch.float8_e4m3fn,
                    "F8_E5M2": torch.float8_e5m2, "I64": torch.int64, "I8": torch.int8, "BOOL": torch.bool}  # fmt: skip
    want = {code: sample(code) for code in torch_dtypes} | {"bf16_scalar": sample("BF16", ())}
    safetensors_io.write(tmp_path / "m.safetensors", want)
    got = reference.load_file(tmp_path / "m.safetensors")
    assert got.keys() == want.keys()
    for code, dtype in torch_dtypes.items():
        assert got[code].dtype == dtype and tuple(got[code].shape) == want[code].shape
        assert torch_bytes(got[code]) == want[code].tobytes(), code
    assert got["bf16_scalar"].shape == () and torch_bytes(got["bf16_scalar"]) == want["bf16_scalar"].tobytes()


def test_files_from_the_reference_torch_writer_read_back_bit_for_bit(tmp_path):
    pytest.importorskip("safetensors")
    torch = pytest.importorskip("torch")
    reference = pytest.importorskip("safetensors.torch")
    torch.manual_seed(0)
    want = {
        "bf16": torch.randn(4, 3).to(torch.bfloat16),
        "f16": torch.randn(5).to(torch.float16),
        "f8": torch.randn(7).to(torch.float8_e4m3fn),
        "f32_scalar": torch.tensor(1.5),
        "i64": torch.arange(6).reshape(2, 3),
        "mask": torch.tensor([True, False, True]),
    }
    reference.save_file(want, tmp_path / "m.safetensors")
    got = safetensors_io.read(tmp_path / "m.safetensors")
    assert got["bf16"].dtype == ml_dtypes.bfloat16 and got["f8"].dtype == ml_dtypes.float8_e4m3fn
    for name, value in want.items():
        assert got[name].shape == tuple(value.shape) and got[name].tobytes() == torch_bytes(value), name


def framed(header_text: str, data: bytes = b"") -> bytes:
    text = header_text.encode() + b" " * (-len(header_text.encode()) % 8)
    return len(text).to_bytes(8, "little") + text + data


F32x2 = '"dtype":"F32","shape":[2],"data_offsets":[0,8]'
HEADERS = {  # name: (the whole file, whether the reference accepts it)
    "plain": (framed('{"a":{' + F32x2 + '}}', bytes(8)), True),
    "keys_out_of_offset_order": (framed('{"b":{"dtype":"U8","shape":[1],"data_offsets":[8,9]},"a":{' + F32x2 + '}}',
                                        bytes(9)), True),
    "unknown_field_in_tensor": (framed('{"a":{' + F32x2 + ',"extra":1}}', bytes(8)), True),
    "null_metadata": (framed('{"__metadata__":null,"a":{' + F32x2 + '}}', bytes(8)), True),
    "unpadded_header": (b"\x02" + bytes(7) + b"{}", True),
    "zero_size_pair": (framed('{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},'
                              '"b":{"dtype":"I8","shape":[3,0],"data_offsets":[0,0]}}'), True),
    "metadata_only": (framed('{"__metadata__":{"k":"v"}}'), True),
    "non_string_metadata": (framed('{"__metadata__":{"k":1},"a":{' + F32x2 + '}}', bytes(8)), False),
    "three_offsets": (framed('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}}', bytes(8)), False),
    "float_size": (framed('{"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}', bytes(8)), False),
    "negative_size": (framed('{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}', bytes(8)), False),
    "boolean_size": (framed('{"a":{"dtype":"F32","shape":[true],"data_offsets":[0,4]}}', bytes(4)), False),
    "size_past_64_bits": (framed('{"a":{"dtype":"U8","shape":[18446744073709551616,0],"data_offsets":[0,0]}}'),
                          False),
    "product_past_64_bits": (framed('{"a":{"dtype":"U8","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}}'),
                             False),
    "lowercase_dtype": (framed('{"a":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}}', bytes(4)), False),
    "missing_shape": (framed('{"a":{"dtype":"F32","data_offsets":[0,8]}}', bytes(8)), False),
    "repeated_field": (framed('{"a":{"dtype":"F32",' + F32x2 + '}}', bytes(8)), False),
    "tensor_is_a_number": (framed('{"a":3}'), False),
    "top_level_array": (framed("[]"), False),
    "nul_padding": (b"\x08" + bytes(7) + b"{}" + bytes(6), False),
    "lone_surrogate_name": (framed('{"\\ud800":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\0"), False),
    "not_utf8": (b"\x08" + bytes(7) + b'{"\xff":1}  ', False),
    "deeply_nested": (framed("[" * 5000 + "]" * 5000), False),
    "all_zero_length": (bytes(8), False),
}


@pytest.mark.parametrize("name", HEADERS)
def test_reader_accepts_exactly_what_the_reference_accepts(tmp_path, name):
    reference = pytest.importorskip("safetensors")
    blob, accepted = HEADERS[name]
    try:
        reference.deserialize(blob)
        reference_accepts = True
    except reference.SafetensorError:
        reference_accepts = False
    assert reference_accepts == accepted, "the reference changed its mind: update HEADERS"
    (tmp_path / "m.safetensors").write_bytes(blob)
    if accepted:
        safetensors_io.read(tmp_path / "m.safetensors")
    else:
        with pytest.raises(CheckpointError, match="m.safetensors: "):
            safetensors_io.read(tmp_path / "m.safetensors")


def test_repeated_tensor_name_is_refused_though_the_reference_keeps_the_last(tmp_path):
    path = raw_file(tmp_path / "m.safetensors", '{"a":{' + F32x2 + '},"a":{' + F32x2 + '}}', bytes(8))
    with pytest.raises(CheckpointError, match="repeats the key 'a'"):
        safetensors_io.read(path)


# ---------------------------------------------------------------- atomic writes


def write_old(tmp_path) -> tuple[os.PathLike, bytes]:
    path = tmp_path / "model.safetensors"
    safetensors_io.write(path, {"old": sample("F32")})
    return path, path.read_bytes()


def test_a_failed_rename_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path, old = write_old(tmp_path)

    def refuse(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: writing failed \(No space left on device\)"):
        safetensors_io.write(path, {"new": sample("F64", (100, 100))})
    assert path.read_bytes() == old
    assert os.listdir(tmp_path) == ["model.safetensors"]


class _InterruptedFile:
    """A file whose second write is cut by Ctrl-C, as a long write of a large tensor can be."""

    def __init__(self, file, failure: BaseException):
        self._file, self._failure, self._writes = file, failure, 0

    def write(self, data):
        self._writes += 1
        if self._writes == 3:  # the length and the header are out; the data is not
            raise self._failure
        return self._file.write(data)

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *failure):
        self._file.close()


@pytest.mark.parametrize("failure", [KeyboardInterrupt(), OSError(errno.EIO, "Input/output error")], ids=repr)
def test_a_write_cut_midway_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch, failure):
    path, old = write_old(tmp_path)
    real_fdopen = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda *args, **kw: _InterruptedFile(real_fdopen(*args, **kw), failure))
    expected = KeyboardInterrupt if isinstance(failure, KeyboardInterrupt) else CheckpointError
    with pytest.raises(expected):
        safetensors_io.write(path, {"new": sample("F64", (100, 100)), "more": sample("I8")})
    assert path.read_bytes() == old
    assert os.listdir(tmp_path) == ["model.safetensors"]


def test_a_write_cut_midway_leaves_nothing_where_there_was_nothing(tmp_path, monkeypatch):
    real_fdopen = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda *a, **kw: _InterruptedFile(real_fdopen(*a, **kw), KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        safetensors_io.write(tmp_path / "model.safetensors", {"new": sample("F32")})
    assert os.listdir(tmp_path) == []


def test_the_data_is_synced_before_the_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: events.append("fsync") or real_fsync(fd))
    monkeypatch.setattr(os, "replace", lambda *a: events.append("replace") or real_replace(*a))
    safetensors_io.write(tmp_path / "model.safetensors", {"w": sample("F32")})
    assert events[:2] == ["fsync", "replace"]


def test_written_file_has_the_permissions_a_plain_open_gives(tmp_path):
    old_umask = os.umask(0o027)
    try:
        safetensors_io.write(tmp_path / "m.safetensors", {"w": sample("F32")})
    finally:
        os.umask(old_umask)
    assert os.stat(tmp_path / "m.safetensors").st_mode & 0o777 == 0o640


def test_saving_through_a_symlink_replaces_its_target_and_keeps_the_link(tmp_path):
    target = tmp_path / "runs" / "latest.safetensors"
    target.parent.mkdir()
    safetensors_io.write(target, {"old": sample("F32")})
    link = tmp_path / "model.safetensors"
    link.symlink_to(target)
    safetensors_io.write(link, {"new": sample("F64")})
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert list(safetensors_io.read(target)) == ["new"]
    assert sorted(os.listdir(target.parent)) == ["latest.safetensors"]


def test_saving_over_a_file_keeps_its_permissions(tmp_path):
    path = tmp_path / "private.safetensors"
    safetensors_io.write(path, {"w": sample("F32")})
    path.chmod(0o600)
    safetensors_io.write(path, {"w": sample("F64")})
    assert os.stat(path).st_mode & 0o777 == 0o600


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root may write any file")
def test_a_read_only_file_is_not_replaced(tmp_path):
    path, old = write_old(tmp_path)
    path.chmod(0o444)
    with pytest.raises(CheckpointError, match=r"cannot write it \(the file is read-only\)"):
        safetensors_io.write(path, {"new": sample("F32")})
    assert path.read_bytes() == old


@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="no /dev/null")
def test_saving_to_a_device_writes_into_it_and_leaves_it_a_device():
    import stat

    safetensors_io.write("/dev/null", {"w": sample("F32")})
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_saving_to_a_pipe_streams_into_it(tmp_path):
    import threading

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    received = []
    reader = threading.Thread(target=lambda: received.append(pipe.read_bytes()))
    reader.start()
    safetensors_io.write(pipe, {"w": sample("F32")})
    reader.join(timeout=30)
    assert (tmp_path / "pipe").is_fifo()
    plain = tmp_path / "plain.safetensors"
    safetensors_io.write(plain, {"w": sample("F32")})
    assert received == [plain.read_bytes()]


# ---------------------------------------------------------------- damaged and foreign files


@pytest.fixture
def good(tmp_path) -> bytes:
    safetensors_io.write(tmp_path / "good.safetensors", {"w": sample("F32", (4, 4)), "b": sample("I8", (3,))})
    return (tmp_path / "good.safetensors").read_bytes()


@pytest.mark.parametrize(
    "where, match",
    [
        (0, "0 bytes, too short to hold the 8-byte header length"),
        (5, "5 bytes, too short"),
        (13, "runs past the end of the 13-byte file"),
        (-1, "the data is truncated: the header describes 67 bytes but the file holds 66"),
        (-60, "the data is truncated: the header describes 67 bytes but the file holds 7"),
    ],
    ids=["empty", "inside_length", "inside_header", "last_byte", "inside_data"],
)
def test_a_truncated_file_is_refused(tmp_path, good, where, match):
    path = tmp_path / "cut.safetensors"
    path.write_bytes(good[:where])
    with pytest.raises(CheckpointError, match=rf"cut\.safetensors: .*{match}"):
        safetensors_io.read(path)
    with pytest.raises(CheckpointError, match=match):
        safetensors_io.header(path)


def test_trailing_bytes_are_refused(tmp_path, good):
    path = tmp_path / "long.safetensors"
    path.write_bytes(good + b"\0\0\0")
    with pytest.raises(CheckpointError, match="3 trailing bytes follow the last tensor"):
        safetensors_io.read(path)


@pytest.mark.parametrize(
    "header, data, match",
    [
        ('{"a": {"dtype": "F32",', b"", r"not valid JSON \(Expecting"),
        ({"a": tensor("F32", [2], 0, 8), "b": tensor("F32", [2], 4, 12)}, bytes(12), "overlapping the tensor before"),
        ({"a": tensor("F32", [2], 0, 8), "b": tensor("F32", [1], 12, 16)}, bytes(16), "a hole of 4 bytes"),
        ({"a": tensor("F32", [2], 8, 0)}, bytes(8), "end before they begin"),
        ({"a": tensor("C64", [1], 0, 8)}, bytes(8), "dtype 'C64', which topos does not read; save it as one of F64"),
        ({"a": tensor("F32", [3], 0, 8)}, bytes(8), r"8 bytes, but shape \[3\] of F32 needs 12"),
        ('{"a":{' + F32x2 + '},"a":{' + F32x2 + '}}', bytes(8), "repeats the key 'a'"),
        ({"a": tensor("F32", [2], 0, 8), "__metadata__": {"k": 1}}, bytes(8), "__metadata__ is not an object of str"),
        ({"a": {"dtype": "F32", "shape": [2]}}, bytes(8), "not an object with dtype, shape and data_offsets"),
        ({"a": tensor("F32", [-1], 0, 8)}, bytes(8), r"shape \[-1\], not a list of sizes"),
        ({"a": tensor("U8", [2**32, 2**32, 0], 0, 0)}, b"", "whose size overflows 64 bits"),
        ({"a": tensor("F32", [2**60], 0, 2**62)}, b"", "whose size overflows 64 bits"),
    ],
    ids=["invalid_json", "overlap", "hole", "backwards", "unknown_dtype", "shape_mismatch", "repeated_key",
         "bad_metadata", "missing_offsets", "negative_size", "count_overflow", "bit_count_overflow"],
)  # fmt: skip
def test_a_malformed_header_is_refused_with_its_reason(tmp_path, header, data, match):
    path = raw_file(tmp_path / "bad.safetensors", header, data)
    with pytest.raises(CheckpointError, match=rf"bad\.safetensors: .*{match}"):
        safetensors_io.read(path)


def test_a_zero_size_tensor_numpy_cannot_shape_is_refused_on_read_only(tmp_path):
    # The reference accepts this (its count is 0); numpy refuses the shape, so read says so plainly.
    path = raw_file(tmp_path / "m.safetensors", {"a": tensor("U8", [0, 2**32, 2**32], 0, 0)})
    assert safetensors_io.header(path) == {"a": (np.dtype(np.uint8), (0, 2**32, 2**32))}
    with pytest.raises(CheckpointError, match="numpy cannot hold tensor 'a' of shape"):
        safetensors_io.read(path)


def test_a_header_length_past_the_file_is_refused(tmp_path):
    path = raw_file(tmp_path / "m.safetensors", {}, length=4096)
    with pytest.raises(CheckpointError, match="header length 4096 runs past the end of the 16-byte file"):
        safetensors_io.read(path)


def test_a_header_over_the_reference_limit_is_refused(tmp_path):
    path = raw_file(tmp_path / "m.safetensors", {}, length=100_000_001)
    with pytest.raises(CheckpointError, match="header length 100000001 is over the 100000000-byte limit"):
        safetensors_io.read(path)


def test_foreign_files_are_named_for_what_they_are(tmp_path):
    np.save(tmp_path / "weights.npy", np.arange(4.0))
    np.savez(tmp_path / "weights.npz", w=np.arange(4.0))
    (tmp_path / "weights.pkl").write_bytes(pickle.dumps({"w": [1.0, 2.0]}))
    (tmp_path / "notes.txt").write_text("these are not tensors, just some words\n")
    for name, match in [("weights.npy", "a NumPy .npy file"), ("weights.npz", "a zip archive"),
                        ("weights.pkl", "a Python pickle, which topos never loads"),
                        ("notes.txt", "over the 100000000-byte limit")]:  # fmt: skip
        with pytest.raises(CheckpointError, match=rf"{name}: .*{match}"):
            safetensors_io.read(tmp_path / name)


def test_reading_a_folder_or_a_missing_file_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="this is a folder, not a safetensors file"):
        safetensors_io.read(tmp_path)
    with pytest.raises(CheckpointError, match=r"absent\.safetensors: no such file; check the path"):
        safetensors_io.read_metadata(tmp_path / "absent.safetensors")


# ---------------------------------------------------------------- what the writer refuses


@pytest.mark.parametrize(
    "tensors, metadata, match",
    [
        ({"": np.zeros(1)}, None, "tensor name '' is not allowed"),
        ({"__metadata__": np.zeros(1)}, None, "tensor name '__metadata__' is not allowed"),
        ({3: np.zeros(1)}, None, "tensor name 3 is not allowed"),
        ({"\ud800": np.zeros(1)}, None, "is not allowed"),
        ({"w": [1.0, 2.0]}, None, "tensor 'w' is a list; convert it with numpy.asarray"),
        ({"w": np.zeros(2, np.complex128)}, None,
         "dtype complex128; cast it to one of float64, float32, float16, bfloat16, float8_e4m3fn"),
        ({"w": np.array(["a"])}, None, "dtype <U1"),
        ({"w": np.zeros(2)}, {"step": 3}, "metadata must map strings to strings"),
        ([("w", np.zeros(2))], None, "tensors is a list; pass a dict"),
    ],
    ids=["empty_name", "metadata_name", "int_name", "surrogate_name", "list", "complex", "unicode", "int_metadata",
         "not_a_mapping"],
)  # fmt: skip
def test_writer_refuses_what_the_format_cannot_hold(tmp_path, tensors, metadata, match):
    with pytest.raises(CheckpointError, match=match):
        safetensors_io.write(tmp_path / "m.safetensors", tensors, metadata)
    assert os.listdir(tmp_path) == []


def test_writing_into_a_missing_folder_names_it(tmp_path):
    with pytest.raises(CheckpointError, match=r"the folder .*absent does not exist; create it first"):
        safetensors_io.write(tmp_path / "absent" / "m.safetensors", {"w": sample("F32")})


def test_writing_onto_a_folder_is_refused(tmp_path):
    (tmp_path / "m.safetensors").mkdir()
    with pytest.raises(CheckpointError, match="this is a folder, not a file"):
        safetensors_io.write(tmp_path / "m.safetensors", {"w": sample("F32")})
    assert os.listdir(tmp_path) == ["m.safetensors"]


def test_writing_below_a_regular_file_is_refused(tmp_path):
    (tmp_path / "plain").write_text("a file, not a folder")
    with pytest.raises(CheckpointError, match="plain is not a folder"):
        safetensors_io.write(tmp_path / "plain" / "m.safetensors", {"w": sample("F32")})


def test_permission_denied_on_the_folder_is_explained(tmp_path, monkeypatch):
    def refuse(*_):  # what a read-only folder answers, even to root's tests
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(CheckpointError, match="cannot create files in .* .permission denied.; choose a writable"):
        safetensors_io.write(tmp_path / "m.safetensors", {"w": sample("F32")})


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root may write in any folder")
def test_writing_into_a_read_only_folder_is_refused(tmp_path):
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(CheckpointError, match="cannot create files in .*locked .permission denied."):
            safetensors_io.write(folder / "m.safetensors", {"w": sample("F32")})
    finally:
        folder.chmod(0o700)


# ---------------------------------------------------------------- bad input: paths, headers, sizes


def test_a_repeated_key_among_thousands_is_found_in_linear_time(tmp_path):
    import time

    # 32,000 keys took 13.8 s when each key was counted over the whole list; now a few milliseconds.
    keys = ",".join(f'"k{i}":"v"' for i in range(32_000))
    path = raw_file(tmp_path / "m.safetensors", '{"__metadata__":{' + keys + "}}")
    start = time.perf_counter()
    assert len(safetensors_io.read_metadata(path)) == 32_000
    assert time.perf_counter() - start < 5.0
    path = raw_file(tmp_path / "m.safetensors", '{"__metadata__":{' + keys + ',"k31999":"again"}}')
    with pytest.raises(CheckpointError, match="repeats the key 'k31999'"):
        safetensors_io.read_metadata(path)


def test_a_header_number_too_long_for_python_is_a_damaged_file(tmp_path):
    path = raw_file(tmp_path / "m.safetensors", '{"a":{"dtype":"F32","shape":[' + "9" * 5000 + '],'
                                                '"data_offsets":[0,0]}}')
    with pytest.raises(CheckpointError, match=r"m\.safetensors: the header holds a number of over \d+ digits.*"
                                              r"damaged or is not a safetensors file"):
        safetensors_io.read(path)


def test_a_path_given_as_bytes_is_read_and_written_like_its_str(tmp_path):
    path = os.fsencode(tmp_path / "m.safetensors")
    safetensors_io.write(path, {"w": sample("F32")})
    assert same_bits(safetensors_io.read(path)["w"], sample("F32"))
    assert safetensors_io.header(path)["w"].shape == (3, 5)


@pytest.mark.parametrize("call", [lambda p: safetensors_io.read(p), lambda p: safetensors_io.header(p),
                                  lambda p: safetensors_io.write(p, {"w": sample("F32")})],
                         ids=["read", "header", "write"])
def test_a_path_holding_a_nul_character_is_refused_by_name(tmp_path, call):
    with pytest.raises(CheckpointError, match=r"path '.*a\\x00b' holds a NUL character.*remove it"):
        call(f"{tmp_path}/a\0b")
    with pytest.raises(CheckpointError, match="holds a NUL character"):
        call(os.fsencode(f"{tmp_path}/a\0b"))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_reading_a_named_pipe_is_refused_at_once_not_waited_on(tmp_path):
    import threading

    pipe = tmp_path / "pipe.safetensors"
    os.mkfifo(pipe)
    link = tmp_path / "link.safetensors"
    link.symlink_to(pipe)
    for path in (pipe, link):
        failures = []

        def attempt(path=path, failures=failures):
            try:
                safetensors_io.read(path)
            except CheckpointError as error:
                failures.append(str(error))

        reader = threading.Thread(target=attempt, daemon=True)
        reader.start()
        reader.join(timeout=10)
        if reader.is_alive():  # it waits for a writer: give it one, so the test ends
            with open(pipe, "wb"):
                pass
            reader.join(timeout=10)
            pytest.fail("reading a named pipe waited for a writer")
        assert len(failures) == 1 and "this is a pipe, not a safetensors file" in failures[0]
        assert str(path) in failures[0]


@pytest.mark.skipif(not os.path.isdir("/dev/fd"), reason="no /dev/fd")
def test_reading_an_anonymous_pipe_is_refused_as_a_pipe_not_as_truncated(tmp_path):
    source = tmp_path / "m.safetensors"
    safetensors_io.write(source, {"w": sample("F32")})
    readable, writable = os.pipe()
    try:
        os.write(writable, source.read_bytes())
        with pytest.raises(CheckpointError, match=r"this is a pipe, not a safetensors file; save the checkpoint to "
                                                  r"a file"):
            safetensors_io.read(f"/dev/fd/{readable}")
    finally:
        os.close(readable)
        os.close(writable)


def test_a_symlink_to_a_regular_file_still_reads(tmp_path):
    target = tmp_path / "target.safetensors"
    safetensors_io.write(target, {"w": sample("F32")})
    link = tmp_path / "link.safetensors"
    link.symlink_to(target)
    assert same_bits(safetensors_io.read(link)["w"], sample("F32"))


def test_reading_some_names_reads_only_those(tmp_path):
    path = tmp_path / "m.safetensors"
    safetensors_io.write(path, {"a": sample("F32"), "b": sample("I8"), "c": sample("BF16", (2,))})
    got = safetensors_io.read(path, ["c", "a"])
    assert list(got) == ["a", "c"] and same_bits(got["a"], sample("F32")) and same_bits(got["c"], sample("BF16", (2,)))
    assert safetensors_io.read(path, []) == {}
    with pytest.raises(CheckpointError, match=r"the file holds no tensor 'd'; read header\(path\)"):
        safetensors_io.read(path, ["a", "d"])
    with pytest.raises(CheckpointError, match=r"names='a' is one string; pass a list of names: names=\['a'\]"):
        safetensors_io.read(path, "a")
    for names in (5, [0]):
        with pytest.raises(CheckpointError, match=r"is not a collection of tensor names; pass a list of str"):
            safetensors_io.read(path, names)


def test_a_tensor_too_big_for_memory_is_a_checkpoint_error_naming_it_and_its_size(tmp_path, monkeypatch):
    path = tmp_path / "m.safetensors"
    safetensors_io.write(path, {"small": sample("U8", (4,)), "big": sample("F32", (1000, 1000))})
    empty = np.empty

    def scarce(shape, dtype=float, *args, **kwargs):  # what NumPy raises for a tensor larger than the memory
        if np.prod(shape) * np.dtype(dtype).itemsize > 10_000:
            raise MemoryError(f"Unable to allocate an array with shape {shape}")
        return empty(shape, dtype, *args, **kwargs)

    monkeypatch.setattr(np, "empty", scarce)
    with pytest.raises(CheckpointError, match=r"m\.safetensors: tensor 'big' \(\[1000, 1000\] F32, 4,000,000 bytes\) "
                                              r"does not fit in memory; free memory, read only the tensors needed"):
        safetensors_io.read(path)
    assert list(safetensors_io.read(path, ["small"])) == ["small"]


def test_advice_for_a_torch_tensor_handed_to_write_works_for_bfloat16(tmp_path):
    torch = pytest.importorskip("torch")
    from topos.base.element import host_array

    tensor = torch.ones(2, dtype=torch.bfloat16, requires_grad=True)
    path = tmp_path / "m.safetensors"
    with pytest.raises(CheckpointError, match=r"tensor 'w' is a Tensor; convert it with "
                                              r"topos\.base\.element\.host_array, "
                                              r"or save it with topos\.checkpoint\.save"):
        safetensors_io.write(path, {"w": tensor})
    safetensors_io.write(path, {"w": host_array(tensor)})  # the advice, followed
    assert safetensors_io.read(path)["w"].dtype == ml_dtypes.bfloat16
    with pytest.raises(CheckpointError, match=r"tensor 'w' is a list; convert it with numpy\.asarray"):
        safetensors_io.write(path, {"w": [1.0, 2.0]})
