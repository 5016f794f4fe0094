"""The vision examples (examples/mnist, examples/cifar10) train end to end, and their loaders refuse bad files clearly.

Each example runs in-process through its ``main(argv)`` with few steps and
small sizes: the bundled digits through IREE and through the FAST plan,
MNIST from IDX files and CIFAR-10 from binary batches that the tests write
themselves (nothing is downloaded). Every bad file is an ExampleError (a
ToposError) that names the file and says what to do.
"""

from __future__ import annotations

import gzip
import importlib.util
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

from topos import ToposError

ROOT = Path(__file__).resolve().parents[1]


def load_example(folder: str):
    spec = importlib.util.spec_from_file_location(f"example_{folder}_train", ROOT / "examples" / folder / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mnist = load_example("mnist")
cifar10 = load_example("cifar10")


@pytest.fixture(autouse=True)
def compile_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("TOPOS_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "vision-cache"))


def final_figures(printed: str) -> dict[str, str]:
    """The ``name: value`` lines an example prints last, by name; the report line under "report"."""
    lines = printed.strip().splitlines()
    figures = dict(line.split(": ", 1) for line in lines[-2:])
    figures["report"] = lines[-3]
    return figures


# ---- the bundled digits -------------------------------------------------------------------------


def test_digits_train_compiled_checked_against_the_oracle_and_beat_chance(tmp_path, capsys):
    curve = tmp_path / "loss.png"
    mnist.main(["--steps", "250", "--check", "2", "--quiet", "--plot", str(curve)])
    printed = capsys.readouterr().out
    assert printed.startswith("scikit-learn digits: 1438 train and 359 test images of 8x8")
    figures = final_figures(printed)
    assert figures["report"].startswith("route iree, compile ") and "ulps of the oracle" in figures["report"]
    assert float(figures["last-500 mean loss"]) < 2.3  # below log(10): it learned something
    assert float(figures["test accuracy"]) > 0.6  # chance is 0.1; this run gets about 0.9
    assert curve.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_the_default_digits_run_reaches_the_documented_accuracy(capsys):
    mnist.main(["--quiet"])
    accuracy = float(final_figures(capsys.readouterr().out)["test accuracy"])
    assert accuracy > 0.9666 - 0.02, f"test accuracy {accuracy}, docs/examples.md says 0.9666"


def test_digits_train_through_the_fast_plan(capsys):
    mnist.main(["--route", "plan", "--steps", "8", "--check", "2", "--quiet", "--seed", "3"])
    figures = final_figures(capsys.readouterr().out)
    assert figures["report"].startswith("route plan, ") and "ulps of the oracle" in figures["report"]
    assert 0.0 <= float(figures["test accuracy"]) <= 1.0


def test_accuracy_pads_the_last_chunk_and_counts_only_real_rows():
    labels = np.arange(10) % 10
    images = labels.astype(np.float32).reshape(10, 1, 1, 1)  # each image spells its label

    def logits_of(chunk):
        assert len(chunk) == 4  # every read is one recording's batch
        return np.eye(10, dtype=np.float32)[chunk[:, 0, 0, 0].astype(int)]

    assert mnist.accuracy(logits_of, images, labels, rows=4) == 1.0
    wrong = labels.copy()
    wrong[[0, 9]] = 5  # padded rows predict 0: they must not count
    assert mnist.accuracy(logits_of, images, wrong, rows=4) == 0.8


# ---- MNIST from IDX files -----------------------------------------------------------------------


def idx(magic: int, array: np.ndarray) -> bytes:
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_mnist(folder: Path, compressed: bool, train: int = 40, test: int = 20, side: int = 28) -> Path:
    """A folder with the four IDX files of a tiny random MNIST, plain or gzipped."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    contents = {
        "train-images-idx3-ubyte": idx(0x803, rng.integers(0, 256, (train, side, side))),
        "train-labels-idx1-ubyte": idx(0x801, rng.integers(0, 10, train)),
        "t10k-images-idx3-ubyte": idx(0x803, rng.integers(0, 256, (test, side, side))),
        "t10k-labels-idx1-ubyte": idx(0x801, rng.integers(0, 10, test)),
    }
    for name, data in contents.items():
        if compressed:
            (folder / f"{name}.gz").write_bytes(gzip.compress(data))
        else:
            (folder / name).write_bytes(data)
    return folder


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip"])
def test_mnist_trains_from_generated_idx_files(tmp_path, capsys, compressed):
    folder = write_mnist(tmp_path / "mnist", compressed)
    mnist.main(["--data", str(folder), "--route", "oracle", "--steps", "3", "--batch", "8", "--test-batch", "8",
                "--quiet"])
    printed = capsys.readouterr().out
    assert printed.startswith(f"MNIST from {folder}: 40 train and 20 test images of 28x28")
    figures = final_figures(printed)
    assert figures["report"].startswith("route oracle, ")
    assert 0.0 <= float(figures["test accuracy"]) <= 1.0


def test_mnist_loader_scales_pixels_to_the_unit_interval(tmp_path):
    digits = mnist.load(write_mnist(tmp_path / "mnist", compressed=False, side=12))
    assert digits.train_images.shape == (40, 1, 12, 12) and digits.train_images.dtype == np.float32
    assert digits.train_images.min() >= 0.0 and digits.train_images.max() <= 1.0
    assert digits.test_labels.dtype == np.int64 and digits.test_labels.max() <= 9


def test_the_bundled_split_is_deterministic_and_disjoint():
    first, again = mnist.load(None, seed=5), mnist.load(None, seed=5)
    assert np.array_equal(first.test_labels, again.test_labels)
    assert len(first.train_labels) + len(first.test_labels) == 1797
    assert first.train_images.max() == 1.0 and first.train_images.dtype == np.float32


def _swap_magic(folder):
    path = folder / "train-images-idx3-ubyte"
    path.write_bytes((0x801).to_bytes(4, "big") + path.read_bytes()[4:])
    return "train-images-idx3-ubyte", ("magic number 0x00000801", "0x00000803", "labels file")


def _truncate_images(folder):
    path = folder / "t10k-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    return "t10k-images-idx3-ubyte", ("truncated", "download it again")


def _short_header(folder):
    (folder / "train-labels-idx1-ubyte").write_bytes((0x801).to_bytes(4, "big") + b"\x00\x00")
    return "train-labels-idx1-ubyte", ("truncated", "header")


def _drop_a_label(folder):
    path = folder / "train-labels-idx1-ubyte"
    labels = np.frombuffer(path.read_bytes(), np.uint8, offset=8)
    path.write_bytes(idx(0x801, labels[:-1]))
    return "train-labels-idx1-ubyte", ("40 images", "39 labels", "train-images-idx3-ubyte")


def _label_ten(folder):
    path = folder / "t10k-labels-idx1-ubyte"
    labels = np.frombuffer(path.read_bytes(), np.uint8, offset=8).copy()
    labels[3] = 10
    path.write_bytes(idx(0x801, labels))
    return "t10k-labels-idx1-ubyte", ("label 10 at index 3", "0..9")


def _gzip_without_suffix(folder):
    path = folder / "train-images-idx3-ubyte"
    path.write_bytes(gzip.compress(path.read_bytes()))
    return "train-images-idx3-ubyte", ("gzipped", ".gz")


def _missing_file(folder):
    (folder / "t10k-labels-idx1-ubyte").unlink()
    return "t10k-labels-idx1-ubyte", ("has no", "nor t10k-labels-idx1-ubyte.gz", "ossci-datasets")


@pytest.mark.parametrize("damage", [_swap_magic, _truncate_images, _short_header, _drop_a_label, _label_ten,
                                    _gzip_without_suffix, _missing_file], ids=lambda f: f.__name__.strip("_"))
def test_a_bad_idx_file_is_an_example_error_naming_the_file_and_the_fix(tmp_path, damage):
    folder = write_mnist(tmp_path / "mnist", compressed=False)
    name, phrases = damage(folder)
    with pytest.raises(ToposError) as caught:
        mnist.main(["--data", str(folder), "--quiet"])
    assert type(caught.value).__name__ == "ExampleError"
    message = str(caught.value)
    assert name in message
    for phrase in phrases:
        assert phrase in message, (phrase, message)


def test_a_truncated_gzip_file_is_an_example_error(tmp_path):
    folder = write_mnist(tmp_path / "mnist", compressed=True)
    path = folder / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-50])
    with pytest.raises(ToposError, match=r"train-images-idx3-ubyte\.gz is not a whole gzip file.*download it again"):
        mnist.main(["--data", str(folder), "--quiet"])


# ---- CIFAR-10 from binary batches ---------------------------------------------------------------


def write_cifar(folder: Path, records: int = 64, files=None) -> Path:
    """A folder of CIFAR-10 binary batches with ``records`` random records each."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(11)
    for name in files or cifar10_files():
        labels = rng.integers(0, 10, (records, 1))
        pixels = rng.integers(0, 256, (records, 3072))
        (folder / name).write_bytes(np.concatenate([labels, pixels], axis=1).astype(np.uint8).tobytes())
    return folder


def cifar10_files():
    return [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]


def test_cifar10_trains_from_generated_batches(tmp_path, capsys):
    folder = write_cifar(tmp_path / "cifar-10-batches-bin")
    cifar10.main(["--data", str(tmp_path), "--route", "oracle", "--steps", "2", "--batch", "8", "--test-batch", "40",
                  "--quiet"])  # the folder the archive was unpacked in works too
    printed = capsys.readouterr().out
    assert printed.startswith(f"CIFAR-10 from {folder}: 320 train and 64 test images of 32x32x3")
    figures = final_figures(printed)
    assert figures["report"].startswith("route oracle, ")
    assert 0.0 <= float(figures["test accuracy"]) <= 1.0


def test_cifar10_limit_reads_only_the_batches_it_needs(tmp_path):
    folder = write_cifar(tmp_path / "cifar", files=["data_batch_1.bin", "test_batch.bin"])
    data = cifar10.load(folder, limit=50)
    assert data.train_images.shape == (50, 3, 32, 32) and data.train_images.dtype == np.uint8
    normalized = data.normalized(data.train_images).astype(np.float64)
    assert np.allclose(normalized.mean(axis=(0, 2, 3)), 0.0, atol=1e-5)
    assert np.allclose(normalized.std(axis=(0, 2, 3)), 1.0, atol=1e-5)


@pytest.mark.parametrize("limit", [0, -1, 2.5, True], ids=["zero", "negative", "float", "bool"])
def test_a_cifar10_limit_below_one_image_is_an_example_error(tmp_path, limit):
    folder = write_cifar(tmp_path / "cifar", records=4, files=["data_batch_1.bin", "test_batch.bin"])
    with pytest.raises(ToposError, match=r"--limit must be a positive number of training images .*got "
                                         rf"{limit!r}.*N >= 1") as caught:
        cifar10.load(folder, limit=limit)
    assert type(caught.value).__name__ == "ExampleError"


def test_batch_norm_running_statistics_move_with_the_training_step():
    from _training import Trainer

    network, (loss, updates) = cifar10.recorder(Namespace(convs=1, seed=0), 4, training=True)
    trainer = Trainer(network, loss, updates, "oracle")
    rng = np.random.default_rng(0)
    trainer.step({"images": rng.standard_normal((4, 3, 32, 32)).astype(np.float32), "labels": rng.integers(0, 10, 4)})
    table = trainer.table()
    assert np.any(np.asarray(table["stages.0.norms.0.running_mean"]) != 0.0)
    assert np.any(np.asarray(table["stages.2.norms.0.running_var"]) != 1.0)
    test, _ = cifar10.recorder(Namespace(convs=1, seed=1), 2, training=False)
    moved = test.parameters(table)  # the inference reading takes the statistics by name
    assert np.array_equal(moved["stages.0.norms.0.running_mean"], table["stages.0.norms.0.running_mean"])


def _truncate_batch(folder):
    path = folder / "data_batch_3.bin"
    path.write_bytes(path.read_bytes()[:-1000])
    return "data_batch_3.bin", ("truncated", "3073-byte records", "download it again")


def _label_out_of_range(folder):
    path = folder / "test_batch.bin"
    data = bytearray(path.read_bytes())
    data[5 * 3073] = 12
    path.write_bytes(bytes(data))
    return "test_batch.bin", ("record 5 has label 12", "0..9")


def _missing_batch(folder):
    (folder / "data_batch_5.bin").unlink()
    return "data_batch_5.bin", ("has no data_batch_5.bin", "cs.toronto.edu")


@pytest.mark.parametrize("damage", [_truncate_batch, _label_out_of_range, _missing_batch],
                         ids=lambda f: f.__name__.strip("_"))
def test_a_bad_cifar10_batch_is_an_example_error_naming_the_file_and_the_fix(tmp_path, damage):
    folder = write_cifar(tmp_path / "cifar")
    name, phrases = damage(folder)
    with pytest.raises(ToposError) as caught:
        cifar10.main(["--data", str(folder), "--quiet"])
    assert type(caught.value).__name__ == "ExampleError"
    message = str(caught.value)
    assert name in message
    for phrase in phrases:
        assert phrase in message, (phrase, message)


@pytest.mark.parametrize("argv", [[], ["--data", "/nonexistent/cifar"]], ids=["no-data", "no-such-folder"])
def test_cifar10_without_its_data_says_where_to_get_it(argv):
    with pytest.raises(ToposError, match=r"cifar-10-binary\.tar\.gz.*https://www\.cs\.toronto\.edu/~kriz/cifar\.html"
                                         r".*--data"):
        cifar10.main(argv + ["--quiet"])


def test_the_command_line_prints_the_error_without_a_traceback():
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "cifar10" / "train.py")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.startswith("error: CIFAR-10 is not shipped with topos") and "Traceback" not in done.stderr
