"""Reading a compiled call's results to the host: ``CompiledRun``, ``to_host``, and the ways a read takes.

Every array handed to the caller is its own read-only copy, never a view
of a device buffer: on the local drivers device memory is host memory,
and a result's buffer may be the next step's input. A result read in
every step (the loss) is copied straight from its mapped buffer; a small
result on a ``STAGED_DRIVERS`` device comes back through a pinned staging
buffer kept per size.
"""

from __future__ import annotations

import atexit
from typing import TYPE_CHECKING

import numpy as np

from topos.base.copies import own
from topos.base.errors import SymbolError
from topos.dialect.iree.devices import CACHING_DRIVERS, DRIVER_OF, STAGED_DRIVERS, kept_staging, queue_copies

if TYPE_CHECKING:
    from topos.dialect.iree.calling import Results
    from topos.dialect.iree.compiled import CompiledPlan

# On a STAGED_DRIVERS device small results are read through a pinned staging buffer kept per
# size, not through DeviceArray.to_host, which imports a fresh host allocation for every read.
_READ_STAGING: dict[tuple[int, int], list] = {}
_KEPT_STAGING_BYTES = 2**20  # larger reads allocate their staging buffer per read, as before
atexit.register(_READ_STAGING.clear)  # registered later, so run first: the buffers before their device


def _widened(view: np.ndarray) -> np.ndarray:
    """int32 is a selection a narrowing target returned (topos.dialect.passes.narrow): int64, as everywhere else."""
    return view.astype(np.int64) if view.dtype.type is np.int32 else view


def _mapped_result(outputs: Results, k: int, view_type, dtype: np.dtype, shape: tuple[int, ...],
                   size: int) -> np.ndarray:
    """Result ``k`` of a local device, read by mapping its buffer: a read-only copy, the caller's own (as ``own``).

    What ``DeviceArray.to_host`` and ``own`` do on a local driver, where
    device memory is host memory, less their Python: no DeviceArray, no
    check of the buffer's memory type, no element type looked up (the first
    read of the result found its dtype and shape: ``CompiledRun.__getitem__``),
    and one copy, of the bytes. ``view_type`` is iree.runtime's
    HalBufferView. Reading makemore's loss every step took about 30 µs
    before and 8 after (docs/performance.md, "The loss read").
    """
    mapped = outputs._list.get_as_object(k, view_type).map()
    copy = np.frombuffer(bytearray(mapped), dtype, count=size).reshape(shape)
    copy.flags.writeable = False
    return copy


def to_host(array) -> np.ndarray:
    """Copy one IREE DeviceArray to a host NumPy array the caller owns (read-only, never a device view)."""
    return own(_host_view(array))


def _host_view(array) -> np.ndarray:
    """The DeviceArray's contents on the host, possibly a view of the device buffer: never hand it out.

    On the local drivers ``DeviceArray.to_host`` maps the device buffer
    itself; that buffer may be the next step's input. ``DeviceArray.to_host``
    elsewhere imports a host allocation as the copy's target. Vulkan
    requires imported host pointers aligned to
    minImportedHostPointerAlignment (4096 on Mesa lavapipe), which a NumPy
    array is not, so there the import fails; then the result is copied
    through a staging buffer the device allocates itself (host-visible,
    mappable), as reference/iree-mlir-notes.md describes. On a device of
    ``STAGED_DRIVERS`` a result of at most ``_KEPT_STAGING_BYTES`` always
    takes that way, through a staging buffer kept for the next read of its size.
    """
    staged = DRIVER_OF.get(id(array._device)) in STAGED_DRIVERS
    if staged and 0 < array._buffer_view.byte_length <= _KEPT_STAGING_BYTES:
        return staged_to_host(array)
    try:
        return np.asarray(array.to_host())
    except ValueError as error:
        if "minImportedHostPointerAlignment" not in str(error):
            raise
    return staged_to_host(array)


def staged_to_host(array) -> np.ndarray:
    import iree.runtime as rt

    # DeviceArray keeps its device and buffer view private; they are all a copy needs.
    device, view = array._device, array._buffer_view
    source = view.get_buffer()
    size = source.byte_length()
    keep = size <= _KEPT_STAGING_BYTES
    kept: list = _READ_STAGING.setdefault((id(device), size), []) if keep else []
    staging = kept_staging(kept, device, size)
    queue_copies(device, [(source, staging.buffer)])
    raw = rt.HalElementType.map_to_dtype(view.element_type)
    result = staging.host.view(raw).reshape(tuple(view.shape)).copy()  # a copy: the staging buffer is reused
    if keep:  # not after a failed read: its copy may still be writing the buffer
        kept.append(staging)
    return result.astype(array.dtype) if array.dtype != raw else result


class CompiledRun:
    """Results of one compiled call; ``run[symbol]`` is a read-only host copy of that result, the caller's own."""

    __slots__ = ("_compiled", "_outputs", "_host")  # a step makes one: slots make it cheaper

    def __init__(self, compiled: CompiledPlan, outputs: Results):
        self._compiled = compiled
        self._outputs = outputs
        self._host: dict[int, np.ndarray] | None = None  # host views of results, kept private; made on first read

    @property
    def network(self):
        """The network whose compiled plan made this run."""
        return self._compiled.plan.network

    @property
    def compiled(self) -> CompiledPlan:
        """The compiled plan whose call made this run (its ``results`` are what the run holds)."""
        return self._compiled

    def __repr__(self) -> str:
        return f"<CompiledRun on {self._compiled.target.name}: {len(self._outputs)} results>"

    def _repr_html_(self) -> str:
        from topos.views.display import compiled_run_card  # the Jupyter card, loaded only when a notebook asks

        return compiled_run_card(self)

    def _position(self, symbol) -> int:
        network = self._compiled.plan.network
        if isinstance(symbol, str):
            from topos.spec.run import refused_name_read

            raise SymbolError(refused_name_read(network, symbol))
        i = network.check(symbol)
        try:
            return self._compiled.results.index(i)
        except ValueError:
            results = ", ".join(repr(network.symbol(k)) for k in self._compiled.results[:8])
            more = f" and {len(self._compiled.results) - 8} more" if len(self._compiled.results) > 8 else ""
            raise SymbolError(f"{symbol!r} is not a result of this compiled plan (its results: {results}{more}); "
                              "add it to the entry's roots or observe=[...] and compile again") from None

    def __getitem__(self, symbol) -> np.ndarray:
        compiled = self._compiled
        try:
            mapped = compiled._mapped_reads.get(symbol)
        except TypeError:  # unhashable: _position says what it is
            mapped = None
        if mapped is not None:  # read every step (the loss): straight from its mapped buffer, no DeviceArray
            return _mapped_result(self._outputs, *mapped)
        k = self._position(symbol)
        host = self._host
        if host is None or k not in host:
            import iree.runtime as rt

            array = self._outputs[k]
            view = _host_view(array)
            widened = _widened(view)
            mapped_here = array._mapped_memory is not None and compiled.driver in CACHING_DRIVERS
            if mapped_here and widened is view and view.size:  # later reads need no widening: map them directly
                compiled._mapped_reads[symbol] = (k, rt.HalBufferView, view.dtype, view.shape, view.size)
            if host is None:
                host = self._host = {}
            host[k] = widened
        # A view of the result may be a view of the next step's state: each read is a copy.
        return own(host[k])

    def device(self, symbol):
        """The result still on the device (no host copy)."""
        return self._outputs[self._position(symbol)]
