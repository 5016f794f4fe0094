"""The sealed spec: an immutable, uncopyable record of every node.

Everything downstream (runs, gradients, plans, MLIR) reads a Network and
never changes it. Weights live outside, in caller-owned Parameters.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np

from topos.base.copies import is_splat, own, own_stored, splat_element
from topos.base.element import short_name
from topos.base.errors import ArgumentError, SealedError, SymbolError
from topos.base.provenance import Site, user_site
from topos.spec.opcodes import Opcode, Spec
from topos.spec.parameters import Parameters, by_names
from topos.spec.symbol import Family, Symbol


@dataclass(frozen=True)
class Node:
    """A snapshot of one recorded node."""

    symbol: Symbol
    opcode: Opcode
    operands: tuple[Symbol, ...]
    attributes: Mapping[str, Any]
    shape: tuple[int, ...]
    dtype: Any
    site: Site
    name: str | None = None  # a parameter's or input's name (explicit, or its module path)
    role: str = ""  # "state" for a non-trainable slot, "required" for an input without default

    @property
    def index(self) -> int:
        return self.symbol.index

    @property
    def is_source(self) -> bool:
        return self.opcode.is_source

    @property
    def trainable(self) -> bool:
        """True for a parameter slot that ``differentiate`` may take as ``wrt`` (not state)."""
        return self.opcode.name == "parameter" and self.role != "state"

    def __str__(self) -> str:
        return describe_line(
            self.index,
            self.opcode,
            tuple(s.index for s in self.operands),
            tuple(self.attributes.items()),
            Spec(self.shape, self.dtype),
            None,
            self.name,
            self.role,
        )

    def _repr_html_(self) -> str:
        from topos.views.display import node_card  # the Jupyter card, loaded only when a notebook asks

        return node_card(self)


class Payloads(Mapping):
    """A source's recorded value by node: each read is the reader's own read-only copy (a splat stays a splat).

    The spec keeps its arrays; a caller who flipped ``writeable`` back on a
    shared one, or handed it to ``torch.from_numpy``, could change the spec.
    """

    __slots__ = ("_arrays",)

    def __init__(self, arrays: Mapping[int, np.ndarray]):
        self._arrays = arrays

    def __getitem__(self, node: int) -> np.ndarray:
        return own_stored(self._arrays[node])

    def __contains__(self, node: object) -> bool:
        return node in self._arrays

    def __iter__(self):
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)


class Columns(NamedTuple):
    """The spec column by column, one entry per node in recording order: what every reading walks.

    ``network.columns`` is this reader. Its tuples, mappings and sets are
    immutable, and ``payloads`` hands out copies (``Payloads``), so nothing
    read through it aliases the spec. ``tape.columns`` is the same reader
    over an open recording (its own growing lists).
    """

    opcodes: Sequence[Opcode]
    operands: Sequence[tuple[int, ...]]
    attributes: Sequence[tuple[tuple[str, Any], ...]]
    specs: Sequence[Spec]
    sites: Sequence[Site]
    payloads: Payloads  # a source's recorded value (leaf, parameter initial, input default), copied when read
    names: Mapping[int, str]  # a parameter's or input's name (given, or its module path)
    state: AbstractSet[int]  # parameter slots that are state (optimizer moments, running statistics)
    required: AbstractSet[int]  # inputs recorded without a default: every run must feed them
    nexts: Mapping[int, int]  # a state slot -> its recorded next value (tape.state_next)
    slots: Sequence[int]  # the parameter nodes: the slots of a Parameters table, in recording order
    inputs: Sequence[int]  # the input nodes, in recording order


class Network:
    """A sealed tape: the spec every later stage reads. Immutable and not copyable."""

    __slots__ = ("_family", "columns", "_payloads", "_reopen", "_consumers", "_by_name", "_leaf_digests")
    _family: Family
    columns: Columns
    _payloads: Mapping[int, np.ndarray]  # the arrays themselves: the spec's own, never handed out
    _reopen: Callable[[Network], Any]  # the tape type that sealed it, continuing it (Network.reopen)
    _consumers: tuple[tuple[int, ...], ...] | None
    _by_name: Mapping[str, int]
    _leaf_digests: dict[int, bytes]

    def __init__(self):
        raise TypeError("a Network comes from Tape.record(...) or tape.seal()")

    @classmethod
    def from_columns(cls, family: Family, columns: Columns, reopen: Callable[[Network], Any]) -> Network:
        """The Network of a tape's columns (``tape.seal()`` calls this); ``reopen(network)`` continues it."""
        if not isinstance(family, Family) or not isinstance(columns, Columns) or not callable(reopen):
            raise ArgumentError("Network.from_columns takes a Family, the Columns of a sealed tape and the function "
                                "that reopens it; a Network comes from Tape.record(...) or tape.seal()")
        self = object.__new__(cls)
        set_ = object.__setattr__
        set_(self, "_family", family)
        set_(self, "columns", columns)
        set_(self, "_payloads", columns.payloads._arrays)
        set_(self, "_reopen", reopen)
        set_(self, "_by_name", MappingProxyType({n: i for i, n in columns.names.items()}))
        set_(self, "_consumers", None)
        set_(self, "_leaf_digests", {})
        return self

    def __setattr__(self, name, value):
        raise SealedError("a Network is immutable; reopen() it to record more")

    def __delattr__(self, name):
        raise SealedError("a Network is immutable; reopen() it to record more")

    def __copy__(self):
        raise SealedError(
            "a Network is not copyable: history stays linear. Share it by reference; "
            "copy Parameters for a what-if instead"
        )

    def __deepcopy__(self, memo):
        self.__copy__()

    def __reduce__(self):
        self.__copy__()

    # -- reading the spec -----------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.columns.opcodes)

    @property
    def family(self) -> Family:
        return self._family

    def check(self, symbol: Symbol, what: str = "symbol") -> int:
        """The node index of ``symbol``, or a SymbolError saying why it is not ours."""
        if not isinstance(symbol, Symbol):
            fix = ("; use its Symbol: the one Tape.record returned for it, or value.symbol"
                   if hasattr(symbol, "symbol") and hasattr(symbol, "tape") else "")
            raise SymbolError(f"{what} {symbol!r} is a {type(symbol).__name__}, not a Symbol{fix}")
        if symbol.family is not self._family:
            raise SymbolError(f"{what} {symbol!r} belongs to another tape, not to this network")
        if not 0 <= symbol.index < len(self.columns.opcodes):
            raise SymbolError(
                f"{what} {symbol!r} was recorded after this network was sealed "
                f"(it has {len(self.columns.opcodes)} nodes); use the newer network"
            )
        return symbol.index

    def symbol(self, index: int) -> Symbol:
        return Symbol(self._family, index)

    def node(self, symbol: Symbol) -> Node:
        """The node named by ``symbol``."""
        return self._node(self.check(symbol))

    def nodes(self) -> tuple[Node, ...]:
        """Every node in recording order."""
        return tuple(self._node(i) for i in range(len(self)))

    def _node(self, i: int) -> Node:
        return Node(
            self.symbol(i),
            self.columns.opcodes[i],
            tuple(self.symbol(j) for j in self.columns.operands[i]),
            MappingProxyType(dict(self.columns.attributes[i])),
            self.columns.specs[i].shape,
            self.columns.specs[i].dtype,
            self.columns.sites[i],
            self.columns.names.get(i),
            role_of(self.columns, i),
        )

    def payload(self, symbol: Symbol) -> np.ndarray | None:
        """The recorded payload of a source (leaf value, parameter initial, input default).

        A required input has none. The array is a read-only copy: the spec's own never leaves it.
        """
        payload = self._payloads.get(self.check(symbol))
        return None if payload is None else own(payload)

    def name(self, symbol: Symbol) -> str:
        """The name of a parameter or input: its given name or module path, else ``%<index>``."""
        return source_name(self.columns, self.check(symbol))

    def named(self, name: str) -> Symbol:
        """The parameter or input called ``name``."""
        if not isinstance(name, str):
            fix = "; for a Symbol's name use network.name(symbol)" if isinstance(name, Symbol) else ""
            raise SymbolError(f"named takes a name (a str), got {type(name).__name__} {name!r}{fix}")
        index = self._by_name.get(name)
        if index is None:
            raise SymbolError(f"no parameter or input is named {name!r}; {_known_names(self)}")
        return self.symbol(index)

    def names(self) -> Mapping[str, Symbol]:
        """Every named parameter and input, name -> Symbol, in recording order."""
        return MappingProxyType({n: self.symbol(i) for n, i in sorted(self._by_name.items(), key=lambda p: p[1])})

    def parameter_symbols(self) -> tuple[Symbol, ...]:
        """Every slot of the parameter table: trainable parameters and state, in recording order."""
        return tuple(self.symbol(i) for i in self.columns.slots)

    def trainable_symbols(self) -> tuple[Symbol, ...]:
        """The trainable slots (parameters that are not state), in recording order."""
        return tuple(self.symbol(i) for i in self.columns.slots if i not in self.columns.state)

    def input_symbols(self) -> tuple[Symbol, ...]:
        return tuple(self.symbol(i) for i in self.columns.inputs)

    def consumers(self) -> tuple[tuple[int, ...], ...]:
        """For each node, the nodes that read it, in recording order."""
        consumers = self._consumers
        if consumers is None:  # computed once; two threads racing here compute the same tuple
            readers: list[list[int]] = [[] for _ in self.columns.opcodes]
            for i, operands in enumerate(self.columns.operands):
                for j in operands:
                    if not readers[j] or readers[j][-1] != i:
                        readers[j].append(i)
            consumers = tuple(tuple(r) for r in readers)
            object.__setattr__(self, "_consumers", consumers)
        return consumers

    def leaf_digest(self, n: int) -> bytes:
        """sha256 of leaf ``n``'s element type and bytes, hashed once per network (payloads are frozen).

        Plan.digest reads it for every leaf on every compile, cache hits
        included: a recording that lifts Python numbers to full-shape
        leaves (GPT-2 124M holds 91 MiB of them) would otherwise hash them
        all again on each lookup.
        """
        digest = self._leaf_digests.get(n)
        if digest is None:  # two threads racing here compute the same bytes
            if not isinstance(n, (int, np.integer)) or not 0 <= n < len(self) or self.columns.opcodes[n].name != "leaf":
                raise SymbolError(f"leaf_digest takes the node index of a leaf of this network, got {n!r}; "
                                  "a Symbol's node is symbol.index")
            payload = self._payloads[n]
            if is_splat(payload):  # its one element and shape (hashing the whole would read it n times)
                one = splat_element(payload)
                digest = hashlib.sha256(b"splat" + str(payload.shape).encode() + one.dtype.str.encode()
                                        + one.tobytes()).digest()
            else:
                payload = np.ascontiguousarray(payload)
                digest = hashlib.sha256(payload.dtype.str.encode() + payload.tobytes()).digest()
            self._leaf_digests[n] = digest
        return digest

    def describe(self, sites: bool = False) -> str:
        """One line per node (index, opcode, operands, attributes, shape, dtype), then a summary."""
        return describe_columns(self.columns, "network", sites)

    def __repr__(self) -> str:
        return (f"<Network {plural(len(self), 'node')}, {plural(len(self.columns.slots), 'parameter')}, "
                f"{plural(len(self.columns.inputs), 'input')}>")

    def _repr_html_(self) -> str:
        from topos.views.display import network_card  # the Jupyter card, loaded only when a notebook asks

        return network_card(self)

    # -- state and runs ----------------------------------------------------------------------
    def parameters(self, source=None, *, strict: bool = True):
        """A fresh Parameters table for this network.

        Without ``source`` every slot holds its record-site initial. With a
        ``source`` (a Parameters table of another recording of the same
        model, or a mapping name -> array, e.g. a checkpoint's tensors)
        every slot takes the source's array of the same name: this is how
        weights move between shape buckets (batch 64 for training, 1 for
        sampling). A slot the source lacks is an error naming it (with
        ``strict=False`` it keeps its initial); a shape or element type
        that differs is always an error. Entries the network has no slot
        for (optimizer state of the training recording, say) are ignored.
        """
        pairs = [(self.symbol(i), self._payloads[i]) for i in self.columns.slots]  # the table copies on read
        table = Parameters._of(self._family, pairs, _slot_meta(self.columns))
        return table if source is None else by_names(table, source, strict)

    def forward(self, parameters, feeds=None):
        """Run the whole spec with the oracle (reference paths, exact bits) -> Run."""
        from topos.readings.interpret import interpret

        return interpret(self, parameters, feeds, wanted=None)

    def entry(self, roots, observe=(), numerics=None, backward=None):
        """Declare an export: what runs may read (roots, observes) and how they compute.

        ``backward=loss`` declares the backward posture: runs will be
        differentiated by ``run.backward(loss)``, so a plan keeps exactly what
        the derivative rules on the loss's path read, and frees the rest.
        """
        from topos.readings.plan.entry import Entry

        if numerics is None:  # the Entry's default, the fast posture
            return Entry(self, roots, observe, backward=backward)
        return Entry(self, roots, observe, numerics, backward)

    def emit_mlir(self, entry=None, debug_info: bool = True) -> str:
        """The topos-dialect text of ``entry``'s closure (default: every node, sinks as results)."""
        from topos.readings.plan.entry import Entry

        if entry is None:
            read = {j for operands in self.columns.operands for j in operands}
            entry = self.entry([self.symbol(i) for i in range(len(self)) if i not in read])
        elif not isinstance(entry, Entry) or entry.network.family is not self._family:
            what = "an Entry of another network" if isinstance(entry, Entry) else f"{type(entry).__name__} {entry!r}"
            raise ArgumentError(
                f"emit_mlir(entry=...) takes an Entry of this network, such as network.entry([loss]), or None "
                f"for every node; got {what}"
            )
        return entry.lower().emit_mlir(debug_info)

    def reopen(self):
        """A tape continuing this spec: every symbol stays valid; each network reopens once."""
        if not self._family.claim_reopening(len(self)):
            raise SealedError(
                f"{user_site()}: this network was already reopened; history stays linear, so continue "
                "from the network that reopening produced"
            )
        return self._reopen(self)


