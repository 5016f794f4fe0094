"""Recording: a tape appends nodes, a Value proxies one node while the tape is open.

Shapes and element types are inferred at the recording line; a mismatch
raises there, naming the line, the opcode, both shapes and a fix.
Sealing freezes the tape into a :class:`~topos.spec.network.Network`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import numpy as np

from topos.base.arguments import flag
from topos.base.copies import is_splat, splat, splat_element
from topos.base.element import Selection, SelectionType, is_element, short_name
from topos.base.errors import ArgumentError, DifferentiationError, RecordingError, SealedError, ShapeError, SymbolError
from topos.base.provenance import Site, user_site
from topos.spec.network import Columns, Network, Payloads, describe_columns
from topos.spec.opcodes import Opcode, Spec, by_name
from topos.spec.opcodes.base import check_size
from topos.spec.recordable import Recordable
from topos.spec.symbol import Family, Symbol

_LEAF, _PARAMETER, _INPUT = by_name("leaf"), by_name("parameter"), by_name("input")


class Value(Recordable):
    """A recording proxy for one node on an open tape; arithmetic on it records nodes."""

    __slots__ = ("_tape", "_index")

    def __init__(self, tape: Tape, index: int):
        self._tape = tape
        self._index = index

    @property
    def shape(self) -> tuple[int, ...]:  # type: ignore[override]  # Recordable declares what a payload has
        return self._tape._specs[self._index].shape

    @property
    def dtype(self):
        return self._tape._specs[self._index].dtype

    @property
    def symbol(self) -> Symbol:
        return Symbol(self._tape._family, self._index)

    @property
    def tape(self) -> Tape:
        return self._tape

    @property
    def name(self) -> str | None:
        """The node's name, if it is a named parameter or input (see ``tape.name``)."""
        return self._tape._names.get(self._index)

    @property
    def trainable(self) -> bool:
        """True for a parameter slot that is not state."""
        return self._tape._opcodes[self._index].name == "parameter" and self._index not in self._tape._state

    def _express(self, opcode, operands, attributes):
        return self._tape._append(opcode, operands, attributes)

    def _constant(self, array):
        return self._tape.leaf(array)

    def _repr_html_(self) -> str:
        from topos.views.display import value_card  # the Jupyter card, loaded only when a notebook asks

        return value_card(self)

    def __repr__(self) -> str:
        spec = self._tape._specs[self._index]
        return f"Value(%{self._index} {self._tape._opcodes[self._index].name} {spec})"

    def __bool__(self):
        raise TypeError("a Value has no truth value while recording; shapes are static, so branch on .shape")

    def __getitem__(self, index):
        raise ShapeError(
            f"{user_site()}: a Value cannot be indexed with [] ({self!r}); "
            "to pick rows of a table use table.gather(topos.selection(indices, extent)) "
            "(or a selection input), and to slice use narrow(axis, start, length)"
        )

    def __iter__(self):
        raise TypeError(f"a Value cannot be iterated ({self!r}); shapes are static, so loop over range(extent)")

    def _no_comparison(self, other):
        raise ShapeError(
            f"{user_site()}: comparisons of Values are not recorded ({self!r}); the vocabulary compares "
            "with step: x.step(t) is 1 where x >= t, else 0 (so x < t is 1 - x.step(t)); to compare "
            "shapes, compare .shape"
        )

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _no_comparison

    __hash__ = object.__hash__


_recording = threading.local()


