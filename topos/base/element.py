"""Element types: the number formats a tensor can hold, and how each one computes.

The element type is a named seam, and it is open: an :class:`Element` names
a NumPy dtype, the *compute* type its arithmetic happens in before each
result is rounded once back to the element, the *accumulate* type its sums
and products add in, its *rounding* (float64 to the element, once) and its
*reference math* (the float64 kernels its transcendental functions
evaluate). :func:`register` validates one and adds it to the registry that
every stage reads: the oracle's kernels (``compute_type``, ``round_to``),
``refmath`` (``round_once`` and the maps), feeds and constants
(``convert``), plans, differentiation, the MLIR dialect (``mlir``, the
element's MLIR type) and the lowering (a ``convert`` to the compute type
and back at every rounding boundary).

float32, float64 and bfloat16 are registered below through the same
:func:`register` a user calls. float32 and float64 compute in themselves;
bfloat16 computes and accumulates in float32 (products of two bfloat16
values are exact in float32, and sums keep 16 more bits than the element
holds). A worked float16 and an 8-bit float are in ``docs/seams.md``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np

from topos.base import kernels64
from topos.base.errors import AtTheUsersLine, ShapeError

float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
bfloat16 = np.dtype(ml_dtypes.bfloat16)


class ElementError(AtTheUsersLine, ValueError):
    """An element type could not be registered (or unregistered): the message names it and the fix."""


@dataclass(frozen=True, kw_only=True)
class Element:
    """An element type: a number format a tensor can hold, and how topos computes with it.

    ``dtype``: the NumPy dtype (a NumPy float or an ``ml_dtypes`` one).
    ``name``: its short name in ``describe`` lines, error messages and
    envelope tables (``"f16"``). ``mlir``: its MLIR element type
    (``"f16"``, ``"f8E5M2"``); None when it cannot be emitted.
    ``compute``: the registered type its arithmetic runs in before one
    rounding back (itself, or a wider type that computes in itself).
    ``accumulate``: the type matmul, sums, fold, scatter, log_softmax and
    logsumexp add in (today it must equal ``compute``).
    ``rounding``: float64 array -> array of ``dtype``, rounded once to
    nearest, ties to even; ``refmath.nearest_even(dtype)`` is one for any
    binary format. ``reference_math``: for each name in
    ``refmath.SUPPORTED``, a float64 kernel whose bits are a fixed function
    of its input bits; the element's function is the kernel on the exactly
    widened input, rounded once. ``refmath.FLOAT64_KERNELS`` are fdlibm's.

    Build one and pass it to :func:`register`, which checks every field
    and returns the registered (normalised) element.
    """

    dtype: Any
    name: str
    mlir: str | None = None
    compute: Any = None
    accumulate: Any = None
    rounding: Callable[[np.ndarray], np.ndarray] | None = None
    reference_math: Mapping[str, Callable[..., np.ndarray]] | None = None

    @property
    def narrow(self) -> bool:
        """True when the element computes in a wider type and rounds back once (bfloat16, float16)."""
        return self.compute != self.dtype

    def __repr__(self) -> str:
        compute = "itself" if not self.narrow else np.dtype(self.compute).name
        return f"Element({self.name}: {np.dtype(self.dtype).name}, mlir {self.mlir}, computes in {compute})"


_BY_DTYPE: dict[np.dtype, Element] = {}
_BY_NAME: dict[str, Element] = {}
_BY_MLIR: dict[str, Element] = {}
_BUILT_IN: set[str] = set()


class Elements(Sequence):
    """The registered element dtypes, in registration order: a live, read-only view of the registry.

    ``dtype in ELEMENTS`` asks whether a dtype is registered; ``tuple(ELEMENTS)``
    takes a snapshot. It compares equal to a tuple or list of the same dtypes.
    """

    def __getitem__(self, index):
        return tuple(_BY_DTYPE)[index]

    def __len__(self) -> int:
        return len(_BY_DTYPE)

    def __iter__(self) -> Iterator[np.dtype]:
        return iter(tuple(_BY_DTYPE))

    def __contains__(self, dtype: object) -> bool:
        if dtype is None:  # np.dtype(None) is float64
            return False
        try:
            return np.dtype(dtype) in _BY_DTYPE  # type: ignore[call-overload]
        except TypeError:
            return False

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Elements):
            return True
        return isinstance(other, (tuple, list)) and tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]  # a live view has no stable hash

    def __repr__(self) -> str:
        return f"Elements({', '.join(d.name for d in self)})"


ELEMENTS = Elements()


def element_of(dtype_or_name) -> Element:
    """The registered :class:`Element` of a dtype (``np.float16``) or a short name (``"f16"``)."""
    if isinstance(dtype_or_name, str) and dtype_or_name in _BY_NAME:
        return _BY_NAME[dtype_or_name]
    try:
        if dtype_or_name is None:  # np.dtype(None) is float64
            raise KeyError(dtype_or_name)
        return _BY_DTYPE[np.dtype(dtype_or_name)]
    except (TypeError, KeyError):
        raise ShapeError(
            f"{dtype_or_name!r} is not a registered element type; the registered ones are "
            f"{_registered_names()}; register another with topos.base.element.register(Element(...))"
        ) from None


def element_for_mlir(mlir: str) -> Element | None:
    """The registered element whose MLIR type is spelled ``mlir`` (``"f16"``), or None."""
    return _BY_MLIR.get(mlir)


def _registered_names() -> str:
    return ", ".join(f"{e.name} ({np.dtype(e.dtype).name})" for e in _BY_DTYPE.values())


def is_element(dtype: object) -> bool:
    """True when ``dtype`` is a registered floating element type."""
    return isinstance(dtype, np.dtype) and dtype in _BY_DTYPE


def short_name(dtype: object) -> str:
    """The spelling used in describe lines and MLIR types: f32, f64, bf16, index<n>, a registered name."""
    if isinstance(dtype, SelectionType):
        return str(dtype)
    numpy_dtype = np.dtype(dtype)  # type: ignore[call-overload]
    element = _BY_DTYPE.get(numpy_dtype)
    return element.name if element is not None else numpy_dtype.name


def compute_type(dtype: np.dtype) -> np.dtype:
    """The type arithmetic and accumulation use before rounding back to ``dtype``."""
    return _BY_DTYPE[dtype].compute


def accumulation_type(dtype: np.dtype) -> np.dtype:
    """The type sums and products accumulate in before rounding back to ``dtype``."""
    return _BY_DTYPE[dtype].accumulate


def round_to(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Round a compute-type result once to its element type (a no-op when they agree).

    NumPy's cast from the compute type is the rounding; :func:`register`
    checks that it agrees with the element's own ``rounding``.
    """
    if array.dtype == dtype:
        return array
    return array.astype(dtype)


