"""Calling a loaded module: each feed checked and pushed in the module's order, the call, its results, its errors.

The path every ``forward`` and training ``step`` takes, so it is written
for the host time of a small step: feeds of the common kind are checked
in a few comparisons (``bind_common``), and ``@main`` is called through
``VmContext.invoke`` (``Invoker``), not iree.runtime's FunctionInvoker,
whose per-call Python was most of a small training step's host time
(benchmarks/host_overhead.py). A call's results stay on the device
(``Results``) until read (``topos.dialect.iree.results``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import ml_dtypes
import numpy as np

from topos.base.element import Selection, SelectionType, convert
from topos.base.errors import ToposError
from topos.base.provenance import user_site
from topos.dialect.iree.compile import TRANSIENT_SIZE
from topos.dialect.iree.devices import STAGED_DRIVERS, kept_staging, queue_copies

if TYPE_CHECKING:
    from topos.dialect.iree.compiled import CompiledPlan


class _Input(NamedTuple):
    """One input the module reads, as ``bind_common`` checks a feed of it."""

    slot: int  # its position among the module's inputs, which follow its parameters
    shape: tuple[int, ...]
    dtype: np.dtype  # int64 for a selection
    rows: int  # a selection's table rows, every index below it; 0 for numbers
    number: float  # rank 0 and not a selection: a Python float strictly within +-number may feed it; else 0.0


@dataclass(frozen=True)
class _Inputs:
    """The inputs among a plan's arguments: found by Symbol or name, and the payloads of those not fed."""

    by_key: Mapping[object, _Input]
    count: int  # how many inputs the module takes
    defaults: tuple[tuple[int, np.ndarray], ...]  # (slot, recorded payload) of each input that need not be fed


def _largest(dtype) -> float:
    """The largest finite value of a number input's element type: a Python float beyond it goes to bind_feeds,
    which refuses it (it would become inf)."""
    try:
        return float(ml_dtypes.finfo(dtype).max)
    except ValueError:
        return 0.0


def argument_inputs(network, inputs) -> _Inputs:
    by_key: dict[object, _Input] = {}
    defaults = []
    for slot, i in enumerate(inputs):
        spec = network.columns.specs[i]
        selection = isinstance(spec.dtype, SelectionType)
        number = not selection and spec.shape == ()
        entry = _Input(slot, tuple(spec.shape), np.dtype(np.int64) if selection else np.dtype(spec.dtype),
                       spec.dtype.extent if selection else 0, _largest(spec.dtype) if number else 0.0)
        by_key[network.symbol(i)] = entry
        if i in network.columns.names:
            by_key[network.columns.names[i]] = entry
        if i not in network.columns.required:
            defaults.append((slot, network.columns.payloads[i]))
    return _Inputs(by_key, len(inputs), tuple(defaults))


def bind_common(inputs: _Inputs, feeds) -> list | None:
    """Each input's value in the module's order, when every feed is of the common kind and every required input is fed.

    The common kind is what ``bind_feeds`` would hand back unchanged: a
    NumPy array of the input's element type and shape (int64 in bounds for
    a selection), or a Python float for a rank-0 number, which ``Invoker``
    converts as ``bind_feeds`` would. None leaves every decision, and every
    error message, to ``bind_feeds``.
    """
    values: list = [None] * inputs.count
    by_key, filled = inputs.by_key, 0
    try:
        for key, value in (feeds or {}).items():
            slot, shape, dtype, rows, number = by_key[key]
            kind = type(value)
            if kind is np.ndarray:
                if value.shape != shape or (value.dtype is not dtype and value.dtype != dtype):
                    return None
                # argmax/argmin rather than min()/max(): they skip NumPy's ufunc machinery, which a step
                # pays for cold, after the module ran (measured: benchmarks/host_overhead.py).
                if rows and not (value.item(value.argmax()) < rows and value.item(value.argmin()) >= 0):
                    return None
            elif kind is Selection:  # checked when it was made: no bounds scan
                if not rows or value.extent > rows or value.indices.shape != shape:
                    return None
                value = value.indices
            elif kind is not float or not -number < value < number:
                # Strict, so that number 0.0 (a selection, or an input of rank > 0) admits no float, not 0.0 and
                # -0.0; NaN, inf, and a float at the largest finite value go to bind_feeds too.
                return None
            if values[slot] is not None:
                return None  # fed twice, by its Symbol and by its name: bind_feeds says so
            filled += 1
            values[slot] = value
    except Exception:  # no input's key, an unhashable one, feeds that are no mapping: bind_feeds says which
        return None
    if filled < inputs.count:
        for slot, payload in inputs.defaults:
            if values[slot] is None:
                values[slot] = payload
                filled += 1
        if filled < inputs.count:
            return None  # a required input not fed
    return values


