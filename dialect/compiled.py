"""IREE as the industrial backend: compile a plan's StableHLO, run it, keep parameters on the device.

A compiled plan serves under the fast posture: its results are checked
against the oracle within the envelopes in ``topos.dialect.conformance``.
"""

from __future__ import annotations

import time
from typing import Mapping

import numpy as np

from topos.errors import FeedError, ToposError
from topos.interpret import bind_feeds, bind_parameters, source_value

from .cache import CompileCache, key
from .targets import DATA_TILING_THRESHOLD, Target, TargetError, check_driver, flags_for, target


class CompileError(ToposError, RuntimeError):
    """IREE refused a module; the message carries its diagnostics."""


class DeviceMemoryError(ToposError, MemoryError):
    """The device could not allocate a buffer a compiled plan needs (IREE's RESOURCE_EXHAUSTED)."""


def compiler_version() -> str:
    try:
        from importlib.metadata import version

        return "iree-base-compiler " + version("iree-base-compiler")
    except Exception:  # a source build without metadata still compiles
        return "iree-base-compiler unknown"


def compile_stablehlo(text: str, flags) -> bytes:
    """Compile StableHLO text in-process with IREE; raise CompileError with its diagnostics."""
    from iree.compiler.api import Output, Session, Source

    session = Session()
    session.set_flags(*flags)
    messages: list[str] = []

    def collect(diagnostic):
        messages.append(_describe_diagnostic(diagnostic))
        return True

    session.context.attach_diagnostic_handler(collect)
    invocation = session.invocation()
    if not invocation.parse_source(Source.wrap_buffer(session, text.encode())) or not invocation.execute():
        raise CompileError("iree-compile failed:\n  " + "\n  ".join(messages or ["(no diagnostics)"]))
    output = Output.open_membuffer()
    invocation.output_vm_bytecode(output)
    return bytes(output.map_memory())


def largest_matmul(plan) -> int:
    """Multiply-adds of the plan's largest matmul (batch x m x k x n), 0 if it has none."""
    network, largest = plan.network, 0
    for n in plan.schedule:
        if network._opcodes[n].name == "matmul":
            a, b = (network._specs[j].shape for j in network._operands[n])
            size = 1
            for extent in a[:-2]:
                size *= extent
            largest = max(largest, size * a[-2] * a[-1] * b[-1])
    return largest


def _describe_diagnostic(diagnostic) -> str:
    """``file:line: error: message (node %3 map)`` when the op carries a node location."""
    from .diagnostics import file_position, name_of

    severity = str(diagnostic.severity).split(".")[-1].lower()
    try:
        position, name = file_position(diagnostic.location), name_of(diagnostic.location)
    except Exception:  # an exotic location kind: fall back to MLIR's own spelling
        position, name = None, None
    if position is None:
        return f"{diagnostic.location}: {severity}: {diagnostic.message}"
    node = f" (node {name})" if name else ""
    return f"{position[0]}:{position[1]}: {severity}: {diagnostic.message}{node}"


def compile_plan(plan, target_name: str = "llvm-cpu", driver: str | None = None, *,
                 cache: CompileCache | bool | None = True, cpu: str = "host",
                 data_tiling: bool | None = None, rewrite=None) -> "CompiledPlan":
    """Lower ``plan`` to StableHLO and compile it with IREE -> CompiledPlan.

    ``data_tiling`` (llvm-cpu): None decides by size — on when the largest
    matmul reaches ``targets.DATA_TILING_THRESHOLD`` multiply-adds.
    ``rewrite`` (str -> str) edits the StableHLO text before IREE sees it:
    the seam ``topos.bisect`` uses to inject a fault on purpose.
    """
    chosen = target(target_name)
    timings: dict[str, float] = {}
    started = time.perf_counter()
    text, located, stage_times = plan._stablehlo_with_timings()
    if rewrite is not None:
        text, located = rewrite(text), rewrite(located)
        if not isinstance(text, str) or not isinstance(located, str):
            raise TypeError("rewrite must return the StableHLO text as a str")
    timings.update(stage_times)
    # The plan names its pass stages (raise, lower, ...); "passes" is always their total.
    timings.setdefault("passes", sum(v for k, v in stage_times.items() if k != "emit"))
    uses_f64 = "f64" in text
    if data_tiling is None:
        data_tiling = largest_matmul(plan) >= DATA_TILING_THRESHOLD
    flags = flags_for(chosen, uses_f64, cpu, uses_bf16="bf16" in text, data_tiling=data_tiling)
    store = CompileCache() if cache is True else (cache or None)
    entry_key = key(text, chosen.name, flags, compiler_version())
    vmfb = store.load(entry_key) if store is not None else None
    hit = vmfb is not None
    began = time.perf_counter()
    if vmfb is None:
        vmfb = compile_stablehlo(located, flags)  # located: IREE's diagnostics name the user's line
        if store is not None:
            store.store(entry_key, vmfb)
    timings["iree-compile" if not hit else "cache-hit"] = time.perf_counter() - began
    timings["total"] = time.perf_counter() - started
    return CompiledPlan(plan, chosen, driver or chosen.driver, flags, text, vmfb, timings, hit)


