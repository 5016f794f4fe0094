"""Modules: PyTorch-shaped containers of parameters, built during a recording and called on Values.

A module is bookkeeping over the public API and nothing more: assigning
``self.weight = Parameter(array)`` records ``tape.parameter(array)`` on the
recording in progress (``Tape.current()``), assigning a module makes it a
child, and calling the module records whatever its ``forward`` spells. The
parameters are ordinary nodes of the spec; a hand-written recording with
the same names records the same network.

Names follow PyTorch's ``state_dict``: a parameter is called by the path of
attribute names from the outermost module down (``blocks.0.attn.in_proj_weight``).
Because a child is built before its parent adopts it, every adoption
renames the child's nodes with the longer path (``tape.name``); the names
are final once the outermost module is built, and sealing checks they are
unique.

State that is carried between steps but never differentiated (BatchNorm's
running statistics) is a ``Buffer``: a slot recorded with
``trainable=False``. A module whose training reading computes the next
value of a buffer records that pair; ``module.state_updates()`` gathers
them as ``topos.Updates`` for the training entry, beside the optimizer's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import numpy as np

from topos import ArgumentError, RecordingError, SelectionType, ShapeError, Tape, Updates, Value
from topos.base.provenance import user_site


class _Slot:
    """What ``Parameter``/``Buffer`` return: a request, turned into a recorded slot on assignment."""

    __slots__ = ("initial", "trainable")

    def __init__(self, initial, trainable: bool):
        self.initial, self.trainable = initial, trainable


def Parameter(initial) -> Value:  # noqa: N802 - PyTorch's spelling
    """Assign to a module attribute to record a trainable slot holding ``initial``.

    Typed as the Value the attribute holds once assigned: the module records it then.
    """
    return cast(Value, _Slot(initial, trainable=True))


def Buffer(initial) -> Value:  # noqa: N802 - PyTorch's spelling
    """Assign to a module attribute to record a state slot (carried between steps, never differentiated)."""
    return cast(Value, _Slot(initial, trainable=False))


class Module:
    """The base of every layer: children, named parameters and buffers, ``forward`` on Values.

    Subclasses call ``super().__init__()`` first, then assign
    ``Parameter``/``Buffer``/``Module`` attributes, and define ``forward``.
    """

    _tape: Tape
    _parameters: dict[str, Value]
    _buffers: dict[str, Value]
    _inputs: dict[str, Value]
    _aliases: dict[str, Value]
    _children: dict[str, Module]
    _parent: Module | None
    _key: str
    _updates: list[tuple[Value, Value]]

    def __init__(self):
        tape = _current()
        if tape is None:
            raise RecordingError(
                f"{user_site()}: {type(self).__name__} is built during a recording; create it inside "
                "the function you pass to Tape.record (or inside a `with tape:` block)"
            )
        set_ = object.__setattr__
        set_(self, "_tape", tape)
        set_(self, "_parameters", {})  # attribute -> Value, the slots this module recorded
        set_(self, "_buffers", {})
        set_(self, "_inputs", {})  # attribute -> Value, inputs its forward recorded (dropout masks)
        set_(self, "_aliases", {})  # attribute -> Value owned by another module (tied weights)
        set_(self, "_children", {})
        set_(self, "_parent", None)
        set_(self, "_key", "")
        set_(self, "_updates", [])  # (state Value, next Value) recorded by training readings

    # -- registration ----------------------------------------------------------------------
    def __setattr__(self, key: str, value) -> None:
        if "_tape" not in self.__dict__:
            raise RecordingError(
                f"{type(self).__name__}.__init__ must call super().__init__() before assigning {key!r}"
            )
        self._forget(key)
        if isinstance(value, _Slot):
            value = self._record_source(key, value.initial, value.trainable)
        elif isinstance(value, Module):
            self._adopt(key, value)
        elif isinstance(value, Value) and value.tape is self._tape and value.name is not None:
            self._aliases[key] = value  # a slot another module owns: tied, named by its owner
        object.__setattr__(self, key, value)

    def __delattr__(self, key: str) -> None:
        self._forget(key)
        object.__delattr__(self, key)

    def _forget(self, key: str) -> None:
        for table in (self._parameters, self._buffers, self._inputs, self._aliases, self._children):
            table.pop(key, None)

    def _record_source(self, key: str, initial, trainable: bool) -> Value:
        value = self._tape.parameter(initial, trainable=trainable, name=self._path_of(key))
        (self._parameters if trainable else self._buffers)[key] = value
        return value

    def _adopt(self, key: str, child: Module) -> None:
        if child._tape is not self._tape:
            raise RecordingError(
                f"{user_site()}: {key!r} was built on another recording; build every module of a "
                "model inside the same recording"
            )
        ancestor: Module | None = self
        while ancestor is not None:
            if ancestor is child:  # a loop in the tree: every walk of it (paths, repr, parameters) never ends
                raise RecordingError(
                    f"{user_site()}: {type(self).__name__}.{key}: assigning {type(child).__name__} would make a "
                    "module its own descendant; keep back-references out of the module tree (store them in a "
                    "plain dict, or pass them to forward)"
                )
            ancestor = ancestor._parent
        self._children[key] = child
        if child._parent is None:  # a module shared by two parents keeps its first path
            object.__setattr__(child, "_parent", self)
            object.__setattr__(child, "_key", key)
            child._rename()

    def record_input(self, key: str, default) -> Value:
        """Record an input this module owns (named by its path), for example a dropout mask."""
        value = self._tape.input(default, name=self._path_of(key))
        self._inputs[key] = value
        return value

    def record_update(self, buffer: Value, new: Value) -> None:
        """Note that this reading computed ``new``, the next value of the state slot ``buffer``."""
        self._updates.append((buffer, new))
        self._tape.state_next(buffer, new)  # a step whose Updates drop it is then refused

    def _rename(self) -> None:
        for table in (self._parameters, self._buffers, self._inputs):
            for key, value in table.items():
                self._tape.name(value, self._path_of(key))
        for child in self._children.values():
            if child._parent is self:
                child._rename()

    # -- paths and traversal ---------------------------------------------------------------
    @property
    def path(self) -> str:
        """The dotted path from the outermost module (``""`` for the outermost itself)."""
        if self._parent is None:
            return ""
        prefix = self._parent.path
        return f"{prefix}.{self._key}" if prefix else self._key

    def _path_of(self, key: str) -> str:
        prefix = self.path
        return f"{prefix}.{key}" if prefix else key

    def _label(self) -> str:
        """How errors name this module: its path and its summary line."""
        path = self.path
        return f"{path} ({self._summary()})" if path else self._summary()

    def named_children(self) -> Iterator[tuple[str, Module]]:
        return iter(list(self._children.items()))

    def children(self) -> Iterator[Module]:
        return (child for _, child in self.named_children())

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """This module and every descendant once, with its path relative to this module."""
        seen: set[int] = set()

        def walk(module, path):
            if id(module) in seen:
                return
            seen.add(id(module))
            yield path, module
            for key, child in module._children.items():
                yield from walk(child, f"{path}.{key}" if path else key)

        yield from walk(self, prefix)

    def modules(self) -> Iterator[Module]:
        return (module for _, module in self.named_modules())

    def _named(self, tables, prefix: str) -> list[tuple[str, Value]]:
        """Each slot once: by its owner's path first, then (tied slots owned elsewhere) by an alias."""
        found, seen = [], set()
        for owned in (True, False):
            for path, module in self.named_modules(prefix):
                for key, value in tables(module, owned).items():
                    if value.symbol.index not in seen:
                        seen.add(value.symbol.index)
                        found.append((f"{path}.{key}" if path else key, value))
        return found

    def named_parameters(self, prefix: str = "") -> list[tuple[str, Value]]:
        """(path, Value) of every trainable parameter, each once, in registration order (PyTorch's order)."""
        return self._named(
            lambda m, owned: m._parameters if owned else {k: v for k, v in m._aliases.items() if v.trainable}, prefix
        )

    def parameters(self) -> list[Value]:
        """The trainable parameters as Values (the ``wrt`` of ``tape.differentiate``)."""
        return [value for _, value in self.named_parameters()]

    def named_buffers(self, prefix: str = "") -> list[tuple[str, Value]]:
        """(path, Value) of every state slot (running statistics), each once."""
        return self._named(lambda m, owned: m._buffers if owned else {}, prefix)

    def state_dict(self) -> dict[str, Value]:
        """Every parameter and buffer by path: the names a PyTorch ``state_dict`` has."""
        return dict(self.named_parameters() + self.named_buffers())

    def state_updates(self) -> Updates:
        """The next values of buffers that training readings recorded in this module tree."""
        pairs, owner = [], {}
        for path, module in self.named_modules():
            for buffer, new in module._updates:
                index = buffer.symbol.index
                if index in owner:
                    raise RecordingError(
                        f"{module._label()} was called in its training reading more than once, so "
                        f"{buffer.name} has two next values; call it once per recording in training "
                        "(use its inference reading for the other calls)"
                    )
                owner[index] = path
                pairs.append((buffer, new))
        return Updates(pairs)

    def dropout_feeds(self, generator) -> dict:
        """Fresh masks for every Dropout in this tree: {mask input Symbol: array} to merge into feeds."""
        from topos.init import checked_generator

        checked_generator(f"{type(self).__name__}.dropout_feeds", generator)
        feeds: dict = {}
        for module in self.modules():
            feeds.update(module.mask_feeds(generator))
        return feeds

    def mask_feeds(self, generator) -> dict:
        """This module's own fed masks, drawn from ``generator`` (none; ``Dropout`` has one per call)."""
        return {}

    # -- calling -----------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        if _current() is not self._tape:
            raise RecordingError(
                f"{user_site()}: {self._label()} belongs to "
                + ("a recording that is sealed" if self._tape.sealed else "another recording")
                + "; a module is built and called inside one recording. Record the model again for "
                "each shape (training batch, sampling), and move the weights with "
                "network.parameters(trained_parameters)"
            )
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(
            f"{type(self).__name__} defines no forward(); define forward(self, ...) to say what calling it records"
        )

    def eval(self):
        """Refused with the fix: a topos module has no mode; the reading is chosen where it is recorded."""
        raise ArgumentError(
            f"{user_site()}: {self._label()}.eval() would set a mode, but a topos "
            "module has none: the graph records one reading per call. Record the evaluation graph inside "
            "`with nn.inference():` (or call the layer with training=False) as its own entry"
        )

    def train(self, mode: bool = True):
        """Refused with the fix, as ``eval`` is."""
        raise ArgumentError(
            f"{user_site()}: {self._label()}.train() would set a mode, but a topos module has none: a call "
            "records the training reading unless it is inside `with nn.inference():` or given training=False"
        )

    # -- checks facades share --------------------------------------------------------------
    def check_input(self, x, features: int | None, axis: int = -1, rank: tuple[int, ...] | None = None,
                    what: str = "features", dtype=None) -> None:
        """A ShapeError naming the user's line and this module when ``x`` does not fit."""
        if not isinstance(x, Value):
            raise ShapeError(
                f"{user_site()}: {self._label()} is called on Values of the recording, got {type(x).__name__}; "
                "record arrays with tape.input(...) or tape.leaf(...) first"
            )
        if rank is not None and x.ndim not in rank:
            raise ShapeError(
                f"{user_site()}: {self._label()} takes an input of rank {' or '.join(map(str, rank))}, "
                f"got {list(x.shape)}"
            )
        if features is not None and (x.ndim == 0 or x.shape[axis] != features):
            where = "last axis" if axis == -1 else f"axis {axis}"
            got = x.shape[axis] if x.ndim else "no"
            raise ShapeError(
                f"{user_site()}: {self._label()} expects {features} {what} along the {where}, "
                f"but the input {list(x.shape)} has {got}; build the module with {got} {what}, or "
                "reshape the input"
            )
        if dtype is not None and isinstance(x.dtype, SelectionType):
            raise ShapeError(
                f"{user_site()}: {self._label()} holds {np.dtype(dtype).name} parameters but the input "
                f"{list(x.shape)} is {x.dtype}, a selection (indices); embed the indices first (nn.Embedding), "
                f"or record the input as {np.dtype(dtype).name} values"
            )
        if dtype is not None and x.dtype != dtype:
            raise ShapeError(
                f"{user_site()}: {self._label()} holds {np.dtype(dtype).name} parameters but the input "
                f"{list(x.shape)} is {x.dtype}; build the module with dtype={x.dtype}, or record the input "
                f"as {np.dtype(dtype).name}"
            )

    # -- printing ----------------------------------------------------------------------------
    def extra_repr(self) -> str:
        return ""

    def _summary(self) -> str:
        return f"{type(self).__name__}({self.extra_repr()})"

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        if self._children:
            lines[0] = lines[0].rstrip("(") + "("
            for keys, inner in _runs(self._children):
                inner = inner.replace("\n", "\n  ")
                if len(keys) == 1:
                    lines.append(f"  ({keys[0]}): {inner}")
                else:  # a stack of like blocks prints once (GPT-2's twelve), as PyTorch's ModuleList does
                    lines.append(f"  ({keys[0]}-{keys[-1]}): {len(keys)} x {inner}")
            lines.append(")")
            return "\n".join(lines)
        return lines[0] + ")"

    def _repr_html_(self) -> str:
        from topos.views.display import module_card  # the Jupyter card, loaded only when a notebook asks

        return module_card(self)


