"""The makemore names data set: 32,033 names, a 27-character vocabulary, the lectures' 80/10/10 split.

``names.txt`` ships beside this file (from Andrej Karpathy's makemore
repository, MIT licence). A user path works too (``--data FILE``: one name
per line, lowercase a-z).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SHIPPED = HERE / "names.txt"
END = "."  # index 0: the start and the end of every name


@dataclass(frozen=True)
class Names:
    """Words split as in the lectures (random.seed(42), shuffle, 80/10/10) and the vocabulary."""

    train: tuple[str, ...]
    dev: tuple[str, ...]
    test: tuple[str, ...]
    characters: str  # index -> character; 0 is END

    @property
    def vocabulary(self) -> int:
        return len(self.characters)

    def index(self, character: str) -> int:
        return self.characters.index(character)

    def decode(self, indices) -> str:
        return "".join(self.characters[i] for i in indices if i != 0)


def load(path: str | Path | None = None, seed: int = 42) -> Names:
    """Read the names, check them, and split them as the lectures do."""
    from _training import ExampleError

    path = Path(path) if path is not None else SHIPPED
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ExampleError(f"cannot read the names file {path}: {error}; pass --data FILE, one name per line") from None
    lines = [(number, line.strip()) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    bad = [(number, w) for number, w in lines if not w.isascii() or not w.isalpha() or not w.islower()]
    if bad:
        number, word = bad[0]
        raise ExampleError(f"{path}, line {number}: {word!r} is not a lowercase name (a-z only); the file must "
                           f"hold one lowercase name per line ({len(bad)} such line{'s' if len(bad) > 1 else ''})")
    words = [w for _, w in lines]
    if not words:
        raise ExampleError(f"{path} holds no names; the file must hold one lowercase name per line")
    if len(words) < 10:
        raise ExampleError(f"{path} holds only {len(words)} names; the 80/10/10 split needs at least 10")
    characters = END + "".join(sorted(set("".join(words))))
    shuffled = list(words)
    random.Random(seed).shuffle(shuffled)  # the lectures' random.seed(42); random.shuffle(words)
    n1, n2 = int(0.8 * len(shuffled)), int(0.9 * len(shuffled))
    return Names(tuple(shuffled[:n1]), tuple(shuffled[n1:n2]), tuple(shuffled[n2:]), characters)


def contexts(names: Names, words, context: int) -> tuple[np.ndarray, np.ndarray]:
    """Every (previous ``context`` characters, next character) pair of ``words``, as index arrays."""
    rows, targets = [], []
    indices = {character: i for i, character in enumerate(names.characters)}
    for word in words:
        window = [0] * context
        for character in word + END:
            index = indices[character]
            rows.append(list(window))
            targets.append(index)
            window = window[1:] + [index]
    return np.array(rows, dtype=np.int64), np.array(targets, dtype=np.int64)
