"""IREE as the industrial backend: compile a plan's StableHLO, run it, keep parameters on the device.

A compiled plan serves under the fast posture: its results are checked
against the oracle within the envelopes in ``topos.dialect.iree.conformance``.

Nothing here may end the caller's process. LLVM exits on some CPU names
and a module built for a CPU this machine lacks dies of SIGILL, so any
``cpu`` but ``host`` or ``generic`` compiles in a child process
(``topos.dialect.iree.compile``) and its module is tried once in a child
before it runs here (``topos.dialect.iree.trial``). Device state knows
the network and the device it belongs to (``topos.dialect.iree.resident``),
and every array handed to the caller is its own read-only copy, never a
view of a device buffer that a later step reads (``topos.dialect.iree.results``).
Runs call the module through ``VmContext.invoke``
(``topos.dialect.iree.calling.Invoker``), not iree.runtime's FunctionInvoker, whose per-call Python
was most of a small training step's host time (benchmarks/host_overhead.py).

This module holds ``compile_plan`` and the ``CompiledPlan`` it builds: loading
the module onto its device, and ``forward``, ``resident`` and ``step``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping

import numpy as np

from topos.base.errors import ArgumentError, FeedError, SymbolError
from topos.base.provenance import user_site
from topos.dialect.ir.bindings import require_compiler
from topos.dialect.iree.cache import CompileCache, cache_for, plan_key
from topos.dialect.iree.calling import (
    Invoker,
    Results,
    argument_inputs,
    bind_common,
    detach,
    device_refs,
    runtime_error,
)
from topos.dialect.iree.compile import (
    CompileError,
    cached_module,
    check_switches,
    compile_module,
    frozen_values_of,
    lowered,
    module_flags,
    rebuilder,
    toolchain_version,
    uses_transient_storage,
)
from topos.dialect.iree.devices import device_for
from topos.dialect.iree.resident import ResidentParameters
from topos.dialect.iree.results import CompiledRun
from topos.dialect.iree.targets import Target, TargetError, check_cpu, check_driver, target
from topos.dialect.iree.trial import try_in_child
from topos.dialect.passes.freeze import SCOPE, as_bytes, key_of
from topos.readings.interpret import bind_feeds, bind_parameters, source_value


def compile_plan(plan, target_name: str = "llvm-cpu", driver: str | None = None, *,
                 cache: CompileCache | bool | str | os.PathLike | None = True, cpu: str = "host",
                 data_tiling: bool | None = None, rewrite=None, frozen=None,
                 transient_storage: bool | None = None) -> CompiledPlan:
    """Lower ``plan`` to StableHLO and compile it with IREE -> CompiledPlan.

    ``cpu`` (llvm-cpu): "host" (this machine, the default), "generic", or
    a name LLVM accepts for this architecture; any other is a TargetError.
    A named CPU compiles in a child process. ``data_tiling`` (llvm-cpu):
    None decides by size — on when the largest matmul of
    ``targets.TILED_MIN_ROWS`` rows or more (any, when frozen) reaches
    ``targets.DATA_TILING_THRESHOLD`` multiply-adds on one thread (local-sync),
    ``targets.SHARED_DATA_TILING_THRESHOLD`` on several workers (local-task), or
    ``targets.NARROW_DATA_TILING_THRESHOLD`` on either for an x86 host without AVX-512.
    ``cache``: True (the default directory), False, a directory, or a CompileCache.
    ``rewrite`` (str -> str) edits the StableHLO text before IREE sees it:
    the seam ``topos.bisect`` uses to inject a fault on purpose.
    ``frozen`` (a Parameters table): every parameter the entry reads
    becomes a module global holding that (immutable) table's value
    (``topos.dialect.passes.freeze``); ``forward(feeds=...)`` then takes the
    inputs alone, and IREE packs data-tiled weights once, at load, not per call.
    ``transient_storage`` (local-task): whether a call's transients live in a
    buffer the CompiledPlan keeps (``with_transient_storage``); None decides
    by size — on when ``transient_estimate`` reaches ``TRANSIENT_STORAGE_FROM``.
    """
    if rewrite is not None and not callable(rewrite):  # refused before the lowering it would follow
        raise ArgumentError(f"rewrite= takes a function from the StableHLO text to the text to compile (str -> str), "
                            f"got {type(rewrite).__name__}; to compile edited text, return it from a function: "
                            "rewrite=lambda text: edited")
    chosen = target(target_name)
    check_cpu(chosen, cpu)  # before LLVM, which ends the process on some names
    check_switches(TargetError, ("data_tiling", "transient_storage"), data_tiling=data_tiling,
                   transient_storage=transient_storage)
    if isinstance(frozen, bool):
        raise FeedError(f"compile(frozen={frozen}): frozen takes the Parameters table to freeze, such as "
                        "frozen=network.parameters() or a trained table; leave it out to pass parameters per call")
    freezing = frozen is not None
    frozen_values = frozen_values_of(plan, frozen) if freezing else None  # a wrong table fails before IREE
    store = cache_for(cache)
    if store is not None:
        store.check()  # a cache that cannot work says so before the compile, not after
    timings: dict[str, float] = {}
    started = time.perf_counter()
    flags = module_flags(plan, chosen, cpu, data_tiling, driver=driver, frozen=freezing)
    transients = uses_transient_storage(plan, driver or chosen.driver, flags, freezing, transient_storage)
    entry_key, vmfb = None, None
    if store is not None and rewrite is None:
        # Keyed on the plan's digest, known before any lowering: a hit costs a hash and a file read.
        entry_key = plan_key(plan, chosen.name, flags, toolchain_version(), frozen=freezing, transients=transients)
        vmfb = cached_module(store, entry_key)
    if vmfb is not None and store is not None and entry_key is not None:
        timings["cache-hit"] = time.perf_counter() - started
        timings["total"] = timings["cache-hit"]
        compiled = CompiledPlan(plan, chosen, driver or chosen.driver, flags, None, vmfb, timings, True,
                                frozen=frozen_values)
        compiled.cache_key = entry_key
        compiled._rebuild = rebuilder(store, entry_key, plan, chosen, flags, freezing, transients)
        return compiled
    require_compiler(
        "compiling this plan", "" if store is None else
        f"pip install iree-base-compiler, or compile this plan where the compiler is, into a cache directory "
        f"(cache=DIR), and copy that directory here: {store.directory} holds no module for this plan, target "
        f"{chosen.name} and these flags (docs/deploy.md)")
    text, located, stage_times = lowered(plan, freezing, chosen)
    if rewrite is not None:
        text, located = rewrite(text), rewrite(located)
        if not isinstance(text, str) or not isinstance(located, str):
            returned = text if not isinstance(text, str) else located
            raise ArgumentError(f"rewrite= must return the StableHLO text as a str, and it returned "
                                f"{type(returned).__name__}; return the edited text (a function that only "
                                "reads it must still return it)")
        flags = module_flags(plan, chosen, cpu, data_tiling, text=text, driver=driver, frozen=freezing)
    timings.update(stage_times)
    # The plan names its pass stages (raise, lower, ...); "passes" is always their total.
    timings.setdefault("passes", sum(v for k, v in stage_times.items() if k != "emit"))
    began = time.perf_counter()
    # located: IREE's diagnostics name the user's line
    vmfb = compile_module(located, flags, transients)
    if store is not None and entry_key is not None:
        store.store(entry_key, vmfb)
    timings["iree-compile"] = time.perf_counter() - began
    timings["total"] = time.perf_counter() - started
    compiled = CompiledPlan(plan, chosen, driver or chosen.driver, flags, text, vmfb, timings, False,
                            frozen=frozen_values)
    compiled.cache_key = entry_key
    return compiled


class CompiledPlan:
    """A plan compiled by IREE: ``forward`` runs it; ``step`` runs a training step on device state."""

    def __init__(self, plan, chosen: Target, driver: str, flags, stablehlo: str | None, vmfb: bytes,
                 timings: Mapping[str, float], cache_hit: bool, frozen: Mapping[int, np.ndarray] | None = None):
        self.plan = plan
        self.target = chosen
        self.driver = driver
        self.flags = tuple(flags)
        self._stablehlo = stablehlo  # None for a cache hit: lowered again only when asked for
        self.vmfb = vmfb
        self.timings = dict(timings)
        self.cache_hit = cache_hit
        self.cache_key: str | None = None
        network = plan.network
        closure = sorted(plan.entry.closure())
        # A frozen module's parameters are its globals, served by key from these arrays (frozen_values_of).
        self._frozen: Mapping[int, np.ndarray] | None = frozen
        self.arguments = (() if frozen is not None else plan.parameter_nodes()) + tuple(
            i for i in closure if network.columns.opcodes[i].name == "input"
        )
        self.results = tuple(plan.entry._readable)
        self._argument_kinds = tuple((i, network.columns.opcodes[i].name == "parameter") for i in self.arguments)
        self._wanted = frozenset(self.arguments)
        self._parameters = tuple(i for i, is_parameter in self._argument_kinds if is_parameter)  # they come first
        self._inputs = argument_inputs(network, self.arguments[len(self._parameters):])
        self._function = None  # iree.runtime's FunctionInvoker of @main (benchmarks call it directly)
        self._invoker: Invoker | None = None  # the path every run takes: VmContext.invoke, no FunctionInvoker
        # Its call (Invoker.calling), kept here and not on the invoker, whose methods it reads: on the invoker it
        # would make a reference cycle, which only the cycle collector frees; here a dropped plan frees both at once.
        self._main: Callable[..., Results] | None = None
        self._device = None
        self._rebuild: Callable[[], bytes] | None = None  # a cache hit's: evict the entry, compile afresh
        self._loading = threading.Lock()
        self._checked_updates: tuple = (None, (), None)
        # Symbol read -> (its result position, HalBufferView, element dtype, shape, size) on a local driver,
        # learnt at the first read of the result; later runs' reads map its buffer directly (results._mapped_result).
        self._mapped_reads: dict = {}

    @property
    def frozen(self) -> tuple[int, ...] | None:
        """The node indices of the parameters compiled in as module globals (``compile(frozen=...)``), or None."""
        return None if self._frozen is None else tuple(self._frozen)

    @property
    def stablehlo(self) -> str:
        """The StableHLO text this module was compiled from (a cache hit lowers the plan again to show it).

        A ``local-task`` module's ``@main`` also takes a transient storage argument
        (``with_transient_storage``), which is IREE's ABI, not StableHLO: this text has none.
        """
        if self._stablehlo is None:
            self._stablehlo = lowered(self.plan, self._frozen is not None, self.target)[0]
        return self._stablehlo

    def _load(self):
        with self._loading:  # threads sharing a compiled plan load its module once
            return self._load_once()

    def _load_once(self):
        if self._function is None:
            import iree.runtime as rt

            check_driver(self.driver)
            try:
                config = rt.Config(device=device_for(self.driver))
            except Exception as error:  # a driver that is listed but has no device
                raise TargetError(
                    f"cannot create an IREE {self.driver!r} device for target {self.target.name}: {error}; "
                    "the module is compiled (compiled.vmfb) and can run on a machine with that device"
                ) from None
            self._try_in_child()
            try:
                context, function = self._register(config)
            except Exception as error:  # the runtime refuses the module
                if self._rebuild is None:
                    raise CompileError(
                        f"IREE's {self.driver} runtime cannot load the module compiled for "
                        f"{self.target.name}: {error}{_load_hint(error)}"
                    ) from None
                # A cached module this runtime will not load (another IREE build, say): rebuild it once.
                rebuild, self._rebuild = self._rebuild, None
                began = time.perf_counter()
                self.vmfb, self.cache_hit = rebuild(), False
                self.timings["iree-compile"] = time.perf_counter() - began
                self._try_in_child()
                try:
                    context, function = self._register(config)
                except Exception as again:
                    raise CompileError(
                        f"IREE's {self.driver} runtime cannot load the module it just compiled for "
                        f"{self.target.name}: {again}{_load_hint(again)}"
                    ) from None
            self._context, self._device, self._function = context, config.device, function
            self._invoker = Invoker(context, config.device, function.vm_function, self)
            self._main = self._invoker.calling()
        return self._function

    def _storage_arguments(self) -> tuple:
        """What to pass before the arguments when calling ``_load()``'s FunctionInvoker (benchmarks, tests).

        A DeviceArray of fresh transient storage for a module compiled with
        it, else nothing; ``forward`` and ``step`` manage their own.
        """
        import iree.runtime as rt

        self._load()
        invoker = self._invoker
        assert invoker is not None  # _load made it
        if invoker._storage_bytes is None:
            return ()
        return (rt.DeviceArray(self._device, invoker.new_storage(), implicit_host_transfer=True),)

    def _register(self, config):
        """(the VmContext holding the module, FunctionInvoker of its ``main``).

        A VmContext of our own rather than iree.runtime's SystemContext,
        which holds its modules and they hold it: that cycle kept a dropped
        plan's module, and a frozen module's copy of its weights, alive
        until the cycle collector ran (256 MiB a compile of a 128 MiB frozen
        weight, measured; a test holds it freed at once).
        """
        import iree.runtime as rt

        instance = config.vm_instance
        modules = list(config.default_vm_modules)  # the HAL module of the device
        if self._frozen is not None:  # the globals' values: IREE reads them as the module loads
            modules.append(rt.create_io_parameters_module(instance, self._provider()))
        module = rt.VmModule.copy_buffer(instance, self.vmfb)
        context = rt.VmContext(instance, modules=[*modules, module])
        main = module.lookup_function("main")
        if main is None:
            raise CompileError(f"the module compiled for {self.target.name} has no main function")
        return context, rt.FunctionInvoker(context, config.device, main)

    def _provider(self):
        """IREE's parameter provider serving each frozen parameter's copy under its key (scope ``freeze.SCOPE``)."""
        import iree.runtime as rt

        assert self._frozen is not None  # only a frozen module has one
        network = self.plan.network
        index = rt.ParameterIndex()
        for i, array in self._frozen.items():
            index.add_buffer(key_of(network, i), as_bytes(array))
        return index.create_provider(scope=SCOPE)

    def _try_in_child(self) -> None:
        """For a module built for a named CPU: one trial call in a child, so SIGILL kills only the child."""
        try_in_child(self.vmfb, self.driver, self.flags, self.plan.network, self.arguments, self._frozen)

    def describe(self) -> str:
        stages = ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in self.timings.items())
        return (f"compiled for {self.target.name} (driver {self.driver}), {len(self.vmfb)} bytes, "
                f"{'cache hit' if self.cache_hit else 'compiled'}: {stages}")

    # -- running ---------------------------------------------------------------------------
    def _arguments(self, parameters, feeds, resident=None):
        """The module's arguments as host arrays, resident parameters as DeviceArrays (export, benchmarks)."""
        network = self.plan.network
        bound_feeds = bind_feeds(network, feeds, freeze=False)  # IREE copies them to the device now
        if resident is not None:  # a training step: the parameters are on the device already
            device = resident._device_arrays
            return [device[i] if is_parameter else source_value(network, i, device, bound_feeds)
                    for i, is_parameter in self._argument_kinds]
        bound_parameters = bind_parameters(network, parameters, self._wanted)
        return [source_value(network, i, bound_parameters, bound_feeds) for i in self.arguments]

    def _values(self, parameters, feeds) -> list:
        """What ``Invoker`` pushes for ``forward``, in the module's order, every feed checked."""
        inputs = self._bind_inputs(feeds)
        bound = bind_parameters(self.plan.network, parameters, self._wanted)
        return [bound[i] for i in self._parameters] + inputs

    def _bind_inputs(self, feeds) -> list:
        """Each input's checked value (fed, or its recorded payload), in the module's order (after the parameters).

        Feeds of the common kind (an array of the input's element type and
        shape, in bounds for a selection; a Python float for a rank-0 input)
        are checked here in a few comparisons; anything else, and every
        mistake, goes through ``bind_feeds``, whose errors name the user's line.
        """
        values = bind_common(self._inputs, feeds)
        return self._bind_general(feeds) if values is None else values

    def _bind_general(self, feeds) -> list:
        network = self.plan.network
        fed = bind_feeds(network, feeds, freeze=False)  # IREE copies them to the device now
        return [source_value(network, i, {}, fed) for i in self.arguments[len(self._parameters):]]

    def forward(self, parameters=None, feeds=None) -> CompiledRun:
        """Run the compiled plan -> a CompiledRun readable by the entry's result symbols.

        ``parameters`` is a host Parameters table, or the ResidentParameters
        of ``resident``/``step``: then the run reads the arrays where they
        live, with no copy (an evaluation between training steps). A module
        compiled with ``frozen=`` holds its parameters: call ``forward(feeds=...)``.
        """
        if self._frozen is not None:
            if parameters is not None:
                raise FeedError(
                    f"{user_site()}: this module was compiled with frozen parameters (compile(frozen=...)) and "
                    "holds their values; call forward(feeds=...), or compile again with frozen=<the new table>"
                )
            values = self._bind_inputs(feeds)
        elif type(parameters) is ResidentParameters:
            return self._forward_resident(parameters, feeds)
        else:
            values = self._values(parameters, feeds)  # checked before the device is touched
        self._load()
        return CompiledRun(self, self._call(self._main, values))

    def _forward_resident(self, state: ResidentParameters, feeds) -> CompiledRun:
        """``forward`` over device state: each parameter pushed as the buffer it is (as ``step`` does)."""
        self._load()
        self._check_state(state)
        inputs = self._bind_inputs(feeds)
        assert self._main is not None  # _load made it
        return CompiledRun(self, self._call(self._main, inputs, device_refs(state._sources, self._parameters)))

    def _call(self, invoke, *arguments) -> Results:
        """Invoke the module; IREE's failures become ToposErrors that say what happened.

        Out of memory, the buffers the caching allocator holds for reuse are
        handed back and the call is made once more: a run reads its
        arguments and writes fresh results, so trying again is safe.
        """
        try:
            return invoke(*arguments)
        except Exception as error:
            return self._call_again(error, invoke, *arguments)

    def _call_again(self, error: Exception, invoke, *arguments) -> Results:
        """``_call`` after ``invoke`` failed with ``error``: once more if it ran out of memory, else a ToposError."""
        if "RESOURCE_EXHAUSTED" not in str(error):
            raise runtime_error(self, error) from None
        assert self._device is not None  # a call runs on a loaded module
        self._device.allocator.trim()
        try:
            return invoke(*arguments)
        except Exception as error:
            raise runtime_error(self, error) from None

    def resident(self, parameters) -> ResidentParameters:
        """Copy a Parameters table to the device once; ``step`` keeps it there."""
        import iree.runtime as rt

        self._refuse_frozen("resident")
        bound = bind_parameters(self.plan.network, parameters, self._wanted)
        self._load()
        try:
            arrays = {i: rt.asdevicearray(self._device, a) for i, a in bound.items()}
        except Exception as error:
            raise runtime_error(self, error) from None
        return ResidentParameters(parameters, self, {i: (Results.of(a), 0) for i, a in arrays.items()})

    def step(self, state: ResidentParameters, feeds, updates) -> tuple[ResidentParameters, CompiledRun]:
        """One training step on device: new parameters stay resident; read the loss from the run.

        ``state`` comes from ``resident`` or an earlier step of a plan of
        this network on this device. ``updates`` maps each parameter to the
        node holding its next value (``topos.sgd(...)`` records one); those
        nodes must be entry results.
        """
        # The path every training step takes: one frame, the common case first.
        if self._frozen is not None:
            self._refuse_frozen("step")
        checked = self._checked_updates
        if updates is not checked[0]:
            self._update_positions(updates)
            checked = self._checked_updates
        main = self._main
        if main is None:
            self._load()
            main = self._main
            assert main is not None  # _load made it
        if type(state) is ResidentParameters and state._plan is self and state._held is not None:
            refs = list(map(state._held._list.get_as_ref, state._layout))  # the short form this plan's steps make
        else:
            self._check_state(state)
            refs = device_refs(state._sources, self._parameters)
        inputs = bind_common(self._inputs, feeds)
        if inputs is None:
            inputs = self._bind_general(feeds)
        try:
            outputs = main(inputs, refs)
        except Exception as error:
            outputs = self._call_again(error, main, inputs, refs)
        _, positions, layout = checked
        if layout is not None:  # every parameter updated: the next step pushes them from these results
            return ResidentParameters(state._template, self, None, outputs, layout), CompiledRun(self, outputs)
        sources = dict(state._sources)
        for parameter, position in positions:
            sources[parameter] = (outputs, position)
        if len(positions) < len(sources):  # a parameter kept: hold its own buffer, not an earlier step's results
            detach(sources, outputs)
        return ResidentParameters(state._template, self, sources), CompiledRun(self, outputs)

    def _refuse_frozen(self, what: str) -> None:
        if self._frozen is not None:
            raise FeedError(
                f"{user_site()}: compiled.{what}(...) keeps parameters on the device for a training step, but "
                "this module was compiled with frozen parameters, which no step can change; compile without "
                "frozen= to train, and call forward(feeds=...) on this one"
            )

    def _update_positions(self, updates) -> tuple[tuple[int, int], ...]:
        """(parameter index, result position) per update, once checked to belong to this plan.

        Kept with the Updates (immutable: checked once) in ``_checked_updates``,
        beside the layout ``step`` gives its state when the updates cover
        exactly the parameters this plan reads (else None).
        """
        if updates is self._checked_updates[0]:
            return self._checked_updates[1]
        from topos.readings.update import Updates

        if not isinstance(updates, Updates):
            raise FeedError(
                f"{user_site()}: step takes the Updates that topos.sgd(...) or an optimizer's record(...) "
                f"returned, got {type(updates).__name__}; pass topos.Updates(()) for a step that updates nothing"
            )
        network = self.plan.network
        position = {n: k for k, n in enumerate(self.results)}
        updates.check_carries_state(network)
        checked = []
        for parameter, new in updates.pairs():
            parameter, new = getattr(parameter, "symbol", parameter), getattr(new, "symbol", new)
            try:
                p, n = network.check(parameter, "updated parameter"), network.check(new, "update")
            except SymbolError as error:
                raise SymbolError(
                    f"{user_site()}: these Updates belong to another network ({error.bare or error}); pass the Updates "
                    "recorded on the network this plan was compiled from"
                ) from None
            if network.columns.opcodes[p].name != "parameter":
                raise FeedError(f"{user_site()}: update {new!r} is paired with {parameter!r}, a "
                                f"{network.columns.opcodes[p].name}; an update's first element is a parameter")
            if (network.columns.specs[p].shape, network.columns.specs[p].dtype) != (
                    network.columns.specs[n].shape, network.columns.specs[n].dtype):
                raise FeedError(f"{user_site()}: update {new!r} has shape {list(network.columns.specs[n].shape)}, "
                                f"but parameter {parameter!r} has {list(network.columns.specs[p].shape)}")
            if n not in position:
                raise FeedError(f"{user_site()}: update {new!r} of {parameter!r} is not a result of this plan's "
                                "entry; compile network.entry(updates.roots(loss))")
            checked.append((p, position[n]))
        at = dict(checked)
        layout = tuple(at[i] for i in self._parameters) if at.keys() == set(self._parameters) else None
        self._checked_updates = (updates, tuple(checked), layout)
        return self._checked_updates[1]

    def _check_state(self, state) -> None:
        """Refuse device state of another network, another device, or missing a parameter this plan reads."""
        if not isinstance(state, ResidentParameters):
            raise FeedError(
                f"{user_site()}: step takes the ResidentParameters that compiled.resident(parameters) or an "
                f"earlier step returned, got {type(state).__name__}; make one with compiled.resident(parameters)"
            )
        if state._plan is self:
            return
        network = self.plan.network
        if state._template._family is not network.family:
            raise SymbolError(
                f"{user_site()}: this device state belongs to another network, not the one this plan was "
                "compiled from; make this plan's state with compiled.resident(parameters), from a "
                "Parameters table of this plan's network"
            )
        if state._device is not self._device:
            raise FeedError(
                f"{user_site()}: this device state lives on the {state._driver} device, but this plan runs on "
                f"{self.driver}; move it with compiled.resident(state.to_host())"
            )
        for i in self.arguments:
            if network.columns.opcodes[i].name == "parameter" and i not in state._sources:
                label = f"%{i}" + (f" ({network.columns.names[i]})" if i in network.columns.names else "")
                raise FeedError(
                    f"{user_site()}: this device state has no array for parameter {label}, which this plan "
                    "reads; make the state with compiled.resident(state.to_host().carried(network))"
                )

    def tally(self):
        """Per scheduled node, the IREE dispatch that computes it (a Dispatch; compiles to flow once)."""
        from topos.dialect.iree.tally import compiled_tally

        return compiled_tally(self)

    def device_memory(self) -> dict[str, int]:
        """IREE's allocator statistics for this plan's device: bytes allocated, freed and the peak.

        ``device_bytes_peak`` is the most device memory held at once since
        the device was created; topos shares one device per driver in a
        process, so measure one model per process to read its own peak
        (``benchmarks/memory.py`` does). On the local drivers the figures
        count the buffers the caching allocator keeps for reuse as held
        (``device_for``), and the transient storage of a local-task plan that takes it
        (``with_transient_storage``). Empty when the runtime was built
        without statistics.
        """
        self._load()
        assert self._device is not None  # _load made it
        allocator = self._device.allocator
        return dict(allocator.statistics) if allocator.has_statistics else {}

    def __repr__(self) -> str:
        frozen = "" if self._frozen is None else f", {len(self._frozen)} frozen parameters"
        return (f"<CompiledPlan {self.target.name}: {len(self.arguments)} arguments{frozen}, "
                f"{len(self.results)} results>")

    def _repr_html_(self) -> str:
        from topos.views.display import compiled_card  # the Jupyter card, loaded only when a notebook asks

        return compiled_card(self)


def _load_hint(error: Exception) -> str:
    """What to do about a module IREE compiled and its runtime will not load, where we know."""
    if "binding count" in str(error):
        return ("\n  a dispatch binds more buffers than the runtime's 32: IREE 3.13 fused many results "
                "(observed rank-0 values, say) into one dispatch; declare fewer of them as results "
                "(docs/reliability.md, iree-binding-count)")
    return ""
