"""CIFAR-10: a small VGG-style network with batch norm on 32x32 colour images, trained compiled.

Three stages of 16, 32 and 64 channels; each is ``--convs`` 3x3 convolutions
(padding 1, no bias) each followed by ``nn.BatchNorm`` and relu, then a 2x2
max-pool (32 -> 16 -> 8 -> 4), then one linear layer to 10 logits;
cross-entropy over the integer labels; SGD with momentum 0.9 and weight
decay 5e-4 at 0.05, then 0.005 from 80% of the steps. Pixels are normalized
per channel by the mean and standard deviation of the training images.

Batch norm has two readings over one set of state slots: the training
recording normalizes by each batch and records the next running mean and
variance, which ``model.state_updates()`` joins to the optimizer's updates,
so one compiled step moves the weights, the momenta and the running
statistics; the test recording (``training=False``) normalizes by the
running statistics and receives them, with the weights, by name. The data
is not shipped: ``--data DIR`` names the folder of CIFAR-10's binary batches.

Run: python examples/cifar10/train.py --data DIR [--limit N] [--steps 2000] [--plot loss.png]
Prints ``last-500 mean loss`` and ``test accuracy`` as its last lines.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/: _training, cifar10.data

import numpy as np  # noqa: E402
from cifar10.data import CHANNELS, CLASSES, SIDE, Cifar, load  # noqa: E402

import topos.nn.functional as F  # noqa: E402
from topos import Tape, init, nn, optim  # noqa: E402

from _training import ExampleError, Reader, fit, in_chunks, parser, plot, positive, run  # noqa: E402

WIDTHS = (16, 32, 64)


class Stage(nn.Module):
    """``convs`` times conv3x3 -> BatchNorm -> relu, then a 2x2 max-pool."""

    def __init__(self, in_channels: int, out_channels: int, convs: int):
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv2d(in_channels if i == 0 else out_channels, out_channels, 3, padding=1,
                                              bias=False) for i in range(convs)])
        self.norms = nn.ModuleList([nn.BatchNorm(out_channels) for _ in range(convs)])
        self.pool = nn.MaxPool2d(2)

    def forward(self, x):
        for conv, norm in zip(self.convs, self.norms):
            x = F.relu(norm(conv(x)))
        return self.pool(x)


class Vgg(nn.Module):
    """Three stages (16, 32, 64 channels), flatten, linear -> 10 (in ``nn.inference()``: running statistics)."""

    def __init__(self, convs: int):
        super().__init__()
        inputs = (CHANNELS,) + WIDTHS[:-1]
        self.stages = nn.ModuleList([Stage(i, o, convs) for i, o in zip(inputs, WIDTHS)])
        side = SIDE // 2 ** len(WIDTHS)
        self.flatten = nn.Flatten()
        self.classifier = nn.Linear(WIDTHS[-1] * side * side, CLASSES)

    def forward(self, images):
        x = images
        for stage in self.stages:
            x = stage(x)
        return self.classifier(self.flatten(x))


def recorder(args, rows: int, training: bool):
    """A recording of the model over ``rows`` images: the loss with SGD's and batch norm's updates, or the logits."""

    def record(tape):
        model = Vgg(args.convs)
        images = tape.input(shape=(rows, CHANNELS, SIDE, SIDE), name="images")
        if not training:
            with nn.inference():
                return model(images)
        labels = tape.input(shape=(rows,), extent=CLASSES, name="labels")
        loss = F.cross_entropy(model(images), labels)
        optimizer = optim.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4)
        return loss, optimizer.record(tape.differentiate(loss, model.parameters())) + model.state_updates()

    return Tape.record(record, seed=args.seed)


def learning_rate(args, step: int) -> float:
    """0.05, then 0.005 from 80% of the steps."""
    return 0.005 if step >= int(0.8 * args.steps) else 0.05


def accuracy(logits_of, images: np.ndarray, labels: np.ndarray, rows: int) -> float:
    """The fraction of ``images`` whose largest logit is the label, read ``rows`` at a time."""
    predicted = in_chunks(lambda chunk: np.argmax(np.asarray(logits_of(chunk)), axis=1), [images], rows)
    return float((predicted == labels).mean())


def main(argv=None) -> None:
    options = parser(__doc__.splitlines()[0], steps=2000)
    options.add_argument("--data", metavar="DIR", help="the folder of CIFAR-10's binary batches (required)")
    options.add_argument("--limit", type=positive, metavar="N", help="train on the first N training images only")
    options.add_argument("--convs", type=int, choices=(1, 2), default=1, help="convolutions per stage (default 1)")
    options.add_argument("--batch", type=positive, default=64, help="training batch (default 64)")
    options.add_argument("--test-batch", type=positive, default=1000,
                         help="rows per read of the test split (default 1000, or the whole split if smaller)")
    args = options.parse_args(argv)
    if args.batch < 2:
        raise ExampleError(f"--batch {args.batch} must be at least 2: batch norm divides by the batch less one")
    if args.limit is not None and args.limit < args.batch:
        raise ExampleError(f"--limit {args.limit} is smaller than a batch of {args.batch}; raise --limit or "
                           "lower --batch")

    cifar: Cifar = load(args.data, args.limit)
    print(cifar.describe())
    images, labels = cifar.train_images, cifar.train_labels
    batches = init.Generator(args.seed)
    picks = [batches.integers((args.batch,), 0, len(labels)) for _ in range(args.steps)]

    def feeds_of(step: int) -> dict:
        rows = picks[step % len(picks)]
        return {"images": cifar.normalized(images[rows]), "labels": labels[rows], "optim.lr": learning_rate(args, step)}

    network, (loss, updates) = recorder(args, args.batch, training=True)
    trainer, losses, ran = fit(network, loss, updates, args, feeds_of, "cifar10 vgg")

    rows = min(args.test_batch, len(cifar.test_labels))
    test, logits = recorder(args, rows, training=False)
    reader, table = Reader(test, [logits], args.route, args.target), test.parameters(trainer.table())
    test_accuracy = accuracy(lambda chunk: reader(table, {"images": cifar.normalized(chunk)})[logits],
                             cifar.test_images, cifar.test_labels, rows)
    if args.plot:
        plot(losses, args.plot, f"VGG-style net on CIFAR-10 ({args.route})")
    print(ran)
    print(f"last-500 mean loss: {np.mean(losses[-500:]):.4f}")
    print(f"test accuracy: {test_accuracy:.4f}")


if __name__ == "__main__":
    run(main)
