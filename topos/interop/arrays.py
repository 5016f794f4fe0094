"""Arrays to and from torch and jax: results, parameter tables and device state, shared where that is safe.

::

    from topos.interop.arrays import jax_array, jax_arrays, numpy_array, parameters_from, torch_tensor, torch_tensors

    loss = torch_tensor(run[loss_symbol])          # a NumPy payload -> a torch tensor of its own
    w = jax_array(state.device("fc1.weight"))      # IREE device state -> jax, sharing the buffer
    weights = torch_tensors(parameters)            # a Parameters table -> {name: tensor}
    parameters = parameters_from(network, model.state_dict())   # and back, bfloat16 included

Feeds need none of this: ``network.forward``, ``entry.interpret``,
``plan.forward`` and ``CompiledPlan.forward / step`` take torch tensors
(bfloat16 and ``requires_grad`` ones included) and jax arrays as they are
(``topos.base.element.host_array`` reads them; a wrong element type or shape
is the usual FeedError naming the input).

What is shared and what is copied, and why (``docs/compiling.md``,
"Arrays to and from jax and torch", has the measurements):

- **Into torch, always one copy.** A torch tensor cannot be read-only and
  torch writes in place, so a tensor that shared memory with anything
  topos keeps, or with a read-only payload, would let ``t.add_(1)``
  change it. ``torch_tensor(run.device(y))`` copies straight from the
  device buffer, once; ``torch_tensor(run[y])`` copies the payload, which
  was itself a copy.
- **Into jax, shared where the memory allows.** A jax array is
  immutable, so it may share: an IREE DeviceArray on a host-mapped buffer
  (the local-sync and local-task CPU drivers) becomes a jax array over the
  very buffer, which stays alive as long as the jax array does. A
  read-only NumPy array goes through ``jax.device_put``, which shares
  64-byte aligned host memory and copies anything else. A writable array
  is copied first, so a later write to it cannot change the jax array.
  One caveat: jax exports its arrays to torch writable
  (``torch.from_dlpack(array)``), and a write through such a tensor
  lands in the shared device buffer; ``jax_array(x, copy=True)`` makes a
  jax array over memory of its own for that.
- **Into NumPy (and so into topos), a view.** ``numpy_array`` of a CPU
  torch tensor or jax array is a read-only view of its memory (bfloat16
  through a uint16 view, bit for bit); feeds and ``parameters_from`` then
  copy, as they copy NumPy arrays, so nothing topos keeps aliases the
  caller's tensors.

jax's float64 needs its 64-bit mode (``jax.config.update("jax_enable_x64",
True)``): without it jax would round a float64 array to float32 without
a word, so ``jax_array`` refuses one with a ``JaxPrecisionError``. An
int64 (uint64) array becomes int32 (uint32) in that mode, which is exact
for values in int32's (uint32's) range; a value outside it would wrap
without a word, so ``jax_array`` refuses it with a ``JaxPrecisionError``.

Something these functions do not take (a recorded Value, a list, a
Selection) is an ``ArgumentError`` (a ``TypeError`` too) that says what to
pass instead; a tensor NumPy cannot read (one on torch's meta device) is
one that names its device.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from topos.base.copies import own
from topos.base.element import bfloat16, host_array
from topos.base.errors import ArgumentError, FeedError, SymbolError, ToposError


class TorchMissingError(ToposError, ImportError):
    """torch is not installed: topos.interop.arrays hands out torch tensors through it."""


def torch_tensor(x) -> Any:
    """``x`` (a NumPy payload or an IREE DeviceArray) as a torch tensor that owns its memory: one copy.

    A requires-grad-free CPU tensor of the same element type, bfloat16
    included; writing to it changes nothing topos or the caller holds.
    """
    torch = _torch()
    return _tensor_over(torch, _fresh_host_copy(x, "torch_tensor"))


def jax_array(x, *, copy: bool = False) -> Any:
    """``x`` (a NumPy payload or an IREE DeviceArray) as a jax array on jax's default device.

    With ``copy=False`` it shares ``x``'s memory where it can: a host-mapped
    device buffer (the local CPU drivers) always, a read-only NumPy array
    when jax's ``device_put`` aliases it (64-byte aligned host memory on
    jax's CPU). ``copy=True`` gives memory nobody else holds, for a jax
    array that will be exported to torch, which writes in place.
    """
    jax = _jax()
    if _is_device_array(x):
        host = _fresh_host_copy(x, "jax_array") if copy else _shared_view(x)
    elif isinstance(x, (np.ndarray, np.generic)):
        host = np.asarray(x)
        if copy or host.flags.writeable:  # jax arrays are immutable: no writable alias may back one
            host = own(host)
    else:
        raise ArgumentError(_takes("jax_array", x))
    return jax.device_put(_as_jax_holds(jax, host))


def numpy_array(x) -> np.ndarray:
    """``x`` (a torch tensor, a jax array, another DLPack exporter, a DeviceArray) as a read-only NumPy array.

    A view of ``x``'s memory where it is on the host (a CPU tensor or
    array), so it changes if ``x`` is written through torch; a DeviceArray
    is copied (``topos.dialect.iree.results.to_host``), since its buffer may
    be device state.
    """
    if _is_device_array(x):
        from topos.dialect.iree.results import to_host

        return to_host(x)
    array = _host(x, "numpy_array")
    if not isinstance(array, (np.ndarray, np.generic)):
        raise ArgumentError(
            f"numpy_array takes a torch tensor, a jax array, an object with __dlpack__ or an IREE DeviceArray, "
            f"got {type(x).__name__}; np.asarray reads other array-likes"
        )
    view = np.asarray(array).view()
    view.flags.writeable = False
    return view


def torch_tensors(table) -> dict[str, Any]:
    """A Parameters table or ResidentParameters as ``{slot name: torch tensor}``: one copy per slot."""
    torch = _torch()
    if _is_parameters(table):
        # named() hands out fresh copies nobody else holds: they become the tensors' memory.
        return {name: _tensor_over(torch, _writable(array)) for name, array in table.named().items()}
    return {name: torch_tensor(array) for name, array in _resident_slots(table, "torch_tensors")}


def jax_arrays(table, *, copy: bool = False) -> dict[str, Any]:
    """A Parameters table or ResidentParameters as ``{slot name: jax array}``.

    Device state shares its buffers as ``jax_array`` does (``copy=True``
    copies them); a host table's arrays are copied once (its reader,
    ``named()``, copies) and jax may then share those copies.
    """
    if _is_parameters(table):
        return {name: jax_array(array) for name, array in table.named().items()}
    return {name: jax_array(array, copy=copy) for name, array in _resident_slots(table, "jax_arrays")}


def parameters_from(network, tensors: Mapping[str, Any], *, strict: bool = True):
    """A Parameters table of ``network`` from ``{slot name: torch tensor, jax array or NumPy array}``.

    ``network.parameters(source, strict=strict)`` with each value read by
    ``element.host_array`` first (so torch bfloat16 and requires-grad
    tensors load bit for bit); the table copies what it keeps. A missing
    name, a shape or an element type that differs is that call's
    FeedError.
    """
    from topos.spec.network import Network

    if not isinstance(network, Network):
        fix = ("; the network comes first: parameters_from(network, state_dict)"
               if _is_parameters(network) or isinstance(network, Mapping) else
               "; record the model first (Tape.record) and pass the Network it gives")
        raise ArgumentError(f"parameters_from takes the Network first, got {type(network).__name__}{fix}")
    if not isinstance(tensors, Mapping):
        fix = ("; for a file, use topos.checkpoint.load(path, network)"
               if isinstance(tensors, (str, bytes, os.PathLike)) else
               "; pass a state_dict-like mapping, such as model.state_dict()")
        raise ArgumentError(f"parameters_from takes a mapping of slot name -> tensor second, got "
                            f"{type(tensors).__name__}{fix}")
    arrays = {}
    for name, value in dict(tensors).items():
        try:
            arrays[name] = _host(value, "parameters_from")
        except ArgumentError as error:
            raise FeedError(f"slot {name}: {error.bare}") from None
    return network.parameters(arrays, strict=strict)


# ---- helpers ------------------------------------------------------------------------------------


def _torch():
    try:
        import torch
    except ImportError as error:
        raise TorchMissingError(
            f"topos.interop.arrays hands out torch tensors, and torch is not installed ({error}); "
            "install it with `pip install torch`"
        ) from None
    return torch


def _jax():
    from topos.interop.jax import JaxMissingError

    try:
        import jax
    except ImportError as error:
        raise JaxMissingError(
            f"topos.interop.arrays hands out jax arrays, and jax is not installed ({error}); "
            "install it with `pip install jax`"
        ) from None
    return jax


_NARROWED_BY_JAX = {np.dtype(np.int64): np.dtype(np.int32), np.dtype(np.uint64): np.dtype(np.uint32)}
"""What jax's 32-bit mode (``jax_enable_x64`` off) turns a 64-bit integer array into, wrapping what does not fit."""


