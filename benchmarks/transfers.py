"""What a compiled step's host transfers cost on a device: each way of moving its batch in and its loss out.

For each training model of ``_zoo.py`` (``--models``; the MLP
784-128-10's batch is 200 KB) compiled for ``--target`` (default cuda; served from a
prepared compile cache with ``--cache DIR`` where IREE's compiler is
absent, as ``gpu_run.sh`` runs it), each row is the median of many calls
in one process. ``--threads 1`` (the default) pins the process to one CPU
(``_pinning.py``); ``--threads 2`` leaves it unpinned, as ``gpu_run.sh``
runs it: a GPU driver has threads of its own, and on one CPU they wait
for the Python thread.

* step       ``compiled.step`` on resident parameters, then the loss read:
             what a training loop does
* module     ``VmContext.invoke`` on prebuilt device arguments: the module
             alone (``host_overhead.module_floor``)
* batch in   the largest feed to the device two ways: IREE's packer
             (``allocate_buffer_copy``: device memory allocated and mapped
             per call; topos's way on every driver but cuda) and topos's
             staging on a ``STAGED_DRIVERS`` driver (``Invoker._staged``
             and ``_copied``: a pinned buffer kept per argument, a queue
             copy into a fresh device buffer)
* feeds in   every array the step feeds, staged as ``compiled.step`` stages
             them: their copies submitted together, one wait
* loss out   the loss to the host two ways: ``DeviceArray.to_host`` and
             ``staged_to_host`` (a queue copy into a pinned buffer kept
             per size; topos's way for small results on cuda)

docs/performance.md, "On a GPU", quotes it. It never asserts a timing; a
driver without a device prints why and exits 0.

Run: python benchmarks/transfers.py [--target cuda] [--cache DIR] [--models mlp-s,lenet] [--calls 200] [--threads 1|2]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _pinning  # noqa: E402, F401  (first: it pins before NumPy loads)

# isort: split
import argparse  # noqa: E402

import numpy as np  # noqa: E402

import topos  # noqa: E402
from topos.dialect.iree.cache import CompileCache  # noqa: E402
from topos.dialect.iree.results import staged_to_host  # noqa: E402
from topos.dialect.iree.targets import target as find_target  # noqa: E402

from _timing import chosen_models, median_seconds, table  # noqa: E402
from _zoo import MODELS, build  # noqa: E402
from gpu_check import device_problem  # noqa: E402
from host_overhead import device_arguments, module_floor  # noqa: E402


def median_us(call, calls: int) -> float:
    return 1e6 * median_seconds(call, calls)  # after one warm-up call: the staging buffers made


def price(key: str, chosen, cache: str | None, calls: int) -> str:
    """The table of one model's transfers (or why it was skipped)."""
    import iree.runtime as rt

    model = build(key)
    try:
        compiled = model.network.entry(model.roots).lower().compile(
            chosen.name, cache=CompileCache(cache) if cache else True)
    except topos.ToposError as error:  # not in the cache, and no compiler here to make it
        return f"{key}: skipped: {error}\n"
    feeds = model.feeds(0)
    state = [compiled.resident(model.parameters)]

    def step():
        state[0], run = compiled.step(state[0], feeds, model.updates)
        return np.asarray(run[model.read])

    rows = [["step: compiled.step, the loss read", median_us(step, calls)],
            ["module: VmContext.invoke on device arguments",
             median_us(module_floor(compiled, device_arguments(compiled, model.network, feeds)).step, calls)]]
    invoker, device = compiled._invoker, compiled._device
    arrays = [v for v in feeds.values() if isinstance(v, np.ndarray)]
    batch = max(arrays, key=lambda a: a.nbytes)
    element_type = rt.array_interop.map_dtype_to_element_type(batch.dtype)
    memory, usage = int(rt.MemoryType.DEVICE_LOCAL), int(rt.BufferUsage.DEFAULT | rt.BufferUsage.MAPPING)
    rows.append([f"batch in {list(batch.shape)} {batch.dtype}, IREE's packer (allocate_buffer_copy)",
                 median_us(lambda: device.allocator.allocate_buffer_copy(memory, usage, device, batch, element_type),
                           calls)])
    if invoker._staging is not None:
        def staged(arrays: list) -> None:
            copies: list = []
            for slot, array in enumerate(arrays):  # a slot each: every argument slot keeps its own staging buffers
                invoker._staged(slot, array, rt.array_interop.map_dtype_to_element_type(array.dtype), copies)
            invoker._copied(copies)

        rows.append([f"batch in {list(batch.shape)} {batch.dtype}, staged (pinned, queue copy)",
                     median_us(lambda: staged([batch]), calls)])
        if len(arrays) > 1:
            rows.append([f"feeds in, all {len(arrays)} staged, one wait ({sum(a.nbytes for a in arrays)} bytes)",
                         median_us(lambda: staged(arrays), calls)])
    loss = compiled.step(state[0], feeds, model.updates)[1].device(model.read)
    # IREE's own read, called directly: topos's to_host takes the staged way on a STAGED_DRIVERS device.
    rows.append(["loss out, DeviceArray.to_host", median_us(lambda: np.asarray(loss.to_host()), calls)])
    rows.append(["loss out, staged (pinned, queue copy)", median_us(lambda: staged_to_host(loss), calls)])
    cpus = sorted(os.sched_getaffinity(0))
    where = f"pinned to CPU {cpus[0]}" if len(cpus) == 1 else f"unpinned ({len(cpus)} CPUs)"
    return (f"{model.name} on {chosen.name} (driver {chosen.driver}); {where}; "
            f"median of {calls} calls\n\n" + table(["what", "µs"], [[what, f"{us:.1f}"] for what, us in rows]) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--cache", metavar="DIR", help="a prepared compile cache (gpu_prepare.sh's .gpu-cache)")
    trained = [m for m in MODELS if m != "gpt2-124m-forward"]  # a step that updates its parameters
    parser.add_argument("--models", default=",".join(trained), help=f"comma-separated subset of {', '.join(trained)}")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--threads", type=int, choices=(1, 2), default=1,
                        help="1: pinned to one CPU (the default); 2: unpinned (_pinning.py reads it)")
    args = parser.parse_args(argv)
    chosen = find_target(args.target)
    problem = device_problem(chosen.driver)
    if problem is not None:
        print(f"transfers: skipped: {problem}")
        return 0
    for key in chosen_models(parser, args.models, trained):
        print(price(key, chosen, args.cache, args.calls), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
