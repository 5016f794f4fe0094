"""Optimizers: one update rule each, read two ways, as derivative rules are.

An optimizer's rule is written once against the recordable vocabulary
(``+``, ``*``, ``sqrt``, ``**`` on payloads). Read on arrays it is a pure
host transform::

    state = optimizer.init(parameters)
    parameters, state = optimizer.step(parameters, gradients, state)

Read on a tape it records the same update as nodes, so one compiled call
runs forward, backward and optimizer together, with the optimizer's state
resident on the device beside the parameters::

    updates = optimizer.record(tape.differentiate(loss, model.parameters()))
    compiled = network.entry(updates.roots(loss)).lower().compile()
    state = compiled.resident(network.parameters())
    state, run = compiled.step(state, feeds, updates)

In the recorded reading the optimizer's state (moments, the step count) is
a set of *state* slots (``tape.parameter(..., trainable=False)``): in the
parameter table, never differentiated, never built by hand. The learning
rate is an input (``optimizer.learning_rate``) whose default is the rate
the optimizer was built with, so a schedule feeds it per step. Both
readings name their state alike (``optim.exp_avg.fc1.weight``,
``optim.step``), so a checkpoint of one loads into the other.

Host and exact-plan readings are bit-identical (same kernels, same
order); a compiled step is within the backend's envelope.

The step count and the learning rate have the parameters' element type
(the vocabulary has no conversion), one per element type in use: a
bfloat16 count is exact up to 256 steps, so train bfloat16 models from a
float32 master copy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import ClassVar

import numpy as np

from topos import ArgumentError, DifferentiationError, Eager, FeedError, Gradients, Parameters, SymbolError, Updates
from topos.base.arguments import positive_rate, rate_as, real
from topos.base.copies import own
from topos.base.element import short_name
from topos.base.provenance import user_site
from topos.readings.differentiate import open_pairs


def _full(scalar, shape):
    """A rank-0 payload filled out to ``shape`` (one broadcast node, or none for rank 0)."""
    return scalar if tuple(shape) == () else scalar.broadcast(shape)


class OptimizerState(Mapping):
    """The host reading's state: a read-only mapping name -> array (moments, step counts)."""

    def __init__(self, arrays: Mapping[str, np.ndarray]):
        frozen = {}
        for name, array in arrays.items():
            array = np.array(array)
            array.flags.writeable = False
            frozen[name] = array
        self._arrays = MappingProxyType(frozen)

    def __getitem__(self, name: str) -> np.ndarray:
        """A read-only copy of one entry."""
        try:
            return own(self._arrays[name])
        except KeyError:
            raise SymbolError(f"the optimizer state has no entry {name!r}") from None

    def __iter__(self):
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def named(self) -> dict[str, np.ndarray]:
        """A new dict name -> read-only copy (what ``topos.checkpoint.save`` writes)."""
        return {name: own(array) for name, array in self._arrays.items()}

    def __repr__(self) -> str:
        return "OptimizerState({" + ", ".join(f"{n}: {list(a.shape)}" for n, a in self._arrays.items()) + "})"


