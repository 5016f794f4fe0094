"""The recordable vocabulary: every opcode and composite as an operator or method.

``Recordable`` is the one interface derivative rules are written against.
A payload that inherits it only says how to express one opcode
(``_express``) and how to make a constant (``_constant``):

* a tape ``Value`` records a node,
* an ``Eager`` array (``topos.readings.eager``) computes with the reference kernels,
* a user's payload (a dual number, an interval) does what it likes.

The composites at the bottom (relu, softmax, broadcast_to, ...) are plain
compositions of opcodes, so every payload gets them for free and a tape
records only primitives.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, Sequence

import numpy as np

from topos.base.copies import splat
from topos.base.element import convert_checked, is_element, short_name
from topos.base.errors import ShapeError
from topos.base.provenance import user_site
from topos.spec.opcodes import by_name

_OP = by_name  # readability: _OP("add")

_SQRT_HALF = math.sqrt(0.5)


class Recordable:
    """Operators and methods shared by every payload that speaks the vocabulary."""

    __slots__ = ()
    __array_priority__ = 1000  # so ndarray (op) Value defers to us

    # -- what a payload must provide ------------------------------------------------
    shape: tuple[int, ...]
    dtype: object

    def _express(self, opcode, operands, attributes):
        raise NotImplementedError

    def _constant(self, array: np.ndarray):
        raise NotImplementedError

    # -- plumbing ----------------------------------------------------------------------
    def _lift(self, other):
        """A Python number or an array beside a payload becomes a constant of its shape and dtype.

        NotImplemented for anything else; ``_binary`` decides between
        Python's protocol and a refusal.
        """
        if isinstance(other, Recordable):
            return other
        if not isinstance(self.dtype, np.dtype):
            raise ShapeError(
                f"a selection ({self.shape} {self.dtype}) has no arithmetic; selections are indices, "
                "used only as the index operand of gather or scatter"
            )
        if isinstance(other, (bool, np.bool_)):
            return NotImplemented  # True is not 1.0 here, as a boolean array is not: refused by _binary
        if isinstance(other, numbers.Real) or _is_element_scalar(other):
            return self._constant(splat(self._number(other), self.shape))
        if isinstance(other, np.ndarray):
            if other.dtype != self.dtype:
                raise ShapeError(
                    f"an array of element type {other.dtype} beside a {self.dtype} tensor; "
                    "convert it with .astype(...) first (only Python numbers adopt the tensor's type)"
                )
            return self._constant(other)
        return NotImplemented

    def _number(self, number) -> np.ndarray:
        """``number`` in this payload's element type, or a ShapeError when it would become inf."""
        try:
            wide = np.float64(number)
        except OverflowError:  # a Python int past float64's range (10**400)
            raise _number_too_large(self, number) from None
        element, overflow = convert_checked(wide, self.dtype)  # NaN and inf are numbers a tensor holds
        if overflow is not None:
            raise _number_too_large(self, number)
        return element

    def _binary(self, name, other, reverse=False):
        lifted = self._lift(other)
        if lifted is NotImplemented:
            # Python's protocol: ``x + other`` first asks x, then other.__radd__. A type that
            # may handle a Value there keeps its turn; the rest are refused by name.
            reflected = _REFLECTED.get(name)
            if not reverse and reflected is not None and _may_handle(other, reflected):
                return NotImplemented
            raise _unsupported_operand(self, name, other)
        operands = (lifted, self) if reverse else (self, lifted)
        return self._express(_OP(name), operands, {})

    def _unary(self, name, **attributes):
        return self._express(_OP(name), (self,), attributes)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    # -- elementwise opcodes -------------------------------------------------------------
    def __add__(self, other):
        return self._binary("add", other)

    def __radd__(self, other):
        return self._binary("add", other, reverse=True)

    def __sub__(self, other):
        return self._binary("sub", other)

    def __rsub__(self, other):
        return self._binary("sub", other, reverse=True)

    def __mul__(self, other):
        return self._binary("mul", other)

    def __rmul__(self, other):
        return self._binary("mul", other, reverse=True)

    def __truediv__(self, other):
        return self._binary("div", other)

    def __rtruediv__(self, other):
        return self._binary("div", other, reverse=True)

    def __pow__(self, other):
        return self._binary("pow", other)

    def __rpow__(self, other):
        return self._binary("pow", other, reverse=True)

    def __neg__(self):
        return self._unary("neg")

    def __matmul__(self, other):
        return self._binary("matmul", other)

    def __rmatmul__(self, other):
        return self._binary("matmul", other, reverse=True)

    def add(self, other):
        return self + other

    def sub(self, other):
        return self - other

    def mul(self, other):
        return self * other

    def div(self, other):
        return self / other

    def pow(self, exponent):
        return self ** exponent

    def neg(self):
        return -self

    def matmul(self, other):
        return self @ other

    def maximum(self, other):
        """Elementwise maximum; ties go to self."""
        return self._binary("maximum", other)

    def step(self, threshold):
        """1 where self >= threshold, else 0 (derivative zero)."""
        return self._binary("step", threshold)

    def map(self, function: str):
        """Apply one of the map functions by name (exp, log, sqrt, tanh, ...)."""
        return self._unary("map", function=function)

    def exp(self):
        return self.map("exp")

    def log(self):
        return self.map("log")

    def sqrt(self):
        return self.map("sqrt")

    def tanh(self):
        return self.map("tanh")

    def sin(self):
        return self.map("sin")

    def cos(self):
        return self.map("cos")

    def log1p(self):
        return self.map("log1p")

    def expm1(self):
        return self.map("expm1")

    def erf(self):
        return self.map("erf")

    def erf_derivative(self):
        """2/sqrt(pi) * exp(-x**2), the derivative of erf."""
        return self.map("erf_derivative")

    # -- reductions and shape opcodes ----------------------------------------------------
    def sum(self):
        """Sum of every element (rank 0)."""
        return self._unary("sum")

    def sum_along(self, axis: int):
        return self._unary("sum_along", axis=axis)

    def broadcast(self, shape: Sequence[int]):
        """Fill ``shape`` with this single-element tensor."""
        return self._unary("broadcast", shape=tuple(shape))

    def broadcast_along(self, axis: int, extent: int):
        """Insert a new axis at ``axis`` with ``extent`` copies."""
        return self._unary("broadcast_along", axis=axis, extent=extent)

    def reshape(self, shape: Sequence[int]):
        """The same elements under a new shape; one extent may be -1 (inferred, as in NumPy)."""
        return self._unary("reshape", shape=_inferred_shape(self.shape, shape))

    def permute(self, order: Sequence[int]):
        return self._unary("permute", order=tuple(order))

    def narrow(self, axis: int, start: int, length: int):
        return self._unary("narrow", axis=axis, start=start, length=length)

    def pad(self, axis: int, start: int, extent: int):
        return self._unary("pad", axis=axis, start=start, extent=extent)

    def unfold(self, axis: int, size: int, step: int = 1, dilation: int = 1):
        return self._unary("unfold", axis=axis, size=size, step=step, dilation=dilation)

    def fold(self, axis: int, size: int, step: int, dilation: int, extent: int):
        return self._unary("fold", axis=axis, size=size, step=step, dilation=dilation, extent=extent)

    def gather(self, selection):
        """Rows of this table picked by ``selection``."""
        return self._express(_OP("gather"), (self, selection), {})

    def scatter(self, selection, extent: int | None = None):
        """Add rows into ``extent`` zero rows at the selection's indices (gather's adjoint)."""
        if extent is None:
            extent = selection.dtype.extent
        return self._express(_OP("scatter"), (self, selection), {"extent": extent})

    def log_softmax(self, axis: int):
        return self._unary("log_softmax", axis=axis)

    def logsumexp(self, axis: int):
        return self._unary("logsumexp", axis=axis)

    # -- composites: spellings that record only the opcodes above -------------------
    def relu(self):
        """max(x, 0)."""
        return self.maximum(0.0)

    def abs(self):
        """max(x, -x)."""
        return self.maximum(-self)

    def softplus(self):
        """log(1 + exp(x)), stable: relu(x) + log1p(exp(-|x|))."""
        return self.relu() + (-self.abs()).exp().log1p()

    def gelu(self):
        """Exact GELU: x * (1 + erf(x / sqrt(2))) / 2."""
        return self * (1.0 + (self * _SQRT_HALF).erf()) * 0.5

    def softmax(self, axis: int):
        """exp(log_softmax(x))."""
        if not _is_axis(axis, self.ndim):
            raise _refusal(
                f"softmax: axis {axis!r} is out of range for shape {list(self.shape)} (rank {self.ndim})",
                (f"topos axes are 0..{self.ndim - 1}" if self.ndim else "a rank-0 tensor has no axes")
                + ", and negative axes are not taken here (topos.nn.functional.softmax(x, -1) resolves them)",
            )
        return self.log_softmax(axis).exp()

    def mean(self):
        """Mean of every element (rank 0)."""
        return self.sum() / float(_volume(self.shape))

    def mean_along(self, axis: int):
        return self.sum_along(axis) / float(self.shape[axis])

    def transpose(self, order: Sequence[int] | None = None):
        """Reverse the axes (NumPy's ``.T``), or permute by ``order``."""
        return self.permute(tuple(reversed(range(self.ndim))) if order is None else order)

    @property
    def T(self):
        return self.transpose()

    def squeeze(self, axis: int):
        """Remove a size-1 axis."""
        if not 0 <= axis < self.ndim or self.shape[axis] != 1:
            raise _refusal(
                f"squeeze: axis {axis} of shape {list(self.shape)} is not a size-1 axis",
                "squeeze removes an axis of extent 1; sum_along or narrow reduce other axes",
            )
        return self.reshape(self.shape[:axis] + self.shape[axis + 1 :])

    def unsqueeze(self, axis: int):
        """Insert a size-1 axis at ``axis``."""
        if not 0 <= axis <= self.ndim:
            raise _refusal(
                f"unsqueeze: axis {axis} is out of range for shape {list(self.shape)}",
                f"the new axis goes at a position 0..{self.ndim}",
            )
        return self.reshape(self.shape[:axis] + (1,) + self.shape[axis:])

    def broadcast_to(self, shape: Sequence[int]):
        """NumPy's broadcasting rule, recorded as reshape and broadcast_along (or one broadcast)."""
        return _broadcast_to(self, (shape,) if isinstance(shape, numbers.Integral) else tuple(shape))

    def broadcast_like(self, other):
        return self.broadcast_to(other.shape)


