"""The text the tiny configs train on, as bytes: the shipped names or a user's file, split, windowed, scheduled.

Shared by ``examples/gpt2/train.py`` and ``examples/llama/train.py``.
The default text is ``examples/makemore/names.txt`` (32,033 names), the
names shuffled by ``topos.init.Generator(seed).permutation`` and joined
with newlines, so a model learns where a name ends; the first 90% of the
bytes train and the last 10% validate.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from topos import init

from _training import ExampleError

NAMES = Path(__file__).resolve().parents[1] / "makemore" / "names.txt"


def read_text(path: str | None, seed: int) -> str:
    """The training text: the shipped names shuffled and joined with newlines, or a user's file as it is."""
    source = Path(path) if path is not None else NAMES
    try:
        text = source.read_text(encoding="utf-8-sig")  # a byte-order mark is not text to learn
    except (OSError, UnicodeDecodeError) as error:
        raise ExampleError(f"cannot read the text {source}: {error}; pass --data FILE, a UTF-8 text file") from None
    if path is None:
        words = [w.strip() for w in text.splitlines() if w.strip()]
        order = init.Generator(seed).permutation(len(words))
        text = "\n".join(words[i] for i in order) + "\n"
    return text


def split(data: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """90% of the bytes to train, the rest to validate; each part must hold a window and its next byte."""
    cut = int(0.9 * len(data))
    train_part, validation = data[:cut], data[cut:]
    if len(validation) < window + 1:
        raise ExampleError(f"the text has {len(data)} bytes; it needs at least {10 * (window + 1) + 1} so that "
                           f"its last 10% holds one window of {window} bytes and the byte after it")
    return train_part, validation


def windows(data: np.ndarray, starts: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokens [rows, length] from each start, and the next token of every position [rows * length]."""
    index = starts[:, None] + np.arange(length + 1)[None, :]
    chunk = data[index]
    return chunk[:, :-1], chunk[:, 1:].reshape(-1)


def learning_rate(args, step: int) -> float:
    """Linear warm-up over the first 5% of the steps, then a cosine decay to a tenth of --lr."""
    warm = max(1, args.steps // 20)
    if step < warm:
        return args.lr * (step + 1) / warm
    progress = (step - warm) / max(1, args.steps - warm)
    return args.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def encoded(path: str | None, seed: int) -> np.ndarray:
    """The training text's UTF-8 bytes as int64 tokens."""
    return np.frombuffer(read_text(path, seed).encode("utf-8"), dtype=np.uint8).astype(np.int64)