def _runs(children: dict) -> list[tuple[list[str], str]]:
    """Children as (keys, repr) runs: consecutive positional children with the same repr share one run."""
    runs: list[tuple[list[str], str]] = []
    for key, child in children.items():
        text = repr(child)
        last = runs[-1] if runs else None
        if (last is not None and key.isdigit() and last[0][-1].isdigit()
                and int(last[0][-1]) + 1 == int(key) and last[1] == text):
            last[0].append(key)
        else:
            runs.append(([key], text))
    return runs


_readings = threading.local()


@contextmanager
def inference():
    """Inside this block, layers with two readings (``BatchNorm``) record their inference reading.

    A scope, not a switch on the module: ``with nn.inference(): logits = model(x)``
    records the evaluation graph of a whole model, beside its training
    graph in the same recording. An explicit ``training=`` still wins.
    """
    depth = getattr(_readings, "depth", 0)
    _readings.depth = depth + 1
    try:
        yield
    finally:
        _readings.depth = depth


def training_reading(training: bool | None = None) -> bool:
    """The reading a layer records: ``training`` when given, else training unless inside ``inference()``."""
    if training is not None:
        if not isinstance(training, (bool, np.bool_)):  # "False" and a recorded Value would both read as True
            raise ArgumentError(
                f"{user_site()}: training= takes True or False (or None for the scope's reading), got "
                f"{type(training).__name__} {training!r}; the reading is chosen when the graph is recorded, "
                "so record both readings (training=True, and training=False or nn.inference()) for two entries"
            )
        return bool(training)
    return getattr(_readings, "depth", 0) == 0