def _volume(shape) -> int:
    return math.prod(shape)


def _inferred_shape(source, shape) -> tuple:
    """``shape`` with its one -1 replaced by the extent that keeps the volume of ``source``."""
    if isinstance(shape, numbers.Integral):
        shape = (shape,)
    shape = tuple(shape)
    if not all(_is_extent(d) or (d == -1 and _is_extent(-d)) for d in shape):
        raise _refusal(
            f"reshape: shape {list(shape)} has an extent that is neither a positive int nor -1",
            "extents are positive ints, with at most one -1 (inferred from the number of elements)",
        )
    holes = [i for i, d in enumerate(shape) if isinstance(d, numbers.Integral) and d == -1]
    if not holes:
        return shape
    rest = [d for i, d in enumerate(shape) if i not in holes]
    known = _volume(rest) if all(isinstance(d, numbers.Integral) and int(d) > 0 for d in rest) else 0
    if len(holes) > 1 or known == 0 or _volume(source) % known:
        raise _refusal(
            f"reshape: cannot infer the -1 extent of {list(shape)} from shape {list(source)} "
            f"({_volume(source)} elements)",
            "use at most one -1, and make the other extents divide the number of elements",
        )
    return shape[: holes[0]] + (_volume(source) // known,) + shape[holes[0] + 1 :]


def _refusal(detail: str, hint: str) -> Exception:
    """A ShapeError at the user's line for a composite, worded like an opcode's refusal."""
    return ShapeError(f"{user_site()}: {detail}\n  hint: {hint}")


_REFLECTED = {
    "add": "__radd__", "sub": "__rsub__", "mul": "__rmul__",
    "div": "__rtruediv__", "pow": "__rpow__", "matmul": "__rmatmul__",
}  # the opcodes spelled as operators, and the method Python asks of the right operand next


def _may_handle(other, reflected: str) -> bool:
    """True when ``other``'s type may take a payload in its reflected operator (a user's own type).

    Built-in and NumPy types, and torch or jax tensors, do not: they return
    NotImplemented and Python's own TypeError would follow, without a fix.
    """
    if type(other).__module__ in ("builtins", "numpy") or isinstance(other, np.generic) or _foreign(other):
        return False
    return hasattr(type(other), reflected)


def _foreign(other) -> bool:
    """A torch tensor, a jax array or another DLPack exporter (``topos.interop.numpy_array`` reads them)."""
    if isinstance(other, (np.ndarray, np.generic)):
        return False
    return _type_name(other).split(".")[0] in ("torch", "jax", "jaxlib") or hasattr(other, "__dlpack__")


def _type_name(other) -> str:
    kind = type(other)
    if kind.__module__ == "builtins":
        return kind.__name__
    return f"{kind.__module__.split('.')[0]}.{kind.__name__}"


def _is_element_scalar(other) -> bool:
    """A NumPy or ml_dtypes scalar of a registered element type (``ml_dtypes.bfloat16(2)``): a number."""
    return isinstance(other, np.generic) and is_element(other.dtype)


def _described(x) -> str:
    return f"{_spec(x)} {type(x).__name__}"


def _unsupported_operand(x, name: str, other) -> Exception:
    """The ShapeError for an operand arithmetic does not take, naming its type and the fix."""
    beside = f"beside a {_described(x)}"
    if isinstance(other, (bool, np.bool_)):
        detail = (f"the bool {other!r} {beside} is refused (True is not 1.0 here, as a boolean array is not); "
                  "write the number: 1.0 or 0.0, or float(flag)")
    elif isinstance(other, (numbers.Complex, np.complexfloating)):
        detail = (f"the complex number {other!r} {beside}: complex numbers are not supported; "
                  "pass the real part (z.real), or record real and imaginary parts as two Values")
    elif isinstance(other, (list, tuple)):
        detail = (f"a {type(other).__name__} {beside}; lists are not lifted: pass np.asarray(values, dtype=x.dtype), "
                  "or record it once with tape.leaf(np.asarray(values, dtype=x.dtype))")
    elif isinstance(other, (str, bytes)):
        detail = (f"the {type(other).__name__} {other!r} {beside}: text has no arithmetic; "
                  "convert it to a number first: float(text)")
    elif _foreign(other):
        detail = (f"a {_type_name(other)} {beside}; convert it to NumPy with topos.interop.numpy_array(tensor), "
                  "in the Value's element type, or record it as an input: "
                  "tape.input(topos.interop.numpy_array(tensor))")
    else:
        what = "None" if other is None else f"a {_type_name(other)}"
        detail = (f"{what} {beside} is not supported; arithmetic takes Python numbers, "
                  "NumPy arrays of the Value's element type, or Values of the same tape")
    return ShapeError(f"{name}: {detail}")


def _number_too_large(x, number) -> Exception:
    """The ShapeError for a finite number that would become inf in ``x``'s element type."""
    import decimal

    import ml_dtypes

    element = short_name(x.dtype)
    try:
        text = f"{float(number):.6g}"
    except OverflowError:  # an int past float64: 10**400 reads 1e+400
        mantissa, exponent = f"{decimal.Decimal(int(number)):.6e}".split("e")
        text = f"{mantissa.rstrip('0').rstrip('.')}e{exponent}"
    largest = float(ml_dtypes.finfo(x.dtype).max)
    wider = "" if x.dtype == np.float64 else ", or record the Value in float64"
    return ShapeError(
        f"the number {text} beside a {_described(x)} does not fit {element} (largest {largest:.6g}); "
        f"scale it{wider}"
    )


def _is_extent(d) -> bool:
    return isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_)) and bool(d >= 1)


