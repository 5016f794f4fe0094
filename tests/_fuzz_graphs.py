"""Random well-typed topos graphs for the whole-stack fuzzer, as replayable recipes.

A ``Graph`` is a recipe, not a recording: a list of ``Op``s (a tape method
for a source, otherwise a ``Value`` method with its arguments), the pool
index of the rank-0 loss, the parameters to differentiate with respect to,
the values to observe, and the feeds. ``graphs()`` draws one with
hypothesis while recording it on a scratch tape (the tape's shape rules
keep every drawn step well-typed); ``record`` replays a recipe on any
tape, so several graphs can share one network and one IREE compile;
``to_python`` prints a recipe as a self-contained model function, which is
what a failure report shows.

The vocabulary: every one of the 27 opcodes (the three sources, the
seven elementwise binaries, neg, map with each of its ten functions,
matmul, both sums, both broadcasts, reshape, permute, narrow, pad,
unfold, fold, gather, scatter, log_softmax, logsumexp), in float32,
float64 and bfloat16. Each graph has one of two *modes*:

* ``tame``: moderate payloads, and the arguments of log, sqrt, log1p, the
  denominator of div and the base of pow pass through ``x * x + c`` (or
  ``x * x`` for log1p) first, so values stay in each function's domain
  and finite differences have something smooth to measure;
* ``wild``: no guards, and payloads may be wide (x50), integer-valued
  (exact ties for maximum and step) or IEEE specials (signed zeros,
  infinities, NaN, subnormals, 1e30): inf and NaN happen and every check
  must agree on them bit for bit (or, for IREE, as the envelope says).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

import topos
from topos import MAP_FUNCTIONS, Tape

DTYPES = {"f32": topos.float32, "f64": topos.float64, "bf16": topos.bfloat16}
SOURCES = ("leaf", "parameter", "input")
BINARY = ("add", "sub", "mul", "div", "pow", "maximum", "step")
UNARY = ("neg", "map", "matmul", "sum", "sum_along", "broadcast", "broadcast_along", "reshape", "permute",
         "narrow", "pad", "unfold", "fold", "gather", "scatter", "log_softmax", "logsumexp")
MAX_RANK = 4
MAX_VOLUME = 64
SPECIALS = (0.0, -0.0, math.inf, -math.inf, math.nan, 1e-40, -1e-40, 1e30, -1e30, 1.0, -1.0, 0.5)


# ---- the recipe ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ref:
    """An earlier value of the recipe's pool, by position."""

    index: int


@dataclass(frozen=True)
class Op:
    """One recorded call: ``tape.<method>(*args)`` for a source, else ``args[0].<method>(*args[1:])``."""

    method: str
    args: tuple


@dataclass(frozen=True)
class Graph:
    """A replayable random graph: its ops, its loss, what to differentiate, observe and feed."""

    dtype: str  # a key of DTYPES
    mode: str  # "tame" or "wild"
    ops: tuple[Op, ...]
    loss: int  # pool index of the rank-0 loss
    wrt: tuple[int, ...]  # pool indices of the parameters differentiated
    observes: tuple[int, ...] = ()
    feeds: tuple[tuple[int, object], ...] = ()  # (pool index of an input, array or Selection)



@dataclass
class Built:
    """A recipe recorded on a tape: its pool of Values (Symbols once sealed), loss, adjoints, feeds."""

    graph: Graph
    pool: list
    loss: object
    adjoints: object
    observes: list
    feeds: dict = field(default_factory=dict)

    def roots(self) -> list:
        """The loss, then every recorded gradient."""
        return [self.loss, *self.adjoints.gradients]

    def detach(self) -> Built:
        """The same, with Symbols in place of Values (what Tape.record hands back)."""
        def symbol(v):
            return getattr(v, "symbol", v)

        return Built(self.graph, [symbol(v) for v in self.pool], symbol(self.loss), self.adjoints.detach(),
                     [symbol(v) for v in self.observes], {symbol(k): v for k, v in self.feeds.items()})


