"""topos: record a tensor graph once, then read the sealed spec in named ways.

``import topos`` loads only NumPy and ml_dtypes; the MLIR side
(``topos.dialect``) is imported on demand.
"""

from .element import ELEMENTS, Selection, SelectionType, bfloat16, float32, float64, selection
from .bisect import BisectReport, bisect
from .differentiate import Adjoints, Field, Gradients
from .errors import (
    DifferentiationError,
    FeedError,
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
from .recordable import Recordable, concat, stack
from .run import Run
from .symbol import Symbol
from .tape import Tape, Value, detach
from .update import Updates, sgd

__version__ = "0.1.0"

__all__ = [
    "ELEMENTS", "MAP_FUNCTIONS", "OPCODES", "Adjoints", "Field", "Gradients",
    "DifferentiationError", "FeedError", "Network", "Node", "Opcode", "Parameters",
    "Recordable", "Run", "Candidate", "Entry", "Numerics", "Plan", "SealedError", "Selection", "SelectionType", "ShapeError", "Symbol",
    "SymbolError", "Tape", "ToposError", "Value",
    "GradientCheckError", "GradientReport", "check_gradients", "BisectReport", "bisect",
    "Updates", "bfloat16", "by_name", "sgd", "concat", "detach", "float32", "float64", "selection", "stack",
]