class Tape:
    """An open recording: append-only nodes with static shapes.

    Use :meth:`record` to build and seal in one call, or create a tape,
    record on it (``with tape:`` makes it the recording in progress, which
    ``topos.nn`` modules build on), and call :meth:`seal`.
    """

    def __init__(self, _family: Family | None = None, *, seed: int = 0):
        self._family = _family or Family()
        self._opcodes: list[Opcode] = []
        self._operands: list[tuple[int, ...]] = []
        self._attributes: list[tuple[tuple[str, Any], ...]] = []
        self._specs: list[Spec] = []
        self._sites: list[Site] = []
        self._payloads: dict[int, np.ndarray] = {}
        # Source metadata beside the columns: a name per named source, the
        # parameter slots that are state (never differentiated), the inputs
        # that must be fed, and the recorded next value of each state slot
        # a training reading advances (so a step that drops it is refused).
        self._names: dict[int, str] = {}
        self._state: set[int] = set()
        self._required: set[int] = set()
        self._nexts: dict[int, int] = {}
        self._slots: list[int] = []  # the parameter nodes, then the input nodes, each in recording order
        self._inputs: list[int] = []
        self._seed = seed
        self._generator = None
        self._frozen_below = 0  # nodes of the network this tape reopened: their names are history
        self._sealed = False

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def record(cls, fn: Callable[[Tape], Any], *, seed: int = 0):
        """Record ``fn(tape)``, seal, and return ``(network, symbols)``.

        While ``fn`` runs the tape is the recording in progress (see
        :meth:`current`). ``seed`` seeds :attr:`generator`, which modules
        draw their initial weights from unless given a generator of their
        own. Whatever ``fn`` returns is detached: any nesting of tuples,
        lists and dicts of Values becomes the same structure of Symbols.
        """
        tape = cls(seed=seed)
        with tape:
            result = fn(tape)
        return tape.seal(), detach(result)

    @staticmethod
    def current() -> Tape:
        """The recording in progress: the innermost ``Tape.record`` or ``with tape:`` block."""
        stack = getattr(_recording, "stack", None)
        if not stack:
            raise RecordingError(
                f"{user_site()}: no recording is in progress; build modules and record "
                "inside Tape.record(fn) (or a `with tape:` block)"
            )
        return stack[-1]

    def __enter__(self) -> Tape:
        self._check_open()
        if not hasattr(_recording, "stack"):
            _recording.stack = []
        _recording.stack.append(self)
        return self

    def __exit__(self, *exc) -> None:
        stack = _recording.stack
        if stack and stack[-1] is self:
            stack.pop()

    @property
    def generator(self):
        """The recording's ``topos.init.Generator`` (seeded by ``Tape.record(..., seed=)``, default 0)."""
        if self._generator is None:
            from topos.init import Generator

            self._generator = Generator(self._seed)
        return self._generator

    def leaf(self, value) -> Value:
        """A constant node holding ``value`` (an array, a number, or a selection)."""
        return self._source(_LEAF, value)

    def parameter(self, initial, *, name: str | None = None, trainable: bool = True) -> Value:
        """A slot of ``network.parameters()``; ``initial`` fills it.

        ``name`` (a dotted path such as ``fc1.weight``) names it in
        describe, errors, MLIR locations and checkpoints; unnamed slots are
        called ``%<index>``. ``trainable=False`` makes it *state*: carried
        between steps like a parameter (optimizer moments, running
        statistics), but refused as a ``wrt`` of ``differentiate``.
        """
        trainable = flag("tape.parameter", "trainable", trainable)  # "no" is truthy: it would mean yes
        if isinstance(initial, Selection):  # its slot would hold int64 indices, which no table can carry
            raise ShapeError(
                f"{user_site()}: parameter: a selection (index<{initial.extent}>, shape "
                f"{list(initial.indices.shape)}) cannot be a parameter; selections are indices, not weights: "
                "feed it per run with tape.input(selection) or record it as a constant with tape.leaf(selection)"
            )
        value = self._source(_PARAMETER, initial)
        if not trainable:
            self._state.add(value._index)
        if name is not None:
            self.name(value, name)
        return value

    def input(self, default=None, *, name: str | None = None, shape=None, dtype=None,
              extent: int | None = None, required: bool | None = None) -> Value:
        """A node fed per run.

        With ``default`` (an array, a number or a selection) the default
        fixes shape and element type and is used when the input is not fed.
        Without one, give ``shape`` and ``dtype`` (float32 by default) or
        ``extent`` (a selection of indices in ``[0, extent)``): the input is
        *required*, and a run that does not feed it fails (``required=False``
        gives it a default of zeros instead). ``required=True`` makes an
        input with a default required too (the default then only fixes the
        spec).
        """
        if required is not None:
            required = flag("tape.input", "required", required)  # "no" is truthy: it would mean yes
        if default is None:
            if shape is None:
                raise ShapeError(
                    f"{user_site()}: input: give a default, or shape= with dtype= (or extent= for indices)"
                )
            site = user_site()
            spec = _declared_spec(shape, dtype, extent, site)
            required = True if required is None else required
            if required:  # the spec alone: no default is made, so a shape beyond this machine's memory costs none
                self._check_open()
                value = self._push(_INPUT, (), (), spec, site, None)
            else:
                value = self._source(_INPUT, _zeros(spec))
        else:
            if shape is not None or dtype is not None or extent is not None:
                raise ShapeError(f"{user_site()}: input: give either a default or shape/dtype/extent, not both")
            value = self._source(_INPUT, default)
        if required:
            self._required.add(value._index)
            self._payloads.pop(value._index, None)  # a required input has no default to fall back on
        if name is not None:
            self.name(value, name)
        return value

    def name(self, value, name: str) -> Value:
        """Name (or rename, while the tape is open) a parameter or input node; returns it.

        Names are unique within a network (checked when sealing), contain
        no whitespace and do not start with ``%``.
        """
        self._check_open()
        index = self._index_of(value)
        kind = self._opcodes[index].name
        if kind not in ("parameter", "input"):
            raise SymbolError(f"{user_site()}: only parameters and inputs take names; %{index} is a {kind}")
        if index < self._frozen_below:
            raise SealedError(
                f"{user_site()}: %{index} belongs to the sealed network this tape continues; its name is "
                "part of that spec and cannot change"
            )
        check_name(name)
        self._names[index] = name
        return Value(self, index)

    def _index_of(self, value) -> int:
        """The node of a Value of this tape, or of a Symbol resolved onto it."""
        return (value if isinstance(value, Value) and value._tape is self else self.resolve(value))._index

    def state_next(self, state, new) -> None:
        """Note that ``new`` is the next value of the state slot ``state`` (a running statistic, say).

        A training step whose Updates leave that slot out is refused
        (``compiled.step``, ``Updates.apply``, ``training_step``): the
        value is computed, so dropping it is a mistake, not a choice.
        """
        self._check_open()
        slot = self._index_of(state)
        if slot not in self._state:
            raise SymbolError(f"{user_site()}: state_next takes a state slot (tape.parameter(..., trainable=False)); "
                              f"%{slot} is not one")
        self._nexts[slot] = self._index_of(new)

    def resolve(self, symbol: Symbol) -> Value:
        """The Value of ``symbol`` on this tape (for example after ``network.reopen()``)."""
        self._check_open()
        self._check_symbol(symbol)
        return Value(self, symbol.index)

    def seal(self):
        """Freeze the recording into an immutable Network; this tape cannot record again."""
        self._check_open()
        _check_unique_names(self)
        self._sealed = True
        columns = Columns(
            tuple(self._opcodes), tuple(self._operands), tuple(self._attributes), tuple(self._specs),
            tuple(self._sites), Payloads(MappingProxyType(dict(self._payloads))), MappingProxyType(dict(self._names)),
            frozenset(self._state), frozenset(self._required), MappingProxyType(dict(self._nexts)),
            tuple(self._slots), tuple(self._inputs),
        )
        return Network.from_columns(self._family, columns, type(self)._continuing)

    @classmethod
    def _continuing(cls, network: Network) -> Tape:
        """A tape holding ``network``'s nodes, recording after them (what ``network.reopen()`` returns)."""
        columns = network.columns
        tape = cls(_family=network.family)
        tape._opcodes = list(columns.opcodes)
        tape._operands = list(columns.operands)
        tape._attributes = list(columns.attributes)
        tape._specs = list(columns.specs)
        tape._sites = list(columns.sites)
        tape._payloads = dict(network._payloads)
        tape._names = dict(columns.names)
        tape._state = set(columns.state)
        tape._required = set(columns.required)
        tape._nexts = dict(columns.nexts)
        tape._slots, tape._inputs = list(columns.slots), list(columns.inputs)
        tape._frozen_below = len(network)
        return tape

    @property
    def columns(self) -> Columns:
        """The recording so far, column by column (``topos.spec.network.Columns``): the tape's own lists, to read."""
        return Columns(self._opcodes, self._operands, self._attributes, self._specs, self._sites,
                       Payloads(self._payloads), self._names, self._state, self._required, self._nexts,
                       self._slots, self._inputs)

    # -- differentiation ----------------------------------------------------------------------
    def differentiate(self, loss, wrt):
        """Append d loss / d wrt as ordinary nodes (recorded reverse mode) -> Adjoints.

        ``loss`` must be rank 0. ``wrt`` lists parameters or inputs (Values
        or Symbols); one that the loss does not depend on gets a recorded zero.
        """
        from topos.readings.differentiate import record_vjp

        return record_vjp(self, loss, None, _wrt_list(wrt, "differentiate"), require_scalar=True)

    def vjp(self, target, seed, wrt):
        """Append the vector-Jacobian product seed^T * d target / d wrt -> Adjoints.

        ``seed`` has the target's shape: an array (recorded as a leaf) or a
        Value, which may itself be computed (a gradient gives a
        Hessian-vector product).
        """
        from topos.readings.differentiate import record_vjp

        return record_vjp(self, target, seed, _wrt_list(wrt, "vjp"), require_scalar=False)

    def compact(self, start: int, keep) -> dict[int, int]:
        """Drop the nodes appended since ``start`` that no Value of ``keep`` needs; return old -> new indices.

        For a reading that appends and then prunes before any Value of the
        dropped nodes escapes: ``differentiate`` runs every rule, which computes
        a cotangent for every operand, and keeps only the chain rule in use
        (the gradient of a constant exponent, say, is dropped). Only computed
        nodes and leaves may stand after ``start``: a parameter or an input is
        a slot the caller holds a name or a Symbol of.
        """
        self._check_open()
        end = len(self)
        is_index = isinstance(start, (int, np.integer)) and not isinstance(start, bool)
        if not is_index or not self._frozen_below <= start <= end:
            raise ArgumentError(f"{user_site()}: compact(start=...) takes a node index of this tape in "
                                f"[{self._frozen_below}, {end}], got {start!r}")
        keep = list(keep)
        for value in keep:
            if not isinstance(value, Value) or value._tape is not self:
                raise SymbolError(f"{user_site()}: compact keeps Values of this tape, got {value!r}")
        if any(i >= start for i in (*self._slots, *self._inputs)):
            raise ArgumentError(f"{user_site()}: compact drops only computed nodes and leaves, and a parameter or "
                                f"an input was recorded after %{start}; compact from after it")
        needed = set()
        stack = [v._index for v in keep if v._index >= start]
        while stack:
            i = stack.pop()
            if i in needed:
                continue
            needed.add(i)
            stack.extend(j for j in self._operands[i] if j >= start)
        renumber = {i: i for i in range(start)}
        rows = list(zip(self._opcodes[start:end], self._operands[start:end], self._attributes[start:end],
                        self._specs[start:end], self._sites[start:end]))
        payloads = {i: self._payloads.pop(i) for i in range(start, end) if i in self._payloads}
        for column in (self._opcodes, self._operands, self._attributes, self._specs, self._sites):
            del column[start:]
        for offset, row in enumerate(rows):
            old = start + offset
            if old not in needed:
                continue
            new = len(self._opcodes)
            renumber[old] = new
            opcode, operands, attributes, spec, site = row
            self._opcodes.append(opcode)
            self._operands.append(tuple(renumber[j] for j in operands))
            self._attributes.append(attributes)
            self._specs.append(spec)
            self._sites.append(site)
            if old in payloads:
                self._payloads[new] = payloads[old]
        self._slots = [renumber[i] for i in self._slots if i in renumber]
        self._inputs = [renumber[i] for i in self._inputs if i in renumber]
        return renumber

    def locate(self, value: Value, site: Site) -> None:
        """Say that the newest node, ``value``, was recorded at ``site``: for a reading that rebuilds a spec
        from elsewhere (topos IR read back names each node's line from its op's location)."""
        if not isinstance(value, Value) or value._tape is not self or value._index != len(self._opcodes) - 1:
            raise SymbolError(f"locate takes the newest Value of this tape, got {value!r}")
        if not isinstance(site, Site):
            raise ArgumentError(f"locate takes a topos.base.provenance.Site, got {type(site).__name__}")
        self._sites[-1] = site

    # -- introspection ----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._opcodes)

    @property
    def sealed(self) -> bool:
        return self._sealed

    def describe(self) -> str:
        """One line per node recorded so far, then a summary."""
        return describe_columns(self.columns, "tape")

    def _repr_html_(self) -> str:
        from topos.views.display import tape_card  # the Jupyter card, loaded only when a notebook asks

        return tape_card(self)

    # -- internals ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._sealed:
            raise SealedError(
                "this tape is sealed; reopen the network (network.reopen()) and "
                "resolve symbols on the new tape to record more"
            )

    def _check_symbol(self, symbol: Symbol) -> None:
        if not isinstance(symbol, Symbol) or symbol.family is not self._family:
            raise SymbolError(f"{symbol!r} does not belong to this tape's family")
        if not 0 <= symbol.index < len(self._opcodes):
            raise SymbolError(f"{symbol!r} is beyond this tape's {len(self._opcodes)} nodes")

    def _source(self, opcode: Opcode, value) -> Value:
        self._check_open()
        site = user_site()
        array, dtype = _payload(value, opcode.name, site)
        return self._push(opcode, (), (), Spec(array.shape, dtype), site, array)

    def _append(self, opcode: Opcode, operands, attributes: dict) -> Value:
        self._check_open()
        indices = []
        for position, operand in enumerate(operands):
            if not isinstance(operand, Value):
                raise SymbolError(
                    f"{user_site()}: {opcode.name}: operand {position} is a "
                    f"{type(operand).__name__}, not a Value of this tape"
                )
            if operand._tape is not self:
                if operand._tape._sealed and operand._tape._family is self._family:
                    raise SealedError(
                        f"{user_site()}: {opcode.name}: operand {position} is a Value of a sealed tape; "
                        "use tape.resolve(symbol) to bring it onto the reopened tape"
                    )
                raise SymbolError(
                    f"{user_site()}: {opcode.name}: operand {position} belongs to another tape; "
                    "values of two tapes cannot be mixed"
                )
            indices.append(operand._index)
        ordered = tuple(
            (name, _freeze(attributes[name])) for name in opcode.attribute_names if name in attributes
        )
        unknown = set(attributes) - set(opcode.attribute_names)
        site = user_site()
        if unknown or len(ordered) != len(opcode.attribute_names):
            raise ShapeError(
                f"{site}: {opcode.name}: attributes {sorted(attributes)} given, "
                f"expected exactly {list(opcode.attribute_names)}"
            )
        spec = opcode.checked([self._specs[i] for i in indices], dict(ordered), site)
        return self._push(opcode, tuple(indices), ordered, spec, site, None)

    def _push(self, opcode, operands, attributes, spec, site, payload) -> Value:
        index = len(self._opcodes)
        self._opcodes.append(opcode)
        self._operands.append(operands)
        self._attributes.append(attributes)
        self._specs.append(spec)
        self._sites.append(site)
        if payload is not None:
            self._payloads[index] = payload
        if opcode.is_source and opcode.name != "leaf":
            (self._slots if opcode.name == "parameter" else self._inputs).append(index)
        return Value(self, index)