class CompiledPlan:
    """A plan compiled by IREE: ``forward`` runs it; ``step`` runs a training step on device state."""

    def __init__(self, plan, chosen: Target, driver: str, flags, stablehlo: str, vmfb: bytes,
                 timings: Mapping[str, float], cache_hit: bool):
        self.plan = plan
        self.target = chosen
        self.driver = driver
        self.flags = tuple(flags)
        self.stablehlo = stablehlo
        self.vmfb = vmfb
        self.timings = dict(timings)
        self.cache_hit = cache_hit
        network = plan.network
        closure = sorted(plan.entry.closure())
        self.arguments = tuple(i for i in closure if network._opcodes[i].name == "parameter") + tuple(
            i for i in closure if network._opcodes[i].name == "input"
        )
        self.results = tuple(plan.entry._readable)
        self._function = None
        self._device = None

    def _load(self):
        if self._function is None:
            import iree.runtime as rt

            check_driver(self.driver)
            try:
                config = rt.Config(self.driver)
            except Exception as error:  # a driver that is listed but has no device
                raise TargetError(
                    f"cannot create an IREE {self.driver!r} device for target {self.target.name}: {error}; "
                    "the module is compiled (compiled.vmfb) and can run on a machine with that device"
                ) from None
            context = rt.SystemContext(config=config)
            module = rt.VmModule.copy_buffer(context.instance, self.vmfb)
            context.add_vm_module(module)
            self._context, self._device = context, config.device
            self._function = context.modules[module.name]["main"]
        return self._function

    def describe(self) -> str:
        stages = ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in self.timings.items())
        return (f"compiled for {self.target.name} (driver {self.driver}), {len(self.vmfb)} bytes, "
                f"{'cache hit' if self.cache_hit else 'compiled'}: {stages}")

    # -- running ---------------------------------------------------------------------------
    def _arguments(self, parameters, feeds, resident=None):
        network = self.plan.network
        wanted = set(self.arguments)
        bound_parameters = {} if resident is not None else bind_parameters(network, parameters, wanted)
        bound_feeds = bind_feeds(network, feeds, freeze=False)  # IREE copies them to the device now
        args = []
        for i in self.arguments:
            if resident is not None and network._opcodes[i].name == "parameter":
                args.append(resident._device_arrays[i])
            else:
                args.append(source_value(network, i, bound_parameters, bound_feeds))
        return args

    def forward(self, parameters, feeds=None) -> "CompiledRun":
        """Run the compiled plan -> a CompiledRun readable by the entry's result symbols."""
        args = self._arguments(parameters, feeds)  # checked before the device is touched
        return CompiledRun(self, self._call(self._load(), args))

    def _call(self, function, args) -> tuple:
        """Invoke the module; IREE's failures become ToposErrors that say what happened."""
        try:
            return _as_tuple(function(*args))
        except Exception as error:
            raise _runtime_error(self, error) from None

    def resident(self, parameters) -> "ResidentParameters":
        """Copy a Parameters table to the device once; ``step`` keeps it there."""
        import iree.runtime as rt

        bound = bind_parameters(self.plan.network, parameters, set(self.arguments))
        self._load()
        try:
            arrays = {i: rt.asdevicearray(self._device, a) for i, a in bound.items()}
        except Exception as error:
            raise _runtime_error(self, error) from None
        return ResidentParameters(parameters, arrays)

    def step(self, state: "ResidentParameters", feeds, updates) -> tuple["ResidentParameters", "CompiledRun"]:
        """One training step on device: new parameters stay resident; read the loss from the run.

        ``updates`` maps each parameter to the node holding its next value
        (``topos.sgd(...)`` records one); those nodes must be entry results.
        """
        position = {n: k for k, n in enumerate(self.results)}
        for parameter, new in updates.pairs():
            if new.index not in position:
                raise FeedError(f"update {new!r} of {parameter!r} is not a result of this plan's entry")
        args = self._arguments(None, feeds, resident=state)
        outputs = self._call(self._load(), args)
        run = CompiledRun(self, outputs)
        arrays = dict(state._device_arrays)
        for parameter, new in updates.pairs():
            arrays[parameter.index] = outputs[position[new.index]]
        return ResidentParameters(state._template, arrays), run

    def __repr__(self) -> str:
        return f"<CompiledPlan {self.target.name}: {len(self.arguments)} arguments, {len(self.results)} results>"