def convert(value, dtype) -> np.ndarray:
    """``value`` (a number, a list, an array) as an array of element type ``dtype``, rounded once.

    Every conversion of a user's number into a tensor goes through here:
    feeds, Python scalars beside a Value, replaced slots, learning rates.
    An element that computes in itself takes NumPy's cast (an IEEE
    conversion, one rounding). A narrow element takes NumPy's cast only
    from itself or its compute type: NumPy's cast into bfloat16 or an 8-bit
    float (ml_dtypes) from float64 goes through float32 and so rounds twice
    (``1 + 2**-8 + 2**-30`` becomes 1.0 in bfloat16, not ``1 + 2**-7``);
    any other source is widened exactly to float64 and rounded once by the
    element's ``rounding``.
    """
    dtype = np.dtype(dtype)
    array = np.asarray(value)
    if array.dtype == dtype:
        return array
    element = _BY_DTYPE.get(dtype)
    if element is not None and element.narrow and array.dtype != element.compute:
        return element.rounding(array.astype(np.float64))  # type: ignore[misc]
    return array.astype(dtype)


class Overflow(NamedTuple):
    """A finite number an element type cannot hold: ``convert`` would make it ``became`` (inf, -inf)."""

    number: float
    at: tuple[int, ...]  # its position in the array; () for a scalar
    element: str  # the element type's short name (f32)
    largest: float  # its largest finite magnitude
    became: str

    def __str__(self) -> str:
        where = f" at position {self.at}" if self.at else ""
        return (f"{self.number!r}{where}: {self.element} holds magnitudes up to {self.largest:.6g} and this "
                f"would become {self.became}")