def _as_jax_holds(jax, host: np.ndarray) -> np.ndarray:
    """``host`` as jax will hold it; what jax's 32-bit mode would change without a word is refused.

    float64 would be rounded (nearly every value), so it is refused
    outright; a 64-bit integer is exact in 32 bits when it fits, so only
    a value outside the 32-bit range is refused, and the rest is narrowed
    here (exactly) rather than by jax.
    """
    from topos.interop.jax import JaxPrecisionError

    if jax.config.jax_enable_x64:
        return host
    if host.dtype == np.float64:
        raise JaxPrecisionError(
            "a float64 array needs jax's 64-bit mode, which is off (jax would round it to float32 "
            "without a word): call jax.config.update(\"jax_enable_x64\", True) before making jax arrays"
        )
    narrow = _NARROWED_BY_JAX.get(host.dtype)
    if narrow is None:
        return host
    limits = np.iinfo(narrow)
    outside = (host < limits.min) | (host > limits.max)
    if outside.any():
        at = tuple(int(k) for k in np.argwhere(outside)[0])
        where = f" at position {at}" if at else ""
        raise JaxPrecisionError(
            f"this {host.dtype} array holds {int(host[at])}{where}, outside {narrow}'s range "
            f"[{limits.min}, {limits.max}], and jax's 64-bit mode is off: jax would make it {narrow} and "
            f"wrap that value to {int(np.asarray(host[at]).astype(narrow))} without a word. Call "
            "jax.config.update(\"jax_enable_x64\", True) before making jax arrays"
        )
    return host.astype(narrow)  # a fresh array nobody else holds: jax may share it


