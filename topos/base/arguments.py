"""The checks every layer, function form, optimizer and recording call runs on its arguments, in one place.

Each raises ``ArgumentError`` naming the owner (``Linear``, ``conv2d``,
``Adam``, ``tape.parameter``), the argument, the value given and what it
must be, so a bad size, rate or switch is refused where it is typed
rather than deep inside a draw or a division. It sits in the core, which
imports nothing above it, so the facades and the core share one set.
"""

from __future__ import annotations

import math
import types
from collections.abc import Sequence

import numpy as np

from topos.base.element import ELEMENTS, convert_checked
from topos.base.errors import ArgumentError


def _is_int(value: object) -> bool:
    """An int or a NumPy integer; a bool is not a size."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def size(owner: str, name: str, value: object, least: int = 1) -> int:
    """``value`` as an int of at least ``least`` (a size, a stride, a padding), or an ArgumentError."""
    if not _is_int(value) or int(value) < least:  # type: ignore[call-overload]
        raise ArgumentError(f"{owner}: {name} must be an int >= {least}, got {_shown(value)}")
    return int(value)  # type: ignore[call-overload]


def sizes(owner: str, name: str, value: object, count: int, least: int = 1) -> tuple[int, ...]:
    """An int or a sequence of ``count`` ints, each at least ``least``, as a tuple of ``count`` ints."""
    if _is_int(value):
        return (size(owner, name, value, least),) * count
    if not isinstance(value, (tuple, list)) or len(value) != count:
        raise ArgumentError(
            f"{owner}: {name} must be an int or {count} ints (height, width), got {_shown(value)}"
        )
    return tuple(size(owner, f"{name}[{position}]", v, least) for position, v in enumerate(value))


def real(owner: str, name: str, value: object, *, low: float | None = None, high: float | None = None,
         low_open: bool = False, high_open: bool = False) -> float:
    """``value`` as a finite float within the bounds given (open or closed), or an ArgumentError."""
    numeric = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    number = float(value) if numeric else math.nan  # type: ignore[arg-type]
    inside = (
        math.isfinite(number)
        and (low is None or (number > low if low_open else number >= low))
        and (high is None or (number < high if high_open else number <= high))
    )
    if not inside:
        raise ArgumentError(f"{owner}: {name} must be {_range(low, high, low_open, high_open)}, got {_shown(value)}")
    return number


def flag(owner: str, name: str, value: object) -> bool:
    """``value`` as a bool, or an ArgumentError: a string such as ``"no"`` is truthy and would switch it on."""
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentError(f"{owner}: {name} must be True or False, got {_shown(value)}")
    return bool(value)


def positive_rate(owner: str, lr: object) -> float:
    """A learning rate: a finite number > 0 (inf, nan, a string or None would train to garbage or crash)."""
    try:
        return real(owner, "lr", lr, low=0.0, low_open=True)
    except ArgumentError:
        raise ArgumentError(
            f"{owner}: the learning rate lr must be positive and finite (a number such as 1e-3), got "
            f"{type(lr).__name__} {lr!r}"
        ) from None


def rate_as(owner: str, lr: float, dtype: np.dtype) -> np.ndarray:
    """A checked rate in a parameter's element type; one too large for it is refused, not made inf."""
    array, overflow = convert_checked(np.float64(lr), dtype)
    if overflow is not None:
        raise ArgumentError(f"{owner}: the learning rate lr = {overflow}; pick a rate the parameters' type can hold")
    return array


def element(owner: str, dtype: object) -> np.dtype:
    """``dtype`` as one of the element types topos computes in, or an ArgumentError."""
    try:
        found = np.dtype(dtype)  # type: ignore[call-overload]
    except TypeError:
        found = None
    if dtype is None or found not in ELEMENTS:
        raise ArgumentError(
            f"{owner}: dtype must be float32, float64 or ml_dtypes.bfloat16, got {_shown(dtype)}"
        )
    return found


def size_list(owner: str, name: str, value: object, least: int = 2) -> list[int]:
    """A list (or tuple) of at least ``least`` sizes, each an int >= 1."""
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ArgumentError(f"{owner}: {name} must be a list of ints (e.g. [784, 128, 10]), got {_shown(value)}")
    if len(value) < least:
        raise ArgumentError(
            f"{owner}: {name} must hold at least two sizes (inputs and outputs), got {list(value)}"
            if least == 2 else f"{owner}: {name} must hold at least {least} sizes, got {list(value)}"
        )
    return [size(owner, f"{name}[{position}]", v) for position, v in enumerate(value)]


def initial(label: str, initializer, generator, shape: tuple[int, ...], dtype) -> np.ndarray:
    """What ``initializer(generator, shape, dtype)`` returns for the slot ``label``, checked to fit it.

    An ``init=`` is any callable of that signature; one that returns another
    shape or element type would otherwise be refused much later, far from
    the constructor that was given it.
    """
    owner = label.split(".")[0]
    if not callable(initializer):
        raise ArgumentError(
            f"{owner}: init must be an initializer from topos.init (a callable (generator, shape, dtype) -> "
            f"array), got {_shown(initializer)}"
        )
    if isinstance(initializer, types.FunctionType) and initializer.__module__ == "topos.init":
        # init.zeros rather than init.zeros(): the factory would be called as the initializer and fail inside
        raise ArgumentError(
            f"{owner}: init=init.{initializer.__name__} is the factory of an initializer, not one; call it: "
            f"init=init.{initializer.__name__}(...) (e.g. init.zeros(), init.normal(std=0.02))"
        )
    array = initializer(generator, shape, dtype)
    expected = f"{np.dtype(dtype).name} {list(shape)}"
    if not isinstance(array, np.ndarray):
        raise ArgumentError(
            f"{label}: init returned {_shown(array)}, expected a {expected} array; an initializer returns "
            "initializer(generator, shape, dtype) as a NumPy array of that shape and dtype"
        )
    if array.dtype != dtype or array.shape != tuple(shape):
        raise ArgumentError(
            f"{label}: init returned {array.dtype.name} {list(array.shape)}, expected {expected}; an "
            "initializer returns an array of the shape and dtype it is given"
        )
    return array


def broadcasts(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether NumPy's rule broadcasts ``shape`` to ``target`` (each trailing axis equal or 1)."""
    return len(shape) <= len(target) and all(a in (1, b) for a, b in zip(shape[::-1], target[::-1]))


def _range(low, high, low_open, high_open) -> str:
    if low is not None and high is not None:
        bounds = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    elif low is not None:
        bounds = f"{'>' if low_open else '>='} {low:g}"
    elif high is not None:
        bounds = f"{'<' if high_open else '<='} {high:g}"
    else:
        return "a finite number"
    return f"{bounds} (a finite number)"


def _shown(value: object) -> str:
    return repr(value) if isinstance(value, (int, float, str, np.number, type(None))) else (
        f"{type(value).__name__} {value!r}"
    )


__all__ = ["broadcasts", "element", "flag", "initial", "positive_rate", "rate_as", "real", "size", "size_list", "sizes"]
