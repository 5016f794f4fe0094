"""IREE targets: the flags that compile a StableHLO module for each device, and the driver that runs it.

Also the CPU names ``llvm-cpu`` accepts. LLVM ends the process (no
exception) on some names it does not know, so a ``cpu`` is checked
against LLVM's own list before any compile; LLVM prints that list only
on its way out, so it is asked once per process, in a child.
"""

from __future__ import annotations

import difflib
import functools
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from topos.base.element import element_of, is_element
from topos.base.errors import TargetError


@dataclass(frozen=True)
class Target:
    """One IREE target: how to compile for it and which runtime driver runs it.

    ``refuses`` maps the MLIR element types this IREE release cannot
    compile or computes wrongly for the target to what was measured; a
    plan holding one is a TargetError naming the element and the target.
    """

    name: str
    flags: tuple[str, ...]
    driver: str
    f64_flags: tuple[str, ...] = ()
    supports_f64: bool = True
    note: str = ""
    refuses: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    # The most update elements one scatter may have here; a larger one is compiled as a chain
    # of smaller ones (topos.dialect.passes.scatters). None: no limit.
    scatter_limit: int | None = None
    # The longest axis one reduction may reduce here; a longer one is reduced in stages
    # (topos.dialect.passes.reductions). None: no limit.
    reduction_limit: int | None = None
    # Barriers IREE needs here (topos.dialect.passes.fences): a scatter's updates widened from a narrow
    # float (a bfloat16 scatter accumulates in float32) kept out of its dispatch; a 16-bit float
    # constant of more than one value kept out of its readers' dispatches; a batched product of two
    # widened operands, its left one read transposed, given that operand as a buffer.
    fences_widened_updates: bool = False
    fences_widened_products: bool = False
    fences_narrow_constants: bool = False

    @property
    def supports_bf16(self) -> bool:
        """Whether bfloat16 compiles and computes right here (not in ``refuses``)."""
        return "bf16" not in self.refuses

    @property
    def narrows_selections(self) -> bool:
        """Whether its modules take and return selections as int32 (``topos.dialect.passes.narrow``)."""
        return NARROW_SELECTIONS in self.flags


_COMMON = ("--iree-input-type=stablehlo",)
# Every i64 tensor of the module as i32, for a target whose shaders have no 64-bit
# integers; @main's selections are narrowed before (topos.dialect.passes.narrow explains why).
NARROW_SELECTIONS = "--iree-input-demote-i64-to-i32"

# Measured with IREE 3.13 over the conformance families (topos.dialect.iree.conformance_cases).
_F8_UNLOWERED = "IREE 3.13 cannot lower 8-bit float conversions for it ({})"
_F8 = ("f8E5M2", "f8E4M3FN")