def _current():
    try:
        return Tape.current()
    except RecordingError:
        return None


class ModuleList(Module):
    """A list of modules named ``0``, ``1``, ...; the caller decides how to call them."""

    def __init__(self, modules=()):
        super().__init__()
        for module in modules:
            self.append(module)

    def append(self, module: Module) -> ModuleList:
        if not isinstance(module, Module):
            raise ArgumentError(
                f"{type(self).__name__} holds modules; item {len(self)} is a {type(module).__name__}; "
                "build it as a Module (nn.Linear(...), or a subclass of nn.Module) first"
            )
        setattr(self, str(len(self._children)), module)
        return self

    def extend(self, modules) -> ModuleList:
        """Append each module of ``modules`` in order, named by its position."""
        if (isinstance(modules, Module) and not isinstance(modules, ModuleList)) or not hasattr(modules, "__iter__"):
            raise ArgumentError(
                f"{user_site()}: {type(self).__name__}.extend takes a list of modules, got "
                f"{type(modules).__name__}; for one module use append(module)"
            )
        for module in modules:
            self.append(module)
        return self

    def __len__(self) -> int:
        return len(self._children)

    def __getitem__(self, position: int) -> Module:
        children = list(self._children.values())
        if isinstance(position, slice):
            return children[position]
        if not isinstance(position, (int, np.integer)) or isinstance(position, (bool, np.bool_)):
            raise ArgumentError(
                f"{type(self).__name__} is indexed by int positions, got {type(position).__name__} {position!r}"
                + (f"; use [{int(position)}]" if isinstance(position, str) and position.isdigit() else "")
            )
        if not -len(children) <= position < len(children):
            raise IndexError(
                f"{type(self).__name__} has {len(children)} module{'s' if len(children) != 1 else ''}; "
                f"position {position} is out of range (use 0..{len(children) - 1}, or negative from the end)"
                if children else f"{type(self).__name__} is empty; position {position} is out of range"
            )
        return children[position]

    def __iter__(self) -> Iterator[Module]:
        return iter(list(self._children.values()))


class Sequential(ModuleList):
    """Modules applied in order; children are named ``0``, ``1``, ... as in PyTorch."""

    def __init__(self, *modules: Module):
        super().__init__(modules)

    def forward(self, x):
        for module in self._children.values():
            x = module(x)
        return x
