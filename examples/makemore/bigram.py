"""makemore, part 1: the bigram model of names, counted and trained, reaching the same loss.

The counting model tallies every (character, next character) pair of the
training names in a 27x27 table ``N`` and predicts ``P = (N + a) / row
sums``: add-``a`` smoothing (``--smoothing``, default 1), so a pair never
seen is not impossible. The neural model is one 27x27 weight ``W``
(the one-hot row of ``i``, picked from an identity table by a selection,
times ``W``: row ``i`` of ``W``), softmax over the row, cross-entropy against the
next character, trained by gradient descent on every training pair at once.

Why the two reach the same loss: smoothing is a regularizer. Add-``a``
counting is what you get by pretending each row saw every next character
``a`` more times; the neural objective adds exactly those pretend pairs,
``a * 27 / M`` times the cross-entropy of every row of ``W`` against the
uniform distribution (``M`` training pairs). Its minimum is then ``W`` =
log of the smoothed counts, and the neural loss on the training pairs
converges to the counting model's: the counting loss is the minimum the
neural one approaches (the lecture's ``0.01 * (W**2).mean()`` is only
like smoothing, so it would converge somewhere nearby instead). With
``--smoothing 0`` the neural minimum is unsmoothed counting, whose
unseen pairs need infinite negative logits: it is approached, slowly, and
the counting model's dev loss is infinite (dev holds pairs training never saw).

Plain gradient descent (``--optimizer sgd``, the lecture's rate 50) moves
rare rows ('q', 'x') barely at all: a row's gradient scales with how often
its character occurs, and the rate is capped by the most frequent row '.'.
Adam (the default) scales each weight's step and agrees with the counts to
a few 1e-5 within 200 steps. Names are drawn from both models with the same
random draws, so they agree once the tables do.

Run: python examples/makemore/bigram.py [--steps 200] [--optimizer adam|sgd] [--smoothing 1] [--plot loss.png]
Prints ``counting loss``, ``neural loss``, ``dev loss`` and sampled names (from both) as its last lines.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/: _training
sys.path.insert(0, str(Path(__file__).resolve().parent))  # names, series

import numpy as np  # noqa: E402

import topos.nn.functional as F  # noqa: E402
from topos import Tape, init, nn, optim  # noqa: E402

from _training import Reader, fit, non_negative_number, plot, run  # noqa: E402
from names import Names, contexts, load  # noqa: E402
from series import parser, sample  # noqa: E402


class Bigram(nn.Module):
    """One weight ``W`` [27, 27]: the next character's logits are ``one_hot(previous) @ W``, row ``previous`` of W."""

    def __init__(self, vocabulary: int):
        super().__init__()
        self.vocabulary = vocabulary
        self.W = nn.Parameter(init.normal()(Tape.current().generator, (vocabulary, vocabulary)))  # torch.randn

    def forward(self, previous):
        # The one-hot rows are picked from an identity table by the selection (F.embedding), as
        # cross_entropy picks its labels' rows. W.gather(previous) is the same row without the
        # matmul, but its gradient is a scatter-add of 182,625 rows into 27, which the reference
        # kernels run one repeat at a time; the matmul's gradient is one more matmul.
        identity = previous.tape.leaf(np.eye(self.vocabulary, dtype=np.float32))
        return F.embedding(identity, previous) @ self.W


def counts(names: Names, previous: np.ndarray, following: np.ndarray) -> np.ndarray:
    """``N[i, j]``: how often character ``j`` follows character ``i`` in the pairs."""
    table = np.zeros((names.vocabulary, names.vocabulary), dtype=np.int64)
    np.add.at(table, (previous, following), 1)
    return table


def mean_loss(probabilities: np.ndarray, previous: np.ndarray, following: np.ndarray) -> float:
    """The mean negative log-likelihood of the pairs under a table of next-character probabilities."""
    with np.errstate(divide="ignore"):
        return float(-np.log(np.asarray(probabilities, np.float64)[previous, following]).mean())