TARGETS: dict[str, Target] = {
    "llvm-cpu": Target(
        "llvm-cpu",
        # No constant evaluation: IREE's JIT of constant subexpressions cost 15-20%
        # of a training step's compile (JitGlobalsPass 0.36-0.48 s of MLP 784-128-10's
        # 2.4-2.9 s; GPT step 11.5 -> 9.8 s, benchmarks/compile_flags.py) and bought
        # no measurable step time; our lowering already folds the constants that
        # matter on the host. It also linked float64 JIT dispatches with the embedded
        # linker, which has no libm ('undefined symbol: sin').
        ("--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu",
         "--iree-opt-const-eval=false"),
        "local-sync",
        # IREE demotes f64 to f32 by default, and its embedded ELF has no libm
        # for f64 tanh: keep f64 and link a system shared object instead.
        ("--iree-input-demote-f64-to-f32=false", "--iree-llvmcpu-link-embedded=false"),
        note="compiled and run on every test run",
    ),
    "cuda": Target(
        "cuda",
        # sm_90 fails in this IREE release ('missing GPU target'); sm_80 PTX
        # is JIT-compiled by the driver on newer GPUs. Split reduction: a product with a long
        # contraction and a small result (a convolution's weight gradient, 16 x 72 over 12 544
        # rows) otherwise runs on a handful of workgroups; the LeNet step went from 9.74 to
        # 0.90 ms on an H200, the other benchmark models unchanged (docs/performance.md).
        ("--iree-hal-target-device=cuda", "--iree-cuda-target=sm_80",
         "--iree-dispatch-creation-enable-split-reduction"),
        "cuda",
        ("--iree-input-demote-f64-to-f32=false",),
        note="sm_80 PTX",
        fences_widened_updates=True,  # else a bfloat16 scatter fails: 'fusion + hoisting patterns'
        fences_widened_products=True,  # else a batched bfloat16 a.T @ b is wrong in all but its last batch
        refuses=MappingProxyType({f8: _F8_UNLOWERED.format(
            "'LLVM Translation failed for operation: builtin.unrealized_conversion_cast'") for f8 in _F8}),
    ),
    "vulkan": Target(
        "vulkan",
        ("--iree-hal-target-backends=vulkan-spirv", NARROW_SELECTIONS),
        "vulkan",
        supports_f64=False,
        note="generic SPIR-V; runs on Mesa lavapipe without a GPU",
        scatter_limit=2**15,  # measured on lavapipe: wrong sums from about 2^16 (topos.dialect.passes.scatters)
        reduction_limit=2**15,  # measured on lavapipe: at most 65,535 elements summed (topos.dialect.passes.reductions)
        refuses=MappingProxyType({
            # Measured on Mesa lavapipe: bf16 constants and broadcasts come back as zeros,
            # log_softmax is wrong and matmul fails to compile ('vector.bitcast' not legalized).
            "bf16": "it computes bfloat16 wrongly in this IREE release (zeros for constants and "
                    "broadcasts on Mesa lavapipe)",
            "f16": "it computes float16 wrongly in this IREE release (add, mul and sums come back "
                   "wrong on Mesa lavapipe; matmul fails to compile: 'vector.bitcast' not legalized)",
            **{f8: _F8_UNLOWERED.format("'builtin.unrealized_conversion_cast' left illegal") for f8 in _F8},
        }),
    ),
    "metal": Target(
        "metal",
        ("--iree-hal-target-backends=metal-spirv",),
        "metal",
        supports_f64=False,
        note="MSL source embedded; the Linux runtime wheel has no metal driver",
        fences_narrow_constants=True,  # else 'spirv.Bitcast' op mismatch in result type bitwidth 16
        refuses=MappingProxyType({f8: _F8_UNLOWERED.format(
            "'spirv.Bitcast' op mismatch in result type bitwidth 8 and operand type bitwidth 32") for f8 in _F8}),
    ),
    "rocm": Target(
        "rocm",
        ("--iree-hal-target-device=hip", "--iree-rocm-target=gfx942"),
        "hip",
        ("--iree-input-demote-f64-to-f32=false",),
        fences_widened_updates=True,
        fences_widened_products=True,  # the same LLVMGPU code generation as cuda's; not run on rocm
        refuses=MappingProxyType({f8: _F8_UNLOWERED.format(
            "'F8E5M2 and F8E4M3FN types are not supported on gfx942 (MI-300) or older chipsets'") for f8 in _F8}),
    ),
}
_ALIASES = {"cpu": "llvm-cpu", "vulkan-spirv": "vulkan", "metal-spirv": "metal", "hip": "rocm"}


def target(name: str) -> Target:
    """The target called ``name`` (aliases: cpu, vulkan-spirv, metal-spirv, hip)."""
    key = _ALIASES.get(name, name)
    if key not in TARGETS:
        raise TargetError(
            f"unknown target {name!r}; choose one of {', '.join(TARGETS)} "
            f"(aliases: {', '.join(_ALIASES)})"
        )
    return TARGETS[key]