def check_name(name) -> str:
    """Refuse a source name that could not travel through describe, MLIR locations and checkpoints."""
    if (not isinstance(name, str) or not name or name.startswith("%")
            or any(c.isspace() or not c.isprintable() for c in name)):  # a control character breaks every printout
        raise SymbolError(
            f"{user_site()}: {name!r} is not a valid name; names are non-empty strings without "
            "whitespace or control characters that do not start with '%' (for example 'blocks.0.attn.qkv.weight')"
        )
    return name


def _check_unique_names(tape) -> None:
    seen: dict[str, int] = {}
    for index, name in sorted(tape._names.items()):
        if name in seen:
            first = seen[name]
            raise SymbolError(
                f"two sources are named {name!r}: %{first} (recorded at {tape._sites[first]}) and "
                f"%{index} (recorded at {tape._sites[index]}); names must be unique: put the modules "
                "in one parent Module so their paths differ, or pass distinct name= arguments"
            )
        seen[name] = index


def _declared_shape(shape) -> tuple[int, ...]:
    """``input(shape=...)``'s shape as a tuple of extents >= 1, or a ShapeError naming it."""
    extents = (shape,) if isinstance(shape, (int, np.integer)) else shape
    try:
        extents = tuple(extents)
    except TypeError:
        extents = None
    if extents is None or not all(
        isinstance(e, (int, np.integer)) and not isinstance(e, (bool, np.bool_)) and e >= 1 for e in extents
    ):
        raise ShapeError(
            f"{user_site()}: input: shape= must be a tuple of ints, each at least 1, got {shape!r}; "
            "every extent of a recorded tensor is fixed and positive (record one graph per shape)"
        )
    return tuple(int(e) for e in extents)


