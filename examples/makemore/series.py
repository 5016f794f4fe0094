"""What the makemore examples share beyond the data and the harness: drawing names, and the last lines.

Every example of the series ends the same way: the harness's ``report``
line, its training figure, ``dev loss: X.XXXX`` and ``samples: ...``
(``finish``). Names are drawn by ``sample`` from whatever gives the next
character's probabilities for a window of the previous ones, so two
models fed the same draws (the counting bigram and the neural one) draw
the same names when they hold the same probabilities.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from names import Names

from topos import init


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