class Invoker:
    """``@main`` called through ``VmContext.invoke``: what iree.runtime's FunctionInvoker does, minus its Python.

    FunctionInvoker looks up a packer per argument by its Python type and
    wraps every result in a DeviceArray on every call. Here the order and
    element types are fixed once per plan: device state is pushed as the
    VmRef it is, a host array is copied to the device as FunctionInvoker's
    packer copies one (DEVICE_LOCAL, usage DEFAULT | MAPPING, C order), a
    rank-0 input fed the same Python float object as last call reuses its
    device copy, and results become DeviceArrays only when read. Our
    modules carry no ``iree.abi`` reflection entry (FunctionInvoker's typed
    ABI; the ``iree.abi.transients.*`` entries are other keys), so
    FunctionInvoker runs them in its dynamic mode: the same element types,
    no dtype overrides.

    A module compiled with transient storage (``with_transient_storage``)
    takes a buffer of ``TRANSIENT_SIZE`` bytes first. Each call takes one
    from the spares, or allocates one when every spare is in use by a call
    on another thread, and puts it back when the module returns: one
    storage per call in flight at once, kept as long as the plan.

    On a driver of ``STAGED_DRIVERS`` (cuda) a host array goes through a
    staging buffer instead: pinned host memory the device can
    read, mapped once and kept per argument (one per call in flight, as the
    storages are), written, then copied by the device's queue into a fresh
    device-local buffer. Fresh, because a result may be that very buffer
    (an entry may return an input), and a result is the caller's. A call's
    copies are submitted together and waited for once, before the call. On
    an H200 a 200 KB batch took 47.5 µs this way against 273-408 µs through
    FunctionInvoker's packer, which allocates and maps device memory for
    every call, and each further feed of a call adds a copy, not a wait
    (docs/performance.md, "On a GPU").
    """

    def __init__(self, vm_context, device, vm_function, compiled: CompiledPlan):
        import iree.runtime as rt

        network = compiled.plan.network
        self._context = vm_context  # what the results of its calls hold (Results)
        self._invoke = vm_context.invoke
        self._function = vm_function
        self._device = device
        self._allocate = device.allocator.allocate_buffer_copy
        self._memory = int(rt.MemoryType.DEVICE_LOCAL)
        self._usage = int(rt.BufferUsage.DEFAULT | rt.BufferUsage.MAPPING)
        self._copied_usage = int(rt.BufferUsage.DEFAULT | rt.BufferUsage.TRANSFER)  # a staged feed's device buffer
        self._list = rt.VmVariantList
        self._element_type = rt.array_interop.map_dtype_to_element_type
        # A target that narrows selections takes them as int32 (topos.dialect.passes.narrow).
        index = np.dtype(np.int32 if compiled.target.narrows_selections else np.int64)
        self._dtypes = tuple(index if isinstance(network.columns.specs[i].dtype, SelectionType)
                             else np.dtype(network.columns.specs[i].dtype) for i in compiled.arguments)
        self._element_types = tuple(self._element_type(d) for d in self._dtypes)
        self._count = len(self._dtypes)  # arguments, after the transient storage if the module takes one
        self._results = len(compiled.results)
        # Per argument: the Python float fed last and its device copy (floats are immutable: `is` is the test).
        self._numbers: list[tuple] = [(None, None)] * self._count
        size = vm_function.reflection.get(TRANSIENT_SIZE)
        self._storage_bytes = None if size is None else int(size)
        self._spare: list = []  # transient storages no call is using (list.pop and append are atomic)
        # Per argument: staging buffers no call is using, on a STAGED_DRIVERS driver; else None.
        self._staging: list[list] | None = ([[] for _ in self._dtypes] if compiled.driver in STAGED_DRIVERS
                                            else None)

    def calling(self) -> Callable[..., Results]:
        """``call(values, refs=())``: ``@main`` called with ``refs`` first (VmRefs of device buffers: the
        parameters of a step, or of a run on device state), then ``values``, the host value of each remaining
        argument in order (arrays, Python floats).

        Every training step takes it, so it is one frame with the common
        case inline, and what it reads is bound here once, as closure cells
        rather than attributes looked up on every call: the step's Python
        runs cold, after the module has filled the caches (measured:
        benchmarks/host_overhead.py).
        """
        new_list, count, result_count = self._list, self._count, self._results
        invoke, function, device, kept = self._invoke, self._function, self._device, self._numbers
        context = self._context
        allocate, memory, usage = self._allocate, self._memory, self._usage
        dtypes, element_types, upload = self._dtypes, self._element_types, self._upload
        direct, transient = self._staging is None, self._storage_bytes is not None

        def call(values: list, refs=()) -> Results:
            arguments, storage = self._begun(count) if transient else (new_list(count), None)
            push = arguments.push_ref
            for ref in refs:
                push(ref)
            staged: list | None = None if direct else []  # a STAGED_DRIVERS driver's feeds, copied together
            numbers: list | None = None  # (argument, Python float, its device copy) fed anew: kept once copied
            try:
                for k, value in enumerate(values, len(refs)):
                    if type(value) is float:  # floats are immutable: `is` tells the float fed last call
                        last, copy = kept[k]
                        if last is not value:
                            copy = upload(k, convert(value, dtypes[k]), staged)  # bind_feeds's conversion
                            numbers = [] if numbers is None else numbers
                            numbers.append((k, value, copy))
                        push(copy)
                    elif direct and value.dtype is dtypes[k]:  # _upload's common case, inline
                        try:
                            push(allocate(memory, usage, device, value, element_types[k]).ref)
                        except ValueError:  # "ndarray is not C-contiguous": _upload copies it
                            push(upload(k, value, staged))
                    else:
                        push(upload(k, value, staged))
                if staged:
                    self._copied(staged)
                for k, value, copy in numbers or ():  # only now: another thread may push a kept copy at once
                    kept[k] = (value, copy)
                results = new_list(result_count)
                invoke(function, arguments, results)
            finally:
                if storage is not None:  # the call is over (our modules are synchronous): the next may use it
                    self._spare.append(storage)
            return Results(results, device, context)

        return call

    def _begun(self, count: int) -> tuple:
        """(the argument list of a call of ``count`` arguments, its transient storage pushed first)."""
        assert self._storage_bytes is not None  # only a module with transient storage takes one
        arguments = self._list(count + 1)
        try:
            storage = self._spare.pop()
        except IndexError:  # every storage is in a call on another thread, or this is the first call
            storage = self.new_storage()
        arguments.push_ref(storage.ref)
        return arguments, storage

    def new_storage(self):
        """A HalBufferView of the module's transient bytes (its contents do not matter: IREE writes before reading)."""
        assert self._storage_bytes is not None  # only a module with transient storage asks
        host = np.empty(self._storage_bytes, np.uint8)
        return self._allocate(self._memory, self._usage, self._device, host, self._element_type(host.dtype))

    def _upload(self, k: int, array: np.ndarray, staged: list | None):
        """``array`` on the device as argument ``k``: its ref (``staged``, None unless this driver stages, collects
        the copies ``_copied`` makes)."""
        dtype = self._dtypes[k]
        if array.dtype is dtype or array.dtype == dtype:
            element_type = self._element_types[k]
        elif dtype.kind == "i":  # int64 indices for int32 (topos.dialect.passes.narrow): checked in [0, extent < 2^31]
            array, element_type = array.astype(dtype), self._element_types[k]
        else:
            element_type = self._element_type(array.dtype)
        if staged is not None and array.nbytes:
            return self._staged(k, array, element_type, staged)
        try:
            view = self._allocate(self._memory, self._usage, self._device, array, element_type)
        except ValueError:  # "ndarray is not C-contiguous": the packer copied such an array into C order
            if array.flags.c_contiguous:
                raise
            view = self._allocate(self._memory, self._usage, self._device, np.ascontiguousarray(array), element_type)
        return view.ref

    def _staged(self, k: int, array: np.ndarray, element_type, staged: list):
        """``array`` written to argument ``k``'s staging buffer: the ref of the fresh device buffer it will be
        copied to, and the copy added to ``staged`` (``_copied`` makes them all)."""
        import iree.runtime as rt

        device = self._device
        assert self._staging is not None  # only a STAGED_DRIVERS invoker stages
        staging = kept_staging(self._staging[k], device, array.nbytes, int(rt.BufferUsage.DEFAULT))
        staging.host[...] = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        target = device.allocator.allocate_buffer(memory_type=self._memory, allowed_usage=self._copied_usage,
                                                  allocation_size=array.nbytes)
        staged.append((k, staging, target))
        return rt.HalBufferView(target, array.shape, element_type).ref

    def _copied(self, staged: list) -> None:
        """Each staged feed copied into its device buffer, then its staging buffer free for the next call.

        If the call fails first, its staging buffers are dropped, not put
        back (the next call makes new ones): after a failed submission a copy
        may still be reading one.
        """
        assert self._staging is not None  # only a STAGED_DRIVERS invoker stages
        queue_copies(self._device, [(staging.buffer, target) for _, staging, target in staged])
        for k, staging, _ in staged:
            self._staging[k].append(staging)


