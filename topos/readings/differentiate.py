"""Reverse mode: one scan, two readings.

``scan`` walks the spec backward from a target, calling each opcode's one
derivative rule. Over ``Eager`` arrays it computes gradients (the backward
scan, :meth:`Run.backward`); over tape Values it records them as ordinary
nodes (:meth:`Tape.differentiate`, :meth:`Tape.vjp`). Both readings make
the same calls in the same order, so their bits agree.

The order is part of the contract:

* nodes are visited in reverse recording order, from the target down;
* only nodes that received a cotangent run their rules (a disconnected
  ``0/0`` cannot inject NaN), and cotangents flow only into nodes that
  depend on a parameter or an input;
* a node's cotangent is its first contribution, then ``+`` each later one,
  in the order they arrive: consumers in reverse recording order, and
  within one consumer by ascending operand position.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from topos.base.copies import own
from topos.base.element import convert_checked, host_array, is_element, short_name
from topos.base.errors import ArgumentError, DifferentiationError, RecordingError, SymbolError
from topos.readings.eager import Eager
from topos.readings.interpret import conversion
from topos.spec.opcodes import OUTPUT
from topos.spec.recordable import Recordable
from topos.spec.tape import Value, detach


def varying(columns) -> list[bool]:
    """For each node of ``columns`` (a network's or a tape's): does it depend on a parameter or an input?"""
    flags = []
    for opcode, operands in zip(columns.opcodes, columns.operands):
        if opcode.is_source:
            flags.append(opcode.name in ("parameter", "input"))
        else:
            flags.append(any(flags[j] for j in operands))
    return flags


def scan(columns, target: int, seed, payload: Callable[[int], Any]) -> dict[int, Any]:
    """Propagate ``seed`` from ``target`` backward; return each reached node's cotangent.

    ``payload(i)`` gives node i's forward value in the payload being read
    (an Eager array, or a Value on the tape).
    """
    flows = varying(columns)
    cotangents: dict[int, object] = {target: seed}
    opcodes, operands, attributes = columns.opcodes, columns.operands, columns.attributes
    for i in range(target, -1, -1):
        g = cotangents.get(i)
        if g is None or opcodes[i].is_source or not flows[i]:
            continue
        inputs = operands[i]
        contributions = opcodes[i].rule(
            *(payload(j) for j in inputs), payload(i), g, **dict(attributes[i])
        )
        for j, c in zip(inputs, contributions):
            if c is None or not flows[j]:
                continue
            previous = cotangents.get(j)
            cotangents[j] = c if previous is None else previous + c
    return cotangents


# ---- the backward scan over a Run ------------------------------------------------------


class Gradients:
    """Node-grain gradients: ``gradients[symbol]`` is d target / d node (zeros if unreached)."""

    __slots__ = ("_network", "_arrays", "_target")

    def __init__(self, network, arrays: dict[int, np.ndarray], target: int | None):
        self._network = network
        self._arrays = arrays
        self._target = target

    @property
    def network(self):
        """The network whose nodes these gradients are indexed by."""
        return self._network

    @property
    def target(self):
        """The Symbol differentiated, or None for a field that sums others (accumulated micro-batches)."""
        return None if self._target is None else self._network.symbol(self._target)

    def __getitem__(self, symbol) -> np.ndarray:
        """A read-only copy of d target / d ``symbol`` (zeros where the target does not depend on it)."""
        return own(self._field(symbol))

    def _field(self, symbol) -> np.ndarray:
        i = self._network.check(symbol)
        array = self._arrays.get(i)
        if array is None:
            spec = self._network.columns.specs[i]
            if not isinstance(spec.dtype, np.dtype):
                raise SymbolError(f"{symbol!r} is a selection; selections have no gradient")
            array = np.zeros(spec.shape, dtype=spec.dtype)
            array.flags.writeable = False
        return array

    def reached(self, symbol) -> bool:
        """True when a cotangent actually flowed into ``symbol``."""
        return self._network.check(symbol) in self._arrays

    def parameters(self, parameters):
        """Project onto parameter slots: a Parameters table shaped like ``parameters``."""

        if parameters._family is not self._network.family:
            raise SymbolError("these Parameters belong to another network family")
        return parameters._like([(s, self._field(s)) for s in parameters.symbols()])

    def __repr__(self) -> str:
        target = "a sum" if self._target is None else f"%{self._target}"
        return f"<Gradients of {target}: {len(self._arrays)} nodes reached>"

    def _repr_html_(self) -> str:
        from topos.views.display import gradients_card  # the Jupyter card, loaded only when a notebook asks

        return gradients_card(self)

    # -- algebra: accumulate over micro-batches or data-parallel shards -------------------
    def map(self, fn) -> Gradients:
        """A new field with ``fn(array)`` at every reached node (unreached nodes still read as zeros)."""
        return Gradients(self._network, {i: _frozen(fn(own(a))) for i, a in self._arrays.items()}, self._target)

    def zip(self, *fields_then_fn) -> Gradients:
        """A new field with ``fn(mine, theirs, ...)`` at every node any of them reached.

        A node one field did not reach contributes its zeros, so
        ``a.zip(b, lambda x, y: x + y)`` is ``a + b``.
        """
        *others, fn = fields_then_fn
        if not callable(fn):
            raise TypeError("zip takes the fields first and the function last: a.zip(b, fn)")
        for other in others:
            if not isinstance(other, Gradients) or other._network.family is not self._network.family:
                raise SymbolError("gradients combine only with gradients of the same network")
        fields = (self, *others)
        reached = sorted(set().union(*(f._arrays for f in fields)))
        targets = {f._target for f in fields}
        target = targets.pop() if len(targets) == 1 else None
        return Gradients(self._network, {i: _frozen(fn(*(f[self._network.symbol(i)] for f in fields)))
                                         for i in reached}, target)

    def __add__(self, other: Gradients) -> Gradients:
        if not isinstance(other, Gradients):
            return NotImplemented
        return self.zip(other, lambda a, b: a + b)

    def __mul__(self, scalar) -> Gradients:
        """Every reached gradient times a number (kept in its element type)."""
        if isinstance(scalar, Gradients):
            return NotImplemented
        return self.map(lambda a: (a * scalar).astype(a.dtype))

    __rmul__ = __mul__

    def __truediv__(self, scalar) -> Gradients:
        return self.map(lambda a: (a / scalar).astype(a.dtype))


def _frozen(array) -> np.ndarray:
    array = np.array(array)
    array.flags.writeable = False
    return array


Field = Gradients


def backward(run, target) -> Gradients:
    """The backward scan over a finished run: d target / d every node."""
    network = run.network
    t = scalar_target(network, target, ", or use tape.vjp with an explicit seed")
    if t not in run._values:
        raise SymbolError(f"{target!r} was not computed by this run")
    specs = network.columns.specs
    posture = run._backward is not None and run._backward.index == t

    def payload(i):
        if i not in run._values:
            if posture:  # freed because no rule declares it reads it: a stand-in that refuses use
                return Freed(network, i)
            raise SymbolError(
                f"the backward scan needs %{i}, which this run did not keep; run the whole spec, or "
                f"declare the backward posture (network.entry(roots, backward={target!r}))"
            )
        return Eager(run._values[i], specs[i].dtype)

    seed = Eager(_ones(specs[t]))
    cotangents = scan(network.columns, t, seed, payload)
    arrays = {}
    for i, c in cotangents.items():
        array = np.asarray(c.array)
        array.flags.writeable = False
        arrays[i] = array
    return Gradients(network, arrays, t)


def scalar_target(network, target, otherwise: str = "") -> int:
    """The node index of ``target`` when it is a rank-0 float value; else the DifferentiationError saying why not.

    The one check for every door that differentiates a finished run (``run.backward``,
    ``recompute.backward``, ``check_gradients``); ``otherwise`` adds that door's other way out.
    """
    t = network.check(target, "target")
    spec, site = network.columns.specs[t], network.columns.sites[t]
    _refuse_selection(target, spec, site)  # before the shape: a rank-0 selection passes that and fails seeding ones
    if spec.shape != ():
        raise DifferentiationError(
            f"backward needs a rank-0 target, but {target!r} has shape {list(spec.shape)} "
            f"(recorded at {site}); reduce it with .sum() or .mean() first{otherwise}"
        )
    return t


def _refuse_selection(target, spec, site) -> None:
    """The DifferentiationError for a selection target, which every door that differentiates refuses alike."""
    if not is_element(spec.dtype):
        raise DifferentiationError(
            f"the target {_symbol_of(target)!r} is a selection ({list(spec.shape)} {short_name(spec.dtype)}, "
            f"recorded at {site}); a selection is indices, with no derivative and so no gradient: the target must "
            "be a float scalar (for tape.vjp, any float value), such as a loss computed from the rows it picks"
        )


def _ones(spec) -> np.ndarray:
    array = np.ones(spec.shape, dtype=spec.dtype)
    array.flags.writeable = False
    return array


# ---- recorded reverse mode ---------------------------------------------------------------


class Adjoints:
    """What differentiate/vjp appended: the target and one gradient per ``wrt``, in order.

    While the tape is open the entries are Values (ready for more
    recording, e.g. a Hessian-vector product); ``detach()`` gives Symbols.
    """

    __slots__ = ("target", "wrt", "gradients")

    def __init__(self, target, wrt: tuple, gradients: tuple):
        self.target = target
        self.wrt = wrt
        self.gradients = gradients

    def __getitem__(self, wrt):
        key = _symbol_of(wrt)
        for w, g in zip(self.wrt, self.gradients):
            if _symbol_of(w) == key:
                return g
        raise SymbolError(f"{wrt!r} is not among this adjoint's wrt")

    def pairs(self) -> list[tuple]:
        """(wrt, gradient) in wrt order."""
        return list(zip(self.wrt, self.gradients))

    def roots(self) -> list:
        """Target then gradients: a ready-made root list for a training entry."""
        return [self.target, *self.gradients]

    def detach(self) -> Adjoints:
        return Adjoints(detach(self.target), tuple(detach(self.wrt)), tuple(detach(self.gradients)))

    def __repr__(self) -> str:
        pairs = ", ".join(f"{_symbol_of(w)!r}->{_symbol_of(g)!r}" for w, g in self.pairs())
        return f"Adjoints(target={_symbol_of(self.target)!r}, {pairs})"

    def _repr_html_(self) -> str:
        from topos.views.display import adjoints_card  # the Jupyter card, loaded only when a notebook asks

        return adjoints_card(self)


def _symbol_of(x):
    return x.symbol if hasattr(x, "symbol") else x


def adjoints_of(owner: str, adjoints) -> Adjoints:
    """``adjoints`` if it is an Adjoints (open or detached); else an ArgumentError naming what came instead."""
    if not isinstance(adjoints, Adjoints):
        raise ArgumentError(
            f"{owner} takes the Adjoints that tape.differentiate(loss, parameters) returned, got "
            f"{type(adjoints).__name__} {adjoints!r}"
        )
    return adjoints


def open_pairs(owner: str, adjoints, tape=None) -> list[tuple]:
    """The (wrt, gradient) Values of ``adjoints``, still on the open ``tape`` (or their own), for recording more."""
    pairs = adjoints_of(owner, adjoints).pairs()
    if any(not isinstance(v, Value) for pair in pairs for v in pair):
        raise RecordingError(
            f"{owner}: these adjoints are detached (Symbols, as Tape.record hands them out); record the update "
            "inside the recording, with the Adjoints tape.differentiate returned there"
        )
    if tape is not None and any(w.tape is not tape for w, _ in pairs):
        raise SymbolError(
            f"{owner}: the adjoints were recorded on another tape than the one given; pass the tape they were "
            "differentiated on"
        )
    return pairs


def record_vjp(tape, target, seed, wrt: Sequence, *, require_scalar: bool) -> Adjoints:
    """Append the reverse scan of ``target`` (seeded by ``seed``) to ``tape``; see Tape.vjp."""
    tape._check_open()
    target_value = _on_tape(tape, target, "target")
    wrt_values = tuple(_on_tape(tape, w, "wrt") for w in wrt)
    columns = tape.columns
    for w in wrt_values:
        kind = columns.opcodes[w._index].name
        if kind not in ("parameter", "input"):
            raise DifferentiationError(
                f"wrt {w.symbol!r} is a {kind} node (recorded at {columns.sites[w._index]}); "
                "differentiate with respect to parameters or inputs"
            )
        if w._index in columns.state:
            raise DifferentiationError(
                f"wrt {w.symbol!r} ({columns.names.get(w._index, 'unnamed')}) is state, not a trainable "
                f"parameter (recorded at {columns.sites[w._index]}); state such as optimizer moments and "
                "running statistics is updated by its own rule, so leave it out of wrt"
            )
        if not isinstance(w.dtype, np.dtype):
            raise DifferentiationError(
                f"wrt {w.symbol!r} is a selection (recorded at {columns.sites[w._index]}); "
                "selections are indices and have no gradient, so leave it out of wrt"
            )
    t = target_value._index
    spec = columns.specs[t]
    _refuse_selection(target_value, spec, columns.sites[t])
    if require_scalar and spec.shape != ():
        raise DifferentiationError(
            f"differentiate needs a rank-0 loss, but {target_value.symbol!r} has shape "
            f"{list(spec.shape)} (recorded at {columns.sites[t]}); reduce it with .sum() or "
            ".mean(), or call tape.vjp(target, seed, wrt) with a seed of that shape"
        )
    start = len(tape)
    if seed is None:
        seed = _ones(spec)
    elif isinstance(seed, Value) or hasattr(seed, "symbol"):
        seed = _on_tape(tape, seed, "seed")
    else:
        seed = direction_array(seed, spec.dtype, "the seed", f"the target {target_value.symbol!r}")
    # Checked before an array seed is recorded as a leaf: a refused call leaves the tape as it was.
    if seed.shape != spec.shape or seed.dtype != spec.dtype:
        raise DifferentiationError(
            f"the seed has shape {list(seed.shape)} {seed.dtype}, "
            f"the target {list(spec.shape)} {spec.dtype}; they must match"
        )
    seed_value = seed if isinstance(seed, Value) else tape.leaf(seed)
    cotangents = scan(tape.columns, t, seed_value, lambda i: Value(tape, i))
    gradients = []
    for w in wrt_values:
        g = cotangents.get(w._index)
        if g is None:  # not an ancestor: a recorded zero, never an error
            g = tape.leaf(np.zeros(w.shape, dtype=w.dtype))
        gradients.append(g)
    kept = tape.compact(start, [seed_value, *gradients])
    return Adjoints(target_value, wrt_values, tuple(Value(tape, kept[g._index]) for g in gradients))


def direction_array(value, dtype, what: str, of: str) -> np.ndarray:
    """A seed or a tangent as an array of ``dtype``, checked as a feed is; else a DifferentiationError.

    An array (NumPy, a torch tensor, a jax array) must have the element
    type already: rounding it quietly would hide a float64 direction
    fed to a float32 model. Python numbers and lists are converted,
    rounding once, and a finite one ``dtype`` cannot hold (it would
    become inf) is refused. ``what`` names the value ("the seed"),
    ``of`` the node it must fit ("the target %3").
    """
    try:
        array = host_array(value)
        fed_as_array = isinstance(array, (np.ndarray, np.generic))
        array = np.asarray(array)
        if not fed_as_array and array.dtype.kind not in "fiu":
            raise TypeError(f"its elements are {array.dtype}, not numbers")
    except (TypeError, ValueError, RuntimeError, BufferError, NotImplementedError) as error:
        raise DifferentiationError(
            f"{what} ({type(value).__name__}) does not convert to an array for {of} "
            f"({short_name(dtype)}): {error}"
        ) from None
    if not fed_as_array:
        converted, overflow = convert_checked(array, dtype)
        if overflow is not None:
            raise DifferentiationError(f"{what} holds {overflow} in {of}; scale it into range, or record the "
                                       "model with a wider element type")
        return converted
    if array.dtype != dtype:
        raise DifferentiationError(
            f"{what} is {array.dtype} and {of} is {short_name(dtype)}; convert it with "
            f"{conversion(value, dtype)} first (topos does not round an array to another element type)"
        )
    return array


def _on_tape(tape, x, role: str):
    if isinstance(x, Value):
        if x._tape is not tape:
            raise SymbolError(f"{role} {x.symbol!r} is a Value of another tape")
        return x
    try:
        return tape.resolve(x)
    except SymbolError as error:
        raise SymbolError(f"{role}: {error}") from None


class Unread(Recordable):
    """A forward value a rule did not declare in ``reads()``: its shape and element type, no data.

    The stand-in the checkpointed backward (``topos.readings.recompute``)
    hands a rule where its opcode's ``reads()`` leaves a value out, so a
    ``reads()`` that misses what its rule uses fails by name.
    """

    __slots__ = ("_opcode", "_position", "shape", "dtype")

    def __init__(self, opcode, position, spec):
        self._opcode, self._position = opcode, position
        self.shape, self.dtype = spec.shape, spec.dtype

    def _refuse(self):
        what = "its output" if self._position == OUTPUT else f"operand {self._position}"
        return RuntimeError(
            f"the derivative rule of {self._opcode.name} used {what}, which "
            f"{self._opcode.name}.reads() does not declare; add it to the opcode's READS "
            "in topos/spec/opcodes/ (a plan or a recomputing backward would not keep it)"
        )

    def _express(self, opcode, operands, attributes):
        raise self._refuse()

    def _constant(self, array):
        raise self._refuse()

    def __getattr__(self, name):  # an array's attribute (a kernel reading the stand-in's data)
        raise self._refuse()


class Freed(Unread):
    """A value a backward-posture plan freed, handed to the scan: it names the consumers whose reads() miss it.

    The scan passes every operand to a rule without saying which rule, so
    the message lists the node's consumers instead.
    """

    __slots__ = ("_network", "_node")

    def __init__(self, network, node: int):
        super().__init__(network.columns.opcodes[node], OUTPUT, network.columns.specs[node])
        self._network, self._node = network, node

    def _refuse(self):
        network, i = self._network, self._node
        readers = ", ".join(f"%{c} {network.columns.opcodes[c].name}" for c in network.consumers()[i]) or "none"
        return RuntimeError(
            f"a derivative rule read %{i} ({network.columns.opcodes[i].name}, recorded at {network.columns.sites[i]}), "
            f"which the backward-posture plan freed because no reads() on the path declares it "
            f"(its consumers: {readers}); add it to that opcode's READS in topos/spec/opcodes/"
        )


def recorded_gradients(run, adjoints, parameters):
    """A Parameters table of the recorded gradients a run computed (zeros for other slots)."""

    network = run.network
    by_wrt = {_symbol_of(w).index: _symbol_of(g) for w, g in adjoints_of("recorded_gradients", adjoints).pairs()}
    pairs = []
    for symbol, array in parameters.items():
        g = by_wrt.get(symbol.index)
        pairs.append((symbol, np.zeros_like(array) if g is None else run[g]))
    if parameters._family is not network.family:
        raise SymbolError("these Parameters belong to another network family")
    return parameters._like(pairs)
