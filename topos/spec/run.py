"""A Run: the values one execution computed, readable by symbol."""

from __future__ import annotations

import numpy as np

from topos.base.copies import own
from topos.base.errors import SymbolError


class Run:
    """The result of one forward execution: ``run[symbol]`` is a read-only array."""

    __slots__ = ("_network", "_values", "_readable", "_backward")

    def __init__(self, network, values: dict[int, np.ndarray], readable=None, backward=None):
        self._network = network
        self._values = values
        self._readable = readable  # None: every node may be read
        self._backward = backward  # the target its entry's backward posture declared, or None

    @property
    def network(self):
        return self._network

    def __getitem__(self, symbol) -> np.ndarray:
        """A read-only copy of the value this run computed (or was fed) for ``symbol``."""
        return own(self._value(symbol))

    def _value(self, symbol) -> np.ndarray:
        if isinstance(symbol, str):
            raise SymbolError(refused_name_read(self._network, symbol))
        i = self._network.check(symbol)
        if self._readable is not None and i not in self._readable:
            raise SymbolError(
                f"{symbol!r} was not declared by this run's entry (roots and observes); "
                "declare it to read it"
            )
        return self._values[i]

    def backward(self, target):
        """The backward scan: gradients of the rank-0 ``target`` at every node -> Gradients."""
        from topos.readings.differentiate import backward

        return backward(self, target)

    def recorded_gradients(self, adjoints, parameters):
        """The gradients ``differentiate`` recorded, read from this run as a Parameters table."""
        from topos.readings.differentiate import recorded_gradients

        return recorded_gradients(self, adjoints, parameters)

    def __contains__(self, symbol) -> bool:
        try:
            self._value(symbol)
        except SymbolError:
            return False
        return True

    def __repr__(self) -> str:
        return f"<Run over {len(self._values)} of {len(self._network)} nodes>"

    def _repr_html_(self) -> str:
        from topos.views.display import run_card  # the Jupyter card, loaded only when a notebook asks

        return run_card(self)


def refused_name_read(network, name: str) -> str:
    """Why ``run[name]`` is refused, and the read that works: feeds take names, runs take Symbols."""
    head = (f"run[{name!r}]: {name!r} is a str, not a Symbol; a run is read by Symbol, not by name "
            "(feeds accept names, runs do not)")
    if name in network.names():
        return f"{head}; read run[network.named({name!r})], or run[symbol] with the Symbol Tape.record returned"
    return (f"{head}, and this network has no parameter or input named {name!r}; read run[symbol] with "
            "the Symbol Tape.record returned for it")
