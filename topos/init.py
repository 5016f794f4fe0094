"""Seeded random numbers that come out bit-for-bit the same everywhere, and the usual weight initializers.

``Generator(seed)`` draws uniform, normal, truncated-normal and integer
values, dropout masks and permutations; ``xavier_uniform()``,
``kaiming_normal()`` and friends turn a generator into a parameter's
starting values. The same seed gives the same bits on every NumPy version,
CPU and platform, so a training run can be repeated exactly and its
checkpoints resumed (``Generator(seed, generator.position)``).

Why not ``numpy.random``: NumPy may change a Generator's algorithms and
float conversions between releases, and NumPy's ``log``/``cos``/``sin``
change bits with SIMD dispatch. So this module uses only integer arithmetic
on uint32/uint64 arrays, IEEE-exact float operations (+ - * / sqrt,
comparisons, floor, ``np.where``) and :mod:`topos.base.refmath` for log, cos, sin
and erf.

Algorithm: Philox4x32-10 (Random123; the counter-based generator JAX, cuRAND
and PyTorch use). The key is the 64-bit seed as two 32-bit words (low word
first); block ``b`` encrypts the counter ``(b mod 2**32, b // 2**32, 0, 0)``
into four 32-bit words. ``position`` counts words drawn so far. Every draw
starts on a fresh block boundary and advances ``position`` past the blocks
it used, so a draw of n values is a fixed function of (seed, position, n),
and element k of a draw never depends on n.

Float conversion: a uniform in [0, 1) takes two words a, b and is
``((a >> 5) * 2**26 + (b >> 6)) * 2**-53``, exact in float64. Every result
is computed in float64 and rounded once to float32 or bfloat16 by
:func:`topos.base.refmath.round_once`. (So uniform values lie in [low, high) in
float64 but may round up to ``high`` in a narrower type.)

Normal: Box-Muller on one block per pair: u1 = 1 - (uniform from words 0, 1)
in (0, 1], u2 = uniform from words 2, 3; r = sqrt(-2 log u1), t = 2 pi u2;
element 2i is r cos t and element 2i+1 is r sin t. Truncated normal rejects
draws outside [low, high] in rounds and keeps the survivors in draw order.

The bits are pinned by SHA-256 digests in ``tests/test_init.py``, also
checked with NumPy's AVX code paths switched off.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeGuard

import ml_dtypes
import numpy as np
from numpy.typing import DTypeLike

from topos.base import refmath
from topos.base.element import ELEMENTS, float32
from topos.base.errors import ArgumentError, ShapeError

Shape = int | tuple[int, ...]

_MASK = 0xFFFFFFFF
_LOW = np.uint64(_MASK)
_HALF = np.uint64(32)
_MULTIPLIERS = (np.uint64(0xD2511F53), np.uint64(0xCD9E8D57))
_WEYL = (0x9E3779B9, 0xBB67AE85)  # key increments between rounds
_TWO_PI = 2.0 * math.pi
_MAX_ROUND = 1 << 22  # values drawn per truncated-normal round, to bound memory
_MIN_MASS = 1e-4  # truncated normal: least probability [low, high] may hold


def _philox4x32_10(counters: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    """Random123's philox4x32_10: encrypt each row of an (n, 4) uint32 counter array under a 2-word key."""
    c0, c1, c2, c3 = (counters[:, i].astype(np.uint64) for i in range(4))
    k0, k1 = key
    for round_index in range(10):
        if round_index:
            k0, k1 = (k0 + _WEYL[0]) & _MASK, (k1 + _WEYL[1]) & _MASK
        p0 = _MULTIPLIERS[0] * c0  # 32x32 -> 64 bits, exact in uint64
        p1 = _MULTIPLIERS[1] * c2
        c0, c1, c2, c3 = (
            (p1 >> _HALF) ^ c1 ^ np.uint64(k0),
            p1 & _LOW,
            (p0 >> _HALF) ^ c3 ^ np.uint64(k1),
            p0 & _LOW,
        )
    return np.stack([c0, c1, c2, c3], axis=1).astype(np.uint32)


