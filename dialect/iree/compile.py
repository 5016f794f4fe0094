"""Compiling a plan's StableHLO with IREE: the flags, the compile itself, transient storage, the cache's rebuild.

What happens before a module exists. ``compile_plan``
(``topos.dialect.iree.compiled``) and ``plan.export`` both build their
flags and modules here. LLVM exits on some CPU names, so a compile for any
``cpu`` but ``host`` or ``generic`` runs in a child process, and a child's
death is a CompileError here, never the end of the caller's process.

``iree.compiler`` is imported inside the functions that compile, never
when this module loads: a machine with IREE's runtime alone imports it
(through ``topos.dialect.iree.compiled``) to serve cached modules.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from topos.base.errors import ToposError
from topos.dialect.ir.bindings import require_compiler
from topos.dialect.iree.cache import CompileCache
from topos.dialect.iree.targets import (
    DATA_TILING_FLAGS,
    PROCESS_WIDE_OPTIONS,
    SAFE_CPUS,
    TILED_MIN_ROWS,
    Target,
    TargetError,
    cpu_of,
    data_tiling_threshold,
    flags_for,
)
from topos.readings.interpret import bind_parameters
from topos.spec.opcodes.base import spec_bytes


class CompileError(ToposError, RuntimeError):
    """IREE refused a module, or its compiler died; the message carries its diagnostics."""


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
        raise CompileError(child_death("The iree-compile tool", done, "compiling with " + " ".join(flags)))


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


def child_environment() -> dict:
    # The child must import the same topos and iree as this process, wherever they came from.
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def _compile_in_child(text: str, flags) -> bytes:
    """compile_stablehlo in a child interpreter: LLVM ending that process is a CompileError here."""
    flags = tuple(flags)
    with tempfile.TemporaryDirectory(prefix="topos-compile-") as directory:
        folder = Path(directory)
        (folder / "module.mlir").write_text(text)
        (folder / "flags.json").write_text(json.dumps(flags))
        code = "import sys; from topos.dialect.iree.compile import _compile_here; sys.exit(_compile_here(sys.argv[1]))"
        done = subprocess.run([sys.executable, "-c", code, directory], capture_output=True, text=True,
                              env=child_environment(), check=False)
        if done.returncode == 3 and (folder / "error.txt").exists():
            raise CompileError((folder / "error.txt").read_text())
        if done.returncode != 0 or not (folder / "module.vmfb").exists():
            raise CompileError(child_death("IREE's compiler", done, "compiling with " + " ".join(flags))
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


def child_death(who: str, done: subprocess.CompletedProcess, doing: str) -> str:
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
        if network.columns.opcodes[n].name == "matmul":
            a, b = (network.columns.specs[j].shape for j in network.columns.operands[n])
            if min(a[-2], b[-1]) < narrowest:
                continue
            size = 1
            for extent in a[:-2]:
                size *= extent
            largest = max(largest, size * a[-2] * a[-1] * b[-1])
    return largest


def _describe_diagnostic(diagnostic) -> str:
    """``file:line: error: message (node %3 map)`` when the op carries a node location."""
    from topos.dialect.ir.diagnostics import file_position, name_of

    severity = str(diagnostic.severity).split(".")[-1].lower()
    try:
        position, name = file_position(diagnostic.location), name_of(diagnostic.location)
    except Exception:  # an exotic location kind: fall back to MLIR's own spelling
        position, name = None, None
    if position is None:
        return f"{diagnostic.location}: {severity}: {diagnostic.message}"
    node = f" (node {name})" if name else ""
    return f"{position[0]}:{position[1]}: {severity}: {diagnostic.message}{node}"


def compile_module(located: str, flags, transients: bool = False) -> bytes:
    """The module of ``located``; ``transients``: with the transient storage argument (``with_transient_storage``)."""
    if transients:
        located = with_transient_storage(located)
    if compiles_in_child(flags):
        return _compile_in_child(located, flags)
    return compile_stablehlo(located, flags)


def cached_module(store: CompileCache, entry_key: str) -> bytes | None:
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
    convolutions as im2col products (topos.dialect.passes.raising);
    ``driver`` (default: the target's) sizes a tiled product's workgroups, and
    on one thread leaves a module under ``UNDISTRIBUTED_BELOW`` undistributed.
    compile and export both build their flags here.
    """
    largest = largest_matmul(plan)
    if data_tiling is None:  # a frozen module counts every product: the walk above already did
        counted = largest if frozen else largest_matmul(plan, TILED_MIN_ROWS)
        data_tiling = counted >= data_tiling_threshold(chosen, driver, cpu)
    elements = {str(dtype) for dtype in {plan.network.columns.specs[n].dtype for n in plan.schedule}}
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


def lowered(plan, frozen: bool, chosen: Target):
    """The pipeline on ``plan`` for ``chosen``: imported at the call, as only a compile that misses the cache lowers
    (a machine with IREE's runtime alone loads this module and runs cached modules)."""
    require_compiler("lowering a plan to StableHLO")
    from topos.dialect.pipeline import stablehlo

    return stablehlo(plan, frozen=frozen, target=chosen)


def frozen_values_of(plan, parameters) -> dict[int, np.ndarray]:
    """Each parameter the entry reads -> its value in ``parameters`` (checked as forward checks them).

    The table's own arrays, not copies: a Parameters table is immutable and
    hands out only copies of them (``topos.base.copies.own``), so nothing can
    change what the module reads while it is loaded. GPT-2 124M's 500 MB of
    weights are not held twice. They stay private to the CompiledPlan (``CompiledPlan.frozen`` names
    only their nodes), so no array of the table is handed out.
    """
    wanted = plan.parameter_nodes()
    bound = bind_parameters(plan.network, parameters, frozenset(wanted))
    return {i: bound[i] for i in wanted}


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
    views = [n for n in plan.schedule if network.columns.opcodes[n].name in _FOLDED_LAYOUTS]
    packed = [j for n in plan.schedule if data_tiled and network.columns.opcodes[n].name == "matmul"
              for j in network.columns.operands[n] if not (frozen and network.columns.opcodes[j].name == "parameter")]
    return plan.working_peak(views) + max((spec_bytes(network.columns.specs[j]) for j in packed), default=0)


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


def rebuilder(store: CompileCache, entry_key: str, plan, chosen: Target, flags, frozen: bool,
               transients: bool) -> Callable[[], bytes]:
    """For a cache hit the device refuses: evict the entry, lower and compile afresh, store the new module."""

    def rebuild() -> bytes:
        store.evict(entry_key)
        _, located, _ = lowered(plan, frozen, chosen)
        fresh = compile_module(located, flags, transients)
        store.store(entry_key, fresh)
        return fresh

    return rebuild
