"""The IREE devices of this process: one per driver, and the pinned staging buffers and queue copies of a GPU.

Shared by everything that runs a module: a state made by one compiled
plan steps in another only on the same device, so ``device_for`` makes
one per driver and keeps it. Feeds going in (``topos.dialect.iree.calling``)
and results coming out (``topos.dialect.iree.results``) on a
``STAGED_DRIVERS`` device both pass through the staging buffers kept here.
"""

from __future__ import annotations

import atexit
import threading
from typing import NamedTuple

import numpy as np

from topos.dialect.iree.targets import check_driver

# One device per driver in a process, as iree.runtime.Config shares one, so that state made by
# one plan steps in another. On the local (CPU) drivers the device's allocator is wrapped in
# IREE's caching allocator: a freed buffer is kept for the next request of the same size instead
# of going back to the heap. Without it every call of GPT-2 124M's forward freed and page-faulted
# in again about 150 MiB (the data-tiled copy of the tied embedding): 465.7 ms a call against
# 413.7 with it (docs/performance.md, "Buffers kept for reuse").
_DEVICES: dict[str, object] = {}
_DEVICES_LOCK = threading.Lock()
CACHING_DRIVERS = frozenset({"local-sync", "local-task"})
# Drivers whose feeds go through kept pinned staging buffers and whose small results come back
# through them (Invoker._staged, staged_to_host), instead of IREE's packer and
# DeviceArray.to_host, which allocate per call. On an H200 a 200 KB batch took 47.5 µs against
# 273-408, a loss 37 µs against 127; a call's feeds are copied together, with one wait. Not
# vulkan: on Mesa lavapipe a queue copy costs 16 ms against 4.5 µs for the packer, whose device
# memory is host memory (benchmarks/transfers.py).
STAGED_DRIVERS = frozenset({"cuda"})
DRIVER_OF: dict[int, str] = {}  # id of a device device_for made -> its driver
# Let go of the devices before interpreter teardown: iree.runtime is imported after this module,
# so its extension is torn down first, and nanobind reports a device still held then as a leak.
atexit.register(_DEVICES.clear)


def device_for(driver: str):
    """This process's IREE device for ``driver``, made on first use (caching allocator on local drivers).

    A driver this runtime lacks is a TargetError naming it and the drivers it has.
    """
    check_driver(driver)
    with _DEVICES_LOCK:
        device = _DEVICES.get(driver)
        if device is None:
            import iree.runtime as rt

            allocators = ["caching"] if driver in CACHING_DRIVERS else []
            device = rt.get_driver(driver).create_default_device(allocators=allocators)
            _DEVICES[driver] = device
            DRIVER_OF[id(device)] = driver
        return device


class Staging(NamedTuple):
    """A pinned staging buffer, mapped for as long as it is kept, and its bytes as a host array."""

    buffer: object  # iree.runtime.HalBuffer
    mapping: object  # iree.runtime.MappedMemory: held, so that ``host`` stays mapped
    host: np.ndarray  # uint8, ``buffer``'s every byte


def kept_staging(kept: list, device, size: int, usage: int = 0) -> Staging:
    """A staging buffer of ``size`` bytes taken from ``kept``, or a new one if it has none of that size.

    ``kept`` is a pool of one argument's or one result size's buffers; the
    caller appends the buffer back once no copy uses it. ``list.pop`` is
    atomic, so two threads never take the same one. Buffers stay mapped:
    pinned memory allocated per call cost 1.3 ms on an H200.
    """
    import iree.runtime as rt

    try:
        staging = kept.pop()
    except IndexError:  # the first use, or every kept buffer is in a call or read on another thread
        staging = None
    if staging is None or staging.host.size != size:  # an argument fed an array of another size drops its old one
        # Host memory the device reads and writes (pinned, on cuda). IREE's HOST_LOCAL is coherent, so
        # a mapping made once sees every later copy's bytes without an invalidation.
        buffer = device.allocator.allocate_buffer(
            memory_type=int(rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE),
            allowed_usage=usage | int(rt.BufferUsage.TRANSFER) | int(rt.BufferUsage.MAPPING),
            allocation_size=size)
        mapping = buffer.map()
        staging = Staging(buffer, mapping, mapping.asarray((size,), np.dtype(np.uint8)))
    return staging


def queue_copies(device, pairs: list) -> None:
    """Each ``(source, destination)`` pair's bytes copied on ``device``'s queue: all submitted, then one host wait.

    One semaphore per copy: copies may finish in any order, and a timeline
    semaphore only counts up. On an H200 two feeds copied this way took
    68 µs against 104 µs waited for one by one (docs/performance.md, "On a GPU").
    """
    import iree.runtime as rt

    done = rt.HalFence(len(pairs))
    for source, destination in pairs:
        semaphore = device.create_semaphore(0)
        device.queue_copy(source, destination, wait_semaphores=[], signal_semaphores=[(semaphore, 1)])
        done.insert(semaphore, 1)
    done.wait()
