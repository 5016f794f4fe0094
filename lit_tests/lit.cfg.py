# ruff: noqa: F821  (lit defines `config` before it runs this file)
# lit configuration for the topos tools: run with `lit lit_tests` (or `make test`,
# through tests/test_lit.py). Tests use the Python `filecheck` and lit's
# internal shell, so they run the same on every machine.
#
# test_source_root is left at its default (this directory): pointing it at a
# subdirectory makes `lit lit_tests/x.mlir` find no tests.
import os
import sys

import lit.formats

config.name = "topos"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".test"]
config.excludes = ["Inputs", "lit.cfg.py", "Output"]

_here = os.path.dirname(os.path.abspath(__file__))
_root = os.path.dirname(_here)
_python = sys.executable  # the interpreter running lit: the project's virtualenv
_bin = os.path.dirname(_python)

config.substitutions.append(("%topos-opt", f"{_python} {_root}/tools/topos-opt"))
config.substitutions.append(("%python", _python))
config.substitutions.append(("%irdl", f"{_root}/dialect/ir/topos.irdl.mlir"))
config.substitutions.append(("%inputs", f"{_here}/Inputs"))

# iree-opt and filecheck live beside the interpreter.
config.environment["PATH"] = os.pathsep.join([_bin, config.environment.get("PATH", os.environ.get("PATH", ""))])
# Inputs/ holds helper scripts and the example pass module; the root makes
# the checkout importable even when topos is not installed.
config.environment["PYTHONPATH"] = os.pathsep.join([f"{_here}/Inputs", _root])
for _name in ("HOME", "TMPDIR"):
    if _name in os.environ:
        config.environment[_name] = os.environ[_name]