# ---- describe ---------------------------------------------------------------------------


def _format_attribute(value) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


def leaf_summary(payload: np.ndarray) -> str:
    """``value=c`` for a uniform float leaf, so constants read at a glance."""
    if payload.dtype.kind in "iu":
        return ""
    values = payload.astype(np.float64).reshape(-1)
    if np.all(values == values[0]):
        return f"value={_number(values[0])}"
    return ""


def _number(x: float) -> str:
    text = repr(float(x))
    return text[:-2] if text.endswith(".0") else text


def role_of(columns: Columns, i: int) -> str:
    """``state`` for a non-trainable slot, ``required`` for an input without default, else empty."""
    if i in columns.state:
        return "state"
    if i in columns.required:
        return "required"
    return ""


def source_name(columns: Columns, i: int) -> str:
    return columns.names.get(i, f"%{i}")


def _known_names(network) -> str:
    names = sorted(network._by_name)
    if not names:
        return "this network names no source (name them with name=, or build them with topos.nn modules)"
    shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
    return f"the names are: {shown}"


def _slot_meta(columns: Columns) -> tuple[tuple[str, ...], frozenset]:
    """(name per slot, state slot indices): what a Parameters table carries beside its arrays."""
    return tuple(source_name(columns, i) for i in columns.slots), frozenset(columns.state)