_CONTEXT = "_topos_module_context"  # the attribute by which a DeviceArray of a call's result holds its context


class Results:
    """Device values of one call: VmRefs to pass to the next call, DeviceArrays made when first read."""

    # The VmContext whose call made them is held, and so is every DeviceArray made of them: IREE crashes the
    # process at exit if a call's results are freed after their context (make demo did, a training step's state
    # and run held at module level). Slots are freed in the order of their sorted names: _list before
    # _module_context.
    __slots__ = ("_list", "_device", "_arrays", "_module_context")

    def __init__(self, values, device, context, arrays: dict | None = None):
        self._list = values  # an iree.runtime.VmVariantList of HalBufferViews
        self._device = device
        self._module_context = context  # None for arrays no call made (resident's copies)
        self._arrays: dict[int, object] = {} if arrays is None else arrays

    @staticmethod
    def of(array) -> Results:
        """One DeviceArray as a one-entry Results (a resident parameter, or one a step kept)."""
        import iree.runtime as rt

        values = rt.VmVariantList(1)
        values.push_ref(array._buffer_view.ref)
        return Results(values, array._device, getattr(array, _CONTEXT, None), {0: array})

    def __len__(self) -> int:
        return len(self._list)

    def __getitem__(self, k: int):
        """Result ``k`` as an iree.runtime.DeviceArray, the same object at every read (as FunctionInvoker made it)."""
        array = self._arrays.get(k)
        if array is None:
            import iree.runtime as rt

            array = rt.DeviceArray(self._device, self._list.get_as_object(k, rt.HalBufferView),
                                   implicit_host_transfer=True)
            setattr(array, _CONTEXT, self._module_context)  # a result the caller keeps keeps its context
            array = self._arrays.setdefault(k, array)  # two threads reading at once keep one array
        return array