def convert_checked(value, dtype) -> tuple[np.ndarray, Overflow | None]:
    """``convert(value, dtype)``, and the first finite number it turned into inf or NaN (None if none).

    A conversion rounds; it must not overflow without a word. Each caller
    refuses an Overflow with its own error (a feed's, a slot's, a seed's).
    """
    array = np.asarray(value)
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is reported, not warned about
        converted = convert(array, dtype)
        if array.dtype == converted.dtype or array.dtype.kind not in "fiu":
            return converted, None
        wide = array.astype(np.float64)
        lost = np.isfinite(wide) & ~np.isfinite(converted.astype(np.float64))
    if not lost.any():
        return converted, None
    at = tuple(int(k) for k in np.argwhere(lost)[0])
    return converted, Overflow(float(wide[at]), at, short_name(converted.dtype),
                               float(ml_dtypes.finfo(converted.dtype).max), str(converted[at]))


# ---- registering an element ---------------------------------------------------------------


def register(element: Element) -> Element:
    """Add ``element`` to the registry every stage reads, after checking it; returns the registered element.

    Refused, with an :class:`ElementError` naming the element and the fix:
    a dtype NumPy cannot hold (or that is not a binary float no wider than
    float64), a name, dtype or MLIR type already registered, a compute or
    accumulate type that is not registered or not closed (it must compute
    in itself), a compute type that cannot hold the element's values, an
    accumulate type other than the compute type, a missing rounding or one
    that disagrees with NumPy's cast from the compute type, and missing or
    broken reference math (each kernel is tried on a float64 array).
    """
    return _add(element, probe=True)


def _add(element: Element, probe: bool) -> Element:
    """Check ``element`` and add it; ``probe`` also runs its rounding and kernels (the built-ins skip that).

    The built-in three are checked field by field like any other, but their
    rounding and kernels are refmath's own, which tests/test_refmath.py
    grades exhaustively; probing them would cost every ``import topos`` 60 ms.
    """
    if not isinstance(element, Element):
        raise ElementError(
            f"register takes a topos.base.element.Element, got {type(element).__name__}; "
            "build one with Element(dtype=..., name=..., mlir=..., compute=..., accumulate=..., "
            "rounding=..., reference_math=...)"
        )
    name = _check_name(element)
    dtype = _check_dtype(element, name)
    compute = _check_compute(element, name, dtype)
    accumulate = _check_accumulate(element, name, dtype, compute)
    mlir = _check_mlir(element, name)
    normalised = replace(element, dtype=dtype, compute=compute, accumulate=accumulate, mlir=mlir,
                         reference_math=_check_reference_math(element, name, probe))
    _check_rounding(normalised, probe)
    _BY_DTYPE[dtype] = normalised
    _BY_NAME[name] = normalised
    if mlir is not None:
        _BY_MLIR[mlir] = normalised
    return normalised


def unregister(dtype_or_name) -> None:
    """Remove a registered element (for experiments and tests); the three built-in ones stay.

    Networks recorded with it keep their payloads but can no longer run:
    unregister only what nothing uses any more.
    """
    element = element_of(dtype_or_name)
    if element.name in _BUILT_IN:
        raise ElementError(f"element {element.name} is built in; only registered elements can be unregistered")
    users = [e.name for e in _BY_DTYPE.values() if e is not element and element.dtype in (e.compute, e.accumulate)]
    if users:
        raise ElementError(
            f"element {element.name} is the compute or accumulate type of {', '.join(users)}; unregister those first"
        )
    del _BY_DTYPE[element.dtype], _BY_NAME[element.name]
    if element.mlir is not None:
        del _BY_MLIR[element.mlir]


def _check_name(element: Element) -> str:
    name = element.name
    if not isinstance(name, str) or not name.isidentifier():
        raise ElementError(
            f"element {name!r} ({element.dtype!r}): its name must be a short identifier such as 'f16' "
            "(it is printed in describe lines and keys the envelope tables)"
        )
    if name in _BY_NAME:
        raise ElementError(
            f"element {name!r} is already registered, as {np.dtype(_BY_NAME[name].dtype).name}; choose "
            f"another name, or topos.base.element.unregister({name!r}) first"
        )
    return name


