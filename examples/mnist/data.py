"""Handwritten digits: scikit-learn's bundled 8x8 digits by default, or MNIST's IDX files from a folder.

The default needs no download: ``sklearn.datasets.load_digits()`` reads
1,797 8x8 images (pixels 0..16) from a file inside the scikit-learn
package; they are split 80/20 into train and test by
``topos.init.Generator(seed).permutation``. ``--data DIR`` reads real MNIST
(70,000 28x28 images, pixels 0..255) from the four IDX files in DIR, plain
or gzipped (``.gz``); MNIST's own train/test split is kept. Either way the
pixels are scaled to [0, 1] float32, shaped ``[N, 1, H, W]``.

The IDX format (LeCun's): a big-endian magic number ``0x00000803`` (images:
unsigned bytes, 3 dimensions) or ``0x00000801`` (labels: 1 dimension), one
big-endian uint32 per dimension, then the bytes row-major.
"""

from __future__ import annotations

import gzip
import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from topos import init

IMAGES_MAGIC = 0x00000803
LABELS_MAGIC = 0x00000801
SPLITS = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
WHERE = ("MNIST's four IDX files (train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
         "t10k-labels-idx1-ubyte, each plain or .gz), e.g. from https://ossci-datasets.s3.amazonaws.com/mnist/")
CLASSES = 10


@dataclass(frozen=True)
class Digits:
    """A train and a test split of digit images ``[N, 1, H, W]`` (float32 in [0, 1]) and labels ``[N]`` (int64)."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    source: str

    @property
    def side(self) -> tuple[int, int]:
        """The images' height and width."""
        return self.train_images.shape[2], self.train_images.shape[3]

    def describe(self) -> str:
        height, width = self.side
        return (f"{self.source}: {len(self.train_labels)} train and {len(self.test_labels)} test images "
                f"of {height}x{width}")


def load(path: str | Path | None = None, seed: int = 42) -> Digits:
    """The bundled digits (split by ``seed``), or MNIST from the IDX files in the folder ``path``."""
    return bundled(seed) if path is None else mnist(Path(path))


def bundled(seed: int) -> Digits:
    """scikit-learn's 8x8 digits, 80% train and 20% test in the order of ``Generator(seed).permutation``."""
    from _training import ExampleError

    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ExampleError("the bundled digits come with scikit-learn: pip install -e '.[examples]', "
                           f"or pass --data DIR with {WHERE}") from None
    digits = load_digits()
    images = (np.asarray(digits.images, np.float64) / 16.0).astype(np.float32)[:, None]
    labels = np.asarray(digits.target, np.int64)
    order = init.Generator(seed).permutation(len(labels))
    test = order[: len(order) // 5]
    train = order[len(order) // 5:]
    return Digits(images[train], labels[train], images[test], labels[test], "scikit-learn digits")


def mnist(folder: Path) -> Digits:
    """MNIST's train and test splits from the IDX files in ``folder``, each checked as it is read."""
    from _training import ExampleError

    if not folder.is_dir():
        raise ExampleError(f"--data {folder} is not a folder; pass the folder holding {WHERE}")
    splits = {}
    for split, (images_name, labels_name) in SPLITS.items():
        images_path, labels_path = _find(folder, images_name), _find(folder, labels_name)
        images = read_idx(images_path, IMAGES_MAGIC)
        labels = read_idx(labels_path, LABELS_MAGIC)
        if len(images) != len(labels):
            raise ExampleError(
                f"{images_path} holds {len(images)} images but {labels_path} holds {len(labels)} labels; "
                f"the {split} split needs one label per image: download both files of the pair again"
            )
        if images.shape[1] < 4 or images.shape[2] < 4:
            raise ExampleError(f"{images_path} holds {images.shape[1]}x{images.shape[2]} images; the network pools "
                               "twice by 2, so images need at least 4x4 pixels")
        wrong = np.flatnonzero(labels >= CLASSES)
        if wrong.size:
            raise ExampleError(f"{labels_path}: label {int(labels[wrong[0]])} at index {int(wrong[0])} is not a "
                               f"digit 0..9; this is not an MNIST label file: download it again")
        splits[split] = ((images.astype(np.float32) / np.float32(255.0))[:, None], labels.astype(np.int64))
    if splits["train"][0].shape[2:] != splits["test"][0].shape[2:]:
        raise ExampleError(f"the train images in {folder} are {splits['train'][0].shape[2:]} pixels but the test "
                           f"images {splits['test'][0].shape[2:]}; both splits must come from one data set")
    return Digits(*splits["train"], *splits["test"], f"MNIST from {folder}")


def _find(folder: Path, name: str) -> Path:
    from _training import ExampleError

    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    raise ExampleError(f"{folder} has no {name} (nor {name}.gz); --data DIR must hold {WHERE}")


def read_idx(path: Path, magic: int) -> np.ndarray:
    """The unsigned bytes of one IDX file (gunzipped if it ends in ``.gz``), after checking its header and size."""
    from _training import ExampleError

    what = "images" if magic == IMAGES_MAGIC else "labels"
    rank = magic & 0xFF
    data = _read(path)
    header = 4 + 4 * rank
    if len(data) >= 4 and int.from_bytes(data[:4], "big") != magic:
        found = int.from_bytes(data[:4], "big")
        hint = (" (it is gzipped: name it with .gz)" if data[:2] == b"\x1f\x8b"
                else " (it is the labels file)" if found == LABELS_MAGIC
                else " (it is the images file)" if found == IMAGES_MAGIC else "")
        raise ExampleError(
            f"{path} starts with the magic number 0x{found:08x}{hint}, but an IDX {what} file starts with "
            f"0x{magic:08x}; pass a folder holding {WHERE}"
        )
    if len(data) < header:
        raise ExampleError(f"{path} is truncated: {len(data)} bytes, shorter than the {header}-byte header of an IDX "
                           f"{what} file; download it again")
    dims = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(rank))
    expected = header + math.prod(dims)
    shape = "x".join(str(d) for d in dims)
    if len(data) < expected:
        raise ExampleError(f"{path} is truncated: its header promises {what} of shape {shape} ({expected} bytes) but "
                           f"the file has {len(data)} bytes; download it again")
    if len(data) > expected:
        raise ExampleError(f"{path} has {len(data) - expected} bytes after the {what} of shape {shape} its header "
                           "promises; this is not an IDX file as written: download it again")
    if dims[0] == 0:
        raise ExampleError(f"{path} holds no {what} (its header says 0); download it again")
    return np.frombuffer(data, np.uint8, offset=header).reshape(dims)


def _read(path: Path) -> bytes:
    from _training import ExampleError

    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as stream:
                return stream.read()
        return path.read_bytes()
    except (EOFError, zlib.error, gzip.BadGzipFile) as error:
        raise ExampleError(f"{path} is not a whole gzip file ({error}); download it again, "
                           "or gunzip it and drop the .gz") from None
    except OSError as error:
        raise ExampleError(f"cannot read {path}: {error}") from None
