"""makemore, part 3: the MLP with BatchNorm after its hidden layer; one spec with a training and an inference entry.

The model of mlp.py with lecture 3's change: the hidden layer is
``Linear (no bias) -> BatchNorm -> tanh`` (a bias before batch
normalization is subtracted away by it; the norm's shift takes its
place). ``nn.BatchNorm`` has two readings over one set of slots, and this
example records both in one spec:

* training, ``norm(h)``: normalizes by the minibatch's statistics and
  records the next running mean and variance; ``model.state_updates()``
  hands those as Updates, joined to the optimizer's with ``+``, so one
  compiled step moves the weights, the optimizer state and the running
  statistics together;
* inference, ``norm(h)`` inside ``with nn.inference():`` (or
  ``norm(h, training=False)``): normalizes by the running statistics, so
  each row's output depends on that row alone.

The training entry's roots are ``updates.roots(loss)``; the inference
entry's are the per-row loss and the next-character probabilities of the
same input. Because inference is row by row, the inference entry,
recorded at the training batch size, reads the whole dev split a batch at
a time and draws the samples too: no second recording, no weights moved.

Run: python examples/makemore/batchnorm.py [--steps 5000] [--optimizer sgd|adam] [--plot loss.png]
Prints ``last-500 mean loss``, ``dev loss`` (the inference reading) and sampled names as its last lines.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/: _training
sys.path.insert(0, str(Path(__file__).resolve().parent))  # names, series

import topos.nn.functional as F  # noqa: E402
from topos import Tape, init, nn, optim, selection  # noqa: E402

from _training import fit, fraction, plot, positive, run  # noqa: E402
from mlp import learning_rate  # noqa: E402
from names import Names  # noqa: E402
from series import finish, parser, read_dev_and_sample, windows  # noqa: E402


class MlpBatchNorm(nn.Module):
    """mlp.py's model with ``BatchNorm`` between the hidden layer (now without a bias) and its tanh."""

    def __init__(self, vocabulary: int, context: int, embedding: int, hidden: int, momentum: float):
        super().__init__()
        xavier = init.xavier_uniform()
        self.C = nn.Embedding(vocabulary, embedding, init=xavier)
        self.hidden = nn.Linear(context * embedding, hidden, bias=False, init=xavier)
        self.norm = nn.BatchNorm(hidden, momentum=momentum)
        self.out = nn.Linear(hidden, vocabulary, init=xavier, bias_init=init.zeros())

    def forward(self, tokens):
        flat = self.C(tokens).reshape((tokens.shape[0], -1))
        return self.out(self.norm(self.hidden(flat)).tanh())


def recorder(names: Names, args):
    """One spec at the training batch size: (loss, updates, per-row inference loss, inference probabilities)."""

    def record(tape):
        model = MlpBatchNorm(names.vocabulary, args.context, args.embedding, args.hidden, args.momentum)
        tokens = tape.input(shape=(args.batch, args.context), extent=names.vocabulary, name="context")
        target = tape.input(shape=(args.batch,), extent=names.vocabulary, name="next")
        loss = F.cross_entropy(model(tokens), target)  # training reading: batch statistics
        optimizer = optim.SGD(lr=0.1) if args.optimizer == "sgd" else optim.Adam(lr=0.01)
        updates = optimizer.record(tape.differentiate(loss, model.parameters())) + model.state_updates()
        with nn.inference():  # the inference reading of the same model: the running statistics
            logits = model(tokens)
        return loss, updates, F.cross_entropy(logits, target, reduction="none"), F.softmax(logits)

    return Tape.record(record, seed=args.seed)


def command_line() -> argparse.ArgumentParser:
    """The options: the series' (the harness's, --samples, --data) and this model's."""
    options = parser(__doc__.splitlines()[0], steps=5000)
    options.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    options.add_argument("--context", type=positive, default=3)
    options.add_argument("--embedding", type=positive, default=10)
    options.add_argument("--hidden", type=positive, default=100)
    options.add_argument("--batch", type=positive, default=64)
    options.add_argument("--momentum", type=fraction, default=0.1, help="of the running statistics (default 0.1)")
    return options


def main(argv=None) -> None:
    args = command_line().parse_args(argv)

    names, (xs, ys), (dev_x, dev_y), picks = windows(args, args.context)
    xs, ys = selection(xs, names.vocabulary), selection(ys, names.vocabulary)  # checked once: batches skip the scan

    def feeds_of(step: int) -> dict:
        rows = picks[step % len(picks)]
        return {"context": xs[rows], "next": ys[rows], "optim.lr": learning_rate(args, step)}

    network, (loss, updates, row_loss, probabilities) = recorder(names, args)
    trainer, losses, ran = fit(network, loss, updates, args, feeds_of, "makemore batchnorm")
    trained = trainer.table()  # weights, optimizer state and the running statistics

    dev_value, words = read_dev_and_sample(names, network, row_loss, probabilities, trained, args, (dev_x, dev_y))
    if args.plot:
        plot(losses, args.plot, f"makemore MLP + BatchNorm ({args.optimizer}, {args.route})")
    finish(ran, losses, dev_value, words)


if __name__ == "__main__":
    run(main)