def _declared_spec(shape, dtype, extent, site: Site) -> Spec:
    """The spec ``input(shape=, dtype=, extent=)`` declares, or a ShapeError naming the argument at fault."""
    shape = _declared_shape(shape)
    if extent is not None:
        extent = Selection(np.zeros(1, np.int64), extent).extent  # topos.selection's own check of the extent
        spec = Spec(shape, SelectionType(extent))
    else:
        try:
            element = np.dtype(np.float32 if dtype is None else dtype)
        except (TypeError, ValueError):
            raise ShapeError(
                f"{site}: input: dtype={dtype!r} is not an element type; use float32, float64 or "
                "ml_dtypes.bfloat16 (for integer indices give extent= instead)"
            ) from None
        spec = Spec(shape, _element_type(element, "input", site))
    check_size(spec, f"{site}: input: ")
    return spec


def _zeros(spec: Spec):
    """A default of zeros for ``spec``: floats as one stored element (a splat), a selection's indices whole."""
    if isinstance(spec.dtype, SelectionType):
        return Selection(np.zeros(spec.shape, np.int64), spec.dtype.extent)
    return splat(np.zeros((), spec.dtype), spec.shape)


def _wrt_list(wrt, method: str) -> list:
    """``wrt`` as a list, or a DifferentiationError for the usual slips (a module, an uncalled method)."""
    if hasattr(wrt, "parameters") and callable(wrt.parameters) and hasattr(wrt, "named_parameters"):
        raise DifferentiationError(
            f"{user_site()}: {method}: wrt is the module {type(wrt).__name__} itself; pass its parameters, "
            "module.parameters() (call it)"
        )
    if callable(wrt):
        owner = getattr(getattr(wrt, "__self__", None), "__class__", None)
        called = f"{owner.__name__}.{wrt.__name__}()" if owner is not None and hasattr(wrt, "__name__") else "it"
        raise DifferentiationError(
            f"{user_site()}: {method}: wrt is a {type(wrt).__name__}, not a list of parameters; pass "
            f"{called} (call it), e.g. model.parameters()"
        )
    if isinstance(wrt, (str, bytes)) or not hasattr(wrt, "__iter__") or isinstance(wrt, Value):
        raise DifferentiationError(
            f"{user_site()}: {method}: wrt must be a list of parameters or inputs (Values or Symbols), got "
            f"{type(wrt).__name__}" + ("; wrap one in a list: [w]" if isinstance(wrt, Value) else "")
        )
    items = list(wrt)
    for item in items:
        if hasattr(item, "parameters") and callable(item.parameters) and hasattr(item, "named_parameters"):
            raise DifferentiationError(
                f"{user_site()}: {method}: wrt holds the module {type(item).__name__}; list its parameters "
                "instead: module.parameters(), or [*a.parameters(), *b.parameters()] for several"
            )
    return items


