"""Host overhead of one compiled training step: the Python topos runs around the IREE call, measured.

One SGD training step of two models, compiled for llvm-cpu (local-sync
driver), timed four ways in one process pinned to one CPU:

* step      ``compiled.step(state, feeds, updates)``, parameters resident,
            the feeds as the training loop passes them (makemore: a dict of
            names, int64 index batches and the rate as a Python float, as
            examples/makemore/mlp.py feeds it; the MLP: arrays by symbol)
* invoker   the module's ``main`` through ``iree.runtime.FunctionInvoker``
            on prebuilt device arguments (the call topos made before its
            low-level invoke path)
* module    ``VmContext.invoke`` on a prebuilt argument list: the floor,
            the module alone with no Python around it but a result list
* chained   ``VmContext.invoke`` with no topos Python, doing the step's
            device work: each call's updated parameters are the next call's
            arguments and the batch is copied from the host every call
* step, selections
            ``compiled.step`` fed each index batch as a ``topos.selection``
            (checked once when it was made, as ``data[rows]`` of a checked
            data set is), so the step scans no index for bounds
* and the loss read
            the same step followed by ``float(run[loss])``, as every
            example's training loop reads it (``examples/_training.py``);
            "loss read" is its time less the step's

topos's share is step minus module, in µs and as a share of the step;
"of which Python" is step minus chained: what is left once the step's own
device work (fresh parameter buffers, the batch upload) is counted as the
step's. Models: makemore's MLP (context 3, embedding 10, hidden 100, batch
64) and the MLP 784-128-10 of benchmarks/_gpt.py.

The columns run in interleaved rounds (``compiled.measure``), so a change
in machine load lands on every column alike; each cell is the median over
all timed steps, on the wall clock and in process CPU time. It never
asserts timings.

Run: python benchmarks/host_overhead.py [--rounds 20] [--steps 200] [--models makemore,mlp-s]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _pinning import PINNED_CPU  # noqa: E402  (first: one core is the measurement's, pinned before NumPy loads)

# isort: split
import argparse  # noqa: E402
import platform  # noqa: E402

from _timing import chosen_models, cpu_model, table  # noqa: E402
from _zoo import build  # noqa: E402
from compiled import Runner, measure  # noqa: E402

MODELS = {"makemore": "makemore-mlp", "mlp-s": "mlp-s"}  # this script's names -> _zoo.py's


def step_runner(compiled, network, feeds: dict, updates, read=None) -> Runner:
    """``compiled.step`` on resident state; with ``read``, the value of that result read back as a float."""
    state = [compiled.resident(network.parameters())]

    def step():
        state[0], run = compiled.step(state[0], feeds, updates)
        if read is not None:
            float(run[read])

    return Runner(step, lambda: None)


def selection_feeds(network, feeds: dict) -> dict:
    """The same feeds with every index batch as a topos.selection: checked here, once."""
    import topos
    from topos.base.element import SelectionType

    chosen = {}
    for key, value in feeds.items():
        dtype = network.columns.specs[network.check(network.named(key) if isinstance(key, str) else key)].dtype
        chosen[key] = topos.selection(value, dtype.extent) if isinstance(dtype, SelectionType) else value
    return chosen


def _host_inputs(compiled, network, feeds: dict) -> dict:
    """Argument position -> the host array a step uploads for that input (the rate as an array)."""
    from topos.readings.interpret import bind_feeds, source_value

    bound = bind_feeds(network, feeds)
    return {k: source_value(network, i, {}, bound) for k, i in enumerate(compiled.arguments)
            if network.columns.opcodes[i].name == "input"}


def device_arguments(compiled, network, feeds: dict) -> list:
    """The module's arguments as IREE DeviceArrays, in its order: resident parameters, then the feeds."""
    import iree.runtime as rt

    state = compiled.resident(network.parameters())
    inputs = _host_inputs(compiled, network, feeds)
    arrays = state._device_arrays
    return [rt.asdevicearray(compiled._device, inputs[k]) if k in inputs else arrays[i]
            for k, i in enumerate(compiled.arguments)]


def invoker_runner(compiled, arguments: list) -> Runner:
    """The module through iree.runtime's FunctionInvoker, on device arguments."""
    function = compiled._load()
    storage = compiled._storage_arguments()  # the module's transient storage, passed first
    return Runner(lambda: function(*storage, *arguments), lambda: None)


def module_floor(compiled, arguments: list) -> Runner:
    """``VmContext.invoke`` on a prebuilt argument list: the module alone."""
    import iree.runtime as rt

    vm_function, context = compiled._load().vm_function, compiled._context
    arrays = [*compiled._storage_arguments(), *arguments]  # the module's transient storage first
    listed = rt.VmVariantList(len(arrays))
    for array in arrays:
        listed.push_ref(array._buffer_view.ref)
    invoke, results = context.invoke, len(compiled.results)
    return Runner(lambda: invoke(vm_function, listed, rt.VmVariantList(results)), lambda: None)