def _is_device_array(x) -> bool:
    runtime = sys.modules.get("iree.runtime")  # a DeviceArray exists only once iree.runtime is imported
    return runtime is not None and isinstance(x, runtime.DeviceArray)


def _is_parameters(table) -> bool:
    from topos.spec.parameters import Parameters

    return isinstance(table, Parameters)


def _takes(function: str, x) -> str:
    return (f"{function} takes a NumPy array (a run's result, a parameter) or an IREE DeviceArray "
            f"(run.device(symbol), state.device(name)), got {type(x).__name__}{_instead(function, x)}")


def _instead(function: str, x) -> str:
    """What to pass in place of ``x``, for the usual near misses."""
    from topos.base.element import Selection
    from topos.spec.symbol import Symbol

    if isinstance(x, Selection):
        return "; pass its indices (selection.indices)"
    if isinstance(x, Symbol) or hasattr(x, "symbol"):  # a recorded node: its numbers are a run's
        return "; a recorded node holds no numbers of its own: pass a run's result, run[symbol]"
    if isinstance(x, (list, tuple, int, float)):
        maker = "torch.tensor(x)" if function.startswith("torch") else "jax.numpy.asarray(x)"
        return f"; {maker} makes one from Python numbers"
    return ""


def _host(x, function: str):
    """``element.host_array(x)``, with a tensor NumPy cannot read refused by name and device."""
    try:
        return host_array(x)
    except (TypeError, ValueError, RuntimeError, BufferError, NotImplementedError) as error:
        device = getattr(x, "device", None)
        if str(device) == "meta":
            raise ArgumentError(
                f"{function} cannot read a {type(x).__name__} on torch's meta device: it has a shape and an "
                f"element type but no numbers ({error}); make one with data first (torch.empty_like(tensor, "
                "device=\"cpu\"), or module.to_empty(device=\"cpu\") and then load or initialise it)"
            ) from None
        on = f" on device {device}" if device is not None else ""
        raise ArgumentError(
            f"{function} cannot read this {type(x).__name__}{on} as a NumPy array ({error}); "
            "move it to the CPU first (tensor.cpu() for torch, jax.device_get(array) for jax)"
        ) from None


