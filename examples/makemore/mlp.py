"""makemore, part 2: a character-level MLP language model over names (Bengio et al. 2003), trained compiled.

The model of Karpathy's lecture: the previous ``--context`` characters are
embedded (``nn.Embedding``), concatenated, passed through one tanh hidden
layer and a linear layer to 27 logits; cross-entropy over the next
character's index. Three recordings of the one model, one per shape (a
training batch, the whole dev split, a batch of samples), share their
weights by name. Training runs through IREE by default (``--route``), after
its first steps are checked against the oracle.

Run: python examples/makemore/mlp.py [--steps 5000] [--optimizer sgd|adam] [--plot loss.png]
Prints ``last-500 mean loss``, ``dev loss`` and sampled names as its last lines.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/: _training
sys.path.insert(0, str(Path(__file__).resolve().parent))  # names, series

import topos.nn.functional as F  # noqa: E402
from topos import Tape, init, nn, optim, selection  # noqa: E402

from _training import Reader, fit, plot, positive, run  # noqa: E402
from names import Names  # noqa: E402
from series import finish, parser, windows  # noqa: E402
from series import sample as draw  # noqa: E402


class Mlp(nn.Module):
    """Embedding table ``C``, a tanh hidden layer, an output layer; every weight Xavier-initialised."""

    def __init__(self, vocabulary: int, context: int, embedding: int, hidden: int):
        super().__init__()
        xavier = init.xavier_uniform()
        self.C = nn.Embedding(vocabulary, embedding, init=xavier)
        self.hidden = nn.Linear(context * embedding, hidden, init=xavier, bias_init=init.zeros())
        self.out = nn.Linear(hidden, vocabulary, init=xavier, bias_init=init.zeros())

    def forward(self, tokens):
        embedded = self.C(tokens)  # [batch, context, embedding]
        flat = embedded.reshape((tokens.shape[0], -1))
        return self.out(self.hidden(flat).tanh())


def recorder(names: Names, args, rows: int, train_with=None):
    """A recording of the model over ``rows`` contexts: the loss (and the optimizer), or the probabilities."""

    def record(tape):
        model = Mlp(names.vocabulary, args.context, args.embedding, args.hidden)
        tokens = tape.input(shape=(rows, args.context), extent=names.vocabulary, name="context")
        logits = model(tokens)
        if train_with is None:
            return F.softmax(logits)
        target = tape.input(shape=(rows,), extent=names.vocabulary, name="next")
        loss = F.cross_entropy(logits, target)
        if train_with == "eval":
            return loss
        optimizer = optim.SGD(lr=0.1) if train_with == "sgd" else optim.Adam(lr=0.01)
        return loss, optimizer.record(tape.differentiate(loss, model.parameters()))

    return Tape.record(record, seed=args.seed)


def learning_rate(args, step: int) -> float:
    """The lecture's schedule: 0.1, then 0.01 from step 4000 of 5000 (scaled to --steps); Adam 0.01 then 0.001."""
    late = step >= int(0.8 * args.steps)
    if args.optimizer == "sgd":
        return 0.01 if late else 0.1
    return 0.001 if late else 0.01


def sample(names: Names, network, probabilities, reader, table, count: int, context: int, seed: int) -> list[str]:
    """``count`` names drawn one character at a time, all rows of the sampling batch at once."""
    return draw(names, lambda window: reader(table, {"context": window})[probabilities], count, context, seed)


def command_line() -> argparse.ArgumentParser:
    """The options: the series' (the harness's, --samples, --data) and this model's."""
    options = parser(__doc__.splitlines()[0], steps=5000)
    options.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    options.add_argument("--context", type=positive, default=3)
    options.add_argument("--embedding", type=positive, default=10)
    options.add_argument("--hidden", type=positive, default=100)
    options.add_argument("--batch", type=positive, default=64)
    return options


def main(argv=None) -> None:
    args = command_line().parse_args(argv)

    names, (xs, ys), (dev_x, dev_y), picks = windows(args, args.context)
    # Checked once here: a batch of a selection, xs[rows], is a selection too, and a step
    # feeds it without scanning its indices again (docs/performance.md, host overhead).
    xs, ys = selection(xs, names.vocabulary), selection(ys, names.vocabulary)

    def feeds_of(step: int) -> dict:
        rows = picks[step % len(picks)]
        return {"context": xs[rows], "next": ys[rows], "optim.lr": learning_rate(args, step)}

    network, (loss, updates) = recorder(names, args, args.batch, args.optimizer)
    trainer, losses, ran = fit(network, loss, updates, args, feeds_of, "makemore mlp")
    trained = trainer.table()

    dev, dev_loss = recorder(names, args, len(dev_x), "eval")
    dev_run = Reader(dev, [dev_loss], args.route, args.target)(dev.parameters(trained),
                                                               {"context": dev_x, "next": dev_y})
    dev_value = float(dev_run[dev_loss])
    sampler, probabilities = recorder(names, args, args.samples)
    words = sample(names, sampler, probabilities, Reader(sampler, [probabilities], args.route, args.target),
                   sampler.parameters(trained), args.samples, args.context, args.seed)
    if args.plot:
        plot(losses, args.plot, f"makemore MLP ({args.optimizer}, {args.route})")
    finish(ran, losses, dev_value, words)


if __name__ == "__main__":
    run(main)