def _finfo(dtype: np.dtype):
    """ml_dtypes' finfo: NumPy's for NumPy floats, and the ml_dtypes formats' own."""
    return ml_dtypes.finfo(dtype)


def _check_dtype(element: Element, name: str) -> np.dtype:
    try:
        dtype = np.dtype(element.dtype)
        if dtype.kind not in "fV":  # ml_dtypes' formats are 'V' or 'f'; finfo would take a complex's parts
            raise ValueError(f"data type {dtype.name} is not a real floating format")
        np.zeros(2, dtype).astype(np.float64)
        info = _finfo(dtype)
    except (TypeError, ValueError) as error:
        raise ElementError(
            f"element {name!r}: NumPy cannot hold {element.dtype!r} as a floating element ({error}); "
            "pass a NumPy or ml_dtypes float dtype such as np.float16 or ml_dtypes.float8_e5m2"
        ) from None
    if info.nmant > 52 or info.maxexp > 1024 or info.minexp < -1022:
        raise ElementError(
            f"element {name!r}: {dtype.name} is wider than float64, which cannot hold its values exactly "
            "(the reference math and the envelopes widen to float64); register a format no wider than float64"
        )
    if dtype in _BY_DTYPE:
        raise ElementError(
            f"element {name!r}: {dtype.name} is already registered, as {_BY_DTYPE[dtype].name}; "
            f"use that element, or topos.base.element.unregister({_BY_DTYPE[dtype].name!r}) first"
        )
    return dtype


def _holds(wide: np.dtype, narrow: np.dtype) -> bool:
    """Whether every value of ``narrow`` is a value of ``wide`` (precision and exponent range)."""
    w, n = _finfo(wide), _finfo(narrow)
    return w.nmant >= n.nmant and w.maxexp >= n.maxexp and w.minexp - w.nmant <= n.minexp - n.nmant


def _closed(kind: str, chosen, name: str, dtype: np.dtype) -> np.dtype:
    """A compute or accumulate type: the element itself, or a registered element that computes in itself."""
    if chosen is None:
        raise ElementError(
            f"element {name!r}: no {kind} type; pass {kind}=np.float32 (compute in float32 and round once, "
            f"as bfloat16 does) or {kind}={dtype.name} (compute in itself)"
        )
    try:
        chosen = np.dtype(chosen)
    except TypeError:
        raise ElementError(f"element {name!r}: {kind} type {chosen!r} is not a NumPy dtype") from None
    if chosen == dtype:
        return chosen
    registered = _BY_DTYPE.get(chosen)
    if registered is None:
        raise ElementError(
            f"element {name!r}: its {kind} type {chosen.name} is not registered; register it first, or "
            f"{kind} in one of {_registered_names()}"
        )
    if registered.narrow:
        raise ElementError(
            f"element {name!r}: its {kind} type {registered.name} itself computes in "
            f"{np.dtype(registered.compute).name}; {kind} in a type that computes in itself, such as "
            f"{np.dtype(registered.compute).name}"
        )
    return chosen


def _check_compute(element: Element, name: str, dtype: np.dtype) -> np.dtype:
    compute = _closed("compute", element.compute, name, dtype)
    if not _holds(compute, dtype):
        raise ElementError(
            f"element {name!r}: its compute type {compute.name} cannot hold every {dtype.name} value, so "
            f"widening would round; compute in a type with at least {_finfo(dtype).nmant} fraction bits and "
            "the element's exponent range (float32 or float64)"
        )
    return compute


def _check_accumulate(element: Element, name: str, dtype: np.dtype, compute: np.dtype) -> np.dtype:
    accumulate = _closed("accumulate", element.accumulate, name, dtype)
    if accumulate == compute:
        return accumulate
    if _holds(compute, accumulate):
        raise ElementError(
            f"element {name!r}: it accumulates in {accumulate.name}, narrower than its compute type "
            f"{compute.name}: every sum would round away what each product kept; use accumulate={compute.name}"
        )
    raise ElementError(
        f"element {name!r}: accumulating in {accumulate.name}, wider than its compute type {compute.name}, "
        "is not served yet (the reference kernels in topos/opcodes accumulate in the compute type, so the "
        f"oracle could not honour it); use accumulate={compute.name}, or compute={accumulate.name}"
    )