# IREE's data tiling packs matmul operands into cache-sized tiles and runs
# its microkernels on them. Packing is paid per call, so it wins only when
# a matmul is big enough to amortize it. Measured on llvm-cpu with
# benchmarks/data_tiling.py (2-core AMD EPYC, Zen 3, 2026-12-01; module time
# tiled / untiled): 784-1024-1024 MLP step (largest matmul 2^27 multiply-adds)
# 0.49-0.53, the small GPT step (2^25) 0.82, GPT-2 124M forward (2^32) 0.89;
# below 2^25 nothing gained: the MNIST LeNet step (2^23.8) 0.99-1.15, the
# 784-128-10 MLP step (2^22.6) 1.02-1.04, makemore's steps 0.84-1.13 (noise).
# (On a Zen 4 machine an earlier run put the small GPT at 1.04: the threshold
# is a measurement of this machine; compile(data_tiling=...) overrides it.)
# The microkernels: mmt4d (the tiled product) and pack, not unpack. On a
# 2-core Intel Xeon with AVX-512 (2026-12-02, benchmarks/data_tiling.py, three
# runs) the unpack microkernel made the small GPT's step 7-11% slower than
# IREE's generated unpack (ukernels=all 19.6-20.7 ms, mmt4d,pack 18.2-18.7),
# and generating pack costs compile time (mmt4d alone: 6.6 s against 5.3 s);
# MLP M and GPT-2 124M ran level with every choice.
DATA_TILING_THRESHOLD = 2**25
# On several local-task workers the small GPT's step (largest product 2^25) ran faster
# untiled in each of nine in-process A/B runs (3-29%, median 5%; the Zen 4 machine,
# 2026-12-04, the same bits) and compiled about 15% sooner, while on one core tiled kept
# a 0-3% lead (five runs). MLP M (2^27) was level there (eleven runs, tiled / untiled
# 0.81-1.12, median 0.97), and MLPs with products of 2^28 to 2^32 ran 1.3-2.0x faster
# tiled. So a module for several workers is tiled from twice the one-thread size.
SHARED_DATA_TILING_THRESHOLD = 2**26
# Both thresholds were measured on CPUs with AVX-512. On an x86 CPU without it (the Zen 3
# machine, AVX2, 2026-12-05; topos's SGD step of a batch-784-H-10 MLP, tiled / untiled, in
# one process) tiling pays from about 2^24 multiply-adds on one thread and on two local-task
# workers alike: 2^23.6 0.94 / 1.03 (one thread / two workers), 2^24.2 0.74 / 0.90, 2^24.6
# 0.72 / 0.94, 2^25.6 0.69 / 0.65; the small GPT's step (2^25) 0.79 / 0.82, where the
# shared threshold had left it untiled. IREE's untiled matmul code holds eight accumulators
# in AVX2's sixteen registers, where its microkernel does better. So a module compiled for
# such a host (cpu="host") is tiled from NARROW_DATA_TILING_THRESHOLD on any driver; other
# CPUs, and CPUs named by cpu=, keep the measured rules above.
NARROW_DATA_TILING_THRESHOLD = 2**24
# A narrow product packs as much weight as it multiplies: with m rows the
# per-call pack of a [k, n] weight is 1/m of the product's work. Two products
# [m, 768] x [768, 3072] and [m, 3072] x [3072, 768] (2026-12-02, the Zen 3
# machine, one core, weights resident; ms tiled / untiled): m = 1 8.8 / 5.8,
# 4 12.4 / 6.0, 8 12.1 / 11.0, 16 11.5 / 15.4, 64 27.6 / 56.8; GPT-2 124M's
# decode step (m = 1, largest product 2^25.2) 187 / 98 ms. So only products
# whose narrower side has TILED_MIN_ROWS rows count toward the threshold. A
# frozen module packs its weights once, at load, and then every product counts:
# there the same products took 2.3 ms tiled at m = 1 and the decode step 54 ms.
TILED_MIN_ROWS = 16
# Fusing a value with several readers into one dispatch: IREE 3.13 cannot compile a tiled
# product whose epilogue hands out two results in the plain layout (x @ w + b returned
# beside its GELU fails with "operations with large vector sizes"; 2026-12-03). Without
# multi-use fusion it compiles, and the small GPT, MLP M and GPT-2 124M ran level and
# gave the same bits (docs/performance.md, "Data tiling by size").
DATA_TILING_FLAGS = ("--iree-opt-data-tiling", "--iree-llvmcpu-enable-ukernels=mmt4d,pack",
                     "--iree-dispatch-creation-fuse-multi-use=false")