def describe_line(index, opcode, operands, attributes, spec, payload, name=None, role="") -> str:
    args = "(" + ", ".join(str(j) for j in operands) + ")"
    attrs = " ".join(f"{k}={_format_attribute(v)}" for k, v in attributes)
    if opcode.name == "leaf" and payload is not None:
        attrs = leaf_summary(payload)
    if name is not None:
        attrs = f"name={name}"
    if role:
        attrs = f"{attrs} {role}".strip()
    return f"{index:>5}  {opcode.name:<15} {args:<12} {attrs:<34} {list(spec.shape)} {short_name(spec.dtype)}".rstrip()


def plural(n: int, noun: str) -> str:
    if n == 1:
        return f"1 {noun}"
    return f"{n} {'leaves' if noun == 'leaf' else noun + 's'}"


def describe_columns(columns: Columns, kind: str, sites: bool = False) -> str:
    lines = []
    for i, opcode in enumerate(columns.opcodes):
        line = describe_line(
            i, opcode, columns.operands[i], columns.attributes[i], columns.specs[i],
            columns.payloads._arrays.get(i), columns.names.get(i), role_of(columns, i),  # read, not handed out
        )
        if sites:
            line = f"{line:<90}  # {columns.sites[i]}"
        lines.append(line)
    names = [op.name for op in columns.opcodes]
    counts = ", ".join(
        plural(names.count(source), source) for source in ("parameter", "input", "leaf")
    )
    lines.append(f"{kind}: {plural(len(names), 'node')} ({counts})")
    return "\n".join(lines)
