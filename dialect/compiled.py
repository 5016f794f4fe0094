"""IREE as the industrial backend: compile a plan's StableHLO, run it, keep parameters on the device.

A compiled plan serves under the fast posture: its results are checked
against the oracle within the envelopes in ``topos.dialect.conformance``.

Nothing here may end the caller's process. LLVM exits on some CPU names
and a module built for a CPU this machine lacks dies of SIGILL, so any
``cpu`` but ``host`` or ``generic`` compiles in a child process and its
module is tried once in a child before it runs here. Device state knows
the network and the device it belongs to, and every array handed to the
caller is its own read-only copy, never a view of a device buffer that a
later step reads. Runs call the module through ``VmContext.invoke``
(``_Invoker``), not iree.runtime's FunctionInvoker, whose per-call Python
was most of a small training step's host time (benchmarks/host_overhead.py).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import ml_dtypes
import numpy as np

from topos.copies import own
from topos.element import Selection, SelectionType, convert
from topos.errors import ArgumentError, FeedError, SymbolError, ToposError
from topos.interpret import bind_feeds, bind_parameters, source_value
from topos.opcodes.base import spec_bytes
from topos.provenance import user_site

from .cache import CompileCache, cache_for, plan_key
from .fences import fence_narrow_constants, fence_widened_products, fence_widened_updates
from .freeze import SCOPE, as_bytes, freeze_parameters, key_of, rewrite_module
from .narrow import check_extents, narrow_selections
from .reductions import split_reductions
from .scatters import check_rows, split_scatters
from .targets import (
    DATA_TILING_FLAGS,
    PROCESS_WIDE_OPTIONS,
    SAFE_CPUS,
    TILED_MIN_ROWS,
    Target,
    TargetError,
    check_cpu,
    check_driver,
    cpu_of,
    data_tiling_threshold,
    flags_for,
    require_compiler,
    target,
)


class CompileError(ToposError, RuntimeError):
    """IREE refused a module, or its compiler died; the message carries its diagnostics."""


class DeviceMemoryError(ToposError, MemoryError):
    """The device could not allocate a buffer a compiled plan needs (IREE's RESOURCE_EXHAUSTED)."""


def compiler_version() -> str:
    """The compiler's version, read from its package metadata (importing it would load MLIR on a cache hit).

    Without iree-base-compiler (a machine that only runs modules compiled
    elsewhere), the runtime's version: IREE releases the two together, and
    a runtime loads the modules of its own release, so a cache the matching
    compiler filled serves here under the same keys (docs/deploy.md).
    """
    from importlib.metadata import PackageNotFoundError, version

    for package in ("iree-base-compiler", "iree-base-runtime"):
        try:
            return "iree-base-compiler " + version(package)
        except PackageNotFoundError:
            continue
    return "iree-base-compiler unknown"  # source builds without metadata still compile


def toolchain_version() -> str:
    """Compiler and runtime versions: the cache keys on both, since the runtime is what loads a module."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        runtime = "iree-base-runtime " + version("iree-base-runtime")
    except PackageNotFoundError:  # a source build without metadata still runs
        runtime = "iree-base-runtime unknown"
    return f"{compiler_version()}, {runtime}"


def compile_stablehlo(text: str, flags) -> bytes:
    """Compile StableHLO text with IREE, in-process; raise CompileError with its diagnostics.

    Flags holding an option IREE keeps process-wide (``targets.PROCESS_WIDE_OPTIONS``),
    which the in-process API refuses, compile with the iree-compile tool instead.
    """
    if any(flag.split("=", 1)[0] in PROCESS_WIDE_OPTIONS for flag in flags):
        return _compile_with_tool(text, flags)
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


def _compile_with_tool(text: str, flags) -> bytes:
    """The iree-compile tool (shipped with iree-base-compiler) as a child process, on the same flags."""
    from iree.compiler.tools.binaries import find_tool

    flags = tuple(flags)
    try:
        tool = find_tool("iree-compile")
    except ValueError as error:  # a broken install: say which flag needed the tool
        raise CompileError(f"{error}\nThe flags {sorted(PROCESS_WIDE_OPTIONS)} need the iree-compile tool; "
                           "reinstall iree-base-compiler") from None
    with tempfile.TemporaryDirectory(prefix="topos-compile-") as directory:
        folder = Path(directory)
        (folder / "module.mlir").write_text(text)
        done = subprocess.run([tool, str(folder / "module.mlir"), *flags,
                               "-o", str(folder / "module.vmfb")], capture_output=True, text=True, check=False)
        if done.returncode == 0 and (folder / "module.vmfb").exists():
            return (folder / "module.vmfb").read_bytes()
        said = [_tool_diagnostic(line) for line in done.stderr.splitlines() if ": error: " in line]
        if done.returncode > 0 and said:
            raise CompileError("iree-compile failed:\n  " + "\n  ".join(said))
        raise CompileError(_child_death("The iree-compile tool", done, "compiling with " + " ".join(flags)))


def _tool_diagnostic(line: str) -> str:
    """The tool's ``"file.py":20:0: error: ...`` as the in-process handler spells it, ``file.py:20: error: ...``."""
    position, _, message = line.partition(": error: ")
    parts = position.strip().strip('"').replace('":', ":").rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit():
        position = f"{parts[0]}:{parts[1]}"
    return f"{position}: error: {message}"


def compiles_in_child(flags) -> bool:
    """True when ``flags`` name an llvm-cpu CPU other than host or generic: such a compile runs in a child."""
    cpu = cpu_of(flags)
    return cpu is not None and cpu not in SAFE_CPUS


def _child_environment() -> dict:
    # The child must import the same topos and iree as this process, wherever they came from.
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def _compile_in_child(text: str, flags) -> bytes:
    """compile_stablehlo in a child interpreter: LLVM ending that process is a CompileError here."""
    flags = tuple(flags)
    with tempfile.TemporaryDirectory(prefix="topos-compile-") as directory:
        folder = Path(directory)
        (folder / "module.mlir").write_text(text)
        (folder / "flags.json").write_text(json.dumps(flags))
        code = "import sys; from topos.dialect.compiled import _compile_here; sys.exit(_compile_here(sys.argv[1]))"
        done = subprocess.run([sys.executable, "-c", code, directory], capture_output=True, text=True,
                              env=_child_environment(), check=False)
        if done.returncode == 3 and (folder / "error.txt").exists():
            raise CompileError((folder / "error.txt").read_text())
        if done.returncode != 0 or not (folder / "module.vmfb").exists():
            raise CompileError(_child_death("IREE's compiler", done, "compiling with " + " ".join(flags))
                               + f". Compile with cpu='host' (the default) or cpu='generic' instead of "
                               f"cpu={cpu_of(flags)!r}")
        unknown = [line for line in done.stderr.splitlines() if "is not a recognized processor" in line]
        if unknown:  # LLVM ignored the CPU (it does on some architectures) instead of ending the process
            raise TargetError(f"LLVM does not know cpu {cpu_of(flags)!r} ({unknown[0].strip()}); "
                              "use cpu='host' (this machine) or cpu='generic'")
        return (folder / "module.vmfb").read_bytes()


def _compile_here(directory: str) -> int:
    """The child's side of _compile_in_child: 0 with module.vmfb written, 3 with error.txt."""
    folder = Path(directory)
    flags = json.loads((folder / "flags.json").read_text())
    try:
        vmfb = compile_stablehlo((folder / "module.mlir").read_text(), flags)
    except CompileError as error:
        (folder / "error.txt").write_text(str(error))
        return 3
    (folder / "module.vmfb").write_bytes(vmfb)
    return 0


def _child_death(who: str, done: subprocess.CompletedProcess, doing: str) -> str:
    """What happened to a child that ended without its result, in words, with its last words."""
    if done.returncode < 0:
        try:
            how = f"was killed by {signal.Signals(-done.returncode).name}"
        except ValueError:
            how = f"was killed by signal {-done.returncode}"
    else:
        how = f"exited with status {done.returncode} without a result"
    lines = [line.strip() for line in (done.stderr or "").splitlines() if line.strip()]
    fatal = [line for line in lines if "LLVM ERROR" in line or "Error" in line]
    said = "; ".join((fatal or lines)[-3:]) or "nothing"
    return (f"{who} {how} while {doing}. It ran in a child process, so this interpreter is unharmed. "
            f"It said: {said}")


def largest_matmul(plan, narrowest: int = 1) -> int:
    """Multiply-adds of the plan's largest matmul (batch x m x k x n), 0 if it has none.

    ``narrowest``: count only products whose m and n both reach it.
    """
    network, largest = plan.network, 0
    for n in plan.schedule:
        if network._opcodes[n].name == "matmul":
            a, b = (network._specs[j].shape for j in network._operands[n])
            if min(a[-2], b[-1]) < narrowest:
                continue
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


def _compile(located: str, flags, transients: bool = False) -> bytes:
    """The module of ``located``; ``transients``: with the transient storage argument (``with_transient_storage``)."""
    if transients:
        located = with_transient_storage(located)
    if compiles_in_child(flags):
        return _compile_in_child(located, flags)
    return compile_stablehlo(located, flags)


def _cached_module(store: CompileCache, entry_key: str) -> bytes | None:
    """The cached module if IREE's VM reads it; an entry it cannot read is evicted, to be rebuilt."""
    vmfb = store.load(entry_key)
    if vmfb is not None and _unreadable(vmfb) is not None:
        store.evict(entry_key)  # checksummed, but not a module this runtime reads
        return None
    return vmfb


def _unreadable(vmfb: bytes) -> str | None:
    """Why IREE's VM cannot read ``vmfb`` (a damaged or foreign module), or None when it can."""
    import iree.runtime as rt

    try:
        module = rt.VmModule.copy_buffer(rt.VmInstance(), vmfb)
    except Exception as error:  # the runtime says what it could not read
        return str(error)
    return None if "main" in module.function_names else "the module has no @main"


def module_flags(plan, chosen: Target, cpu: str, data_tiling: bool | None,
                 text: str | None = None, driver: str | None = None, frozen: bool = False) -> tuple[str, ...]:
    """The compiler flags of ``plan``'s module for ``chosen``, read off the plan before any lowering.

    Its element types decide float64's flags and whether the target refuses
    an element (``Target.refuses``); ``data_tiling`` None decides by the
    largest matmul against the driver's ``data_tiling_threshold`` (counting
    products of ``TILED_MIN_ROWS`` rows or more, unless the module is
    ``frozen``: its weights are packed once, at load); a ``stablehlo.convolution`` in ``text`` (StableHLO a
    rewrite produced) brings IREE's img2col, which topos's own emission never needs: it spells
    convolutions as im2col products (topos.dialect.raising);
    ``driver`` (default: the target's) sizes a tiled product's workgroups, and
    on one thread leaves a module under ``UNDISTRIBUTED_BELOW`` undistributed.
    compile and export both build their flags here.
    """
    largest = largest_matmul(plan)
    if data_tiling is None:  # a frozen module counts every product: the walk above already did
        counted = largest if frozen else largest_matmul(plan, TILED_MIN_ROWS)
        data_tiling = counted >= data_tiling_threshold(chosen, driver, cpu)
    elements = {str(dtype) for dtype in {plan.network._specs[n].dtype for n in plan.schedule}}
    convolution = text is not None and "stablehlo.convolution" in text
    return flags_for(chosen, "float64" in elements, cpu, uses_bf16="bfloat16" in elements,
                     data_tiling=data_tiling, elements=elements, convolution=convolution, driver=driver,
                     largest_product=largest)


def check_switches(error: Callable[[str], Exception], by_size: tuple[str, ...] = (), **switches) -> None:
    """Refuse a switch that is not a bool (or None, for those ``by_size`` decides): "no" is truthy, so it would
    switch it on (and ``export(force="no")`` would delete a folder)."""
    for name, value in switches.items():
        if not isinstance(value, bool) and not (value is None and name in by_size):
            raise error(f"{name}={value!r}: pass " + ("True, False or None (decide by size)" if name in by_size
                                                      else "True or False"))


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
    (``topos.dialect.freeze``); ``forward(feeds=...)`` then takes the
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
        vmfb = _cached_module(store, entry_key)
    if vmfb is not None and store is not None and entry_key is not None:
        timings["cache-hit"] = time.perf_counter() - started
        timings["total"] = timings["cache-hit"]
        compiled = CompiledPlan(plan, chosen, driver or chosen.driver, flags, None, vmfb, timings, True,
                                frozen=frozen_values)
        compiled.cache_key = entry_key
        compiled._rebuild = _rebuilder(store, entry_key, plan, chosen, flags, freezing, transients)
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
    vmfb = _compile(located, flags, transients)
    if store is not None and entry_key is not None:
        store.store(entry_key, vmfb)
    timings["iree-compile"] = time.perf_counter() - began
    timings["total"] = time.perf_counter() - started
    compiled = CompiledPlan(plan, chosen, driver or chosen.driver, flags, text, vmfb, timings, False,
                            frozen=frozen_values)
    compiled.cache_key = entry_key
    return compiled


def entry_parameters(plan) -> tuple[int, ...]:
    """The parameters ``plan``'s entry reads, in node order: the module's first arguments, or its globals."""
    network = plan.network
    return tuple(i for i in sorted(plan.entry.closure()) if network._opcodes[i].name == "parameter")


def frozen_values_of(plan, parameters) -> dict[int, np.ndarray]:
    """Each parameter the entry reads -> its value in ``parameters`` (checked as forward checks them).

    The table's own arrays, not copies: a Parameters table is immutable and
    hands out only copies of them (``topos.copies.own``), so nothing can
    change what the module reads while it is loaded. GPT-2 124M's 500 MB of
    weights are not held twice. They stay private to the CompiledPlan (``CompiledPlan.frozen`` names
    only their nodes), so no array of the table is handed out.
    """
    wanted = entry_parameters(plan)
    bound = bind_parameters(plan.network, parameters, frozenset(wanted))
    return {i: bound[i] for i in wanted}


def lowered(plan, frozen: bool, chosen: Target | None = None) -> tuple[str, str, dict[str, float]]:
    """(plain, located StableHLO, stage seconds) of ``plan``; ``frozen``: its parameters as named globals;
    for a ``chosen`` target, what it needs: selections as i32 (``topos.dialect.narrow``), large
    scatters in chunks (``topos.dialect.scatters``), long reductions in stages (``topos.dialect.reductions``),
    the barriers it needs (``topos.dialect.fences``)."""
    network = plan.network
    narrow = chosen is not None and chosen.narrows_selections
    limit = None if chosen is None else chosen.scatter_limit
    if chosen is not None and (narrow or limit is not None):  # the refusals come before any lowering
        closure = plan.entry.closure()
        if narrow:
            check_extents(network, closure, chosen.name)
        if limit is not None:
            check_rows(network, closure, chosen.name, limit)
    text, located, times = plan._stablehlo_with_timings()
    if frozen:
        began = time.perf_counter()
        text, located = freeze_parameters(located, [key_of(network, i) for i in entry_parameters(plan)])
        times["freeze"] = time.perf_counter() - began
    stages = [] if chosen is None else _target_stages(chosen, located)
    if stages:  # on one parse of the module
        text, located, rewritten = rewrite_module(located, stages)
        times.update(rewritten)
    return text, located, times


def _target_stages(chosen: Target, located: str) -> list:
    """(stage, rewrite of the parsed module) for what ``chosen`` needs of this StableHLO, in order."""
    stages: list = []
    if chosen.narrows_selections:
        stages.append(("narrow", narrow_selections))
    scatters, reductions = chosen.scatter_limit, chosen.reduction_limit
    if scatters is not None and "stablehlo.scatter" in located:
        stages.append(("scatters", lambda module: split_scatters(module, scatters)))
    if reductions is not None and "stablehlo.reduce" in located:
        stages.append(("reductions", lambda module: split_reductions(module, reductions)))
    if chosen.fences_widened_updates and "stablehlo.scatter" in located:
        stages.append(("fences", fence_widened_updates))
    if chosen.fences_widened_products and "stablehlo.dot_general" in located and "f16>" in located:
        stages.append(("products", fence_widened_products))
    if chosen.fences_narrow_constants and "f16>" in located:  # bf16 and f16
        stages.append(("constants", fence_narrow_constants))
    return stages


# A local-task module whose transients (packed weights, activations a backward reads, ...)
# outgrow IREE's pools keeps them in a buffer the CompiledPlan passes in (IREE's
# ``iree.abi.transients``), not in one the queue allocates and frees around every call. IREE
# 3.13's local-task pools allocations up to 64 MiB and serves larger ones from a pass-through
# pool, so GPT-2 124M's forward mapped and faulted in the 154 MB packed copy of its tied
# embedding on every call: 303-311 against 252 ms a call with storage, bitwise the same. Models
# whose transients fit the pools ran 3-9% slower with it (medians of seven A/B runs), so
# only those estimated to outgrow them take it; IREE reports the true size only after compiling.
# On local-sync the caching allocator already reuses transients and storage ran up to 7%
# slower, so local-sync keeps IREE's allocation; so do the GPU drivers (not measured).
# benchmarks/transients.py, docs/performance.md "Transient storage on local-task".
TRANSIENT_STORAGE_DRIVERS = frozenset({"local-task"})
TRANSIENT_STORAGE = "%transients: !hal.buffer_view {iree.abi.transients}"
TRANSIENT_SIZE = "iree.abi.transients.size.constant"  # reflection: the bytes a call needs (shapes are static)
# Half the 64 MiB pool: the estimate ran from 2.6x under IREE's figure (the LeNet step: 5.4
# against 14.2 MiB) to 1.16x over (GPT-2 124M: 172 against 148 MiB), and the seven benchmark
# models fall far from it either way (at most 18 MiB, or 172).
TRANSIENT_STORAGE_FROM = 32 * 2**20
# GPT-2's logits are a product transposed and reshaped into the result; counted as buffers, the
# frozen forward's estimate was 50.6 MiB against IREE's 3.0, and storage cost it 7% (one A/B).
_FOLDED_LAYOUTS = frozenset({"reshape", "permute"})


def transient_estimate(plan, data_tiled: bool, frozen: bool) -> int:
    """Bytes a call of ``plan``'s module may hold as transients, read off the plan before lowering.

    The plan's peak of live computed values other than its results (those
    live in the buffers a call hands out: ``Plan.working_peak``) and its
    reshapes and transposes (IREE folds them into a neighbouring dispatch), plus, when
    data tiling packs operands into tiles on every call, a packed copy of
    its largest matmul operand (a frozen module's parameters are packed once,
    at load).
    """
    network = plan.network
    views = [n for n in plan.schedule if network._opcodes[n].name in _FOLDED_LAYOUTS]
    packed = [j for n in plan.schedule if data_tiled and network._opcodes[n].name == "matmul"
              for j in network._operands[n] if not (frozen and network._opcodes[j].name == "parameter")]
    return plan.working_peak(views) + max((spec_bytes(network._specs[j]) for j in packed), default=0)


def uses_transient_storage(plan, driver: str, flags, frozen: bool, chosen: bool | None) -> bool:
    """Whether ``plan``'s module for ``driver`` takes transient storage: ``chosen`` (compile's
    ``transient_storage``), or by ``transient_estimate`` when None."""
    if driver not in TRANSIENT_STORAGE_DRIVERS:
        if chosen:
            raise TargetError(f"transient_storage=True needs a driver of {sorted(TRANSIENT_STORAGE_DRIVERS)}, "
                              f"not {driver!r}: {driver} allocates a call's transients itself; "
                              f"compile with driver='local-task' or leave transient_storage unset")
        return False
    if chosen is not None:
        return bool(chosen)
    data_tiled = DATA_TILING_FLAGS[0] in flags
    return transient_estimate(plan, data_tiled, frozen) >= TRANSIENT_STORAGE_FROM


def with_transient_storage(located: str) -> str:
    """``located`` with IREE's transient storage as ``@main``'s first argument (what ``compile`` builds).

    First, so that the rewrite is one textual insertion whatever the other
    arguments' types and locations hold. ``plan.export`` does not add it: a
    deployed module allocates its own transients, and ``iree-run-module``
    feeds it as it is.
    """
    head = "func.func @main("
    if located.count(head) != 1:  # emission writes exactly one and freeze keeps it: a rewrite changed that
        raise CompileError(f"the StableHLO has {located.count(head)} '{head}' heads, expected one: "
                           f"a compile(rewrite=...) must keep the module's single @main")
    start = located.index(head) + len(head)
    separator = "" if located.startswith(")", start) else ", "
    return f"{located[:start]}{TRANSIENT_STORAGE}{separator}{located[start:]}"


def _rebuilder(store: CompileCache, entry_key: str, plan, chosen: Target, flags, frozen: bool,
               transients: bool) -> Callable[[], bytes]:
    """For a cache hit the device refuses: evict the entry, lower and compile afresh, store the new module."""

    def rebuild() -> bytes:
        store.evict(entry_key)
        _, located, _ = lowered(plan, frozen, chosen)
        fresh = _compile(located, flags, transients)
        store.store(entry_key, fresh)
        return fresh

    return rebuild


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
# through them (_Invoker._staged, _staged_to_host), instead of IREE's packer and
# DeviceArray.to_host, which allocate per call. On an H200 a 200 KB batch took 47.5 µs against
# 273-408, a loss 37 µs against 127; a call's feeds are copied together, with one wait. Not
# vulkan: on Mesa lavapipe a queue copy costs 16 ms against 4.5 µs for the packer, whose device
# memory is host memory (benchmarks/transfers.py).
STAGED_DRIVERS = frozenset({"cuda"})
_DRIVER_OF: dict[int, str] = {}  # id of a device device_for made -> its driver
# Let go of the devices before interpreter teardown: iree.runtime is imported after this module,
# so its extension is torn down first, and nanobind reports a device still held then as a leak.
atexit.register(_DEVICES.clear)
# On a STAGED_DRIVERS device small results are read through a pinned staging buffer kept per
# size, not through DeviceArray.to_host, which imports a fresh host allocation for every read.
_READ_STAGING: dict[tuple[int, int], list] = {}
_KEPT_STAGING_BYTES = 2**20  # larger reads allocate their staging buffer per read, as before
atexit.register(_READ_STAGING.clear)  # registered later, so run first: the buffers before their device


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
            _DRIVER_OF[id(device)] = driver
        return device


# Trial runs of modules compiled for a named CPU: (sha256 of the vmfb, driver) -> why it
# cannot run here, or None. One trial per module per process.
_TRIALS: dict[tuple[str, str], str | None] = {}

_TRIAL = """
import json, sys
from pathlib import Path
import numpy as np
try:
    import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy)
except ImportError:
    pass
import iree.runtime as rt
folder, driver = Path(sys.argv[1]), sys.argv[2]
config = rt.Config(driver)
context = rt.SystemContext(config=config)
arguments = json.loads((folder / "arguments.json").read_text())
frozen = json.loads((folder / "frozen.json").read_text())
if frozen:  # a frozen module's globals: zeros of each one's size, served as its parameters would be
    index = rt.ParameterIndex()
    for key, size in frozen:
        index.add_splat(key, np.zeros(1, np.uint8), size)
    context.add_vm_module(rt.create_io_parameters_module(context.instance, index.create_provider(scope=sys.argv[3])))
module = rt.VmModule.copy_buffer(context.instance, (folder / "module.vmfb").read_bytes())
context.add_vm_module(module)
main = context.modules[module.name]["main"]
size = main.vm_function.reflection.get(sys.argv[4])  # TRANSIENT_SIZE: a local-task module's storage bytes
storage = [] if size is None else [np.empty(int(size), np.uint8)]
main(*storage, *[np.zeros(shape, np.dtype(dtype)) for shape, dtype in arguments])
"""


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
        self.arguments = (() if frozen is not None else entry_parameters(plan)) + tuple(
            i for i in closure if network._opcodes[i].name == "input"
        )
        self.results = tuple(plan.entry._readable)
        self._argument_kinds = tuple((i, network._opcodes[i].name == "parameter") for i in self.arguments)
        self._wanted = frozenset(self.arguments)
        self._parameters = tuple(i for i, is_parameter in self._argument_kinds if is_parameter)  # they come first
        self._inputs = _argument_inputs(network, self.arguments[len(self._parameters):])
        self._function = None  # iree.runtime's FunctionInvoker of @main (benchmarks call it directly)
        self._invoker: _Invoker | None = None  # the path every run takes: VmContext.invoke, no FunctionInvoker
        # Its call (_Invoker.calling), kept here and not on the invoker, whose methods it reads: on the invoker it
        # would make a reference cycle, which only the cycle collector frees; here a dropped plan frees both at once.
        self._main: Callable[..., _Results] | None = None
        self._device = None
        self._rebuild: Callable[[], bytes] | None = None  # a cache hit's: evict the entry, compile afresh
        self._loading = threading.Lock()
        self._checked_updates: tuple = (None, (), None)
        # Symbol read -> (its result position, HalBufferView, element dtype, shape, size) on a local driver,
        # learnt at the first read of the result; later runs' reads map its buffer directly (_mapped_result).
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
            self._invoker = _Invoker(context, config.device, function.vm_function, self)
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
        cpu = cpu_of(self.flags)
        if cpu is None or cpu in SAFE_CPUS or not self.driver.startswith("local"):
            return
        trial = (hashlib.sha256(self.vmfb).hexdigest(), self.driver)
        if trial not in _TRIALS:
            _TRIALS[trial] = self._trial_in_child(cpu)
        if _TRIALS[trial] is not None:
            raise TargetError(_TRIALS[trial])

    def _trial_in_child(self, cpu: str) -> str | None:
        network = self.plan.network
        arguments = []
        for i in self.arguments:
            spec = network._specs[i]
            dtype = np.dtype(np.int64) if isinstance(spec.dtype, SelectionType) else np.dtype(spec.dtype)
            arguments.append((list(spec.shape), dtype.name))
        with tempfile.TemporaryDirectory(prefix="topos-trial-") as directory:
            folder = Path(directory)
            (folder / "module.vmfb").write_bytes(self.vmfb)
            (folder / "arguments.json").write_text(json.dumps(arguments))
            (folder / "frozen.json").write_text(json.dumps(
                [(key_of(network, i), a.nbytes) for i, a in (self._frozen or {}).items()]))
            try:
                done = subprocess.run([sys.executable, "-c", _TRIAL, directory, self.driver, SCOPE, TRANSIENT_SIZE],
                                      capture_output=True,
                                      text=True, env=_child_environment(), check=False)
            except OSError:
                return None
        if done.returncode >= 0:
            return None  # ran, or failed in an ordinary way that running here will report
        what = _child_death("a trial call of the module", done, f"running on the {self.driver} device")
        lacks = " uses instructions this machine's CPU lacks" if done.returncode == -signal.SIGILL else (
            " cannot run on this machine")
        return (f"the module compiled for cpu={cpu!r}{lacks}: {what}. Compile with cpu='host' (the "
                f"default) to run here; compiled.vmfb still runs on a machine with a {cpu} CPU")

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
        """What ``_Invoker`` pushes for ``forward``, in the module's order, every feed checked."""
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
        values = _bind_common(self._inputs, feeds)
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
        return CompiledRun(self, self._call(self._main, inputs, _refs(state._sources, self._parameters)))

    def _call(self, invoke, *arguments) -> _Results:
        """Invoke the module; IREE's failures become ToposErrors that say what happened.

        Out of memory, the buffers the caching allocator holds for reuse are
        handed back and the call is made once more: a run reads its
        arguments and writes fresh results, so trying again is safe.
        """
        try:
            return invoke(*arguments)
        except Exception as error:
            return self._call_again(error, invoke, *arguments)

    def _call_again(self, error: Exception, invoke, *arguments) -> _Results:
        """``_call`` after ``invoke`` failed with ``error``: once more if it ran out of memory, else a ToposError."""
        if "RESOURCE_EXHAUSTED" not in str(error):
            raise _runtime_error(self, error) from None
        assert self._device is not None  # a call runs on a loaded module
        self._device.allocator.trim()
        try:
            return invoke(*arguments)
        except Exception as error:
            raise _runtime_error(self, error) from None

    def resident(self, parameters) -> ResidentParameters:
        """Copy a Parameters table to the device once; ``step`` keeps it there."""
        import iree.runtime as rt

        self._refuse_frozen("resident")
        bound = bind_parameters(self.plan.network, parameters, self._wanted)
        self._load()
        try:
            arrays = {i: rt.asdevicearray(self._device, a) for i, a in bound.items()}
        except Exception as error:
            raise _runtime_error(self, error) from None
        return ResidentParameters(parameters, self, {i: (_Results.of(a), 0) for i, a in arrays.items()})

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
            refs = _refs(state._sources, self._parameters)
        inputs = _bind_common(self._inputs, feeds)
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
            _detach(sources, outputs)
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
        from topos import Updates

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
            if network._opcodes[p].name != "parameter":
                raise FeedError(f"{user_site()}: update {new!r} is paired with {parameter!r}, a "
                                f"{network._opcodes[p].name}; an update's first element is a parameter")
            if (network._specs[p].shape, network._specs[p].dtype) != (network._specs[n].shape, network._specs[n].dtype):
                raise FeedError(f"{user_site()}: update {new!r} has shape {list(network._specs[n].shape)}, "
                                f"but parameter {parameter!r} has {list(network._specs[p].shape)}")
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
            if network._opcodes[i].name == "parameter" and i not in state._sources:
                label = f"%{i}" + (f" ({network._names[i]})" if i in network._names else "")
                raise FeedError(
                    f"{user_site()}: this device state has no array for parameter {label}, which this plan "
                    "reads; make the state with compiled.resident(state.to_host().carried(network))"
                )

    def tally(self):
        """Per scheduled node, the IREE dispatch that computes it (topos.backends.Dispatch; compiles to flow once)."""
        from .tally import compiled_tally

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
        from topos.display import compiled_card  # the Jupyter card, loaded only when a notebook asks

        return compiled_card(self)


class _Input(NamedTuple):
    """One input the module reads, as ``_bind_common`` checks a feed of it."""

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


def _argument_inputs(network, inputs) -> _Inputs:
    by_key: dict[object, _Input] = {}
    defaults = []
    for slot, i in enumerate(inputs):
        spec = network._specs[i]
        selection = isinstance(spec.dtype, SelectionType)
        number = not selection and spec.shape == ()
        entry = _Input(slot, tuple(spec.shape), np.dtype(np.int64) if selection else np.dtype(spec.dtype),
                       spec.dtype.extent if selection else 0, _largest(spec.dtype) if number else 0.0)
        by_key[network.symbol(i)] = entry
        if i in network._names:
            by_key[network._names[i]] = entry
        if i not in network._required:
            defaults.append((slot, network._payloads[i]))
    return _Inputs(by_key, len(inputs), tuple(defaults))


def _bind_common(inputs: _Inputs, feeds) -> list | None:
    """Each input's value in the module's order, when every feed is of the common kind and every required input is fed.

    The common kind is what ``bind_feeds`` would hand back unchanged: a
    NumPy array of the input's element type and shape (int64 in bounds for
    a selection), or a Python float for a rank-0 number, which ``_Invoker``
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


class _Invoker:
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
        self._context = vm_context  # what the results of its calls hold (_Results)
        self._invoke = vm_context.invoke
        self._function = vm_function
        self._device = device
        self._allocate = device.allocator.allocate_buffer_copy
        self._memory = int(rt.MemoryType.DEVICE_LOCAL)
        self._usage = int(rt.BufferUsage.DEFAULT | rt.BufferUsage.MAPPING)
        self._copied_usage = int(rt.BufferUsage.DEFAULT | rt.BufferUsage.TRANSFER)  # a staged feed's device buffer
        self._list = rt.VmVariantList
        self._element_type = rt.array_interop.map_dtype_to_element_type
        # A target that narrows selections takes them as int32 (topos.dialect.narrow).
        index = np.dtype(np.int32 if compiled.target.narrows_selections else np.int64)
        self._dtypes = tuple(index if isinstance(network._specs[i].dtype, SelectionType)
                             else np.dtype(network._specs[i].dtype) for i in compiled.arguments)
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

    def calling(self) -> Callable[..., _Results]:
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

        def call(values: list, refs=()) -> _Results:
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
            return _Results(results, device, context)

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
        elif dtype.kind == "i":  # int64 indices for int32 (topos.dialect.narrow): checked in [0, extent < 2^31]
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
        staging = _kept_staging(self._staging[k], device, array.nbytes, int(rt.BufferUsage.DEFAULT))
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
        _queue_copies(self._device, [(staging.buffer, target) for _, staging, target in staged])
        for k, staging, _ in staged:
            self._staging[k].append(staging)


_CONTEXT = "_topos_module_context"  # the attribute by which a DeviceArray of a call's result holds its context


class _Results:
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
    def of(array) -> _Results:
        """One DeviceArray as a one-entry _Results (a resident parameter, or one a step kept)."""
        import iree.runtime as rt

        values = rt.VmVariantList(1)
        values.push_ref(array._buffer_view.ref)
        return _Results(values, array._device, getattr(array, _CONTEXT, None), {0: array})

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


def _refs(sources: dict, parameters: tuple) -> list:
    """The VmRef of each of ``parameters``' device buffers in ``sources`` (a ResidentParameters table), in order."""
    refs = []
    for i in parameters:
        results, position = sources[i]
        refs.append(results._list.get_as_ref(position))
    return refs


def _detach(sources: dict, outputs: _Results) -> None:
    """Point each parameter a step kept at a one-entry _Results of its own buffer.

    A kept parameter may still name an earlier step's results, which hold
    that step's every buffer; state must not keep those alive.
    """
    for parameter, (results, position) in sources.items():
        if results is not outputs and len(results) > 1:
            sources[parameter] = (_Results.of(results[position]), 0)


def _load_hint(error: Exception) -> str:
    """What to do about a module IREE compiled and its runtime will not load, where we know."""
    if "binding count" in str(error):
        return ("\n  a dispatch binds more buffers than the runtime's 32: IREE 3.13 fused many results "
                "(observed rank-0 values, say) into one dispatch; declare fewer of them as results "
                "(docs/reliability.md, iree-binding-count)")
    return ""


def _runtime_error(compiled: CompiledPlan, error: Exception) -> ToposError:
    """A ToposError for a failed IREE call: out of memory gets its own class and the plan's peak."""
    if "RESOURCE_EXHAUSTED" in str(error):
        peak, node = compiled.plan.peak()
        return DeviceMemoryError(
            f"{user_site()}: the {compiled.target.name} device ({compiled.driver}) ran out of memory running "
            f"this plan; its live values peak at {peak} bytes (node {node}, see plan.describe()): reduce the "
            f"batch or the declared results, or run on a larger device. IREE said: {error}"
        )
    return ToposError(f"{user_site()}: IREE could not run the module compiled for {compiled.target.name}: {error}")


def _widened(view: np.ndarray) -> np.ndarray:
    """int32 is a selection a narrowing target returned (topos.dialect.narrow): int64, as everywhere else."""
    return view.astype(np.int64) if view.dtype.type is np.int32 else view


def _mapped_result(outputs: _Results, k: int, view_type, dtype: np.dtype, shape: tuple[int, ...],
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
    staged = _DRIVER_OF.get(id(array._device)) in STAGED_DRIVERS
    if staged and 0 < array._buffer_view.byte_length <= _KEPT_STAGING_BYTES:
        return _staged_to_host(array)
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
    size = source.byte_length()
    keep = size <= _KEPT_STAGING_BYTES
    kept: list = _READ_STAGING.setdefault((id(device), size), []) if keep else []
    staging = _kept_staging(kept, device, size)
    _queue_copies(device, [(source, staging.buffer)])
    raw = rt.HalElementType.map_to_dtype(view.element_type)
    result = staging.host.view(raw).reshape(tuple(view.shape)).copy()  # a copy: the staging buffer is reused
    if keep:  # not after a failed read: its copy may still be writing the buffer
        kept.append(staging)
    return result.astype(array.dtype) if array.dtype != raw else result


class _Staging(NamedTuple):
    """A pinned staging buffer, mapped for as long as it is kept, and its bytes as a host array."""

    buffer: object  # iree.runtime.HalBuffer
    mapping: object  # iree.runtime.MappedMemory: held, so that ``host`` stays mapped
    host: np.ndarray  # uint8, ``buffer``'s every byte


def _kept_staging(kept: list, device, size: int, usage: int = 0) -> _Staging:
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
        staging = _Staging(buffer, mapping, mapping.asarray((size,), np.dtype(np.uint8)))
    return staging


def _queue_copies(device, pairs: list) -> None:
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


class CompiledRun:
    """Results of one compiled call; ``run[symbol]`` is a read-only host copy of that result, the caller's own."""

    __slots__ = ("_compiled", "_outputs", "_host")  # a step makes one: slots make it cheaper

    def __init__(self, compiled: CompiledPlan, outputs: _Results):
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
        from topos.display import compiled_run_card  # the Jupyter card, loaded only when a notebook asks

        return compiled_run_card(self)

    def _position(self, symbol) -> int:
        network = self._compiled.plan.network
        if isinstance(symbol, str):
            from topos.run import refused_name_read

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

    def __init__(self, template, plan: CompiledPlan, sources: dict | None = None, held: _Results | None = None,
                 layout: tuple[int, ...] = ()):
        self._template = template
        self._plan = plan
        self._held = held  # the short form: the results of the step that made this state, or None
        self._layout = layout  # where each of plan._parameters is among them
        self._table = sources  # the table form; made from the short form when first read

    @property
    def _sources(self) -> dict:
        """Parameter index -> (_Results holding its device buffer, position there)."""
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
        from topos.display import resident_card  # the Jupyter card, loaded only when a notebook asks

        return resident_card(self)