def _check_mlir(element: Element, name: str) -> str | None:
    mlir = element.mlir
    if mlir is None:
        return None
    if not isinstance(mlir, str) or not mlir:
        raise ElementError(f"element {name!r}: mlir must be an MLIR element type spelling such as 'f16', got {mlir!r}")
    if mlir in _BY_MLIR:
        raise ElementError(
            f"element {name!r}: MLIR type {mlir} already stands for {_BY_MLIR[mlir].name}; one MLIR type "
            "can read back as only one element"
        )
    return mlir


def _check_reference_math(element: Element, name: str, probe: bool) -> Mapping[str, Callable[..., np.ndarray]]:
    supplied = element.reference_math
    if supplied is None:
        raise ElementError(
            f"element {name!r} has no reference math; pass reference_math=refmath.FLOAT64_KERNELS "
            f"(fdlibm in float64, rounded once to the element) or a mapping of {', '.join(kernels64.SUPPORTED)} "
            "to float64 kernels"
        )
    if not isinstance(supplied, Mapping):
        raise ElementError(
            f"element {name!r}: reference_math must be a mapping of function names to float64 kernels, "
            f"got {type(supplied).__name__}; start from refmath.FLOAT64_KERNELS"
        )
    missing = [f for f in kernels64.SUPPORTED if f not in supplied]
    unknown = sorted(set(supplied) - set(kernels64.SUPPORTED))
    if missing or unknown:
        said = (f"lacks {', '.join(missing)}" if missing else "") + ("; " if missing and unknown else "") + (
            f"names unknown functions {', '.join(unknown)}" if unknown else "")
        raise ElementError(
            f"element {name!r}: its reference math {said}; every one of {', '.join(kernels64.SUPPORTED)} needs "
            "a float64 kernel: take the missing ones from refmath.FLOAT64_KERNELS "
            "({**refmath.FLOAT64_KERNELS, **yours})"
        )
    points = np.array([0.5, 2.0])
    for function in kernels64.SUPPORTED if probe else ():
        kernel = supplied[function]
        try:
            with np.errstate(all="ignore"):
                out = np.asarray(kernel(points, points) if function == "pow" else kernel(points))
        except Exception as error:  # noqa: BLE001 - whatever the user's kernel raised, say which one
            raise ElementError(
                f"element {name!r}: its reference kernel for {function} fails on a float64 array: {error!r}"
            ) from None
        if out.dtype != float64 or out.shape != points.shape:
            raise ElementError(
                f"element {name!r}: its reference kernel for {function} returns {out.dtype} {list(out.shape)} for "
                f"float64 {list(points.shape)}; a kernel maps float64 arrays to float64 arrays of the same shape"
            )
    return MappingProxyType(dict(supplied))