def _finite(value: object, name: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ArgumentError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ArgumentError(f"{name} must be finite, got {value!r}")
    return float(value)


def _interval(low: object, high: object) -> tuple[float, float]:
    low, high = _finite(low, "low"), _finite(high, "high")
    if not low < high:
        raise ArgumentError(f"low must be below high, got low={low!r}, high={high!r}")
    if not math.isfinite(high - low):  # a uniform is low + (high - low) * u, computed in float64
        raise ArgumentError(f"high - low must be finite in float64, got low={low!r}, high={high!r}; narrow the range")
    return low, high


def _rounded(x64: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``round_once``, refusing draws the element type cannot hold: they would become inf without a word."""
    rounded = refmath.round_once(x64, dtype)
    if not np.isfinite(rounded).all():
        largest = float(ml_dtypes.finfo(dtype).max)
        raise ArgumentError(
            f"values as large as {float(np.abs(x64).max()):.6g} do not fit {dtype.name}, whose largest is "
            f"{largest:.6g}; choose bounds, a mean or a std within it"
        )
    return rounded


def _std(std: object, positive: bool = False) -> float:
    std = _finite(std, "std")
    if std < 0 or (positive and std == 0):
        raise ArgumentError(f"std must be {'positive' if positive else 'non-negative'}, got {std!r}")
    return std


def _is_int(value: object) -> TypeGuard[int | np.integer]:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _integer(value: object, name: str) -> int:
    if not _is_int(value):
        raise ArgumentError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return int(value)


def _count(value: object, name: str) -> int:
    count = _integer(value, name)
    if count < 1:
        raise ArgumentError(f"{name} must be an int of at least 1, got {value!r}")
    return count


def _shape(shape: object) -> tuple[int, ...]:
    extents = []
    for extent in shape if isinstance(shape, (tuple, list)) else (shape,):
        if not (_is_int(extent) and extent >= 1):
            raise ShapeError(f"shape must be an int or a tuple of ints, each at least 1, got {shape!r}")
        extents.append(int(extent))
    return tuple(extents)


def _element(dtype: DTypeLike) -> np.dtype:
    try:
        element = np.dtype(dtype)
    except TypeError:
        element = np.dtype(np.void)  # not an element; np.dtype(None) would be float64
    if dtype is None or element not in ELEMENTS:
        raise ShapeError(f"unsupported element type {dtype!r}; use float32, float64 or ml_dtypes.bfloat16")
    return element


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def _unit(words: np.ndarray) -> np.ndarray:
    """Uniforms in [0, 1) from consecutive word pairs: 27 + 26 bits, exact in float64."""
    pairs = words.reshape(-1, 2).astype(np.uint64)
    mantissa = (pairs[:, 0] >> np.uint64(5)) * np.uint64(67108864) + (pairs[:, 1] >> np.uint64(6))
    return mantissa.astype(np.float64) * 2.0**-53


def _drawing(method):
    """A draw too large for this machine's memory leaves the stream where it was and says which draw it was.

    Every draw allocates its words and floats before it returns, so a
    shape with 10**12 elements fails inside NumPy; the stream's position
    is restored so that a smaller retry draws the same bits it would have.
    """

    @functools.wraps(method)
    def draw(self, *args, **kwargs):
        position = self._position
        try:
            return method(self, *args, **kwargs)
        except ArgumentError:  # a refused draw takes nothing from the stream
            self._position = position
            raise
        except MemoryError as error:
            self._position = position
            what = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
            raise _too_big(f"Generator.{method.__name__}({what})", error) from None

    return draw


def _too_big(call: str, error: MemoryError) -> ArgumentError:
    return ArgumentError(
        f"{call} does not fit in this machine's memory ({error}); ask for fewer values: "
        "the generator's stream is left where it was"
    )


class Generator:
    """A seeded stream of random numbers (Philox4x32-10) whose bits are the same on every machine.

    Each draw advances ``position``; ``Generator(seed, position)`` resumes a
    stream exactly where a checkpoint left it.
    """

    __slots__ = ("_position", "_seed")

    def __init__(self, seed: int, position: int = 0) -> None:
        seed = _integer(seed, "seed")
        if not 0 <= seed < 2**64:
            raise ArgumentError(f"seed must be in [0, 2**64), got {seed}; pass a non-negative 64-bit int")
        position = _integer(position, "position")
        if not 0 <= position <= 2**66:
            raise ArgumentError(f"position must be in [0, 2**66], got {position}; pass a generator's .position")
        self._seed = seed
        self._position = position

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def position(self) -> int:
        """32-bit words drawn so far (always a whole number of 4-word blocks after a draw)."""
        return self._position

    def __repr__(self) -> str:
        return f"Generator(seed={self._seed}, position={self._position})"

    def _words(self, count: int) -> np.ndarray:
        """The next ``count`` words, starting on a fresh block; advances position past the blocks used."""
        first, blocks = -(-self._position // 4), -(-count // 4)
        if first + blocks > 2**64:
            raise ArgumentError(f"{self!r} has run out of counters; split() it or pick another seed")
        key = (self._seed & _MASK, self._seed >> 32)
        words = np.empty((blocks, 4), dtype=np.uint32)
        for part in refmath.chunks(blocks):  # blocks are independent: chunks keep the bits
            rows = range(blocks)[part]
            index = np.arange(rows.start, rows.stop, dtype=np.uint64) + np.uint64(first)
            counters = np.zeros((index.size, 4), dtype=np.uint32)
            counters[:, 0] = index & _LOW
            counters[:, 1] = index >> _HALF
            words[part] = _philox4x32_10(counters, key)
        self._position = 4 * (first + blocks)
        return words.reshape(-1)[:count]

    def _normal64(self, count: int) -> np.ndarray:
        """``count`` standard normals in float64 by Box-Muller, one block per (cos, sin) pair."""
        pairs = -(-count // 2)
        words = self._words(4 * pairs).reshape(pairs, 4)
        normals = np.empty((pairs, 2))
        for part in refmath.chunks(pairs):  # pairs are independent: chunks keep the bits
            uniforms = _unit(words[part]).reshape(-1, 2)
            radius = np.sqrt(-2.0 * refmath.log(1.0 - uniforms[:, 0]))
            sine, cosine = refmath.sin_cos64(_TWO_PI * uniforms[:, 1])
            normals[part, 0] = radius * cosine
            normals[part, 1] = radius * sine
        return normals.reshape(-1)[:count]

    @_drawing
    def bits(self, count: int) -> np.ndarray:
        """The next ``count`` raw 32-bit words, as uint32."""
        return _frozen(self._words(_count(count, "count")))

    @_drawing
    def uniform(self, shape: Shape, low: float = 0.0, high: float = 1.0, dtype: DTypeLike = float32) -> np.ndarray:
        """Values uniform in [low, high): ``low + (high - low) * u`` in float64, rounded once."""
        shape, dtype, (low, high) = _shape(shape), _element(dtype), _interval(low, high)
        u = _unit(self._words(2 * math.prod(shape)))
        return _frozen(_rounded(low + (high - low) * u, dtype).reshape(shape))

    @_drawing
    def normal(self, shape: Shape, mean: float = 0.0, std: float = 1.0, dtype: DTypeLike = float32) -> np.ndarray:
        """Normal values ``mean + std * z``, z by Box-Muller (see the module docstring for the order)."""
        shape, dtype, mean, std = _shape(shape), _element(dtype), _finite(mean, "mean"), _std(std)
        z = self._normal64(math.prod(shape))
        return _frozen(_rounded(mean + std * z, dtype).reshape(shape))

    @_drawing
    def truncated_normal(
        self, shape: Shape, mean: float = 0.0, std: float = 1.0, low: float = -2.0, high: float = 2.0,
        dtype: DTypeLike = float32,
    ) -> np.ndarray:
        """Normal(mean, std) values conditioned on [low, high]; the bounds are absolute, as in torch's trunc_normal_.

        Rejection in rounds: each round draws enough normals to finish with
        high probability (a count computed from the interval's mass by
        refmath.erf), keeps those inside in draw order, and repeats if short.
        """
        shape, dtype, mean, std = _shape(shape), _element(dtype), _finite(mean, "mean"), _std(std, positive=True)
        low, high = _interval(low, high)
        edges = refmath.erf(np.array([low - mean, high - mean]) / std * math.sqrt(0.5))
        mass = float(edges[1] - edges[0]) / 2.0
        if mass < _MIN_MASS:
            raise ArgumentError(
                f"[low, high] = [{low}, {high}] holds only {mass:.3g} of normal(mean={mean}, std={std}); "
                f"rejection needs at least {_MIN_MASS}: move the bounds toward the mean or widen them"
            )
        need, kept = math.prod(shape), []
        while need:
            values = mean + std * self._normal64(min(math.ceil(need / mass * 1.1) + 16, _MAX_ROUND))
            inside = values[(values >= low) & (values <= high)][:need]
            kept.append(inside)
            need -= inside.size
        return _frozen(_rounded(np.concatenate(kept), dtype).reshape(shape))

    @_drawing
    def dropout_mask(self, shape: Shape, p: float, dtype: DTypeLike = float32) -> np.ndarray:
        """An inverted-dropout mask: 0 where the uniform u < p, else 1 / (1 - p) (rounded once)."""
        shape, dtype, p = _shape(shape), _element(dtype), _finite(p, "p")
        if not 0.0 <= p < 1.0:
            raise ArgumentError(f"dropout probability p must be in [0, 1), got {p!r}")
        u = _unit(self._words(2 * math.prod(shape)))
        return _frozen(refmath.round_once(np.where(u < p, 0.0, 1.0 / (1.0 - p)), dtype).reshape(shape))

    @_drawing
    def integers(self, shape: Shape, low: int, high: int) -> np.ndarray:
        """int64 values in [low, high): ``low + floor(u * (high - low))`` with a 53-bit u.

        No modulo bias; the floor leaves each value's probability within a
        relative (high - low) * 2**-53 of uniform (exactly uniform for powers of two).
        """
        shape, low, high = _shape(shape), _integer(low, "low"), _integer(high, "high")
        if not (-(2**63) <= low < high <= 2**63 and high - low <= 2**53):
            raise ArgumentError(
                f"integers needs low < high within int64 and high - low <= 2**53, got low={low}, high={high}"
            )
        u = _unit(self._words(2 * math.prod(shape)))
        offsets = np.floor(u * float(high - low)).astype(np.int64)  # at most high - low - 1: see tests
        return _frozen((offsets + np.int64(low)).reshape(shape))

    @_drawing
    def permutation(self, n: int) -> np.ndarray:
        """A uniformly random ordering of range(n), as int64: a stable argsort of n random 64-bit keys."""
        n = _count(n, "n")
        pairs = self._words(2 * n).reshape(n, 2).astype(np.uint64)
        keys = (pairs[:, 0] << _HALF) | pairs[:, 1]
        return _frozen(np.argsort(keys, kind="stable").astype(np.int64))

    @_drawing
    def split(self, count: int) -> tuple[Generator, ...]:
        """``count`` new generators for independent streams (e.g. one per module); advances this one.

        Child i's seed is words 0 and 1 of this generator's next block i, so
        its key is this stream's output; the children start at position 0.
        """
        count = _count(count, "count")
        words = self._words(4 * count).reshape(count, 4).astype(np.uint64)
        return tuple(Generator(int(row[0]) | (int(row[1]) << 32)) for row in words)

    def fork(self) -> Generator:
        """One new generator for an independent stream: ``split(1)[0]``."""
        return self.split(1)[0]


def dropout_mask(generator: Generator, shape: Shape, p: float, dtype: DTypeLike = float32) -> np.ndarray:
    """An inverted-dropout mask from ``generator``: each element 0 with probability p, else 1 / (1 - p)."""
    return checked_generator("dropout_mask", generator).dropout_mask(shape, p, dtype)


def checked_generator(owner: str, generator: object) -> Generator:
    """``generator`` if it is a topos.init.Generator; else an ArgumentError naming ``owner`` and what came."""
    if not isinstance(generator, Generator):
        raise ArgumentError(
            f"{owner}: pass a topos.init.Generator (e.g. topos.init.Generator(seed)), got "
            f"{type(generator).__name__} {generator!r}"
        )
    return generator


# --------------------------------------------------------------------------
# Initializers
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Initializer:
    """A rule for a parameter's starting values: ``initializer(generator, shape, dtype)`` -> a new read-only array."""

    name: str
    arguments: tuple[tuple[str, object], ...]
    _draw: Callable[[Generator, tuple[int, ...], np.dtype], np.ndarray] = field(repr=False, compare=False)

    def __call__(self, generator: Generator, shape: Shape, dtype: DTypeLike = float32) -> np.ndarray:
        if not isinstance(generator, Generator):
            swapped = isinstance(shape, Generator)
            raise ArgumentError(
                f"{self!r} takes a topos.init.Generator first, got {type(generator).__name__} {generator!r}"
                + ("; the arguments are swapped: the generator comes first, then the shape: "
                   if swapped else "; call it as ")
                + "initializer(generator, shape, dtype)"
            )
        try:
            return self._draw(generator, _shape(shape), _element(dtype))
        except MemoryError as error:
            raise _too_big(f"{self!r} for shape {shape!r}", error) from None

    def __repr__(self) -> str:
        return f"{self.name}({', '.join(f'{key}={value!r}' for key, value in self.arguments)})"


def _filled(name: str, arguments: tuple, value: float) -> Initializer:
    def fill(generator, shape, dtype):
        return _frozen(_rounded(np.full(shape, value), dtype))

    return Initializer(name, arguments, fill)


def zeros() -> Initializer:
    """All zeros (draws nothing from the generator)."""
    return _filled("zeros", (), 0.0)


def ones() -> Initializer:
    """All ones (draws nothing from the generator)."""
    return _filled("ones", (), 1.0)


def constant(value: float) -> Initializer:
    """Every element ``value``, rounded once (draws nothing from the generator)."""
    value = _finite(value, "value")
    return _filled("constant", (("value", value),), value)


def uniform(low: float = 0.0, high: float = 1.0) -> Initializer:
    """U(low, high), as torch.nn.init.uniform_."""
    low, high = _interval(low, high)
    return Initializer("uniform", (("low", low), ("high", high)),
                       lambda g, shape, dtype: g.uniform(shape, low, high, dtype))


def normal(mean: float = 0.0, std: float = 1.0) -> Initializer:
    """N(mean, std**2), as torch.nn.init.normal_."""
    mean, std = _finite(mean, "mean"), _std(std)
    return Initializer("normal", (("mean", mean), ("std", std)),
                       lambda g, shape, dtype: g.normal(shape, mean, std, dtype))


def truncated_normal(mean: float = 0.0, std: float = 1.0, low: float = -2.0, high: float = 2.0) -> Initializer:
    """Normal(mean, std) conditioned on the absolute bounds [low, high] (torch.nn.init.trunc_normal_)."""
    mean, std, (low, high) = _finite(mean, "mean"), _std(std, positive=True), _interval(low, high)
    arguments = (("mean", mean), ("std", std), ("low", low), ("high", high))
    return Initializer(
        "truncated_normal", arguments, lambda g, shape, dtype: g.truncated_normal(shape, mean, std, low, high, dtype)
    )


def fans(shape: tuple[int, ...]) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight shaped [out, in, *kernel], as torch.nn.init computes them."""
    if len(shape) < 2:
        raise ShapeError(f"fan-based initializers need a shape [out, in, *kernel] of rank >= 2, got {shape}")
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


_LINEAR = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
_GAINS = {**dict.fromkeys(_LINEAR, 1.0), "sigmoid": 1.0, "tanh": 5.0 / 3, "relu": math.sqrt(2.0), "selu": 3.0 / 4}
_NONLINEARITIES = (*_GAINS, "leaky_relu")


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The scale torch.nn.init recommends for weights feeding ``nonlinearity`` (param: leaky_relu's slope)."""
    if not isinstance(nonlinearity, str):
        raise ArgumentError(f"nonlinearity must be a name such as 'relu', got {type(nonlinearity).__name__} "
                            f"{nonlinearity!r}")
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else _finite(param, "param (the negative slope)")
        return math.sqrt(2.0 / (1 + slope * slope))
    if nonlinearity not in _GAINS:
        raise ArgumentError(f"unknown nonlinearity {nonlinearity!r}; use one of {', '.join(_NONLINEARITIES)}")
    return _GAINS[nonlinearity]


def _gain(gain: object, positive: bool) -> float:
    """A scale checked where it is given, rather than as the bounds or std it becomes."""
    gain = _finite(gain, "gain")
    if gain < 0 or (positive and gain == 0):
        raise ArgumentError(f"gain must be {'positive' if positive else 'non-negative'}, got {gain!r}")
    return gain


def xavier_uniform(gain: float = 1.0) -> Initializer:
    """Glorot uniform: U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out))."""
    gain = _gain(gain, positive=True)

    def draw(g: Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        bound = gain * math.sqrt(6.0 / sum(fans(shape)))
        return g.uniform(shape, -bound, bound, dtype)

    return Initializer("xavier_uniform", (("gain", gain),), draw)


def xavier_normal(gain: float = 1.0) -> Initializer:
    """Glorot normal: N(0, std**2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    gain = _gain(gain, positive=False)

    def draw(g: Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return g.normal(shape, 0.0, gain * math.sqrt(2.0 / sum(fans(shape))), dtype)

    return Initializer("xavier_normal", (("gain", gain),), draw)


def _kaiming(name: str, a: float, mode: str, nonlinearity: str, sample: str) -> Initializer:
    a = _finite(a, "a")
    if mode not in ("fan_in", "fan_out"):
        raise ArgumentError(f"unknown mode {mode!r}; use 'fan_in' or 'fan_out'")
    gain = calculate_gain(nonlinearity, a)

    def draw(g: Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        fan = fans(shape)[0 if mode == "fan_in" else 1]
        if sample == "uniform":
            bound = gain * math.sqrt(3.0 / fan)
            return g.uniform(shape, -bound, bound, dtype)
        return g.normal(shape, 0.0, gain / math.sqrt(fan), dtype)

    return Initializer(name, (("a", a), ("mode", mode), ("nonlinearity", nonlinearity)), draw)


def kaiming_uniform(a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu") -> Initializer:
    """He uniform: U(-b, b) with b = gain * sqrt(3 / fan), gain = calculate_gain(nonlinearity, a)."""
    return _kaiming("kaiming_uniform", a, mode, nonlinearity, "uniform")


def kaiming_normal(a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu") -> Initializer:
    """He normal: N(0, std**2) with std = gain / sqrt(fan), gain = calculate_gain(nonlinearity, a)."""
    return _kaiming("kaiming_normal", a, mode, nonlinearity, "normal")


glorot_uniform = xavier_uniform
glorot_normal = xavier_normal
he_uniform = kaiming_uniform
he_normal = kaiming_normal
