"""Run a Python script as on a machine with IREE's runtime and no compiler: python without_compiler.py SCRIPT ARGS...

``iree.compiler`` cannot be imported (as when iree-base-compiler is not
installed) and its package metadata is gone; everything else, the
runtime included, is this interpreter's. The tests of
``test_without_compiler.py`` run their child processes through it.
"""

import importlib.abc
import importlib.metadata
import os
import sys


class _NoCompiler(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "iree.compiler" or name.startswith("iree.compiler."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoCompiler())
_version = importlib.metadata.version


def _without_the_compiler(name):
    if name == "iree-base-compiler":
        raise importlib.metadata.PackageNotFoundError(name)
    return _version(name)


importlib.metadata.version = _without_the_compiler

script = os.path.abspath(sys.argv[1])
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(script)
with open(script) as file:
    code = compile(file.read(), script, "exec")
exec(code, {"__name__": "__main__", "__file__": script})