def _probe_values(dtype: np.dtype) -> np.ndarray:
    """Float64 points that pin a rounding: element values, midpoints and their neighbours, edges."""
    info = _finfo(dtype)
    bits = 8 * dtype.itemsize
    if bits <= 16:
        patterns = np.arange(1 << bits, dtype=np.uint64)
    else:  # a spread of patterns: every 2**(bits - 14)-th one
        patterns = np.arange(0, 1 << bits, 1 << (bits - 14), dtype=np.uint64)
    raw = patterns.astype({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[dtype.itemsize])
    with np.errstate(invalid="ignore"):
        values = raw.view(dtype).astype(np.float64)
    values = np.unique(values[np.isfinite(values)])
    midpoints = (values[:-1] + values[1:]) / 2  # exact in float64: the element has far fewer bits
    top = float(info.max) * (1 + float(info.eps) / 4)  # between max and the first value past it
    return np.concatenate([values, midpoints, [top, -top, np.inf, -np.inf]])


def _check_rounding(element: Element, probe: bool) -> None:
    name, dtype, compute = element.name, np.dtype(element.dtype), np.dtype(element.compute)
    if element.rounding is None or not callable(element.rounding):
        raise ElementError(
            f"element {name!r} has no rounding; pass rounding=refmath.nearest_even({dtype.name}) "
            "(float64 to the element, ties to even, once)"
        )
    if not element.narrow or not probe:
        return
    points = _probe_values(dtype)
    try:
        with np.errstate(all="ignore"):
            got = np.asarray(element.rounding(points))
    except Exception as error:  # noqa: BLE001 - whatever the user's rounding raised, say so
        raise ElementError(f"element {name!r}: its rounding fails on a float64 array: {error!r}") from None
    if got.dtype != dtype or got.shape != points.shape:
        raise ElementError(
            f"element {name!r}: its rounding returns {got.dtype} {list(got.shape)} for float64 "
            f"{list(points.shape)}; it must return {dtype.name} of the same shape"
        )
    # Compute results are rounded by NumPy's cast (round_to), wide sources by ``rounding``:
    # the two must be one function wherever the compute type holds the value.
    with np.errstate(all="ignore"):
        held = points.astype(compute).astype(np.float64) == points
        cast = points.astype(compute).astype(dtype)
    a, b = got.astype(np.float64), cast.astype(np.float64)
    same = ((a == b) & (np.signbit(a) == np.signbit(b))) | (np.isnan(a) & np.isnan(b))
    differ = held & ~same
    if differ.any():
        where = int(np.flatnonzero(differ)[0])
        raise ElementError(
            f"element {name!r}: its rounding gives {a[where]!r} for {points[where]!r}, but NumPy's cast from "
            f"{compute.name} gives {b[where]!r}; topos rounds compute results with the cast and wide sources "
            f"with rounding, so they must agree: pass rounding=refmath.nearest_even({dtype.name})"
        )


def _register_built_in(dtype: np.dtype, name: str, compute: np.dtype) -> None:
    _add(Element(dtype=dtype, name=name, mlir=name, compute=compute, accumulate=compute,
                 rounding=kernels64.nearest_even(dtype), reference_math=kernels64.FLOAT64_KERNELS), probe=False)
    _BUILT_IN.add(name)


_register_built_in(float32, "f32", float32)
_register_built_in(float64, "f64", float64)
_register_built_in(bfloat16, "bf16", float32)


@dataclass(frozen=True)
class SelectionType:
    """The type of an index payload: integers in ``[0, extent)`` that pick rows of a table."""

    extent: int

    def __str__(self) -> str:
        return f"index<{self.extent}>"


def host_array(value):
    """``value`` as a NumPy array when it is a torch tensor, a jax array or another DLPack exporter; else ``value``.

    The door foreign arrays come in by: feeds (``interpret.bind_feeds``,
    which every oracle run and compiled call uses), and parameter sources
    and reads through ``topos.interop.arrays``. Where the memory is on the
    host the result is a view of it, not a copy: a run copies its feeds
    itself, and IREE copies them to its device. A torch tensor is detached
    first (a feed is data; a gradient would never flow back into torch),
    moved to the CPU if it lives elsewhere, and bfloat16, which NumPy cannot
    hold, is read through a uint16 view as ml_dtypes.bfloat16, bit for bit.
    torch and jax are recognised through the modules already imported (a
    torch tensor exists only once torch is), so topos imports neither.
    """
    if isinstance(value, (np.ndarray, np.generic)):  # the common case, first: every step feeds arrays
        return value
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().resolve_conj().resolve_neg()
        if tensor.dtype == torch.bfloat16:
            return tensor.view(torch.uint16).numpy().view(bfloat16)
        return tensor.numpy()
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(value, getattr(jax, "Array", ())):
        return np.asarray(value)  # jax hands NumPy bfloat16 as ml_dtypes.bfloat16 itself
    if hasattr(value, "__dlpack__"):
        return np.from_dlpack(value)
    return value


@dataclass(frozen=True, init=False)
class Selection:
    """Indices into a table of ``extent`` rows, recorded as a leaf or fed as an input.

    Build one with ``topos.selection(indices, extent)`` and pass it to
    ``tape.leaf`` or ``tape.input``; a fed selection is a plain integer array.
    Constructing one directly validates it the same way.
    """

    indices: np.ndarray
    extent: int

    # Written out rather than generated: a generated __init__ has no source file, and an
    # error's site must be the user's line.
    def __init__(self, indices, extent: int):
        object.__setattr__(self, "indices", indices)
        object.__setattr__(self, "extent", extent)
        self._validate()

    def __getitem__(self, key) -> Selection:
        """``indices[key]`` as a Selection of the same extent, not checked again: valid indices stay valid.

        Check a data set once, ``data = topos.selection(X, extent)``, and
        feed ``data[rows]`` each step: a compiled step takes a Selection's
        indices as they are, where an int64 array costs two bounds scans a
        step (about 2.5 µs each on makemore's batches, after the module ran).
        """
        try:
            taken = np.asarray(self.indices[key])
        except (IndexError, TypeError, ValueError) as error:  # NumPy's words, with the shape and the fix
            raise ShapeError(
                f"selection[{key!r}]: {error}; this selection's indices have shape {list(self.indices.shape)}: "
                "index it as that int64 array (rows in range, integer or slice keys)"
            ) from None
        if not taken.flags.c_contiguous:
            taken = taken.copy()
        picked = object.__new__(Selection)
        object.__setattr__(picked, "indices", _sealed(taken))
        object.__setattr__(picked, "extent", self.extent)
        return picked

    def _validate(self):
        extent = self.extent
        if isinstance(extent, bool) or not isinstance(extent, (int, np.integer)) or extent < 1:
            raise ShapeError(f"selection extent must be a positive integer, got {extent!r}")
        if not np.size(self.indices):  # before the type: NumPy calls [] float64, and it could never be used
            raise ShapeError(
                f"a selection needs at least one index, got none (shape {list(np.shape(self.indices))}); "
                "recorded tensors are never empty: pick at least one row"
            )
        array = integer_indices(self.indices)
        check_indices(array, int(extent))
        object.__setattr__(self, "indices", _sealed(array))
        object.__setattr__(self, "extent", int(extent))


def _sealed(array: np.ndarray) -> np.ndarray:
    """``array`` read-only for good: a view of a read-only base refuses ``flags.writeable = True``.

    A checked selection is fed without a second bounds scan, so its indices
    must not change after the check: an index out of range would reach
    IREE's gather, which clamps it without a word.
    """
    base = array.base
    if isinstance(base, np.ndarray) and not base.flags.writeable:
        return array  # already a view of a read-only base, and read-only itself
    owner = array if base is None else array.copy()  # a view of memory someone may still write
    owner.flags.writeable = False
    return owner.view()  # a view of a read-only array is read-only


def selection(indices, extent: int) -> Selection:
    """Index payload for gather/scatter: integers, each in ``[0, extent)``."""
    return Selection(indices, extent)


def integer_indices(indices) -> np.ndarray:
    """A fresh int64 array of ``indices``, refusing anything that is not integers (floats, booleans)."""
    array = np.asarray(indices)
    if array.dtype.kind not in "iu":
        kind = "booleans (a mask, not indices)" if array.dtype.kind == "b" else f"{array.dtype} values"
        raise ShapeError(
            f"selection indices must be integers, got {kind}; convert deliberately, e.g. "
            "np.flatnonzero(mask) for a mask or np.round(x).astype(int) for whole floats"
        )
    if array.dtype.kind == "u" and array.size and int(array.max()) > np.iinfo(np.int64).max:
        raise ShapeError("selection indices do not fit in int64")
    return np.array(array, dtype=np.int64)


def check_indices(array: np.ndarray, extent: int) -> None:
    """Raise a ShapeError (a ValueError) naming the first index outside ``[0, extent)``."""
    if not array.size or (array.min() >= 0 and array.max() < extent):  # two reductions, no temporaries
        return
    bad = (array < 0) | (array >= extent)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ShapeError(
            f"selection index {int(array[where])} at position {where} is outside [0, {extent}); "
            f"a selection picks rows of a table of {extent} rows: filter or clip the indices, or declare "
            "the extent of the table they index"
        )
