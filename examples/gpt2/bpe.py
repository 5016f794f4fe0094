"""GPT-2's tokenizer: byte-level BPE read from a user's ``vocab.json`` and ``merges.txt``, or plain bytes.

Byte-level BPE as OpenAI's ``encoder.py`` does it: the text is split into
pieces by a pre-tokenizer pattern, each piece's UTF-8 bytes are spelled
with the 256 printable stand-ins of :func:`bytes_to_unicode`, and adjacent
symbols are merged, lowest merge rank first, until no ranked pair is left;
each final symbol's id comes from ``vocab.json``. Decoding joins the
symbols and maps the stand-ins back to bytes, so any text round-trips.
``<|endoftext|>`` (any ``<|...|>`` in the vocabulary) is one special token.

The pre-tokenizer is GPT-2's pattern
``'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+``.
Python's ``re`` lacks ``\\p{L}`` and ``\\p{N}``; when the third-party
``regex`` module is installed it is used with the pattern as written,
otherwise :data:`PATTERN` spells letters as ``[^\\W\\d_]`` and numbers as
``\\d``. The two agree except on numeric characters that are not decimal
digits (``²``, ``½``, Roman numerals: ``\\p{N}`` in GPT-2, letters here), which
then split differently (still a valid encoding that decodes to the same
text, only not the ids GPT-2 would give).

Without vocabulary files the tokenizer is :class:`Bytes`: 256 symbols, one
per byte, the vocabulary the tiny configs train on.
"""

from __future__ import annotations

import json
import numbers
import re
from functools import lru_cache
from pathlib import Path

import numpy as np

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+"""
_SPECIAL = re.compile(r"^<\|[^|]+\|>$")
_UNRANKED = float("inf")


def _pre_tokenizer():
    try:
        import regex  # not a dependency: used only where someone installed it
    except ImportError:
        return re.compile(PATTERN)
    return regex.compile(GPT2_PATTERN)


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table byte -> printable character: printable Latin-1 bytes stand for themselves, others shift up."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    codes, shifted = list(printable), 0
    table = {b: chr(b) for b in printable}
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            codes.append(256 + shifted)
            shifted += 1
    return dict(sorted(table.items()))


class Bytes:
    """The 256-symbol tokenizer: a token is a byte of the UTF-8 text."""

    vocabulary = 256
    end_of_text = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        ids = list(ids)
        _check_ids(ids, range(256))
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return "Bytes()"


class BytePairEncoding:
    """GPT-2's byte-level BPE over ``vocab`` (symbol -> id) and ``merges`` (pairs, in rank order)."""

    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]], source: str = "the vocabulary",
                 merges_source: str = "the merges"):
        from _training import ExampleError

        self.encoder = _checked_vocab(vocab, source)
        self.decoder = {i: s for s, i in self.encoder.items()}
        self.ranks = {pair: rank for rank, pair in enumerate(merges)}
        self.byte_symbols = bytes_to_unicode()
        self.symbol_bytes = {c: b for b, c in self.byte_symbols.items()}
        missing = [b for b, c in self.byte_symbols.items() if c not in self.encoder]
        if missing:
            symbol = self.byte_symbols[missing[0]]
            raise ExampleError(f"{source} lacks the symbol of byte {missing[0]} ({symbol!r}); a byte-level "
                               "BPE vocabulary holds all 256 byte symbols, as GPT-2's vocab.json does")
        unknown = next(((rank, pair) for rank, pair in enumerate(merges) if "".join(pair) not in self.encoder), None)
        if unknown is not None:  # encode would make a symbol with no id
            rank, (first, second) = unknown
            raise ExampleError(f"{merges_source}: merge {rank} ({first!r} {second!r}) makes {first + second!r}, "
                               f"which {source} lacks; vocab.json and merges.txt must come from the same tokenizer")
        self.specials = {s: i for s, i in self.encoder.items() if _SPECIAL.match(s)}
        self.end_of_text = self.specials.get("<|endoftext|>")
        self._split = re.compile("(" + "|".join(map(re.escape, self.specials)) + ")") if self.specials else None
        self._pieces = _pre_tokenizer()
        self._cache: dict[str, list[str]] = {}

    @property
    def vocabulary(self) -> int:
        return max(self.decoder) + 1

    @classmethod
    def from_files(cls, vocab_path, merges_path) -> BytePairEncoding:
        """Read ``vocab.json`` (symbol -> id) and ``merges.txt`` (``#version`` line, then ``a b`` per line)."""
        from _training import ExampleError

        vocab = json.loads(Path(vocab_path).read_text(encoding="utf-8"))
        merges = []
        for number, line in enumerate(Path(merges_path).read_text(encoding="utf-8").splitlines(), 1):
            if line.startswith("#version") or not line.strip():
                continue
            pair = line.split()
            if len(pair) != 2:
                raise ExampleError(f"{merges_path}, line {number}: {line!r} is not two symbols separated by a "
                                   "space; merges.txt holds one merge 'a b' per line after its #version line")
            merges.append((pair[0], pair[1]))
        return cls(vocab, merges, str(vocab_path), str(merges_path))

    def _bpe(self, piece: str) -> list[str]:
        """The symbols of one pre-token (already in byte stand-ins) after every ranked merge."""
        if piece in self._cache:
            return self._cache[piece]
        symbols = list(piece)
        while len(symbols) > 1:
            pair = min(zip(symbols, symbols[1:]), key=lambda p: self.ranks.get(p, _UNRANKED))
            if pair not in self.ranks:
                break
            merged, k = [], 0
            while k < len(symbols):  # merge every occurrence of the pair, left to right
                if k + 1 < len(symbols) and (symbols[k], symbols[k + 1]) == pair:
                    merged.append(symbols[k] + symbols[k + 1])
                    k += 2
                else:
                    merged.append(symbols[k])
                    k += 1
            symbols = merged
        self._cache[piece] = symbols
        return symbols

    def encode(self, text: str) -> list[int]:
        ids = []
        for part in (self._split.split(text) if self._split else [text]):
            if part in self.specials:
                ids.append(self.specials[part])
                continue
            for piece in self._pieces.findall(part):
                spelled = "".join(self.byte_symbols[b] for b in piece.encode("utf-8"))
                for symbol in self._bpe(spelled):
                    if symbol not in self.encoder:  # __init__ checks every merge, so only a bug gets here
                        from _training import ExampleError

                        raise ExampleError(f"the merges make {symbol!r}, which vocab.json lacks; the two files "
                                           "must come from the same tokenizer")
                    ids.append(self.encoder[symbol])
        return ids

    def decode(self, ids) -> str:
        ids = list(ids)
        _check_ids(ids, self.decoder)
        data = bytearray()
        for i in ids:
            symbol = self.decoder[int(i)]
            if symbol in self.specials:
                data.extend(symbol.encode("utf-8"))
            else:
                data.extend(self.symbol_bytes[c] for c in symbol)
        return data.decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return f"BytePairEncoding({len(self.encoder)} symbols, {len(self.ranks)} merges)"


