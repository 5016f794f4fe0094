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
        from _training import ExampleError

        if not isinstance(character, str) or len(character) != 1 or character not in self.characters:
            raise ExampleError(f"{character!r} is not a character of the vocabulary {self.characters!r}; "
                               "pass one of its characters")
        return self.characters.index(character)

    def decode(self, indices) -> str:
        """The word of ``indices`` (0, the end marker, dropped); an index outside 0..vocabulary-1 is refused."""
        from _training import ExampleError

        indices = list(indices)
        wrong = [i for i in indices if not _is_index(i) or not 0 <= i < self.vocabulary]
        if wrong:
            raise ExampleError(f"index {wrong[0]!r} is not a character of the vocabulary; indices run "
                               f"0..{self.vocabulary - 1} (0 is the end marker {END!r})")
        return "".join(self.characters[int(i)] for i in indices if i != 0)


def _is_index(value) -> bool:
    """An int or a NumPy integer (not a bool): what an index array yields."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def load(path: str | Path | None = None, seed: int = 42) -> Names:
    """Read the names, check them, and split them as the lectures do."""
    from _training import ExampleError

    path = Path(path) if path is not None else SHIPPED
    try:
        text = path.read_text(encoding="utf-8-sig")  # an editor's byte-order mark is not a name's letter
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
    from _training import ExampleError

    if not _is_index(context) or context < 1:
        raise ExampleError(f"the context length must be a positive number of characters, got {context!r}; "
                           "pass --context N (or block_size) with N >= 1")
    if isinstance(words, str):
        raise ExampleError(f"words must be a sequence of names (e.g. names.train), got the string {words!r}; "
                           "wrap one name in a list")
    context = int(context)
    rows, targets = [], []
    indices = {character: i for i, character in enumerate(names.characters)}
    for word in words:
        if not isinstance(word, str) or any(c not in indices or c == END for c in word):
            raise ExampleError(f"{word!r} is not a name over the vocabulary's letters {names.characters[1:]!r}; "
                               "pass words of the names file (names.train, names.dev or names.test)")
        window = [0] * context
        for character in word + END:
            index = indices[character]
            rows.append(list(window))
            targets.append(index)
            window = window[1:] + [index]
    return np.array(rows, dtype=np.int64), np.array(targets, dtype=np.int64)