def _broadcast_to(x, shape):
    source = x.shape
    if not all(_is_extent(d) for d in shape):
        raise _refusal(
            f"broadcast_to: the target shape {list(shape)} has an extent that is not a positive int",
            "every extent of the target is an int >= 1; NumPy's -1 is not taken here: spell the extent out",
        )
    if len(source) > len(shape) or any(
        s not in (1, t) for s, t in zip(reversed(source), reversed(shape))
    ):
        raise _refusal(
            f"broadcast_to: {list(source)} cannot broadcast to {list(shape)} under NumPy's rule "
            "(trailing axes must match or be 1)",
            "reshape the operand so that each axis, counted from the last, equals the target's or is 1",
        )
    if source == shape:
        return x
    if _volume(source) == 1:
        return x.broadcast(shape)
    aligned = (1,) * (len(shape) - len(source)) + source
    kept = [i for i, (s, t) in enumerate(zip(aligned, shape)) if s == t]
    core = tuple(aligned[i] for i in kept)
    y = x if core == source else x.reshape(core)
    for axis, extent in enumerate(shape):
        if axis not in kept:
            y = y.broadcast_along(axis, extent)
    return y


def concat(values: Sequence[Recordable], axis: int):
    """Join tensors along an existing axis: each is zero-padded to the total and summed.

    Spelled with pad and add, so a -0.0 element comes out as +0.0
    (-0.0 + 0.0), as in the compiled step.
    """
    values = _joined_operands("concat", values)
    first = values[0]
    if not _is_axis(axis, first.ndim):
        raise _refusal(
            f"concat: axis {axis!r} is out of range for operand 0 {_spec(first)} (rank {first.ndim})",
            f"join along an existing axis 0..{first.ndim - 1} (negative axes are not taken), "
            "or stack along a new one",
        )
    for position, v in enumerate(values[1:], start=1):
        others = [i for i in range(first.ndim) if i != axis]
        if v.ndim != first.ndim or any(v.shape[i] != first.shape[i] for i in others):
            raise _refusal(
                f"concat: shapes {list(first.shape)} and {list(v.shape)} differ outside axis {axis} "
                f"(operands 0 and {position})",
                "every operand must match the others on all axes but the joined one",
            )
    total = sum(v.shape[axis] for v in values)
    offset, result = 0, None
    for v in values:
        placed = v if v.shape[axis] == total else v.pad(axis, offset, total)
        result = placed if result is None else result + placed
        offset += v.shape[axis]
    return result