# A tiled product's workgroup should, on one thread (local-sync, llvm-cpu's driver),
# span many rows: IREE's default 64 KiB budget gives MLP M's [128, 784] x [784, 1024]
# and GPT-2's LM head workgroups of 2 x 2 tiles of 16 x 16, so the weight is read
# from memory once per 32 rows. With 1 MiB (8 x 8 and 8 x 2 tiles; 2026-12-02, the
# Xeon, iree-benchmark-module on one core) MLP M's step took 5% less and GPT-2's
# forward 7-9% less, the small GPT's the same; on two local-task workers MLP M's step
# was 45% slower (too few workgroups to share), so on several workers only a module whose
# largest product reaches LARGE_TILES_FROM gets it: GPT-2 124M's forward, whose tied LM head
# [128, 768] x [768, 50257] has hundreds of large workgroups, took 4-6% less on two local-task
# workers (resident and frozen, four A/B runs; the Zen 4 machine, 2026-12-04), while MLP M
# (largest product 2^27) took 16% more there and the small GPT (2^25) the same.
LARGE_TILE_FLAGS = ("--iree-llvmcpu-matmul-tile-bytes=1048576",)
LARGE_TILES_FROM = 2**30
SINGLE_THREAD_DRIVERS = frozenset({"local-sync"})
# On one thread IREE still cuts each dispatch into workgroups, sized for threads that
# are not there; undistributed, a dispatch is one workgroup. A/B in one process (the
# Zen 4 machine, 2026-12-04, topos's step on local-sync, 9 interleaved rounds, the same
# bits; docs/performance.md "One workgroup per dispatch on one thread"): the LeNet's
# step 13-16% faster, the makemore transformer's 5-7%, makemore's MLP 5%, MLP S level;
# their compiles 8-14% shorter. Only untiled modules get it: IREE 3.13 refused makemore's
# data-tiled MLP (the example at its default sizes) undistributed ("'iree_linalg_ext.map_store'
# op write affecting operations on global resources are restricted to workgroup
# distributed contexts"), so the tiled small GPT and MLP M (3-9% faster in the same
# A/B) keep IREE's workgroups. So does a product of UNDISTRIBUTED_BELOW multiply-adds
# or more: GPT-2 124M's tied LM head, [128, 768] x [768, 50257], read its weight once
# per workgroup row band distributed and more often as one workgroup (97 -> 125 ms).
SINGLE_THREAD_FLAGS = ("--iree-llvmcpu-disable-distribution",)
UNDISTRIBUTED_BELOW = 2**30
# Options IREE keeps process-wide: the in-process compiler API (Session.set_flags)
# answers 'option not found' for them, so a module whose flags hold one is compiled
# by the iree-compile tool in a child process (dialect/iree/compile.py), which takes them.
PROCESS_WIDE_OPTIONS = frozenset({"--iree-llvmcpu-matmul-tile-bytes"})

# IREE 3.13's llvm-cpu compiles a stablehlo.convolution into a direct loop
# nest; its img2col preprocessing rewrites the convolution as an im2col copy
# and a matmul first. Measured with benchmarks/img2col.py, now convolutions.py (2-core AMD EPYC,
# Zen 3, 2026-12-01; module time with / without, two runs): the forward plans
# with their convolutions spelled named, MNIST LeNet 0.14-0.15, the benchmark
# conv net 0.18-0.21, a LeNet-like net 0.36-0.48. Added only to StableHLO that
# holds one: topos's own emission spells convolutions as columns (raising.py),
# 2.1-3.1x faster again.
IMG2COL_FLAGS = ("--iree-preprocessing-pass-pipeline="
                 "builtin.module(util.func(iree-global-opt-convert-conv2d-to-img2col))",)


# The CPUs every llvm-cpu compile may name without asking LLVM: this machine's own
# ("host", the default) and LLVM's portable baseline ("generic"). Only these compile
# in-process; any other name compiles in a child process (dialect/iree/compile.py).
SAFE_CPUS = ("host", "generic")
CPU_FLAG = "--iree-llvmcpu-target-cpu="

# A module whose StableHLO cannot fail in any interesting way; compiling it with
# cpu "help" makes LLVM print the CPU names it accepts, then end the process.
_LIST_CPUS = r"""
from iree.compiler.api import Session, Source
session = Session()
session.set_flags("--iree-input-type=stablehlo", "--iree-hal-target-device=local",
                  "--iree-hal-local-target-device-backends=llvm-cpu", "--iree-llvmcpu-target-cpu=help")
invocation = session.invocation()
text = ("func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n"
        "  %0 = stablehlo.add %a, %a : tensor<4xf32>\n  return %0 : tensor<4xf32>\n}\n")
invocation.parse_source(Source.wrap_buffer(session, text.encode()))
invocation.execute()
"""