def _fresh_host_copy(x, function: str) -> np.ndarray:
    """A writable host copy of ``x`` that nothing else holds."""
    if _is_device_array(x):
        from topos.dialect.iree.results import to_host

        return _writable(to_host(x))
    if isinstance(x, (np.ndarray, np.generic)):
        return np.array(x, order="C", copy=True)
    raise ArgumentError(_takes(function, x))


def _writable(array: np.ndarray) -> np.ndarray:
    """``array`` made writable when it is a copy that owns its memory (no one else sees it); else a copy."""
    if array.flags.owndata and array.base is None:
        array.flags.writeable = True
        return array
    return np.array(array, order="C", copy=True)


def _tensor_over(torch, array: np.ndarray):
    """A torch tensor over ``array``'s memory (no copy); bfloat16 through a uint16 view, bit for bit."""
    if array.dtype == bfloat16:
        return torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(array)


class _Held:
    """A read-only array interface over a DeviceArray's host view that keeps the DeviceArray alive.

    IREE's mapped view does not hold the buffer it maps: once the
    DeviceArray is dropped the buffer is freed and the view reads reused
    memory (measured). An array made from this object has it as its base,
    so whoever keeps the array (jax, for a shared jax array) keeps the
    DeviceArray, its mapping and its buffer.
    """

    def __init__(self, device_array, view: np.ndarray):
        self._device_array = device_array
        interface = dict(view.__array_interface__)  # bfloat16's is '|V2': _shared_view reinterprets the bits
        interface["data"] = (interface["data"][0], True)  # read-only: NumPy then refuses setflags(write=True)
        self.__array_interface__ = interface


def _shared_view(device_array) -> np.ndarray:
    """The device buffer as a read-only host array that keeps it alive: a view where the driver maps it."""
    try:
        view = np.asarray(device_array.to_host())  # maps a host-visible buffer; copies one that is not
    except ValueError:  # Vulkan refuses to import an unaligned host pointer: stage the copy instead
        from topos.dialect.iree.results import to_host

        return to_host(device_array)
    bits = np.dtype(f"u{view.dtype.itemsize}")  # the interface cannot spell ml_dtypes' types
    return np.asarray(_Held(device_array, view.view(bits))).view(view.dtype)


def _resident_slots(state, function: str):
    """(name, DeviceArray or host array) per slot of device state, in slot order."""
    from topos.dialect.iree.compiled import ResidentParameters

    if not isinstance(state, ResidentParameters):
        raise ArgumentError(f"{function} takes a Parameters table or ResidentParameters (compiled.resident(...), "
                        f"a step's state), got {type(state).__name__}")
    host = None
    for name in state.names():
        try:
            yield name, state.device(name)
        except SymbolError:  # a slot the compiled plan does not read never went to the device
            host = state.to_host() if host is None else host
            yield name, host[name]
