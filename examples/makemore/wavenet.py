"""makemore, part 5: lecture 5's hierarchical model (a WaveNet-like tree) over 8 characters, trained compiled.

The 8 previous characters are embedded (24 numbers each) and fused two at
a time, three times: each level is ``FlattenConsecutive(2) -> Linear (no
bias) -> BatchNorm -> tanh``, taking ``[B, T, C]`` to ``[B, T/2, hidden]``,
until one vector of ``--hidden`` (128) numbers per context is left; a
linear layer gives the 27 logits.

Lecture 5's BatchNorm normalizes a ``[B, T, C]`` activation over both B
and T (each of the C channels gets one mean and variance over all B*T
rows). ``nn.BatchNorm``, like ``torch.nn.BatchNorm1d``, normalizes axis 1
of ``[N, C]``, ``[N, C, L]`` or ``[N, C, H, W]``, so each level reshapes
``[B, T, C]`` to ``[B*T, C]`` rows (a reshape, no copy), normalizes them,
and reshapes back. Transposing to ``[B, C, T]`` would give the same
statistics at the cost of two permutes.

As in batchnorm.py, one spec holds the training entry (batch statistics;
the running statistics move through ``model.state_updates()`` joined to
the optimizer's Updates) and the inference entry (the model recorded again
inside ``with nn.inference():``), which reads the dev split a batch at a
time and draws the samples.

The lecture trains 200,000 steps of batch 32 (train 1.77, dev 1.99). The
default here is 20,000 steps, the rate 0.1 dropping to 0.01 for the last
quarter as in the lecture's schedule: about 1.4 ms a compiled step, so
the whole run (compile, oracle check, training, dev, samples) took under
a minute on a 2-core machine shared with other jobs, reaching a last-500
training loss of 2.03 and a dev loss of 2.05.

Run: python examples/makemore/wavenet.py [--steps 20000] [--plot loss.png]
Prints ``last-500 mean loss``, ``dev loss`` (the inference reading) and sampled names as its last lines.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/: _training
sys.path.insert(0, str(Path(__file__).resolve().parent))  # names, series

import topos.nn.functional as F  # noqa: E402
from topos import Tape, init, nn, optim, selection  # noqa: E402

from _training import fit, fraction, plot, positive, run  # noqa: E402
from names import Names  # noqa: E402
from series import finish, parser, read_dev_and_sample, windows  # noqa: E402


class FlattenConsecutive(nn.Module):
    """``[B, T, C]`` -> ``[B, T/n, n*C]``: every ``n`` consecutive positions side by side (a reshape)."""

    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def forward(self, x):
        batch, length, channels = x.shape
        return x.reshape((batch, length // self.n, channels * self.n))

    def extra_repr(self) -> str:
        return f"{self.n}"


class Level(nn.Module):
    """One level of the tree: FlattenConsecutive(2) -> Linear (no bias) -> BatchNorm over the B*T rows -> tanh."""

    def __init__(self, channels: int, hidden: int, momentum: float):
        super().__init__()
        self.flatten = FlattenConsecutive(2)
        self.linear = nn.Linear(2 * channels, hidden, bias=False)
        self.norm = nn.BatchNorm(hidden, momentum=momentum)

    def forward(self, x):
        h = self.linear(self.flatten(x))  # [B, T/2, hidden]
        batch, length, hidden = h.shape
        rows = self.norm(h.reshape((batch * length, hidden)))  # statistics over B and T
        return rows.reshape((batch, length, hidden)).tanh()


class WaveNet(nn.Module):
    """Embedding ``C``, log2(context) levels, and the output layer (its weight scaled by 0.1, as in the lecture)."""

    def __init__(self, vocabulary: int, context: int, embedding: int, hidden: int, momentum: float):
        super().__init__()
        self.C = nn.Embedding(vocabulary, embedding)
        levels = int(math.log2(context))
        self.levels = nn.ModuleList([Level(embedding if k == 0 else hidden, hidden, momentum) for k in range(levels)])
        self.out = nn.Linear(hidden, vocabulary, init=init.normal(0.0, 0.1 / math.sqrt(hidden)),
                             bias_init=init.zeros())

    def forward(self, tokens):
        x = self.C(tokens)  # [B, context, embedding]
        for level in self.levels:
            x = level(x)
        return self.out(x.reshape((tokens.shape[0], -1)))  # [B, 1, hidden] -> [B, hidden]


def recorder(names: Names, args):
    """One spec at the training batch size: (loss, updates, per-row inference loss, inference probabilities)."""

    def record(tape):
        model = WaveNet(names.vocabulary, args.context, args.embedding, args.hidden, args.momentum)
        tokens = tape.input(shape=(args.batch, args.context), extent=names.vocabulary, name="context")
        target = tape.input(shape=(args.batch,), extent=names.vocabulary, name="next")
        loss = F.cross_entropy(model(tokens), target)
        updates = optim.SGD(lr=0.1).record(tape.differentiate(loss, model.parameters())) + model.state_updates()
        with nn.inference():  # every BatchNorm's inference reading: the running statistics
            logits = model(tokens)
        return loss, updates, F.cross_entropy(logits, target, reduction="none"), F.softmax(logits)

    return Tape.record(record, seed=args.seed)


def learning_rate(args, step: int) -> float:
    """The lecture's schedule: 0.1, then 0.01 for the last quarter (its 150,000 of 200,000, scaled to --steps)."""
    return 0.01 if step >= int(0.75 * args.steps) else 0.1


def _power_of_two(text: str) -> int:
    value = int(text)
    if value < 2 or value & (value - 1):
        raise argparse.ArgumentTypeError(f"must be a power of two (2, 4, 8, 16, ...), got {text}")
    return value


def command_line() -> argparse.ArgumentParser:
    """The options: the series' (the harness's, --samples, --data) and this model's."""
    options = parser(__doc__.splitlines()[0], steps=20000)
    options.add_argument("--context", type=_power_of_two, default=8, help="characters seen (a power of two; default 8)")
    options.add_argument("--embedding", type=positive, default=24)
    options.add_argument("--hidden", type=positive, default=128)
    options.add_argument("--batch", type=positive, default=32)
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
    trainer, losses, ran = fit(network, loss, updates, args, feeds_of, "makemore wavenet")
    trained = trainer.table()

    dev_value, words = read_dev_and_sample(names, network, row_loss, probabilities, trained, args, (dev_x, dev_y))
    if args.plot:
        plot(losses, args.plot, f"makemore WaveNet ({args.route})")
    finish(ran, losses, dev_value, words)


if __name__ == "__main__":
    run(main)