@functools.cache
def llvm_cpus() -> tuple[str, tuple[str, ...]] | None:
    """(architecture, CPU names) that IREE's LLVM accepts for this machine; None if LLVM would not say.

    Asked of a child process once per process (about 0.3 s): LLVM prints
    the list only on a name it does not know, and then ends the process.
    """
    try:
        done = subprocess.run([sys.executable, "-c", _LIST_CPUS], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    said = done.stderr + done.stdout
    names = re.search(r"List of accepted CPUs: *(.+)", said)
    architecture = re.search(r"Unknown CPU for target architecture (\S+?)\.?\s*$", said, re.MULTILINE)
    if names is None or architecture is None:
        return None
    return architecture.group(1), tuple(n.strip() for n in names.group(1).split(",") if n.strip())


def check_cpu(chosen: Target, cpu) -> None:
    """Raise a TargetError naming the mistake unless ``cpu`` is one LLVM accepts for ``chosen``."""
    if not isinstance(cpu, str):
        raise TargetError(f"cpu must be a str such as 'host' (this machine), got {type(cpu).__name__} {cpu!r}")
    if chosen.name != "llvm-cpu":
        if cpu != "host":
            raise TargetError(
                f"cpu={cpu!r} chooses the CPU of target llvm-cpu; target {chosen.name} takes no cpu "
                f"(its flags are in topos.dialect.iree.targets.TARGETS): drop cpu="
            )
        return
    if cpu in SAFE_CPUS:
        return
    known = llvm_cpus()
    if known is None:  # LLVM would not say: the child-process compile still keeps this process alive
        return
    architecture, names = known
    if cpu in names:
        return
    # GCC's "native" and architecture names are this machine to most people; LLVM knows neither.
    closest = ["host"] if cpu.lower() in ("native", "x86_64", "amd64", "aarch64", "arm64") else []
    if cpu.lower() in ("x86_64", "amd64") and "x86-64" in names:
        closest.insert(0, "x86-64")
    closest += [n for n in difflib.get_close_matches(cpu.lower(), names, n=3, cutoff=0.6) if n not in closest]
    hint = f"did you mean {' or '.join(repr(n) for n in closest)}? " if closest else ""
    raise TargetError(
        f"unknown cpu {cpu!r} for {architecture}: {hint}Use cpu='host' (this machine's CPU: compile's "
        f"default) or cpu='generic' (any {architecture} machine: export's default), or one of the names LLVM "
        f"accepts for {architecture}: {', '.join(names)}"
    )


def data_tiling_threshold(chosen: Target, driver: str | None = None, cpu: str = "host") -> int:
    """Multiply-adds of the largest matmul from which a module for ``driver`` (default: the target's) and
    ``cpu`` is data tiled unless ``compile(data_tiling=...)`` says otherwise."""
    if cpu == "host" and narrow_vector_host():
        return NARROW_DATA_TILING_THRESHOLD
    return DATA_TILING_THRESHOLD if _one_thread(chosen, driver) else SHARED_DATA_TILING_THRESHOLD


def narrow_vector_host() -> bool:
    """True on an x86-64 machine whose features (``host_isa``) show AVX2 and no AVX-512: its data-tiling
    threshold is lower. Where the features cannot be read (no ``/proc/cpuinfo``) the measured rules stay."""
    architecture, *features = host_isa().split()
    return architecture in ("x86_64", "AMD64") and "avx2" in features and "avx512f" not in features


def _one_thread(chosen: Target, driver: str | None) -> bool:
    return (driver or chosen.driver) in SINGLE_THREAD_DRIVERS


def flags_for(chosen: Target, uses_f64: bool, cpu: str = "host", uses_bf16: bool = False,
              data_tiling: bool = False, elements: Iterable = (), convolution: bool = False,
              driver: str | None = None, largest_product: int = 0) -> tuple[str, ...]:
    """Every compiler flag for this target and module; an unknown ``cpu`` is a TargetError.

    ``elements``: the module's element types (dtypes or their names); one
    the target refuses (``Target.refuses``) is a TargetError naming it.
    ``convolution``: the module holds a ``stablehlo.convolution`` (llvm-cpu
    then adds ``IMG2COL_FLAGS``). ``driver`` (default: the target's) is the
    one the module will run on. For a single-threaded driver, an untiled
    module whose ``largest_product`` (multiply-adds of its largest matmul) is
    under ``UNDISTRIBUTED_BELOW`` adds ``SINGLE_THREAD_FLAGS``, and a
    data-tiled one ``LARGE_TILE_FLAGS``; on several workers a data-tiled
    module gets those only when ``largest_product`` reaches ``LARGE_TILES_FROM``.
    """
    check_cpu(chosen, cpu)
    check_elements(chosen, [*elements, *(["bfloat16"] if uses_bf16 else [])])
    flags = list(_COMMON + chosen.flags)
    if chosen.name == "llvm-cpu":
        flags.append(CPU_FLAG + cpu)
        one_thread = _one_thread(chosen, driver)
        if one_thread and not data_tiling and largest_product < UNDISTRIBUTED_BELOW:
            flags.extend(SINGLE_THREAD_FLAGS)
        if data_tiling:
            flags.extend(DATA_TILING_FLAGS)
            if one_thread or largest_product >= LARGE_TILES_FROM:
                flags.extend(LARGE_TILE_FLAGS)
        if convolution:
            flags.extend(IMG2COL_FLAGS)
    if uses_f64:
        if not chosen.supports_f64:
            raise TargetError(f"target {chosen.name} has no float64 support; record the graph in float32")
        if "--iree-llvmcpu-link-embedded=false" in chosen.f64_flags and not (
            shutil.which("ld") or shutil.which("cc")
        ):
            raise TargetError(
                "float64 on llvm-cpu links a system shared object (libm for f64 tanh), "
                "but no system linker (ld) was found; install binutils or use float32"
            )
        flags.extend(chosen.f64_flags)
    return tuple(flags)


def check_elements(chosen: Target, elements: Iterable) -> None:
    """Raise a TargetError naming the element and the target when ``chosen`` refuses one of ``elements``.

    ``elements`` are dtypes (``np.float16``), their NumPy names
    (``"float16"``) or the registered short names (``"f16"``); selections
    and anything unregistered are skipped (the recording refused those).
    """
    for dtype in elements:
        try:
            element = element_of(dtype)
        except (TypeError, ValueError):
            continue
        if not is_element(element.dtype) or element.mlir is None or element.mlir not in chosen.refuses:
            continue
        usable = [n for n, t in TARGETS.items() if element.mlir not in t.refuses]
        raise TargetError(
            f"target {chosen.name} cannot serve element {element.name} ({element.mlir}): "
            f"{chosen.refuses[element.mlir]}; record the graph in float32 for {chosen.name}, or compile "
            f"{element.name} for {', '.join(usable)}"
        )


def cpu_of(flags) -> str | None:
    """The CPU an llvm-cpu flag list names, or None for a target without one."""
    for flag in flags:
        if flag.startswith(CPU_FLAG):
            return flag[len(CPU_FLAG):]
    return None


@functools.cache
def host_isa() -> str:
    """What this machine's CPU executes: its architecture and feature flags (``/proc/cpuinfo``), else its name.

    A module compiled with ``cpu="host"`` may use every one of those
    features, and its flags say only "host"; the compile cache keys such a
    module on this too, so that a cache filled on one machine never serves
    it to a CPU that lacks them (the first dispatch would die of SIGILL).
    """
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        features = next(line.partition(":")[2].split() for line in lines if line.startswith(("flags", "Features")))
    except (OSError, StopIteration):
        return f"{platform.machine()} {platform.processor()}"
    return f"{platform.machine()} {' '.join(sorted(set(features)))}"


def check_driver(name: str) -> None:
    """Raise a TargetError naming the driver when this runtime cannot run it."""
    import iree.runtime as rt

    available = rt.query_available_drivers()
    if name not in available:
        raise TargetError(
            f"the IREE runtime on this machine has no {name!r} driver "
            f"(available: {', '.join(available)}); the module still compiles — run it elsewhere"
        )
