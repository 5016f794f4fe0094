"""Optimizer updates recorded in the graph, so a whole training step compiles to one function.

``sgd(tape, adjoints, learning_rate)`` appends ``p - learning_rate * g``
for every parameter the adjoints cover and returns the pairs. An entry
over ``updates.roots(loss)`` then computes the loss and every next
parameter in one run — the shape a compiled backend keeps on the device.
(Host-side optimizers that step a Parameters table stay pure table
transforms; this is the in-graph spelling of the same rule.)
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from topos.base.arguments import positive_rate, rate_as
from topos.base.errors import ArgumentError, DifferentiationError, FeedError, ShapeError, SymbolError
from topos.readings.differentiate import open_pairs
from topos.spec.network import source_name
from topos.spec.tape import detach


class Updates:
    """(parameter, next value) pairs recorded on a tape; Values while open, Symbols once detached."""

    __slots__ = ("_pairs",)

    def __init__(self, pairs):
        try:
            self._pairs = tuple((p, new) for p, new in pairs)
        except (TypeError, ValueError):
            raise ArgumentError(
                f"Updates takes (parameter, next value) pairs, got {type(pairs).__name__} {pairs!r}"
            ) from None
        counts = Counter(getattr(p, "symbol", p) for p, _ in self._pairs)
        twice = [slot for slot, count in counts.items() if count > 1]
        if twice:
            raise DifferentiationError(
                f"slots {twice} are updated twice; each parameter or state slot takes one next value per step"
            )

    def pairs(self) -> tuple:
        return self._pairs

    def __getitem__(self, parameter):
        key = getattr(parameter, "symbol", parameter)
        for p, new in self._pairs:
            if getattr(p, "symbol", p) == key:
                return new
        raise KeyError(f"{parameter!r} has no recorded update")

    def __len__(self) -> int:
        return len(self._pairs)

    def roots(self, loss=None) -> list:
        """Root list for a training entry: the loss (if given) then every next value."""
        return ([loss] if loss is not None else []) + [new for _, new in self._pairs]

    def __add__(self, other: Updates) -> Updates:
        """Both sets of pairs (an optimizer's and a module's running statistics, say); a slot twice is an error."""
        if not isinstance(other, Updates):
            return NotImplemented
        return Updates(self._pairs + other._pairs)  # which refuses a slot in both

    def apply(self, parameters, run):
        """The next table: each updated slot takes its next value from ``run`` (any run that computed them).

        This is the host side of a training step over an oracle run or a
        plan's run; ``compiled.step`` does the same on the device.
        """
        if not hasattr(parameters, "with_payloads"):
            fix = ("device state is stepped where it lives: compiled.step(state, feeds, updates)"
                   if hasattr(parameters, "to_host") else "pass the table the run read (network.parameters())")
            raise ArgumentError(f"apply takes the host Parameters table to update, got "
                                f"{type(parameters).__name__}; {fix}")
        if not hasattr(run, "__getitem__"):
            raise ArgumentError(f"apply takes the run that computed the next values (oracle, plan or compiled), "
                                f"got {type(run).__name__}")
        network = getattr(run, "network", None)
        if network is not None and hasattr(network, "columns"):  # a run of a Network (every run topos makes)
            self.check_carries_state(network)
        nexts = {}
        for p, n in self._pairs:
            p, n = getattr(p, "symbol", p), getattr(n, "symbol", n)
            try:
                nexts[p] = run[n]
            except (KeyError, SymbolError) as error:
                reason = f" ({error.bare or error})" if isinstance(error, SymbolError) else ""
                raise SymbolError(f"apply: the run has no value for {n!r}, the next value of {p!r}{reason}; "
                                  "run an entry over updates.roots(loss)") from None
        return parameters.with_payloads(nexts)

    def check_carries_state(self, network) -> None:
        """Refuse Updates that leave out a state slot whose next value the recording computed.

        A training reading (BatchNorm's) records its statistics' next values
        (``tape.state_next``); a step over Updates without them would keep
        the initial statistics forever, without a word.
        """
        slots = [getattr(p, "symbol", p) for p, _ in self._pairs]
        if any(getattr(slot, "family", None) is not network.family for slot in slots):
            return  # Updates of another network: the caller refuses them by the pair
        covered = {slot.index for slot in slots}
        dropped = [source_name(network.columns, i) for i in network.columns.nexts if i not in covered]
        if dropped:
            many = len(dropped) > 1
            raise FeedError(
                f"these Updates leave out the state slot{'s' if many else ''} {', '.join(dropped)}, whose next "
                f"value{'s' if many else ''} the recording computed (a training reading, such as BatchNorm's), "
                f"so {'they' if many else 'it'} would never change; join them: optimizer.record(adjoints) + "
                "model.state_updates() (or record the layer's inference reading, training=False, to keep "
                f"{'them' if many else 'it'} fixed)"
            )

    def detach(self) -> Updates:
        return Updates((detach(p), detach(new)) for p, new in self._pairs)

    def __repr__(self) -> str:
        return "Updates(" + ", ".join(f"{getattr(p, 'symbol', p)!r}->{getattr(n, 'symbol', n)!r}"
                                      for p, n in self._pairs) + ")"

    def _repr_html_(self) -> str:
        from topos.views.display import updates_card  # the Jupyter card, loaded only when a notebook asks

        return updates_card(self)


def sgd(tape, adjoints, learning_rate) -> Updates:
    """Record ``p - learning_rate * g`` for each (parameter, gradient) of ``adjoints``.

    ``learning_rate`` is a number (recorded as a leaf) or a rank-0 Value
    (for example an input, so a schedule can feed it per step).
    """
    recorded = open_pairs("sgd", adjoints, tape)
    if hasattr(learning_rate, "symbol"):
        if learning_rate.shape != ():
            raise ShapeError(
                f"sgd: the learning rate {learning_rate.symbol!r} has shape {list(learning_rate.shape)}; "
                "pass a number or a rank-0 Value"
            )
    else:
        learning_rate = positive_rate("sgd", learning_rate)
    pairs = []
    for parameter, gradient in recorded:
        if tape.columns.opcodes[parameter._index].name != "parameter":
            raise DifferentiationError(f"sgd: {parameter.symbol!r} is not a parameter")
        if hasattr(learning_rate, "symbol"):
            rate = learning_rate if gradient.shape == () else learning_rate.broadcast(gradient.shape)
        else:
            rate = tape.leaf(np.full(gradient.shape, rate_as("sgd", learning_rate, gradient.dtype), gradient.dtype))
        pairs.append((parameter, parameter - rate * gradient))
    return Updates(pairs)