class Optimizer:
    """The two readings shared by every optimizer; a subclass writes ``prepare`` and ``update``.

    ``weight_decay`` applies to the parameters ``decay(name)`` accepts
    (default: every one), e.g. ``decay=lambda name: not name.endswith("bias")``.
    ``prefix`` starts the names of the state slots and the rate input.
    """

    buffers: tuple[str, ...] = ()  # per-parameter state, named like PyTorch's
    _lr: float
    counts_steps: ClassVar[bool] = False

    def __init__(self, lr: float, weight_decay: float = 0.0, decay: Callable[[str], bool] | None = None, *,
                 prefix: str = "optim"):
        owner = type(self).__name__
        lr = positive_rate(owner, lr)
        weight_decay = real(owner, "weight_decay", weight_decay, low=0.0)
        if decay is not None and not callable(decay):
            raise ArgumentError(
                f"{owner}: decay must be a function of a parameter's name (e.g. lambda name: not "
                f"name.endswith('bias')), got {type(decay).__name__} {decay!r}"
            )
        if not isinstance(prefix, str) or not prefix or prefix.startswith("%") or any(c.isspace() for c in prefix):
            raise ArgumentError(
                f"{owner}: prefix must be a non-empty name without whitespace (e.g. 'optim'), got {prefix!r}"
            )
        self._rates: dict = {}
        self.lr, self.weight_decay, self.prefix = lr, weight_decay, prefix
        self._decay = decay or (lambda name: True)

    @property
    def lr(self) -> float:
        """The learning rate: the host step's, and the recorded rate input's default."""
        return self._lr

    @lr.setter
    def lr(self, value) -> None:
        owner = type(self).__name__
        if self._rates:  # a compiled step would keep the recorded default and the host reading move on
            names = [self._group_name("lr", d, list(self._rates)) for d in self._rates]
            raise ArgumentError(
                f"{owner}.lr: this optimizer's step is recorded, and its rate is the input "
                f"{', '.join(map(repr, names))}; changing lr now would leave the recorded step at {self._lr:g}. "
                f"Feed the rate per step instead, {{{names[0]!r}: {value!r}}}, or pass step(..., lr=) on the host"
            )
        self._lr = positive_rate(owner, value)

    # -- the rule, written once ----------------------------------------------------------
    def prepare(self, rate, step):
        """Per element type: rank-0 quantities every update shares (bias corrections)."""
        return {"rate": rate}

    def update(self, name: str, parameter, gradient, buffers: dict, shared: dict):
        """The next (parameter, buffers) of one slot; every argument is a payload of one reading."""
        raise NotImplementedError

    def _decays(self, name: str) -> bool:
        return self.weight_decay > 0 and bool(self._decay(name))

    # -- names shared by both readings ---------------------------------------------------
    def _state_name(self, buffer: str, parameter: str) -> str:
        return f"{self.prefix}.{buffer}.{parameter}"

    def _group_name(self, what: str, dtype, dtypes) -> str:
        return f"{self.prefix}.{what}" if len(dtypes) == 1 else f"{self.prefix}.{what}.{short_name(dtype)}"

    def _step_all(self, slots, rates, steps):
        """Run the rule over ``slots`` [(name, p, g, buffers)] grouped by element type -> new values."""
        shared, new_steps = {}, {}
        for dtype in rates:
            step = steps.get(dtype)
            if step is not None:
                step = new_steps[dtype] = step + 1.0
            shared[dtype] = self.prepare(rates[dtype], step)
        results = [self.update(name, p, g, buffers, shared[p.dtype]) for name, p, g, buffers in slots]
        return results, new_steps

    # -- host reading ------------------------------------------------------------------
    def layout(self, parameters: Parameters) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """name -> (shape, element type) of every state entry this optimizer keeps for ``parameters``."""
        layout, dtypes = {}, _dtypes(parameters)
        for name, array in _trainable(parameters):
            for buffer in self.buffers:
                layout[self._state_name(buffer, name)] = (array.shape, array.dtype)
        if self.counts_steps:
            for dtype in dtypes:
                layout[self._group_name("step", dtype, dtypes)] = ((), dtype)
        return layout

    def init(self, parameters: Parameters) -> OptimizerState:
        """Zero state for every trainable slot of ``parameters`` (and zero step counts)."""
        return OptimizerState({n: np.zeros(shape, dtype) for n, (shape, dtype) in self.layout(parameters).items()})

    def step(self, parameters: Parameters, gradients, state: OptimizerState | None = None,
             lr: float | None = None) -> tuple[Parameters, OptimizerState]:
        """One host step: new (parameters, state); nothing is changed in place.

        ``gradients`` is a table over the same slots
        (``run.backward(loss).parameters(parameters)``) or the Gradients
        themselves. ``lr`` overrides the rate for this step.
        """
        gradients = _aligned_gradients(parameters, gradients)
        state = self.init(parameters) if state is None else state
        dtypes = _dtypes(parameters)
        _check_state(self, state, parameters, dtypes)
        owner = f"{type(self).__name__}.step"
        rate = self.lr if lr is None else positive_rate(owner, lr)
        rates = {d: Eager(rate_as(owner, rate, d)) for d in dtypes}
        steps = {d: Eager(state[self._group_name("step", d, dtypes)]) for d in dtypes} if self.counts_steps else {}
        slots = []
        for name, array in _trainable(parameters):
            buffers = {b: Eager(state[self._state_name(b, name)]) for b in self.buffers}
            slots.append((name, Eager(array), Eager(gradients[name]), buffers))
        results, new_steps = self._step_all(slots, rates, steps)
        new_parameters, new_state = {}, dict(state.named())
        for (name, *_), (p, buffers) in zip(slots, results):
            new_parameters[name] = p.array
            for b, value in buffers.items():
                new_state[self._state_name(b, name)] = value.array
        for d, value in new_steps.items():
            new_state[self._group_name("step", d, dtypes)] = value.array
        return parameters.with_payloads(new_parameters), OptimizerState(new_state)

    # -- recorded reading --------------------------------------------------------------
    def record(self, adjoints) -> Updates:
        """Append this optimizer's update for every (parameter, gradient) of ``adjoints`` -> Updates.

        Records the rate input(s), the state slots and the update nodes;
        the Updates pair every parameter and state slot with its next value.
        """
        owner = f"{type(self).__name__}.record"
        pairs = open_pairs(owner, adjoints)
        if not pairs:
            raise DifferentiationError(f"{owner}: the adjoints cover no parameter")
        tape = pairs[0][0].tape
        self._check_names_free(tape)
        for parameter, _ in pairs:
            if not parameter.trainable:
                raise DifferentiationError(
                    f"{user_site()}: {type(self).__name__}.record: {parameter.symbol!r} ({parameter.name}) is not "
                    "a trainable parameter; optimizers update parameters (differentiate with respect to "
                    "model.parameters())"
                )
        dtypes = list(dict.fromkeys(p.dtype for p, _ in pairs))
        rates = {d: tape.input(rate_as(owner, self.lr, d), name=self._group_name("lr", d, dtypes)) for d in dtypes}
        self._rates = {d: v.symbol for d, v in rates.items()}
        steps = {}
        if self.counts_steps:
            steps = {d: tape.parameter(np.zeros((), d), name=self._group_name("step", d, dtypes), trainable=False)
                     for d in dtypes}
        slots = []
        for parameter, gradient in pairs:
            name = parameter.name or f"%{parameter.symbol.index}"
            buffers = {b: tape.parameter(np.zeros(parameter.shape, parameter.dtype), name=self._state_name(b, name),
                                         trainable=False) for b in self.buffers}
            slots.append((name, parameter, gradient, buffers))
        results, new_steps = self._step_all(slots, rates, steps)
        updates = []
        for (_, parameter, _, buffers), (new, new_buffers) in zip(slots, results):
            updates.append((parameter, new))
            updates.extend((buffers[b], new_buffers[b]) for b in self.buffers)
        updates.extend((steps[d], new_steps[d]) for d in new_steps)
        return Updates(updates)

    def _check_names_free(self, tape) -> None:
        """Refuse a second recording of optimizer state under one prefix: the names would clash at sealing."""
        taken = [name for name in tape.columns.names.values() if name.startswith(f"{self.prefix}.")]
        if taken:
            raise SymbolError(
                f"{user_site()}: {type(self).__name__}.record: this recording already holds optimizer state named "
                f"{taken[0]!r} (an optimizer with prefix={self.prefix!r} was recorded on it before); record one "
                "optimizer over all the parameters (differentiate with respect to every module's parameters), "
                f"or build the second optimizer with another prefix, e.g. {type(self).__name__}(..., "
                f"prefix='{self.prefix}2')"
            )

    @property
    def learning_rate(self):
        """The Symbol of the rate input :meth:`record` made (feed it to change the rate per step)."""
        if len(self._rates) != 1:
            raise SymbolError(
                "record() has not run yet: call optimizer.record(adjoints) inside the recording first"
                if not self._rates else
                f"this optimizer has one rate input per element type: {self.prefix}.lr.<type>; feed them by name"
            )
        return next(iter(self._rates.values()))

    def state_from(self, tensors: Mapping[str, np.ndarray], parameters: Parameters) -> OptimizerState:
        """Host state for ``parameters`` taken by name from ``tensors`` (a checkpoint's), checked."""
        expected = self.layout(parameters)
        missing = [n for n in expected if n not in tensors]
        wrong = [f"{n}: {list(np.shape(tensors[n]))} {np.asarray(tensors[n]).dtype}, expected "
                 f"{list(shape)} {dtype}" for n, (shape, dtype) in expected.items()
                 if n in tensors and (np.shape(tensors[n]) != shape or np.asarray(tensors[n]).dtype != dtype)]
        if missing or wrong:
            raise FeedError(
                f"the tensors do not hold {type(self).__name__}'s state for these parameters:\n  "
                + "\n  ".join((["missing: " + ", ".join(missing)] if missing else []) + wrong)
            )
        return OptimizerState({n: tensors[n] for n in expected})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(lr={self.lr}, weight_decay={self.weight_decay})"


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum, Nesterov momentum and weight decay (PyTorch's rule).

    ``g += weight_decay * p``; with momentum, ``buf = momentum * buf + g`` and
    ``g = g + momentum * buf`` (Nesterov) or ``g = buf``; then ``p -= lr * g``.
    """

    def __init__(self, lr: float, momentum: float = 0.0, nesterov: bool = False, weight_decay: float = 0.0,
                 decay=None, *, prefix: str = "optim"):
        super().__init__(lr, weight_decay, decay, prefix=prefix)
        momentum = real("SGD", "momentum", momentum, low=0.0)
        if nesterov and momentum == 0:
            raise ArgumentError("SGD: Nesterov momentum needs momentum > 0; pass momentum=0.9, say, or nesterov=False")
        self.momentum, self.nesterov = momentum, nesterov
        self.buffers = ("momentum_buffer",) if momentum else ()

    def update(self, name, p, g, buffers, shared):
        if self._decays(name):
            g = g + p * self.weight_decay
        new_buffers = {}
        if self.momentum:
            velocity = buffers["momentum_buffer"] * self.momentum + g
            new_buffers["momentum_buffer"] = velocity
            g = g + velocity * self.momentum if self.nesterov else velocity
        return p - _full(shared["rate"], p.shape) * g, new_buffers


class Adam(Optimizer):
    """Adam (PyTorch's rule): bias-corrected moments, ``weight_decay`` added to the gradient (L2).

    ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g g``, then
    ``p -= (lr / (1 - b1**t)) * m / (sqrt(v) / sqrt(1 - b2**t) + eps)``.
    """

    buffers = ("exp_avg", "exp_avg_sq")
    counts_steps = True
    decoupled = False

    def __init__(self, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, decay=None, *, prefix: str = "optim"):
        super().__init__(lr, weight_decay, decay, prefix=prefix)
        owner = type(self).__name__
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ArgumentError(
                f"{owner}: betas must be a pair (beta1, beta2) of numbers in [0, 1), e.g. (0.9, 0.999), got "
                f"{betas!r}" + ("; pass it as betas=(...) (the second positional argument is betas)"
                                if not isinstance(betas, (tuple, list)) else "")
            )
        try:
            beta1, beta2 = (real(owner, f"betas[{i}]", b, low=0.0, high=1.0, high_open=True)
                            for i, b in enumerate(betas))
        except ArgumentError:
            raise ArgumentError(f"{owner}: betas must lie in [0, 1) and be finite, got {betas!r}") from None
        self.betas, self.eps = (beta1, beta2), real(owner, "eps", eps, low=0.0, low_open=True)

    def prepare(self, rate, step):
        beta1, beta2 = self.betas
        return {
            "rate": rate,
            "step_size": rate / (1.0 - beta1 ** step),
            "correction": (1.0 - beta2 ** step).sqrt(),
        }

    def update(self, name, p, g, buffers, shared):
        beta1, beta2 = self.betas
        if self._decays(name):
            if self.decoupled:
                p = p * (1.0 - _full(shared["rate"], p.shape) * self.weight_decay)
            else:
                g = g + p * self.weight_decay
        m = buffers["exp_avg"] * beta1 + g * (1.0 - beta1)
        v = buffers["exp_avg_sq"] * beta2 + g * g * (1.0 - beta2)
        denominator = v.sqrt() / _full(shared["correction"], p.shape) + self.eps
        new = p - _full(shared["step_size"], p.shape) * m / denominator
        return new, {"exp_avg": m, "exp_avg_sq": v}


class AdamW(Adam):
    """Adam with decoupled weight decay: ``p *= 1 - lr * weight_decay`` before the Adam step (default 0.01).

    ``decay`` picks the parameters that decay by name, e.g.
    ``decay=lambda name: name.endswith("weight") and "norm" not in name``.
    """

    decoupled = True

    def __init__(self, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, decay=None, *, prefix: str = "optim"):
        super().__init__(lr, betas, eps, weight_decay, decay, prefix=prefix)


# ---- helpers ---------------------------------------------------------------------------------


def _table(parameters: Parameters) -> Parameters:
    if not isinstance(parameters, Parameters):
        raise FeedError(
            f"{user_site()}: optimizers step a Parameters table (network.parameters(), or one a step returned), "
            f"got {type(parameters).__name__}; a dict of arrays becomes one with network.parameters(mapping)"
        )
    return parameters


def _trainable(parameters: Parameters) -> Iterable[tuple[str, np.ndarray]]:
    parameters = _table(parameters)
    return [(name, parameters[name]) for name in parameters.names() if parameters.trainable(name)]


def _dtypes(parameters: Parameters) -> list:
    return list(dict.fromkeys(array.dtype for _, array in _trainable(parameters)))


def _aligned_gradients(parameters: Parameters, gradients) -> Parameters:
    parameters = _table(parameters)
    if isinstance(gradients, Gradients):
        try:
            gradients = gradients.parameters(parameters)
        except SymbolError:
            raise SymbolError(
                f"{user_site()}: these gradients belong to another network than the parameters being stepped; "
                "take them from run.backward(loss) of a run of these parameters"
            ) from None
    if not isinstance(gradients, Parameters):
        raise FeedError(
            f"{user_site()}: step takes gradients as a table (run.backward(loss).parameters(parameters)), got "
            f"{type(gradients).__name__}"
        )
    if gradients._family is not parameters._family or gradients.symbols() != parameters.symbols():
        raise SymbolError(
            f"{user_site()}: these gradients are not over the same slots as the parameters (another network, "
            "or another recording of it); take them from a run of the network these parameters serve"
        )
    return gradients


def _check_state(optimizer: Optimizer, state, parameters: Parameters, dtypes) -> None:
    if not isinstance(state, OptimizerState):
        raise FeedError(
            f"{user_site()}: the optimizer state must come from optimizer.init or step, got {type(state).__name__}"
        )
    expected = optimizer.layout(parameters)
    arrays = state._arrays
    missing = [n for n in expected if n not in arrays]
    extra = [n for n in arrays if n not in expected]
    reshaped = [f"{n}: {list(arrays[n].shape)}, these parameters need {list(expected[n][0])}"
                for n in expected if n in arrays and arrays[n].shape != expected[n][0]]
    if missing or extra or reshaped:
        problems = (["missing: " + _listed(missing)] if missing else []) + (
            ["not for these parameters: " + _listed(extra)] if extra else []) + reshaped[:8] + (
            [f"... and {len(reshaped) - 8} more of another shape"] if len(reshaped) > 8 else [])
        raise SymbolError(
            f"{user_site()}: this {type(optimizer).__name__} state was made for other parameters "
            f"(it has {len(state)} entries, these parameters need {len(expected)}):\n  " + "\n  ".join(problems)
            + "\n  start from optimizer.init(parameters), or load the state that was saved with them"
        )
    retyped = [f"{n}: {arrays[n].dtype}, the parameters need {expected[n][1]}"
               for n in expected if arrays[n].dtype != expected[n][1]]
    if retyped:
        raise FeedError(
            f"{user_site()}: this {type(optimizer).__name__} state holds entries of another element type than "
            "the parameters:\n  " + "\n  ".join(retyped[:8]) + "\n  start from optimizer.init(parameters), or "
            "convert the state to the parameters' element type (optimizer.state_from checks it)"
        )


def _listed(names: list[str]) -> str:
    return ", ".join(names[:8]) + (f", ... ({len(names) - 8} more)" if len(names) > 8 else "")


__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "OptimizerState"]