def device_refs(sources: dict, parameters: tuple) -> list:
    """The VmRef of each of ``parameters``' device buffers in ``sources`` (a ResidentParameters table), in order."""
    refs = []
    for i in parameters:
        results, position = sources[i]
        refs.append(results._list.get_as_ref(position))
    return refs


def detach(sources: dict, outputs: Results) -> None:
    """Point each parameter a step kept at a one-entry Results of its own buffer.

    A kept parameter may still name an earlier step's results, which hold
    that step's every buffer; state must not keep those alive.
    """
    for parameter, (results, position) in sources.items():
        if results is not outputs and len(results) > 1:
            sources[parameter] = (Results.of(results[position]), 0)


class DeviceMemoryError(ToposError, MemoryError):
    """The device could not allocate a buffer a compiled plan needs (IREE's RESOURCE_EXHAUSTED)."""


def runtime_error(compiled: CompiledPlan, error: Exception) -> ToposError:
    """A ToposError for a failed IREE call: out of memory gets its own class and the plan's peak."""
    if "RESOURCE_EXHAUSTED" in str(error):
        peak, node = compiled.plan.peak()
        return DeviceMemoryError(
            f"{user_site()}: the {compiled.target.name} device ({compiled.driver}) ran out of memory running "
            f"this plan; its live values peak at {peak} bytes (node {node}, see plan.describe()): reduce the "
            f"batch or the declared results, or run on a larger device. IREE said: {error}"
        )
    return ToposError(f"{user_site()}: IREE could not run the module compiled for {compiled.target.name}: {error}")
