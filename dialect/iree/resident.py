"""Parameters kept on the device between training steps: ``ResidentParameters``.

``CompiledPlan.resident`` makes the first; every ``step`` hands back the
next. A state knows its network and its device, so a plan of another
network or on another device refuses it (``CompiledPlan._check_state``),
and ``to_host`` is the one copy back of a training loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from topos.base.errors import SymbolError
from topos.dialect.iree.results import to_host

if TYPE_CHECKING:
    from topos.dialect.iree.calling import Results
    from topos.dialect.iree.compiled import CompiledPlan


class ResidentParameters:
    """A Parameters table whose arrays live on the IREE device between steps.

    It knows its network (through the table it was made from) and its
    device, so ``step`` refuses it anywhere else.

    Two forms, one meaning. A step that updates every parameter its plan
    reads makes the short form: the step's results (``held``) and each
    parameter's position among them in the module's argument order
    (``layout``), which the next step of that plan pushes as they are. Any
    other state is a table: parameter index -> (results holding its buffer,
    position there). ``_sources`` reads either form as the table.
    """

    __slots__ = ("_template", "_plan", "_held", "_layout", "_table")  # a step makes one: slots make it cheaper

    def __init__(self, template, plan: CompiledPlan, sources: dict | None = None, held: Results | None = None,
                 layout: tuple[int, ...] = ()):
        self._template = template
        self._plan = plan
        self._held = held  # the short form: the results of the step that made this state, or None
        self._layout = layout  # where each of plan._parameters is among them
        self._table = sources  # the table form; made from the short form when first read

    @property
    def _sources(self) -> dict:
        """Parameter index -> (Results holding its device buffer, position there)."""
        table = self._table
        if table is None:
            held = self._held
            table = self._table = {i: (held, position) for i, position in zip(self._plan._parameters, self._layout)}
        return table

    @property
    def _device(self):
        return self._plan._device

    @property
    def _driver(self) -> str:
        return self._plan.driver

    @property
    def _device_arrays(self) -> dict:
        """Parameter index -> its DeviceArray (made on first read, then the same object)."""
        return {i: results[position] for i, (results, position) in self._sources.items()}

    @property
    def driver(self) -> str:
        """The IREE driver whose device holds the arrays (``local-sync``, ``cuda``, ...)."""
        return self._driver

    def names(self) -> tuple[str, ...]:
        """The slot names of the table this state was made from, in slot order; ``device(name)`` reads one."""
        return self._template.names()

    def device(self, symbol):
        """The parameter's array on the device (an IREE DeviceArray; no host copy)."""
        slot = self._template._slot(symbol)  # a SymbolError for a symbol of another network
        index = self._template.symbols()[slot].index  # a name works too
        if index not in self._sources:
            raise SymbolError(f"{symbol!r} is not a parameter the compiled plan reads")
        results, position = self._sources[index]
        return results[position]

    def to_host(self):
        """Copy back to a host Parameters table (the only host transfer of the training loop)."""
        pairs = []
        for symbol in self._template.symbols():
            source = self._sources.get(symbol.index)
            pairs.append((symbol, self._template[symbol] if source is None else to_host(source[0][source[1]])))
        return self._template._like(pairs)

    def __repr__(self) -> str:
        return f"<ResidentParameters: {len(self._sources)} arrays on {self._driver}>"

    def _repr_html_(self) -> str:
        from topos.views.display import resident_card  # the Jupyter card, loaded only when a notebook asks

        return resident_card(self)
