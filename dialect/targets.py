"""IREE targets: the flags that compile a StableHLO module for each device, and the driver that runs it."""

from __future__ import annotations

import shutil
from dataclasses import dataclass

from topos.errors import ToposError


class TargetError(ToposError, ValueError):
    """An unknown target, or a target this machine cannot compile or run."""


@dataclass(frozen=True)
class Target:
    """One IREE target: how to compile for it and which runtime driver runs it."""

    name: str
    flags: tuple[str, ...]
    driver: str
    f64_flags: tuple[str, ...] = ()
    supports_f64: bool = True
    supports_bf16: bool = True
    note: str = ""


_COMMON = ("--iree-input-type=stablehlo",)

TARGETS: dict[str, Target] = {
    "llvm-cpu": Target(
        "llvm-cpu",
        ("--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu"),
        "local-sync",
        # IREE demotes f64 to f32 by default, and its embedded ELF has no libm
        # for f64 tanh: keep f64 and link a system shared object instead.
        ("--iree-input-demote-f64-to-f32=false", "--iree-llvmcpu-link-embedded=false"),
        note="compiled and run on every test run",
    ),
    "cuda": Target(
        "cuda",
        # sm_90 fails in this IREE release ('missing GPU target'); sm_80 PTX
        # is JIT-compiled by the driver on newer GPUs.
        ("--iree-hal-target-device=cuda", "--iree-cuda-target=sm_80"),
        "cuda",
        ("--iree-input-demote-f64-to-f32=false",),
        note="sm_80 PTX",
    ),
    "vulkan": Target(
        "vulkan",
        ("--iree-hal-target-backends=vulkan-spirv",),
        "vulkan",
        supports_f64=False,
        # Measured on Mesa lavapipe: bf16 constants and broadcasts come back as zeros,
        # log_softmax is wrong and matmul fails to compile ('vector.bitcast' not legalized).
        supports_bf16=False,
        note="generic SPIR-V; runs on Mesa lavapipe without a GPU",
    ),
    "metal": Target(
        "metal",
        ("--iree-hal-target-backends=metal-spirv",),
        "metal",
        supports_f64=False,
        note="MSL source embedded; the Linux runtime wheel has no metal driver",
    ),
    "rocm": Target(
        "rocm",
        ("--iree-hal-target-device=hip", "--iree-rocm-target=gfx942"),
        "hip",
        ("--iree-input-demote-f64-to-f32=false",),
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
# a matmul is big enough to amortize it: measured on llvm-cpu (2-core EPYC,
# benchmarks/compiled.py), a 784-1024-1024 MLP step (largest matmul ~2^26.6
# multiply-adds) ran 18% faster with it, a 784-128-10 MLP step (~2^22.6)
# 39% slower and a small GPT step (~2^25) 4% slower.
DATA_TILING_THRESHOLD = 2**26
DATA_TILING_FLAGS = ("--iree-opt-data-tiling", "--iree-llvmcpu-enable-ukernels=all")


def flags_for(chosen: Target, uses_f64: bool, cpu: str = "host", uses_bf16: bool = False,
              data_tiling: bool = False) -> tuple[str, ...]:
    """Every compiler flag for this target and module."""
    if uses_bf16 and not chosen.supports_bf16:
        raise TargetError(
            f"target {chosen.name} computes bfloat16 wrongly in this IREE release (zeros for constants "
            "and broadcasts on Mesa lavapipe); record the graph in float32 for this target"
        )
    flags = list(_COMMON + chosen.flags)
    if chosen.name == "llvm-cpu":
        flags.append(f"--iree-llvmcpu-target-cpu={cpu}")
        if data_tiling:
            flags.extend(DATA_TILING_FLAGS)
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


def check_driver(name: str) -> None:
    """Raise a TargetError naming the driver when this runtime cannot run it."""
    import iree.runtime as rt

    available = rt.query_available_drivers()
    if name not in available:
        raise TargetError(
            f"the IREE runtime on this machine has no {name!r} driver "
            f"(available: {', '.join(available)}); the module still compiles — run it elsewhere"
        )