def _as_tuple(outputs) -> tuple:
    return outputs if isinstance(outputs, tuple) else (outputs,)


def _runtime_error(compiled: CompiledPlan, error: Exception) -> ToposError:
    """A ToposError for a failed IREE call: out of memory gets its own class and the plan's peak."""
    if "RESOURCE_EXHAUSTED" in str(error):
        peak, node = compiled.plan.peak()
        return DeviceMemoryError(
            f"the {compiled.target.name} device ({compiled.driver}) ran out of memory running this plan; "
            f"its live values peak at {peak} bytes (node {node}, see plan.describe()): reduce the batch "
            f"or the declared results, or run on a larger device. IREE said: {error}"
        )
    return ToposError(f"IREE could not run the module compiled for {compiled.target.name}: {error}")


def to_host(array) -> np.ndarray:
    """Copy one IREE DeviceArray to a host NumPy array.

    ``DeviceArray.to_host`` imports a host allocation as the copy's target.
    Vulkan requires imported host pointers aligned to
    minImportedHostPointerAlignment (4096 on Mesa lavapipe), which a NumPy
    array is not, so there the import fails; then the result is copied
    through a staging buffer the device allocates itself (host-visible,
    mappable), as reference/iree-mlir-notes.md describes.
    """
    try:
        return np.asarray(array.to_host())
    except ValueError as error:
        if "minImportedHostPointerAlignment" not in str(error):
            raise
    return _staged_to_host(array)


def _staged_to_host(array) -> np.ndarray:
    import iree.runtime as rt

    # DeviceArray keeps its device and buffer view private; they are all a copy needs.
    device, view = array._device, array._buffer_view
    source = view.get_buffer()
    staging = device.allocator.allocate_buffer(
        memory_type=int(rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE),
        allowed_usage=int(rt.BufferUsage.TRANSFER_TARGET | rt.BufferUsage.MAPPING_SCOPED),
        allocation_size=source.byte_length(),
    )
    semaphore = device.create_semaphore(0)
    device.queue_copy(source, staging, wait_semaphores=rt.HalFence.create_at(semaphore, 0),
                      signal_semaphores=rt.HalFence.create_at(semaphore, 1))
    rt.HalFence.create_at(semaphore, 1).wait()
    mapped = staging.map()
    raw = rt.HalElementType.map_to_dtype(view.element_type)
    result = np.array(mapped.asarray(tuple(view.shape), raw))  # a copy: the mapping ends with staging
    return result.astype(array.dtype) if array.dtype != raw else result


class CompiledRun:
    """Results of one compiled call; ``run[symbol]`` copies that result to the host once."""

    def __init__(self, compiled: CompiledPlan, outputs: tuple):
        self._compiled = compiled
        self._outputs = outputs
        self._host: dict[int, np.ndarray] = {}

    def _position(self, symbol) -> int:
        i = self._compiled.plan.network.check(symbol)
        try:
            return self._compiled.results.index(i)
        except ValueError:
            from topos.errors import SymbolError

            raise SymbolError(f"{symbol!r} is not a declared result of this compiled plan") from None

    def __getitem__(self, symbol) -> np.ndarray:
        k = self._position(symbol)
        if k not in self._host:
            array = to_host(self._outputs[k])
            array.flags.writeable = False
            self._host[k] = array
        return self._host[k]

    def device(self, symbol):
        """The result still on the device (no host copy)."""
        return self._outputs[self._position(symbol)]


class ResidentParameters:
    """A Parameters table whose arrays live on the IREE device between steps."""

    def __init__(self, template, device_arrays: dict):
        self._template = template
        self._device_arrays = device_arrays

    def device(self, symbol):
        """The parameter's array on the device (an IREE DeviceArray; no host copy)."""
        from topos.errors import SymbolError

        self._template._slot(symbol)  # a SymbolError for a symbol of another network
        index = symbol.index
        if index not in self._device_arrays:
            raise SymbolError(f"{symbol!r} is not a parameter the compiled plan reads")
        return self._device_arrays[index]

    def to_host(self):
        """Copy back to a host Parameters table (the only host transfer of the training loop)."""

        pairs = []
        for symbol, array in self._template.items():
            device = self._device_arrays.get(symbol.index)
            pairs.append((symbol, array if device is None else to_host(device)))
        return self._template._like(pairs)
