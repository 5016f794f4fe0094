"""What the makemore examples share beyond the data and the harness: options, windows, drawing names, the last lines.

Every example takes the harness's options plus ``--samples`` and
``--data`` (``parser``), and trains on random batches of windows of
the split (``windows``). Every example of the series ends the same way: the harness's ``report``
line, its training figure, ``dev loss: X.XXXX`` and ``samples: ...``
(``finish``). Names are drawn by ``sample`` from whatever gives the next
character's probabilities for a window of the previous ones, so two
models fed the same draws (the counting bigram and the neural one) draw
the same names when they hold the same probabilities.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import numpy as np

from topos import init

from _training import Reader, in_chunks, positive
from _training import parser as harness_parser
from names import Names, contexts, load


def parser(description: str, steps: int) -> argparse.ArgumentParser:
    """The harness's options (--route, --steps, --seed, --plot, --check, --quiet), --samples and --data."""
    options = harness_parser(description, steps=steps)
    options.add_argument("--samples", type=positive, default=20, help="names drawn at the end (default 20)")
    options.add_argument("--data", help="a names file of your own (one lowercase name per line)")
    return options


def windows(args, context: int) -> tuple[Names, tuple, tuple, list[np.ndarray]]:
    """The names, the (window, next) pairs of train and dev, and the rows of each step's batch.

    The split is always the lectures' (seed 42); ``--seed`` draws the
    batches, ``args.batch`` rows a step.
    """
    names = load(args.data, seed=42)
    train, dev = contexts(names, names.train, context), contexts(names, names.dev, context)
    batches = init.Generator(args.seed)
    picks = [batches.integers((args.batch,), 0, len(train[0])) for _ in range(args.steps)]
    return names, train, dev, picks


def sample(names: Names, next_probabilities: Callable[[np.ndarray], np.ndarray], count: int, context: int,
           seed: int, longest: int = 40) -> list[str]:
    """``count`` names drawn one character at a time, all rows at once.

    ``next_probabilities(window)`` maps a ``[count, context]`` window of the
    previous indices (0 = '.', which pads the start) to ``[count,
    vocabulary]`` probabilities. Every row takes one uniform draw per
    character, finished or not, so the draws do not depend on the model.
    """
    generator = init.Generator(seed)
    window = np.zeros((count, context), dtype=np.int64)
    words: list[list[int]] = [[] for _ in range(count)]
    done = np.zeros(count, dtype=bool)
    for _ in range(longest):
        p = np.asarray(next_probabilities(window), dtype=np.float64)
        u = np.asarray(generator.uniform((count, 1), dtype=np.float64))
        picked = np.minimum((np.cumsum(p, axis=1) < u).sum(axis=1), names.vocabulary - 1)
        for row in np.flatnonzero(~done):
            if picked[row] == 0:
                done[row] = True
            else:
                words[row].append(int(picked[row]))
        if done.all():
            break
        window = np.concatenate([window[:, 1:], picked[:, None]], axis=1)
    return [names.decode(w) for w in words]


def finish(report_line: str, losses: Sequence[float], dev_loss: float, words: Sequence[str]) -> None:
    """The series' last lines: the report, the mean of the last 500 minibatch losses, the dev loss, the samples."""
    print(report_line)
    print(f"last-500 mean loss: {np.mean(losses[-500:]):.4f}")
    print(f"dev loss: {dev_loss:.4f}")
    print("samples: " + " ".join(words))


def read_dev_and_sample(names: Names, network, row_loss, probabilities, trained, args, dev) -> tuple[float, list[str]]:
    """The dev loss and the samples through one row-by-row inference entry of ``args.batch`` rows.

    The entry reads ``context`` and ``next`` and gives each row's loss and
    next-character probabilities; sampling has no targets, so it feeds '.'
    (their loss goes unread).
    """
    inference = Reader(network, [row_loss, probabilities], args.route, args.target)

    def read(root, context, following=None):
        following = np.zeros(len(context), np.int64) if following is None else following
        return inference(trained, {"context": context, "next": following})[root]

    dev_value = float(in_chunks(lambda c, f: read(row_loss, c, f), list(dev), args.batch).mean())
    words = sample(names, lambda window: in_chunks(lambda c: read(probabilities, c), [window], args.batch),
                   args.samples, args.context, args.seed)
    return dev_value, words