def _freeze(value):
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, np.integer):
        return int(value)
    return value


def _payload(value, kind: str, site: Site) -> tuple[np.ndarray, Any]:
    """Turn a recorded payload into a read-only array and its element type."""
    dtype: Any
    if isinstance(value, Selection):
        array = value.indices.copy()
        dtype = SelectionType(value.extent)
    elif isinstance(value, Recordable):
        raise ShapeError(f"{site}: {kind}: payload is a Value; sources take arrays or numbers")
    else:
        if is_splat(value):  # one stored element (a lifted number, np.broadcast_to): kept that way
            array = splat(splat_element(value), value.shape)
        else:
            array = _converted(value, kind, site)
            if array.dtype.kind in "iub" and not isinstance(value, np.ndarray):
                array = array.astype(np.float64)  # a bare Python number or list means float64
        dtype = _element_type(array.dtype, kind, site)
    if array.size == 0:
        raise ShapeError(f"{site}: {kind}: empty tensors (shape {list(array.shape)}) are not allowed")
    array.flags.writeable = False
    return array, dtype


def _element_type(dtype: np.dtype, kind: str, site: Site) -> np.dtype:
    """``dtype`` if a source may hold it, else a ShapeError naming the element types it may."""
    if not is_element(dtype):
        raise ShapeError(
            f"{site}: {kind}: element type {dtype} is not supported; "
            "use float32, float64 or ml_dtypes.bfloat16 (integer indices go in topos.selection)"
        )
    return dtype


def _converted(value, kind: str, site: Site) -> np.ndarray:
    """``np.array(value)``, or a ShapeError naming a payload NumPy cannot make one array of (a ragged list)."""
    try:
        return np.array(value)
    except (ValueError, TypeError) as error:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        if "inhomogeneous" in str(error):
            problem = "is ragged (its rows differ in length), so it is no tensor; give every row the same length"
        else:
            problem = f"does not convert to an array ({error}); pass numbers"
        raise ShapeError(
            f"{site}: {kind}: the payload {shown} {problem}, or pass a NumPy array of the shape you mean"
        ) from None


def detach(result):
    """Replace every Value in a nest of tuples, lists and dicts by its Symbol."""
    if isinstance(result, Value):
        return result.symbol
    if isinstance(result, tuple):
        return tuple(detach(r) for r in result)
    if isinstance(result, list):
        return [detach(r) for r in result]
    if isinstance(result, dict):
        return {k: detach(v) for k, v in result.items()}
    if hasattr(result, "detach") and not isinstance(result, type):
        return result.detach()
    return result


__all__ = ["Tape", "Value", "detach", "short_name"]

