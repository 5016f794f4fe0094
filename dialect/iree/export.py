"""``plan.export(directory)``: a self-contained IREE artifact that runs and checks itself without topos.

The folder holds

* ``module.vmfb``: the module as ``iree-compile`` writes it (no cache
  header), compiled from the portable StableHLO below, so it carries no
  path of the machine that built it;
* ``module.stablehlo.mlir``: the portable StableHLO (no locations), and
  ``module.located.mlir``: the same ops with every node's location, paths
  relative to the working directory the export ran in (a path outside it
  keeps only its file name), for debugging;
* ``flags.txt``: the exact ``iree-compile`` command line that rebuilds
  ``module.vmfb`` from ``module.stablehlo.mlir``;
* ``manifest.json``: the function, each argument and result with its
  node, name, role, shape and element type, the target and driver, the
  topos and IREE versions, and each result's envelope;
* ``inputs/`` and ``expected/``: the oracle's test vectors, ``.npy`` for
  float32, float64 and indices, raw little-endian ``.bin`` for bfloat16
  (NumPy's format has no bfloat16; ``iree-run-module`` reads it as
  ``SHAPExbf16=@file.bin``); indices are int64, or int32 for a target
  that narrows selections (``vulkan``: ``topos.dialect.passes.narrow``);
* ``check.sh``: runs ``iree-run-module --expected_output`` on those
  vectors with tolerances from the envelopes; exit status 0 means the
  module reproduces the oracle on this machine.

With ``frozen=True`` the parameters are not arguments: the module reads
them as globals by name (``topos.dialect.passes.freeze``), and their values are
written once to ``parameters.irpa`` (an IREE parameter archive, keyed by
parameter name) instead of ``inputs/``; ``check.sh`` passes
``--parameters=topos=parameters.irpa``, and the manifest lists them under
``frozen``. Another checkpoint of the same network runs with the same
module and another archive.

A result's envelope is the end-to-end one every compiled result meets
(``conformance.END_TO_END_ULPS`` units of its element type's epsilon
times the largest magnitude of the oracle's value), as an absolute
tolerance; ``iree-run-module`` takes one tolerance per element type, so
``check.sh`` passes the largest of each type's results.

The artifact is written to a temporary folder beside ``directory`` and
renamed into place when whole: a failed export leaves nothing, and an
existing non-empty ``directory`` is replaced only with ``force=True``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np

from topos.base.errors import AtTheUsersLine
from topos.dialect.iree.compile import check_switches, compile_module, frozen_values_of, module_flags, toolchain_version
from topos.dialect.iree.compiled import CompiledPlan
from topos.dialect.iree.conformance import END_TO_END_ULPS
from topos.dialect.iree.targets import target
from topos.dialect.passes.freeze import SCOPE, as_bytes, key_of
from topos.readings.plan.numerics import Numerics
from topos.spec.parameters import Parameters

# The runtime device iree-run-module names for each driver CompiledPlan uses.
_DEVICES = {"local-sync": "local-task", "local-task": "local-task", "cuda": "cuda", "vulkan": "vulkan",
            "metal": "metal", "hip": "hip"}
_THRESHOLD_FLAGS = {"f32": "--expected_f32_threshold", "f64": "--expected_f64_threshold",
                    "bf16": "--expected_bf16_threshold"}
# No source map and no DWARF: the module then names no path of the machine that built it, and
# iree-compile on the command line rebuilds it byte for byte (measured: without these the two
# differ, by the buffer name the locations carry).
_STRIPPED = ("--iree-vm-bytecode-module-strip-source-map=true",)
_STRIPPED_CPU = ("--iree-llvmcpu-debug-symbols=false",)
_LOCATED_FILE = re.compile(r'loc\("([^"]+)":(\d+):(\d+)\)')


class ExportError(AtTheUsersLine, ValueError):
    """An export refused: an existing folder, an unwritable path, missing feeds, a target that cannot."""


def export_plan(plan, directory, target_name: str = "llvm-cpu", *, parameters=None, feeds=None,
                cpu: str | None = None, force: bool = False, data_tiling: bool | None = None,
                frozen=False) -> Path:
    """Write the artifact of ``plan`` for ``target_name`` into ``directory`` and return its path.

    ``parameters`` (default: the record-site initial table) and ``feeds``
    (default: the recorded defaults) are the test vectors the oracle runs.
    ``cpu`` (llvm-cpu) defaults to ``"generic"``, LLVM's portable x86-64 or
    AArch64 baseline, because an exported module travels; ``"host"`` is
    this machine's CPU (faster, and may not run elsewhere). Other targets
    take no cpu. ``frozen`` (True, or a Parameters table as ``compile``
    takes it: then it is also ``parameters``): the parameters become module
    globals served from ``parameters.irpa`` (see the module's docstring).
    """
    if not isinstance(directory, (str, os.PathLike)):
        raise ExportError(f"export writes into a folder: pass its path (a str or a pathlib.Path), such as "
                          f"plan.export('artifact'); got {type(directory).__name__} {directory!r}")
    check_switches(ExportError, ("data_tiling",), force=force, data_tiling=data_tiling)
    if isinstance(frozen, Parameters):  # compile(frozen=table)'s spelling: the table is what to freeze
        if parameters is not None and parameters is not frozen:
            raise ExportError("export got two tables, parameters= and frozen=; pass the one to freeze "
                              "as frozen=table (or parameters=table, frozen=True)")
        parameters, frozen = frozen, True
    elif not isinstance(frozen, bool):
        raise ExportError(f"frozen={frozen!r} ({type(frozen).__name__}): pass True, False or the Parameters "
                          "table to freeze")
    folder = Path(directory)
    _check_destination(folder, force)
    chosen = target(target_name)
    if cpu is not None and chosen.name != "llvm-cpu":
        raise ExportError(f"cpu={cpu!r} chooses the CPU of an llvm-cpu export; target {chosen.name} takes no "
                          "cpu: drop cpu=")
    if cpu is None:
        cpu = "generic" if chosen.name == "llvm-cpu" else "host"
    network = plan.network
    parameters = network.parameters() if parameters is None else parameters
    held = frozen_values_of(plan, parameters) if frozen else None  # a wrong table fails before IREE
    from topos.dialect.pipeline import stablehlo  # lowering needs the compiler: loaded here, not with this module

    text, located, _ = stablehlo(plan, frozen=frozen, target=chosen)
    # Sized for the device check.sh runs it on (local-task for llvm-cpu: a thread per core), not for
    # topos's own single-threaded calls.
    flags = module_flags(plan, chosen, cpu, data_tiling, driver=_DEVICES.get(chosen.driver, chosen.driver),
                         frozen=frozen)
    flags += _STRIPPED if chosen.name != "llvm-cpu" else _STRIPPED + _STRIPPED_CPU
    vmfb = compile_module(text, flags)  # the portable text: the module names no path of this machine
    compiled = CompiledPlan(plan, chosen, chosen.driver, flags, text, vmfb, {}, False, frozen=held)
    arguments = compiled._arguments(parameters, feeds)  # FeedError names a missing or wrong feed
    oracle = network.entry(list(plan.entry.roots), observe=list(plan.entry.observes),
                           numerics=Numerics.EXACT).interpret(parameters, feeds)
    results = [(i, np.asarray(oracle[network.symbol(i)])) for i in compiled.results]
    if chosen.narrows_selections:  # the module takes and returns selections as i32 (topos.dialect.passes.narrow)
        arguments = [_narrowed(np.asarray(a)) for a in arguments]
        results = [(i, _narrowed(value)) for i, value in results]

    argument_rows = [_describe(network, i, k, np.asarray(a)) for k, (i, a) in
                     enumerate(zip(compiled.arguments, arguments))]
    result_rows = [{**_describe(network, i, k, value), "role": _result_role(plan, i),
                    "envelope_abs": _envelope(value)} for k, (i, value) in enumerate(results)]
    manifest = {
        "function": "main",
        "target": chosen.name,
        "driver": chosen.driver,
        "device": _DEVICES.get(chosen.driver, chosen.driver),
        "flags": list(flags),
        "versions": {"topos": _topos_version(), "iree": toolchain_version()},
        "envelope": (f"|compiled - oracle| <= {END_TO_END_ULPS:g} * eps(dtype) * max|oracle| per result "
                     "(topos.dialect.iree.conformance.END_TO_END_ULPS)"),
        "arguments": argument_rows,
        "results": result_rows,
    }
    if held is not None:
        manifest["frozen"] = {"file": "parameters.irpa", "scope": SCOPE, "parameters": [
            {**{f: v for f, v in _describe(network, i, k, held[i]).items() if f != "file"}, "key": key_of(network, i)}
            for k, i in enumerate(plan.parameter_nodes())]}
    try:  # os.access passes for root, and says nothing of a full disk or a read-only mount
        partial = Path(tempfile.mkdtemp(prefix=f".{folder.name}.partial-", dir=_parent(folder)))
    except OSError as error:
        raise ExportError(f"cannot create files in {_parent(folder)} ({error.strerror or error}); "
                          "choose a writable folder") from None
    try:
        partial.chmod(0o777 & ~_umask())  # what mkdir would have made; mkdtemp makes 0700
        (partial / "module.vmfb").write_bytes(vmfb)
        (partial / "module.stablehlo.mlir").write_text(text)
        (partial / "module.located.mlir").write_text(_relative_locations(located))
        (partial / "flags.txt").write_text(shlex.join(["iree-compile", *flags, "module.stablehlo.mlir",
                                                       "-o", "module.vmfb"]) + "\n")
        inputs = [_write_vector(partial / "inputs", row, np.asarray(a))
                  for row, a in zip(argument_rows, arguments)]
        expected = [_write_vector(partial / "expected", row, value)
                    for row, (_, value) in zip(result_rows, results)]
        if held is not None:
            _write_archive(partial / "parameters.irpa", {key_of(network, i): a for i, a in held.items()})
        (partial / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        check = partial / "check.sh"
        check.write_text(_check_script(manifest, inputs, expected))
        check.chmod(0o755)
        _move_into_place(partial, folder)
    except OSError as error:
        shutil.rmtree(partial, ignore_errors=True)
        raise ExportError(f"cannot write the export to {folder}: {error.strerror or error}") from None
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return folder


def _check_destination(folder: Path, force: bool) -> None:
    here = Path.cwd().resolve()
    if folder.resolve() == here or folder.resolve() in here.parents:  # force would delete where we stand
        what = "is the current directory" if folder.resolve() == here else "holds the current directory"
        raise ExportError(f"{str(folder)!r} {what}, which export cannot replace; name a new folder, such as "
                          "'artifact'")
    if folder.exists() and not folder.is_dir():
        raise ExportError(f"{folder} is a file; export writes a folder: name a new folder")
    if folder.is_dir() and any(folder.iterdir()) and not force:
        raise ExportError(f"{folder} exists and is not empty; choose a new folder, or pass force=True "
                          "(topos export --force) to replace it")
    parent = _parent(folder)
    if not parent.is_dir():
        raise ExportError(f"the folder {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK):
        raise ExportError(f"cannot create files in {parent} (permission denied); choose a writable folder")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _parent(folder: Path) -> Path:
    return folder.resolve().parent


def _move_into_place(partial: Path, folder: Path) -> None:
    """Rename the finished folder into place; an existing one (force) is moved aside first, then removed."""
    if folder.exists():
        aside = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old-", dir=_parent(folder)))
        try:
            os.replace(folder, aside / folder.name)
        except OSError:
            aside.rmdir()  # nothing was moved: leave no empty folder behind
            raise
        os.replace(partial, folder)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(partial, folder)


def _narrowed(value: np.ndarray) -> np.ndarray:
    return value.astype(np.int32) if value.dtype == np.int64 else value


def _describe(network, i: int, position: int, value: np.ndarray) -> dict:
    node = network._node(i)
    name = node.name or f"node{i}_{node.opcode.name}"
    return {"position": position, "node": i, "name": name, "opcode": node.opcode.name,
            "role": _argument_role(node), "shape": list(value.shape), "dtype": _mlir_type(value.dtype),
            "file": f"{position:02d}_{_safe(name)}"}


def _argument_role(node) -> str:
    if node.opcode.name == "parameter":
        return "state" if node.role == "state" else "parameter"
    return node.opcode.name


def _result_role(plan, i: int) -> str:
    return "root" if any(s.index == i for s in plan.entry.roots) else "observe"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:60]


def _mlir_type(dtype) -> str:
    dtype = np.dtype(dtype)
    if dtype == ml_dtypes.bfloat16:
        return "bf16"
    return {"f": "f", "i": "i", "u": "ui"}[dtype.kind] + str(dtype.itemsize * 8)


def _envelope(value: np.ndarray) -> float:
    if value.dtype.kind not in "fV" and value.dtype != ml_dtypes.bfloat16:
        return 0.0
    eps = float(ml_dtypes.finfo(value.dtype).eps)
    finite = np.abs(value.astype(np.float64))
    finite = finite[np.isfinite(finite)]
    return END_TO_END_ULPS * eps * (float(finite.max()) if finite.size else 0.0)


def _write_vector(folder: Path, row: dict, value: np.ndarray) -> str:
    """Write one test vector; return its iree-run-module spelling (``@file.npy`` or ``SHAPExbf16=@file.bin``)."""
    folder.mkdir(exist_ok=True)
    if row["dtype"] == "bf16" or value.ndim == 0:  # iree-run-module reads a rank-0 .npy as shape [1]
        path = folder / f"{row['file']}.bin"
        array = np.ascontiguousarray(value)
        path.write_bytes(array.view(np.uint16).astype("<u2").tobytes() if row["dtype"] == "bf16"
                         else array.astype(array.dtype.newbyteorder("<")).tobytes())
        shape = "".join(f"{d}x" for d in value.shape)
        return f"{shape}{row['dtype']}=@{folder.name}/{path.name}"
    path = folder / f"{row['file']}.npy"
    np.save(path, np.ascontiguousarray(value))
    return f"@{folder.name}/{path.name}"


def _check_script(manifest: dict, inputs: list[str], expected: list[str]) -> str:
    thresholds: dict[str, float] = {}
    for row in manifest["results"]:  # one tolerance per element type: the largest of its results
        if row["dtype"] in _THRESHOLD_FLAGS:
            thresholds[row["dtype"]] = max(thresholds.get(row["dtype"], 0.0), row["envelope_abs"])
    command = ['"$RUN"', "--module=module.vmfb", f"--device={manifest['device']}", "--function=main"]
    if "frozen" in manifest:
        command.append(f"--parameters={manifest['frozen']['scope']}={manifest['frozen']['file']}")
    command += [f"--input={spec}" for spec in inputs]
    command += [f"--expected_output={spec}" for spec in expected]
    command += ["--expected_rtol=0"] + [f"{_THRESHOLD_FLAGS[t]}={v:.9g}" for t, v in sorted(thresholds.items())]
    body = " \\\n  ".join(command)
    return f"""#!/bin/sh
# Runs module.vmfb on the oracle's inputs and compares every result with the oracle's,
# within its envelope ({manifest['envelope']}).
# Exit status 0: the module reproduces the oracle here. Needs iree-run-module on PATH
# (pip install iree-base-runtime), or IREE_RUN_MODULE naming it. Target {manifest['target']},
# device {manifest['device']}.
set -eu
cd "$(dirname "$0")"
RUN="${{IREE_RUN_MODULE:-iree-run-module}}"
exec {body}
"""


def _write_archive(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """An IREE parameter archive of ``arrays`` by key: the bytes each frozen global reads."""
    from iree.runtime import save_archive_file

    save_archive_file({key: as_bytes(a) for key, a in arrays.items()}, path)


def _relative_locations(located: str) -> str:
    def relative(match: re.Match) -> str:
        path = match.group(1)
        if os.path.isabs(path):
            try:
                shorter = os.path.relpath(path)
            except ValueError:
                shorter = os.path.basename(path)
            path = os.path.basename(path) if shorter.startswith("..") else shorter
        return f'loc("{path}":{match.group(2)}:{match.group(3)})'

    return _LOCATED_FILE.sub(relative, located)


def _topos_version() -> str:
    # The parent package is loaded before any of its modules, so this reads it without importing upward.
    return sys.modules["topos"].__version__


__all__ = ["ExportError", "export_plan"]
