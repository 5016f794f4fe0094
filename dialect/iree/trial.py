"""A module built for a named CPU, tried once in a child process before it runs in this one.

A module compiled for a CPU this machine lacks dies of SIGILL, which no
``try`` catches: so the first load of a module built for any ``cpu`` but
``host`` or ``generic`` on a local driver makes one call in a child, on
zeros, and a death there is a TargetError here, never the end of the
caller's process. One trial per module and driver per process.
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from topos.base.element import SelectionType
from topos.dialect.iree.compile import TRANSIENT_SIZE, child_death, child_environment
from topos.dialect.iree.targets import SAFE_CPUS, TargetError, cpu_of
from topos.dialect.passes.freeze import SCOPE, key_of

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


def try_in_child(vmfb: bytes, driver: str, flags, network, arguments: tuple[int, ...],
                 frozen: Mapping[int, np.ndarray] | None) -> None:
    """For a module built for a named CPU: one trial call in a child, so SIGILL kills only the child.

    ``arguments``: the nodes of ``network`` the module takes, in order;
    ``frozen``: a frozen module's parameter values (the trial serves zeros of their sizes).
    """
    cpu = cpu_of(flags)
    if cpu is None or cpu in SAFE_CPUS or not driver.startswith("local"):
        return
    trial = (hashlib.sha256(vmfb).hexdigest(), driver)
    if trial not in _TRIALS:
        _TRIALS[trial] = _trial_in_child(vmfb, driver, cpu, network, arguments, frozen)
    if _TRIALS[trial] is not None:
        raise TargetError(_TRIALS[trial])


def _trial_in_child(vmfb: bytes, driver: str, cpu: str, network, arguments_of: tuple[int, ...],
                    frozen: Mapping[int, np.ndarray] | None) -> str | None:
    arguments = []
    for i in arguments_of:
        spec = network.columns.specs[i]
        dtype = np.dtype(np.int64) if isinstance(spec.dtype, SelectionType) else np.dtype(spec.dtype)
        arguments.append((list(spec.shape), dtype.name))
    with tempfile.TemporaryDirectory(prefix="topos-trial-") as directory:
        folder = Path(directory)
        (folder / "module.vmfb").write_bytes(vmfb)
        (folder / "arguments.json").write_text(json.dumps(arguments))
        (folder / "frozen.json").write_text(json.dumps(
            [(key_of(network, i), a.nbytes) for i, a in (frozen or {}).items()]))
        try:
            done = subprocess.run([sys.executable, "-c", _TRIAL, directory, driver, SCOPE, TRANSIENT_SIZE],
                                  capture_output=True,
                                  text=True, env=child_environment(), check=False)
        except OSError:
            return None
    if done.returncode >= 0:
        return None  # ran, or failed in an ordinary way that running here will report
    what = child_death("a trial call of the module", done, f"running on the {driver} device")
    lacks = " uses instructions this machine's CPU lacks" if done.returncode == -signal.SIGILL else (
        " cannot run on this machine")
    return (f"the module compiled for cpu={cpu!r}{lacks}: {what}. Compile with cpu='host' (the "
            f"default) to run here; compiled.vmfb still runs on a machine with a {cpu} CPU")