def stack(values: Sequence[Recordable], axis: int):
    """Join equal-shaped tensors along a new axis."""
    values = _joined_operands("stack", values)
    first = values[0]
    if not _is_axis(axis, first.ndim + 1):
        raise _refusal(
            f"stack: axis {axis!r} is out of range for operands of shape {list(first.shape)}",
            f"the new axis goes at a position 0..{first.ndim} (negative axes are not taken)",
        )
    for position, v in enumerate(values[1:], start=1):
        if v.shape != first.shape:
            raise _refusal(
                f"stack: shapes {list(first.shape)} and {list(v.shape)} differ (operands 0 and {position})",
                "stack joins equal-shaped tensors along a new axis; concat joins along an existing one",
            )
    return concat([v.unsqueeze(axis) for v in values], axis)


def _joined_operands(what: str, values) -> list:
    """concat's or stack's operands as a list of payloads of one element type, or a refusal naming the bad one."""
    if isinstance(values, Recordable) or not isinstance(values, (Sequence, Iterator)) or isinstance(values, str):
        raise _refusal(
            f"{what}: takes a list of Values, got a {_type_name(values)}",
            f"pass them in a list: topos.{what}([a, b], axis)",
        )
    values = list(values)
    if not values:
        raise _refusal(f"{what}: no operands", f"pass at least one Value: topos.{what}([a, b], axis)")
    for position, v in enumerate(values):
        if not isinstance(v, Recordable):
            fix = ("record it first with tape.leaf(topos.interop.numpy_array(tensor))" if _foreign(v)
                   else "record it first with tape.leaf(array)")
            raise _refusal(f"{what}: operand {position} is a {_type_name(v)}", fix)
    first = values[0]
    for position, v in enumerate(values[1:], start=1):
        if v.dtype != first.dtype:
            raise _refusal(
                f"{what}: element types differ: operand 0 is {_spec(first)}, operand {position} is {_spec(v)}",
                "every operand must have the same element type; record them all in one dtype",
            )
    return values


def _is_axis(axis, bound: int) -> bool:
    return isinstance(axis, (int, np.integer)) and not isinstance(axis, bool) and bool(0 <= axis < bound)


def _spec(x) -> str:
    return f"{list(x.shape)} {short_name(x.dtype)}"
