"""What the plan passes and topos-raise read back from a module: the spec it holds, its plan, its topos ops.

Every pass over topos IR is a reading of the spec the module holds: it
parses the spec back (``spec_of``), lowers it with the core's plan
(``plan_of``), and annotates the ops in node order (``spec_ops``).
"""

from __future__ import annotations

import contextlib

from iree.compiler import ir

from topos.base.errors import ToposError
from topos.dialect.ir.diagnostics import DialectError, core_message
from topos.dialect.ir.parse import main_function, parse_spec
from topos.dialect.passes.registry import PassFailure
from topos.readings.plan.numerics import Numerics


def spec_of(module):
    """(network, roots, observes): the spec ``module`` holds, parsed back."""
    return parse_spec(module)


# Annotations these passes (and topos-raise) read back from the IR, with the
# attribute class they are written as. The verifiers accept any topos.*
# attribute, so input text may carry one of another type.
READ_BACK = {"topos.fusion_kind": (ir.StringAttr, 'a string such as "convolution"')}


def spec_ops(module) -> tuple:
    """(@main, its topos ops in order): position k is node k of the parsed spec.

    Refuses (PassFailure) an op whose annotation in READ_BACK is of the wrong attribute class.
    """
    function = main_function(module)
    block = function.regions[0].blocks[0]
    ops = [op for op in block.operations if op.operation.name.startswith("topos.")]
    for op in ops:
        for name, (kind, spelling) in READ_BACK.items():
            if name in op.attributes and not isinstance(op.attributes[name], kind):
                message = f"'{op.operation.name}' op: annotation '{name}' must be {spelling}, got {op.attributes[name]}"
                raise PassFailure.at(op, message)
    return function, ops


@contextlib.contextmanager
def core_refusals(function):
    """The core's refusals (a ToposError, say an entry without roots) as a PassFailure at @main."""
    try:
        yield
    except DialectError:
        raise
    except ToposError as error:
        raise PassFailure.at(function, core_message(error)) from error


def plan_of(module, numerics: str = "exact") -> tuple:
    """(network, plan): the spec ``module`` holds, lowered by the core's plan under ``numerics`` ("exact" or "fast").

    A refusal of the core's (a ToposError) is a PassFailure at @main.
    """
    network, roots, observes = spec_of(module)
    posture = Numerics.EXACT if numerics == "exact" else Numerics.FAST
    with core_refusals(main_function(module)):
        return network, network.entry(list(roots), observe=list(observes), numerics=posture).lower()


__all__ = ["READ_BACK", "core_refusals", "plan_of", "spec_of", "spec_ops"]