def _checked_vocab(vocab, source: str) -> dict[str, int]:
    """``vocab`` as a dict, after checking it is symbol -> id with unique non-negative int ids; else ExampleError."""
    from _training import ExampleError

    fix = "vocab.json must be one JSON object of symbol -> id (a non-negative int, each id once), as GPT-2's is"
    if not isinstance(vocab, dict):
        raise ExampleError(f"{source} holds a JSON {type(vocab).__name__}, not an object of symbol -> id; {fix}")
    owners: dict[int, str] = {}
    for symbol, index in vocab.items():
        if not isinstance(symbol, str) or not symbol:
            raise ExampleError(f"{source}: the symbol {symbol!r} is not a non-empty string; {fix}")
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ExampleError(f"{source}: {symbol!r} has the id {index!r}, not a non-negative int; {fix}")
        if index in owners:
            raise ExampleError(f"{source}: {symbol!r} and {owners[index]!r} share the id {index}; {fix}")
        owners[index] = symbol
    return dict(vocab)


def _check_ids(ids: list, valid) -> None:
    """ExampleError naming the first of ``ids`` that is not an int in ``valid`` (a range or an id -> symbol dict)."""
    from _training import ExampleError

    for i in ids:
        integral = isinstance(i, numbers.Integral) and not isinstance(i, (bool, np.bool_))
        if not integral or int(i) not in valid:
            last = len(valid) - 1 if isinstance(valid, range) else max(valid)
            raise ExampleError(f"token id {int(i) if integral else repr(i)} is not in the vocabulary; pass ids "
                               f"of 0..{last} (ints), the ids the tokenizer's encode gives")


def load(folder=None, vocab=None, merges=None):
    """The tokenizer of ``folder`` (its vocab.json and merges.txt), of the two files, or Bytes() for none."""
    from _training import ExampleError

    if folder is None and vocab is None and merges is None:
        return Bytes()
    if folder is not None:
        vocab, merges = Path(folder) / "vocab.json", Path(folder) / "merges.txt"
    if vocab is None or merges is None:
        raise ExampleError("a BPE tokenizer needs both vocab.json and merges.txt; pass --tokenizer FOLDER")
    try:
        return BytePairEncoding.from_files(vocab, merges)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError) as error:
        raise ExampleError(f"cannot read the tokenizer from {vocab} and {merges}: {error}; pass the folder "
                           "holding GPT-2's vocab.json and merges.txt") from None
    except RecursionError:  # json.loads of a vocab.json nested thousands deep
        raise ExampleError(f"cannot read the tokenizer from {vocab}: its JSON is nested too deeply to be a "
                           "vocabulary; pass the folder holding GPT-2's vocab.json and merges.txt") from None
