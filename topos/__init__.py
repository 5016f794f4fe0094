"""topos: record a tensor graph once, then read the sealed spec in named ways.

This is the door: every name a user imports from ``topos``. The layers
behind it are folders, bottom to top (``topos/layers.py`` has the plan):
``base``, ``spec``, ``readings``, ``views``, then the facades ``nn``,
``optim``, ``init`` and ``checkpoint``, which use only the names below.
``import topos`` loads NumPy, ml_dtypes, the spec and its readings; the
views and the facades load when first named, and the MLIR side
(``topos.dialect``) when first asked for.
"""

import importlib

from topos.base.element import ELEMENTS, Selection, SelectionType, bfloat16, float32, float64, selection
from topos.base.errors import (
    ArgumentError,
    CheckpointError,
    DifferentiationError,
    FeedError,
    PlanError,
    RecordingError,
    SealedError,
    ShapeError,
    SymbolError,
    ToposError,
)
from topos.readings.differentiate import Adjoints, Field, Gradients
from topos.readings.eager import Eager
from topos.readings.gradcheck import GradientCheckError, GradientReport, check_gradients
from topos.readings.plan.entry import Entry
from topos.readings.plan.numerics import Fidelity, Numerics, exactly, posture, register_kernel, unregister_kernel
from topos.readings.plan.patterns import Candidate
from topos.readings.plan.plan import Plan
from topos.readings.update import Updates, sgd
from topos.spec.network import Network, Node
from topos.spec.opcodes import MAP_FUNCTIONS, OPCODES, Opcode, by_name
from topos.spec.parameters import Parameters
from topos.spec.recordable import Recordable, concat, stack
from topos.spec.run import Run
from topos.spec.symbol import Symbol
from topos.spec.tape import Tape, Value, detach

__version__ = "0.1.0"


# The views (drawings, bisect, the backends) load when first named too: import topos stays the spec
# and its readings, and a drawing's Graphviz and subprocess wait for the first drawing.
_VIEWS = {"Drawing": "drawing", "DrawingError": "drawing", "draw": "drawing", "plot_live_bytes": "drawing",
          "BisectReport": "bisect", "bisect": "bisect", "backends": "backends"}


def __getattr__(name: str):
    """A view or a facade, loaded when first named (``topos.draw``, ``topos.nn``, ``from topos import optim``)."""
    if name in _VIEWS:
        value = getattr(importlib.import_module(f"topos.views.{_VIEWS[name]}"), name)
        globals()[name] = value  # once: later lookups find it here
        return value
    if name == "nn":
        import topos.nn as nn

        return nn
    if name == "optim":
        import topos.optim as optim

        return optim
    if name == "init":
        import topos.init as init

        return init
    if name == "checkpoint":
        import topos.checkpoint as checkpoint

        return checkpoint
    raise AttributeError(f"module 'topos' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

__all__ = [
    "ELEMENTS", "MAP_FUNCTIONS", "OPCODES", "Adjoints", "ArgumentError", "BisectReport", "Candidate", "CheckpointError",
    "DifferentiationError", "Drawing", "DrawingError", "Eager", "Entry", "FeedError", "Fidelity", "Field",
    "GradientCheckError", "GradientReport", "Gradients", "Network", "Node", "Numerics", "Opcode", "Parameters",
    "Plan", "PlanError", "Recordable", "RecordingError", "Run", "SealedError", "Selection", "SelectionType",
    "ShapeError",
    "Symbol", "SymbolError", "Tape", "ToposError", "Updates", "Value", "backends", "bfloat16", "bisect", "by_name",
    "check_gradients", "checkpoint", "concat", "detach", "draw", "exactly", "float32", "float64", "init", "nn", "optim",
    "plot_live_bytes", "posture", "register_kernel", "selection", "sgd", "stack", "unregister_kernel",
]
