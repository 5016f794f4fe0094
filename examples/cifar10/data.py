"""CIFAR-10 from its binary batches in a folder of your own (nothing is shipped: 60,000 32x32 colour images).

The binary version (``cifar-10-binary.tar.gz`` from
https://www.cs.toronto.edu/~kriz/cifar.html) unpacks to
``cifar-10-batches-bin/`` with ``data_batch_1.bin`` .. ``data_batch_5.bin``
(the 50,000 training images) and ``test_batch.bin`` (10,000). Each record
is 3,073 bytes: one label byte (0..9) and 3,072 pixel bytes, the red, green
and blue 32x32 planes row-major, so a file reshapes to ``[N, 3, 32, 32]``
as it stands. The real files hold 10,000 records each; any whole number of
records is accepted (small files for tests).

Images stay uint8 (150 MB for the training split rather than 600 MB as
float32); ``Cifar.normalized`` turns a batch into float32 with the
per-channel mean and standard deviation of the training images in use.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

CHANNELS, SIDE, CLASSES = 3, 32, 10
RECORD = 1 + CHANNELS * SIDE * SIDE
TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
TEST_FILE = "test_batch.bin"
UNPACKED = "cifar-10-batches-bin"
WHERE = ("download CIFAR-10's binary version (cifar-10-binary.tar.gz, 163 MB) from "
         "https://www.cs.toronto.edu/~kriz/cifar.html, unpack it (tar xzf cifar-10-binary.tar.gz) and pass "
         f"--data path/to/{UNPACKED}")


@dataclass(frozen=True)
class Cifar:
    """Training and test images ``[N, 3, 32, 32]`` (uint8), labels ``[N]`` (int64), the training pixels' statistics."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    mean: np.ndarray  # [3] float64, per channel, of the training pixels scaled to [0, 1]
    std: np.ndarray  # [3] float64, likewise (the population standard deviation)
    source: str

    def normalized(self, images: np.ndarray) -> np.ndarray:
        """``(pixels / 255 - mean) / std`` per channel, as float32."""
        scale = (1.0 / (255.0 * self.std)).astype(np.float32).reshape(1, CHANNELS, 1, 1)
        shift = (-self.mean / self.std).astype(np.float32).reshape(1, CHANNELS, 1, 1)
        return images.astype(np.float32) * scale + shift

    def describe(self) -> str:
        means = ", ".join(f"{m:.3f}" for m in self.mean)
        stds = ", ".join(f"{s:.3f}" for s in self.std)
        return (f"{self.source}: {len(self.train_labels)} train and {len(self.test_labels)} test images of "
                f"{SIDE}x{SIDE}x{CHANNELS}; channel means {means}, standard deviations {stds}")


def load(path: str | Path | None, limit: int | None = None) -> Cifar:
    """The training batches (only as many as the first ``limit`` images need) and the test batch from ``path``."""
    from _training import ExampleError

    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ExampleError(f"--limit must be a positive number of training images (or None for all), got {limit!r}; "
                           "pass --limit N with N >= 1, or leave it out")
    if path is None:
        raise ExampleError(f"CIFAR-10 is not shipped with topos: {WHERE}")
    folder = Path(path)
    if not folder.is_dir():
        raise ExampleError(f"--data {folder} is not a folder; {WHERE}")
    if not (folder / TEST_FILE).exists() and (folder / UNPACKED).is_dir():
        folder = folder / UNPACKED  # the folder the archive was unpacked in
    images, labels, count = [], [], 0
    for name in TRAIN_FILES:
        if limit is not None and count >= limit:
            break
        batch_images, batch_labels = read_batch(_find(folder, name))
        images.append(batch_images)
        labels.append(batch_labels)
        count += len(batch_labels)
    train_images = np.concatenate(images)[:limit]
    train_labels = np.concatenate(labels)[:limit]
    if limit is not None and len(train_labels) < limit:
        print(f"--limit {limit}: the training batches in {folder} hold only {len(train_labels)} images; using them all")
    test_images, test_labels = read_batch(_find(folder, TEST_FILE))
    mean, std = channel_statistics(train_images)
    if not np.all(std > 0):
        raise ExampleError(f"the training images in {folder} have a constant channel (standard deviations {std}); "
                           f"they cannot be normalized: check the files ({WHERE})")
    return Cifar(train_images, train_labels, test_images, test_labels, mean, std, f"CIFAR-10 from {folder}")


def _find(folder: Path, name: str) -> Path:
    from _training import ExampleError

    path = folder / name
    if not path.is_file():
        expected = ", ".join(TRAIN_FILES + (TEST_FILE,))
        raise ExampleError(f"{folder} has no {name}; the folder must hold CIFAR-10's binary batches ({expected}): "
                           f"{WHERE}")
    return path


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One binary batch file -> images ``[N, 3, 32, 32]`` (uint8) and labels ``[N]`` (int64), checked."""
    from _training import ExampleError

    try:
        data = path.read_bytes()
    except OSError as error:
        raise ExampleError(f"cannot read {path}: {error}") from None
    if not data:
        raise ExampleError(f"{path} is empty; it should hold {RECORD}-byte records: download it again")
    if len(data) % RECORD:
        whole = len(data) // RECORD
        raise ExampleError(
            f"{path} is truncated or not a CIFAR-10 binary batch: {len(data)} bytes is {whole} whole {RECORD}-byte "
            f"records (1 label byte + 3072 pixel bytes) and {len(data) - whole * RECORD} bytes over; the real files "
            "are 30,730,000 bytes (10,000 records): download it again (the CIFAR-100 files have 3074-byte records)"
        )
    records = np.frombuffer(data, np.uint8).reshape(-1, RECORD)
    labels = records[:, 0].astype(np.int64)
    wrong = np.flatnonzero(labels >= CLASSES)
    if wrong.size:
        raise ExampleError(f"{path}: record {int(wrong[0])} has label {int(labels[wrong[0]])}, not a class 0..9; "
                           "this is not a CIFAR-10 binary batch: download it again")
    return records[:, 1:].reshape(-1, CHANNELS, SIDE, SIDE), labels


def channel_statistics(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each channel's mean and standard deviation of ``pixels / 255``, exactly, from a histogram of its 256 values."""
    values = np.arange(256, dtype=np.float64) / 255.0
    means, stds = [], []
    for channel in range(images.shape[1]):
        counts = np.bincount(images[:, channel].reshape(-1), minlength=256).astype(np.float64)
        mean = float(counts @ values) / counts.sum()
        means.append(mean)
        stds.append(np.sqrt(float(counts @ (values - mean) ** 2) / counts.sum()))
    return np.array(means), np.array(stds)