def blocks(pairs: int) -> tuple[int, int]:
    """(blocks, block): ``pairs`` rows laid out as a near-square ``[blocks, block]`` (padded up to fill it)."""
    block = max(1, math.isqrt(pairs - 1) + 1)
    return -(-pairs // block), block


def recorder(names: Names, args, pairs: int):
    """The neural bigram over all ``pairs`` training pairs: (objective, loss, table, updates).

    ``objective`` is what trains (the loss plus the pretend pairs of
    smoothing), ``loss`` the mean cross-entropy of the real pairs, and
    ``table`` every row's softmax: the model's whole [27, 27] table.

    The pairs come padded to ``[blocks, block]`` rows; a padding row's
    label is ``vocabulary`` (``ignore_index``), so it adds nothing. The
    mean is summed block by block, then over the blocks: one float32 sum
    of all 182,625 x 27 terms, as a single reduction, drifts on IREE's CPU
    backend by about 1e-3 of the loss, more than the gap this example
    measures; two short sums stay within about 1e-7.
    """
    vocabulary = names.vocabulary
    count, width = blocks(pairs)

    def record(tape):
        model = Bigram(vocabulary)
        previous = tape.input(shape=(count * width,), extent=vocabulary, name="previous")
        following = tape.input(shape=(count * width,), extent=vocabulary + 1, name="next")  # + 1: padding
        each = F.cross_entropy(model(previous), following, reduction="none", ignore_index=vocabulary)
        loss = each.reshape((count, width)).sum_along(1).sum_along(0) / float(pairs)
        every = model.W  # row i: the logits after character i
        objective = loss
        if args.smoothing:
            uniform = tape.leaf(np.full((vocabulary, vocabulary), 1.0 / vocabulary, np.float32))
            pretend = F.cross_entropy(every, uniform, reduction="sum")  # one pretend pair per row and column
            objective = loss + pretend * (args.smoothing * vocabulary / pairs)
        optimizer = optim.SGD(lr=50.0) if args.optimizer == "sgd" else optim.Adam(lr=0.3)
        return objective, loss, F.softmax(every), optimizer.record(tape.differentiate(objective, model.parameters()))

    return Tape.record(record, seed=args.seed)


def padded(names: Names, previous: np.ndarray, following: np.ndarray) -> dict:
    """The feeds of the pairs, padded to ``[blocks, block]`` rows with pairs ('.', ignored label)."""
    count, width = blocks(len(previous))
    extra = count * width - len(previous)
    return {"previous": np.concatenate([previous, np.zeros(extra, np.int64)]),
            "next": np.concatenate([following, np.full(extra, names.vocabulary, np.int64)])}


def learning_rate(args, step: int) -> float:
    """SGD: the lecture's constant 50. Adam: 0.3, then 0.03 from half-way, 0.003 for the last fifth."""
    if args.optimizer == "sgd":
        return 50.0
    return 0.3 if step < args.steps // 2 else 0.03 if step < int(0.8 * args.steps) else 0.003


def command_line() -> argparse.ArgumentParser:
    """The options: the series' (the harness's, --samples, --data) and this model's."""
    options = parser(__doc__.splitlines()[0], steps=200)
    options.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    options.add_argument("--smoothing", type=non_negative_number, default=1.0,
                         help="pretend counts added to every pair (default 1; 0: none)")
    return options


def main(argv=None) -> None:
    args = command_line().parse_args(argv)

    names = load(args.data, seed=42)
    xs, ys = contexts(names, names.train, 1)
    dev_x, dev_y = contexts(names, names.dev, 1)
    xs, dev_x = xs[:, 0], dev_x[:, 0]

    N = counts(names, xs, ys)
    smoothed = N + args.smoothing
    counting = smoothed / smoothed.sum(axis=1, keepdims=True)

    network, (objective, loss, table, updates) = recorder(names, args, len(xs))
    pairs = padded(names, xs, ys)
    feeds_of = lambda step: {**pairs, "optim.lr": learning_rate(args, step)}  # noqa: E731
    trainer, losses, ran = fit(network, objective, updates, args, feeds_of, "makemore bigram")

    trained = Reader(network, [loss, table], args.route, args.target)(trainer.table(), feeds_of(args.steps))
    neural = np.asarray(trained[table], np.float64)
    neural_loss, counting_loss = float(trained[loss]), mean_loss(counting, xs, ys)
    words = {which: sample(names, lambda window, p=p: p[window[:, -1]], args.samples, 1, args.seed)
             for which, p in (("counting", counting), ("neural", neural))}
    if args.plot:
        plot(losses, args.plot, f"makemore bigram, the training objective ({args.optimizer}, {args.route})")
    smoothing = f"add-{args.smoothing:g} smoothed counts" if args.smoothing else "unsmoothed counts"
    print(ran)
    print(f"counting loss: {counting_loss:.4f} (training pairs, {smoothing}: the neural loss's limit)")
    print(f"neural loss: {neural_loss:.4f} (training pairs, after {args.steps} steps; "
          f"{neural_loss - counting_loss:+.1e} from counting)")
    print(f"dev loss: {mean_loss(neural, dev_x, dev_y):.4f} (neural; counting {mean_loss(counting, dev_x, dev_y):.4f})")
    print("counting samples: " + " ".join(words["counting"]))
    print("samples: " + " ".join(words["neural"]))


if __name__ == "__main__":
    run(main)
