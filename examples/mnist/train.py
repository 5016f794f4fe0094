"""MNIST: a LeNet-style convolutional network on handwritten digits, trained compiled.

Two 3x3 convolutions (8 and 16 filters, padding 1) each followed by relu
and a 2x2 max-pool, then one linear layer to 10 logits; cross-entropy over
the integer labels (a selection with extent 10); SGD at 0.1, then 0.01 from
80% of the steps. The data is scikit-learn's bundled 8x8 digits (8 -> 4 -> 2
pixels through the pools) unless ``--data DIR`` names a folder with real
MNIST's IDX files (28 -> 14 -> 7). Two recordings of the one model share
their weights by name: a training batch, and the test batch the whole test
split is read in (``--test-batch`` rows at a time, the last chunk padded and
trimmed). Training runs through IREE by default (``--route``), after its
first steps are checked against the oracle.

Run: python examples/mnist/train.py [--data DIR] [--steps 2000] [--plot loss.png]
Prints ``last-500 mean loss`` and ``test accuracy`` as its last lines.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/: _training, mnist.data

import numpy as np  # noqa: E402
from mnist.data import CLASSES, Digits, load  # noqa: E402

import topos.nn.functional as F  # noqa: E402
from topos import Tape, init, nn, optim  # noqa: E402

from _training import Reader, fit, in_chunks, parser, plot, positive, run  # noqa: E402


class LeNet(nn.Module):
    """conv3x3(8)-relu-maxpool2, conv3x3(16)-relu-maxpool2, flatten, linear -> 10; PyTorch's default init."""

    def __init__(self, height: int, width: int):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.classifier = nn.Linear(16 * (height // 4) * (width // 4), CLASSES)

    def forward(self, images):
        return self.classifier(self.features(images))


def recorder(digits: Digits, args, rows: int, training: bool):
    """A recording of the model over ``rows`` images: the loss and SGD's updates, or the logits."""

    def record(tape):
        height, width = digits.side
        model = LeNet(height, width)
        images = tape.input(shape=(rows, 1, height, width), name="images")
        logits = model(images)
        if not training:
            return logits
        labels = tape.input(shape=(rows,), extent=CLASSES, name="labels")
        loss = F.cross_entropy(logits, labels)
        return loss, optim.SGD(lr=0.1).record(tape.differentiate(loss, model.parameters()))

    return Tape.record(record, seed=args.seed)


def learning_rate(args, step: int) -> float:
    """0.1, then 0.01 from 80% of the steps."""
    return 0.01 if step >= int(0.8 * args.steps) else 0.1


def accuracy(logits_of, images: np.ndarray, labels: np.ndarray, rows: int) -> float:
    """The fraction of ``images`` whose largest logit is the label, read ``rows`` at a time."""
    predicted = in_chunks(lambda chunk: np.argmax(np.asarray(logits_of(chunk)), axis=1), [images], rows)
    return float((predicted == labels).mean())


def main(argv=None) -> None:
    options = parser(__doc__.splitlines()[0], steps=2000)
    options.add_argument("--data", metavar="DIR",
                         help="a folder with MNIST's four IDX files, plain or .gz (default: scikit-learn's 8x8 digits)")
    options.add_argument("--batch", type=positive, default=64, help="training batch (default 64)")
    options.add_argument("--test-batch", type=positive, default=1000,
                         help="rows per read of the test split (default 1000, or the whole split if smaller)")
    args = options.parse_args(argv)

    digits = load(args.data, seed=args.seed)
    print(digits.describe())
    images, labels = digits.train_images, digits.train_labels
    batches = init.Generator(args.seed)
    picks = [batches.integers((args.batch,), 0, len(labels)) for _ in range(args.steps)]

    def feeds_of(step: int) -> dict:
        rows = picks[step % len(picks)]
        return {"images": images[rows], "labels": labels[rows], "optim.lr": learning_rate(args, step)}

    network, (loss, updates) = recorder(digits, args, args.batch, training=True)
    trainer, losses, ran = fit(network, loss, updates, args, feeds_of, "mnist lenet")

    rows = min(args.test_batch, len(digits.test_labels))
    test, logits = recorder(digits, args, rows, training=False)
    reader, table = Reader(test, [logits], args.route, args.target), test.parameters(trainer.table())
    test_accuracy = accuracy(lambda chunk: reader(table, {"images": chunk})[logits],
                             digits.test_images, digits.test_labels, rows)
    if args.plot:
        plot(losses, args.plot, f"LeNet on {digits.source} ({args.route})")
    print(ran)
    print(f"last-500 mean loss: {np.mean(losses[-500:]):.4f}")
    print(f"test accuracy: {test_accuracy:.4f}")


if __name__ == "__main__":
    run(main)