def _apply(tape, pool, op: Op):
    args = [pool[a.index] if isinstance(a, Ref) else a for a in op.args]
    if op.method in SOURCES:
        return getattr(tape, op.method)(*args)
    return getattr(args[0], op.method)(*args[1:])


def record(graph: Graph, tape) -> Built:
    """Replay ``graph`` on ``tape`` (which may hold other graphs): its values, loss and recorded gradients."""
    pool: list = []
    for op in graph.ops:
        pool.append(_apply(tape, pool, op))
    loss = pool[graph.loss]
    adjoints = tape.differentiate(loss, [pool[i] for i in graph.wrt])
    feeds = {pool[i]: value for i, value in graph.feeds}
    return Built(graph, pool, loss, adjoints, [pool[i] for i in graph.observes], feeds)


def record_alone(graph: Graph):
    """(network, Built with Symbols) for one recipe on a fresh tape."""
    return Tape.record(lambda tape: record(graph, tape))  # Tape.record detaches the Built


def record_together(graphs) -> tuple:
    """(network, [Built]) for several recipes on one tape: one network, one compile for all of them."""
    return Tape.record(lambda tape: [record(g, tape) for g in graphs])


# ---- printing a recipe as code a person can paste --------------------------------------------------


def _number(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(float(x))


def _nested(array: np.ndarray) -> str:
    if array.ndim == 0:
        return _number(float(array))
    return "[" + ", ".join(_nested(row) for row in array) + "]"


def literal(value, dtype_name: str) -> str:
    """Python source that rebuilds ``value`` (an element array, a Selection or a number) exactly."""
    if isinstance(value, topos.Selection):
        return f"topos.selection({np.asarray(value.indices).tolist()!r}, {value.extent})"
    if isinstance(value, np.ndarray) and value.dtype.kind in "iu":
        return f"np.array({value.tolist()!r})"
    if isinstance(value, np.ndarray):
        return f"np.array({_nested(value.astype(np.float64))}, topos.{np.dtype(value.dtype).name})"
    if isinstance(value, float):
        return _number(value)
    return repr(value)


def to_python(graph: Graph) -> str:
    """The recipe as a model function, ready to paste after ``import numpy as np, topos``."""
    lines = ["import numpy as np", "import topos", "from topos import Tape", "from numpy import inf, nan", "",
             "def model(tape):"]
    for k, op in enumerate(graph.ops):
        args = ", ".join(f"v{a.index}" if isinstance(a, Ref) else literal(a, graph.dtype)
                         for a in (op.args if op.method in SOURCES else op.args[1:]))
        if op.method in SOURCES:
            lines.append(f"    v{k} = tape.{op.method}({args})")
        else:
            lines.append(f"    v{k} = v{op.args[0].index}.{op.method}({args})")
    wrt = ", ".join(f"v{i}" for i in graph.wrt)
    lines.append(f"    adjoints = tape.differentiate(v{graph.loss}, [{wrt}])")
    observes = ", ".join(f"v{i}" for i in graph.observes)
    feeds = ", ".join(f"v{i}: {literal(v, graph.dtype)}" for i, v in graph.feeds)
    lines.append(f"    return v{graph.loss}, adjoints, [{observes}], {{{feeds}}}")
    lines += ["", "network, (loss, adjoints, observes, feeds) = Tape.record(model)"]
    return "\n".join(lines)


# ---- drawing a recipe ------------------------------------------------------------------------------


class _Drawer:
    """Draws ops one at a time, recording each on a scratch tape so the shape rules vet it."""

    def __init__(self, draw, tape, dtype_name: str, mode: str):
        self.draw = draw
        self.tape = tape
        self.dtype_name = dtype_name
        self.dtype = DTYPES[dtype_name]
        self.mode = mode
        self.ops: list[Op] = []
        self.pool: list = []
        self.feeds: list[tuple[int, object]] = []

    # -- bookkeeping
    def emit(self, method: str, *args) -> int:
        op = Op(method, tuple(args))
        self.pool.append(_apply(self.tape, self.pool, op))
        self.ops.append(op)
        return len(self.pool) - 1

    def value(self, k: int):
        return self.pool[k]

    def computed(self) -> list[int]:
        return [k for k, op in enumerate(self.ops) if op.method not in SOURCES]

    def elements(self) -> list[int]:
        return [k for k, v in enumerate(self.pool) if isinstance(v.dtype, np.dtype)]

    # -- data
    def payload(self, shape) -> np.ndarray:
        rng = np.random.default_rng(self.draw(st.integers(0, 2**32 - 1)))
        if self.mode == "tame":
            kind = self.draw(st.sampled_from(("uniform", "positive")))
            values = rng.uniform(-2.0, 2.0, shape) if kind == "uniform" else rng.uniform(0.25, 2.0, shape)
        else:
            kind = self.draw(st.sampled_from(("normal", "positive", "wide", "integers", "specials")))
            if kind == "normal":
                values = rng.standard_normal(shape)
            elif kind == "positive":
                values = rng.uniform(0.25, 4.0, shape)
            elif kind == "wide":
                values = rng.standard_normal(shape) * 50.0
            elif kind == "integers":
                values = rng.integers(-2, 3, shape).astype(np.float64)
            else:
                values = np.where(rng.random(shape) < 0.4, rng.choice(SPECIALS, shape), rng.standard_normal(shape))
        return np.asarray(values).astype(self.dtype)

    def source(self, shape, role: str | None = None) -> int:
        role = role or self.draw(st.sampled_from(SOURCES))
        k = self.emit(role, self.payload(shape))
        if role == "input" and self.draw(st.booleans()):
            self.feeds.append((k, self.payload(shape)))
        return k

    def selection(self, shape, extent: int) -> int:
        rng = np.random.default_rng(self.draw(st.integers(0, 2**32 - 1)))
        role = self.draw(st.sampled_from(("leaf", "input")))
        k = self.emit(role, topos.selection(rng.integers(0, extent, shape), extent))
        if role == "input" and self.draw(st.booleans()):
            self.feeds.append((k, rng.integers(0, extent, shape)))  # a fed selection is plain integers
        return k

    def shape(self) -> tuple[int, ...]:
        rank = self.draw(st.sampled_from((0, 1, 1, 2, 2, 2, 3, 3)))
        return tuple(self.draw(st.integers(1, 4)) for _ in range(rank))

    # -- guards (tame mode): keep an argument inside a function's domain
    def positive(self, k: int) -> int:
        """x * x + c, c in {0.25, 1}: strictly positive and smooth."""
        square = self.emit("mul", Ref(k), Ref(k))
        return self.emit("add", Ref(square), self.draw(st.sampled_from((0.25, 1.0))))

    def nonnegative(self, k: int) -> int:
        return self.emit("mul", Ref(k), Ref(k))

    # -- one step
    def partner(self, k: int):
        """A second operand for an elementwise binary on value k: Ref, a lifted number, or a fresh source."""
        value = self.value(k)
        choice = self.draw(st.sampled_from(("same", "scalar", "broadcast", "fresh")))
        same = [j for j in self.elements() if self.value(j).shape == value.shape]
        if choice == "same" and same:
            return Ref(self.draw(st.sampled_from(same)))
        if choice == "scalar":
            return self.draw(st.sampled_from((0.5, 2.0, -1.0, 3.0)))
        if choice == "broadcast":
            smaller = [j for j in self.elements() if self.value(j).ndim <= value.ndim and all(
                s in (1, t) for s, t in zip(reversed(self.value(j).shape), reversed(value.shape)))]
            if smaller:
                return Ref(self.emit("broadcast_to", Ref(self.draw(st.sampled_from(smaller))), value.shape))
        return Ref(self.source(value.shape))

    def fits(self, shape) -> bool:
        return len(shape) <= MAX_RANK and math.prod(shape) <= MAX_VOLUME

    def shrink(self, k: int) -> int:
        """The fallback when a drawn step would grow past MAX_RANK or MAX_VOLUME."""
        return self.emit("sum_along", Ref(k), 0) if self.value(k).ndim else self.emit("neg", Ref(k))

    def step(self) -> int:
        elements = self.elements()
        k = elements[-1] if self.draw(st.booleans()) else self.draw(st.sampled_from(elements))
        name = self.draw(st.sampled_from(BINARY + UNARY))
        value = self.value(k)
        rank, shape = value.ndim, value.shape
        if name in BINARY:
            return self.binary(name, k)
        if rank == 0 and name not in ("neg", "map", "sum", "reshape", "broadcast", "broadcast_along", "scatter"):
            name = "map"
        if name == "neg":
            return self.emit("neg", Ref(k))
        if name == "map":
            return self.map(k, self.draw(st.sampled_from(sorted(MAP_FUNCTIONS))))
        if name == "sum":
            return self.emit("sum", Ref(k))
        if name == "broadcast":
            single = [j for j in self.elements() if math.prod(self.value(j).shape) == 1]
            if not single or self.draw(st.booleans()):
                single = [self.emit("sum", Ref(k))]
            return self.emit("broadcast", Ref(self.draw(st.sampled_from(single))), self.shape())
        if name == "reshape":
            volume = math.prod(shape)
            options = [(volume,), (1, volume), tuple(reversed(shape)) or (1,), shape + (1,), ()]
            options = [o for o in options if math.prod(o) == volume and len(o) <= MAX_RANK]
            return self.emit("reshape", Ref(k), self.draw(st.sampled_from(options)))
        if name == "broadcast_along":
            axis, extent = self.draw(st.integers(0, rank)), self.draw(st.integers(1, 3))
            if not self.fits(shape[:axis] + (extent,) + shape[axis:]):
                return self.shrink(k)
            return self.emit("broadcast_along", Ref(k), axis, extent)
        if name == "scatter":
            return self.scatter(k)
        axis = self.draw(st.integers(0, rank - 1))
        extent = shape[axis]
        if name == "sum_along":
            return self.emit("sum_along", Ref(k), axis)
        if name == "permute":
            return self.emit("permute", Ref(k), tuple(self.draw(st.permutations(range(rank)))))
        if name == "narrow":
            start = self.draw(st.integers(0, extent - 1))
            return self.emit("narrow", Ref(k), axis, start, self.draw(st.integers(1, extent - start)))
        if name == "pad":
            start = self.draw(st.integers(0, 2))
            total = start + extent + self.draw(st.integers(0, 2))
            if not self.fits(shape[:axis] + (total,) + shape[axis + 1:]):
                return self.shrink(k)
            return self.emit("pad", Ref(k), axis, start, total)
        if name == "unfold":
            dilation = self.draw(st.integers(1, 2))
            size = self.draw(st.integers(1, (extent - 1) // dilation + 1))
            step = self.draw(st.integers(1, 2))
            count = (extent - dilation * (size - 1) - 1) // step + 1
            if not self.fits(shape[:axis] + (count, size) + shape[axis + 1:]):
                return self.shrink(k)
            return self.emit("unfold", Ref(k), axis, size, step, dilation)
        if name == "fold":
            return self.fold(k)
        if name == "gather":
            return self.gather(k)
        if name == "log_softmax":
            return self.emit("log_softmax", Ref(k), axis)
        if name == "logsumexp":
            return self.emit("logsumexp", Ref(k), axis)
        return self.matmul(k)

    def binary(self, name: str, k: int) -> int:
        other = self.partner(k)
        left, right = Ref(k), other
        if isinstance(other, Ref) and self.draw(st.booleans()):
            left, right = other, left
        if self.mode == "tame" and name == "div":
            right = Ref(self.positive(self._as_ref(right, left)))
        if self.mode == "tame" and name == "pow":
            left = Ref(self.positive(left.index))
        return self.emit(name, left, right)

    def _as_ref(self, operand, like: Ref) -> int:
        """A number operand becomes a leaf of ``like``'s shape (so a guard can square it)."""
        if isinstance(operand, Ref):
            return operand.index
        shape = self.value(like.index).shape
        return self.emit("leaf", np.full(shape, operand, dtype=self.dtype))

    def map(self, k: int, function: str) -> int:
        if self.mode == "tame" and function in ("log", "sqrt"):
            k = self.positive(k)
        elif self.mode == "tame" and function == "log1p":
            k = self.nonnegative(k)
        return self.emit("map", Ref(k), function)

    def matmul(self, k: int) -> int:
        value = self.value(k)
        if value.ndim == 1:
            k = self.emit("reshape", Ref(k), (1, value.shape[0]))
            value = self.value(k)
        inner = value.shape[-1]
        batch = value.shape[:-2]
        fitting = [j for j in self.elements() if self.value(j).ndim == value.ndim
                   and self.value(j).shape[:-2] == batch and self.value(j).shape[-2] == inner]
        if fitting and self.draw(st.booleans()):
            right = self.draw(st.sampled_from(fitting))
        else:
            right = self.source(batch + (inner, self.draw(st.integers(1, 4))))
        if not self.fits(value.shape[:-1] + self.value(right).shape[-1:]):
            return self.shrink(k)
        return self.emit("matmul", Ref(k), Ref(right))

    def fold(self, k: int) -> int:
        value = self.value(k)
        if value.ndim < 2:  # make a (count, size) pair first
            extent = value.shape[0] if value.ndim else 1
            k = self.emit("reshape", Ref(k), (extent, 1) if value.ndim else (1, 1))
            value = self.value(k)
        axis = self.draw(st.integers(0, value.ndim - 2))
        count, size = value.shape[axis], value.shape[axis + 1]
        step, dilation = self.draw(st.integers(1, 2)), self.draw(st.integers(1, 2))
        span = dilation * (size - 1) + 1
        extent = span + (count - 1) * step + self.draw(st.integers(0, step - 1))
        return self.emit("fold", Ref(k), axis, size, step, dilation, extent)

    def gather(self, k: int) -> int:
        table = self.value(k)
        room = MAX_RANK - table.ndim + 1
        rank = self.draw(st.integers(0, min(2, room)))
        shape = tuple(self.draw(st.integers(1, 3)) for _ in range(rank))
        if not self.fits(shape + table.shape[1:]):
            shape = ()
        selection = self.selection(shape, table.shape[0])
        return self.emit("gather", Ref(k), Ref(selection))

    def scatter(self, k: int) -> int:
        values = self.value(k)
        rank = self.draw(st.integers(0, min(2, values.ndim)))
        extent = self.draw(st.integers(1, 4))
        if not self.fits((extent,) + values.shape[rank:]):
            if values.ndim == 0 or not self.fits(values.shape[1:]):
                return self.shrink(k)
            rank, extent = 1, 1
        selection = self.selection(values.shape[:rank], extent)
        return self.emit("scatter", Ref(k), Ref(selection), extent)


@st.composite
def graphs(draw, dtype: str | None = None, mode: str | None = None, max_steps: int = 12) -> Graph:
    """A random recipe in ``dtype`` (a DTYPES key, drawn when None) and ``mode`` (tame or wild)."""
    dtype = dtype or draw(st.sampled_from(tuple(DTYPES)))
    mode = mode or draw(st.sampled_from(("tame", "tame", "wild")))
    tape = Tape()  # a scratch recording: its shape rules vet each step, then it is dropped
    drawer = _Drawer(draw, tape, dtype, mode)
    drawer.source(drawer.shape(), role="parameter")  # every graph has something to differentiate
    for _ in range(draw(st.integers(0, 2))):
        drawer.source(drawer.shape())
    for _ in range(draw(st.integers(1, max_steps))):
        drawer.step()
    # the loss: the newest value's sum, plus up to two other computed values' sums
    computed = [k for k in drawer.computed() if isinstance(drawer.value(k).dtype, np.dtype)]
    terms = [computed[-1] if computed else drawer.elements()[-1]]
    terms += draw(st.lists(st.sampled_from(computed or terms), max_size=2))
    loss = None
    for term in terms:
        total = term if drawer.value(term).shape == () else drawer.emit("sum", Ref(term))
        loss = total if loss is None else drawer.emit("add", Ref(loss), Ref(total))
    if loss in (k for k, op in enumerate(drawer.ops) if op.method in SOURCES):
        loss = drawer.emit("neg", Ref(loss))  # a source as loss is legal, but a computed one tests more
    wrt = tuple(k for k, op in enumerate(drawer.ops) if op.method == "parameter")
    observes = tuple(draw(st.lists(st.sampled_from(range(len(drawer.pool))), max_size=3)))
    return Graph(dtype, mode, tuple(drawer.ops), loss, wrt, observes, tuple(drawer.feeds))


# ---- a float64 replay, to tell a finite-difference artefact from a derivative rule's error --------------


def _wide(array) -> np.ndarray:
    array = np.asarray(array)
    return array if array.dtype.kind in "iu" else array.astype(np.float64)


def float64_values(network, run, overrides=None) -> dict[int, np.ndarray]:
    """Every node of ``network`` replayed over float64 with ``Opcode.express`` (check_gradients' twin).

    Sources come from ``run`` (the oracle's, so feeds and the parameter table are as checked),
    widened exactly, except the node indices in ``overrides``.
    """
    overrides = overrides or {}
    values: dict[int, np.ndarray] = {}
    with np.errstate(all="ignore"):
        for node in network.nodes():
            i = node.index
            if i in overrides:
                values[i] = overrides[i]
            elif node.is_source:
                values[i] = _wide(run[node.symbol])
            else:
                operands = [values[s.index] for s in node.operands]
                values[i] = np.asarray(node.opcode.express(operands, dict(node.attributes)))
    return values


def branches(network, values) -> dict[int, np.ndarray]:
    """For every maximum and step node, which side each element took (the graph's kinks)."""
    taken = {}
    with np.errstate(invalid="ignore"):
        for node in network.nodes():
            if node.opcode.name in ("maximum", "step"):
                a, b = (values[s.index] for s in node.operands)
                taken[node.index] = (a >= b) | (np.isnan(a) if node.opcode.name == "maximum" else False)
    return taken


def float64_gradients(network, values, target: int, sources, terms: dict | None = None,
                      every: dict | None = None) -> dict[int, np.ndarray]:
    """d target / d each source by the derivative rules over the float64 replay (``Opcode.vjp``).

    With ``terms`` (a dict), it also receives, per source, the largest magnitude of any term added
    into that source's cotangent, elementwise: the scale of the accumulation's own roundoff. With
    ``every`` (a dict), it receives the cotangent of every node that has one.
    """
    nodes = network.nodes()
    cotangents: dict[int, np.ndarray] = {target: np.ones(())}
    largest: dict[int, np.ndarray] = {}
    with np.errstate(all="ignore"):
        for node in reversed(nodes[: target + 1]):
            g = cotangents.get(node.index)
            if g is None or node.is_source:
                continue
            operands = [s.index for s in node.operands]
            contributions = node.opcode.vjp([values[j] for j in operands], values[node.index], g,
                                            dict(node.attributes))
            for j, c in zip(operands, contributions):
                if c is not None:
                    c = np.asarray(c)
                    cotangents[j] = c if j not in cotangents else cotangents[j] + c
                    largest[j] = np.abs(c) if j not in largest else np.maximum(largest[j], np.abs(c))
    if terms is not None:
        terms.update({i: largest.get(i, np.zeros(nodes[i].shape)) for i in sources})
    if every is not None:
        every.update(cotangents)
    return {i: cotangents.get(i, np.zeros(nodes[i].shape)) for i in sources}


def ancestors(network, target: int) -> list[int]:
    """``target`` and every node it reads, in recording order."""
    needed = {target}
    for node in reversed(network.nodes()[: target + 1]):
        if node.index in needed:
            needed.update(s.index for s in node.operands)
    return sorted(needed)