def chained_module(compiled, network, feeds: dict, updates) -> Runner:
    """``VmContext.invoke`` doing a step's device work: updated parameters passed on, the batch uploaded each call."""
    import iree.runtime as rt

    vm_function, context, device = compiled._load().vm_function, compiled._context, compiled._device
    storage = compiled._storage_arguments()  # the module's transient storage, passed first
    refs = [array._buffer_view.ref for array in (*storage, *device_arguments(compiled, network, feeds))]
    inputs = _host_inputs(compiled, network, feeds)
    uploads = [(k + len(storage), array, rt.array_interop.map_dtype_to_element_type(array.dtype))
               for k, array in inputs.items()]
    slot = {i: k + len(storage) for k, i in enumerate(compiled.arguments)}
    moves = [(slot[parameter], position) for parameter, position in compiled._update_positions(updates)]
    allocate, invoke, results = device.allocator.allocate_buffer_copy, context.invoke, len(compiled.results)
    memory, usage = int(rt.MemoryType.DEVICE_LOCAL), int(rt.BufferUsage.DEFAULT | rt.BufferUsage.MAPPING)

    def call():
        for k, array, element_type in uploads:
            refs[k] = allocate(memory, usage, device, array, element_type).ref
        listed = rt.VmVariantList(len(refs))
        for ref in refs:
            listed.push_ref(ref)
        out = rt.VmVariantList(results)
        invoke(vm_function, listed, out)
        for k, position in moves:
            refs[k] = out.get_as_ref(position)

    return Runner(call, lambda: None)


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="interleaved rounds (default 20)")
    parser.add_argument("--steps", type=int, default=200, help="steps per column per round (default 200)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {', '.join(MODELS)}")
    args = parser.parse_args()
    chosen = chosen_models(parser, args.models, MODELS)

    print(f"machine: {cpu_model()}, {os.cpu_count()} CPUs, {platform.machine()}; pinned to CPU {PINNED_CPU}, "
          "OPENBLAS/OMP/MKL_NUM_THREADS=1; IREE llvm-cpu, local-sync")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    rows = {"wall": [], "cpu": []}
    for key in chosen:
        model = build(MODELS[key])
        name, network, roots, feeds, updates = model.name, model.network, model.roots, model.feeds(0), model.updates
        compiled = network.entry(roots).lower().compile("llvm-cpu")
        arguments = device_arguments(compiled, network, feeds)
        runners = {"step": step_runner(compiled, network, feeds, updates),
                   "invoker": invoker_runner(compiled, arguments), "module": module_floor(compiled, arguments),
                   "chained": chained_module(compiled, network, feeds, updates),
                   "selections": step_runner(compiled, network, selection_feeds(network, feeds), updates),
                   "read": step_runner(compiled, network, selection_feeds(network, feeds), updates, model.read)}
        timing = measure(runners, dict.fromkeys(runners, args.steps), args.rounds, warmup=20)
        for clock, rows_of in rows.items():
            step, invoker, module, chained, selections, read = (getattr(timing[c], clock) for c in runners)
            rows_of.append([name, _us(step), _us(invoker), _us(module), _us(chained), _us(step - module),
                            f"{100 * (step - module) / step:.1f} %", _us(step - chained),
                            f"{100 * (step - chained) / step:.1f} %", _us(selections),
                            _us(selections - chained), f"{100 * (selections - chained) / selections:.1f} %",
                            _us(read), _us(read - selections)])
        del runners, arguments, compiled  # release device buffers before the next model

    header = ["model", "step µs", "invoker µs", "module µs", "chained µs", "topos share µs", "share of step",
              "of which Python µs", "Python share", "step, selections µs", "its Python µs", "its Python share",
              "and the loss read µs", "loss read µs"]
    print("one compiled training step: median wall-clock µs. invoker: the module through iree.runtime's "
          "FunctionInvoker on device arguments; module: VmContext.invoke on a prebuilt argument list (the floor); "
          "chained: VmContext.invoke passing updated parameters on and uploading the batch each call, no topos "
          "Python; step, selections: the index batches fed as topos.selection; and the loss read: that step, then "
          "float(run[loss]). topos share = step - module; "
          "of which Python = step - chained\n")
    print(table(header, rows["wall"]))
    print("\nthe same steps, median process CPU µs\n")
    print(table(header, rows["cpu"]))
    print(f"\ntimed steps per cell: {args.rounds} rounds x {args.steps}")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
