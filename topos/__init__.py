"""topos: record a tensor graph once, then read the sealed spec in named ways.

``import topos`` loads only NumPy and ml_dtypes; the MLIR side
(``topos.dialect``) is imported on demand.
"""

from .backends import backends
from .bisect import BisectReport, bisect
from .differentiate import Adjoints, Field, Gradients
from .drawing import Drawing, DrawingError, draw, plot_live_bytes
from .element import ELEMENTS, Selection, SelectionType, bfloat16, float32, float64, selection
from .errors import (
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
from .gradcheck import GradientCheckError, GradientReport, check_gradients
from .network import Network, Node
from .opcodes import MAP_FUNCTIONS, OPCODES, Opcode, by_name
from .parameters import Parameters
from .plan import Candidate, Entry, Numerics, Plan
from .plan.numerics import Fidelity, exactly, posture, register_kernel, unregister_kernel
from .recordable import Eager, Recordable, concat, stack
from .run import Run
from .symbol import Symbol
from .tape import Tape, Value, detach
from .update import Updates, sgd

# The facades use only the names above, so they are imported last.
from . import checkpoint, init, nn, optim  # noqa: E402, I001  # isort: skip

__version__ = "0.1.0"

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
