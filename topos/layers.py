"""The floor plan: which layer each folder is, bottom to top, and the only imports that point up.

topos is six layers, and imports point down: a module imports its own room
or a room below it. Two kinds of upward import exist, and both are listed
here and nowhere else:

* the **doors**, ``topos/__init__.py`` and ``dialect/__init__.py``, which
  name what users import (the root door loads the facades only when one is
  first used, so no layer below them waits on them);
* the **hooks**, convenience methods on a lower layer that call a higher
  one (``Network.forward`` runs the oracle, ``plan.compile`` runs IREE,
  every ``_repr_html_`` asks the views for its card). A hook imports inside
  its method, at the call, never when its module loads.

``tests/test_layers.py`` reads this module. It fails, naming the file, the
line and the edge, on any other upward import, on an import cycle, on an
import of another module's underscore name, and on a facade that reaches
past the public surface. docs/architecture.md walks through the plan.
"""

from __future__ import annotations

from typing import NamedTuple


class Room(NamedTuple):
    """A folder (or module) of one layer: the module names it holds and what a contributor finds there."""

    layer: str
    modules: tuple[str, ...]  # a module belongs to the room when its name is one of these or starts with one + "."
    holds: str


ROOMS: tuple[Room, ...] = (
    Room("base", ("topos.base",),
         "errors, element types, reference math, provenance, copies, atomic files, argument checks"),
    Room("spec", ("topos.spec",),
         "the opcodes, the recordable vocabulary, tape, network, parameters, runs, symbols"),
    Room("readings", ("topos.readings",),
         "the oracle, reverse and forward mode, recompute, gradient checks, updates, plans and fusion patterns"),
    Room("readings", ("topos.dialect.ir",),
         "the topos dialect: op classes, emission and parsing, IRDL, contexts, diagnostics"),
    Room("readings", ("topos.dialect.passes",),
         "the pass registry, plans and fusion as passes, raising, the lowering table and its StableHLO builders, "
         "the rewrites a target needs"),
    Room("readings", ("topos.dialect.pipeline",),
         "the pipeline: the one list of stages from a plan to StableHLO"),
    Room("readings", ("topos.dialect.iree",),
         "IREE: targets, the compile cache, compiling and calling modules, resident state, export, conformance"),
    Room("door", ("topos.dialect",), "the dialect's door: the names users import from topos.dialect"),
    Room("views", ("topos.views",), "drawings, notebook cards, bisect, backends"),
    Room("door", ("topos", "topos.layers"), "the root door: every name users import from topos; this floor plan"),
    Room("facades", ("topos.nn", "topos.optim", "topos.init", "topos.checkpoint"),
         "layers, losses, optimizers, initializers, checkpoints: the public surface only (rule 5)"),
    Room("tools", ("topos.cli", "topos.interop", "topos.dialect.opt"),
         "the topos command, topos-opt, interop with jax and torch"),
)

DOORS = ("topos", "topos.dialect")  # a door's room matches its own name only, not the modules below it


class Hook(NamedTuple):
    """A declared upward import: ``importer`` imports ``imported`` inside ``method``, at the call."""

    importer: str
    imported: str
    method: str


# Every notebook card: an object's _repr_html_ asks the views for it, only when a notebook shows it.
_CARDS = tuple(
    Hook(importer, "topos.views.display", method)
    for importer, method in (
        ("topos.spec.network", "Node._repr_html_, Network._repr_html_"),
        ("topos.spec.parameters", "Parameters._repr_html_"),
        ("topos.spec.run", "Run._repr_html_"),
        ("topos.spec.tape", "Tape._repr_html_, Value._repr_html_"),
        ("topos.readings.differentiate", "Adjoints._repr_html_, Gradients._repr_html_"),
        ("topos.readings.gradcheck", "GradientReport._repr_html_"),
        ("topos.readings.update", "Updates._repr_html_"),
        ("topos.readings.plan.entry", "Entry._repr_html_"),
        ("topos.readings.plan.plan", "Plan._repr_html_"),
        ("topos.dialect.iree.compiled", "CompiledPlan._repr_html_"),
        ("topos.dialect.iree.results", "CompiledRun._repr_html_"),
        ("topos.dialect.iree.resident", "ResidentParameters._repr_html_"),
    )
)

HOOKS: tuple[Hook, ...] = (
    Hook("topos.spec.network", "topos.readings.interpret", "Network.forward"),
    Hook("topos.spec.network", "topos.readings.plan.entry", "Network.entry, Network.emit_mlir"),
    Hook("topos.spec.tape", "topos.readings.differentiate", "Tape.differentiate, Tape.vjp"),
    Hook("topos.spec.run", "topos.readings.differentiate", "Run.backward"),
    Hook("topos.spec.tape", "topos.init", "Tape.generator (the recording's seeded generator)"),
    Hook("topos.readings.plan.plan", "topos.dialect.ir.bindings", "Plan.emit_mlir, .emit_stablehlo, .export: "
         "the compiler's absence said before any MLIR import"),
    Hook("topos.readings.plan.plan", "topos.dialect.pipeline", "Plan.emit_mlir, Plan.emit_stablehlo"),
    Hook("topos.readings.plan.plan", "topos.dialect.iree.compiled", "Plan.compile"),
    Hook("topos.readings.plan.plan", "topos.dialect.iree.export", "Plan.export"),
    Hook("topos", "topos.nn", "the door: topos.nn, loaded when first named"),
    Hook("topos", "topos.optim", "the door: topos.optim, loaded when first named"),
    Hook("topos", "topos.init", "the door: topos.init, loaded when first named"),
    Hook("topos", "topos.checkpoint", "the door: topos.checkpoint, loaded when first named"),
    *_CARDS,
)

# Besides the names topos exports, the core helpers a facade may import: none of them records a
# node, so a hand-written twin that skips them still records the same graph (docs/principles/facades.md).
FACADE_HELPERS: dict[str, frozenset[str]] = {
    "topos.base.provenance": frozenset({"user_site"}),  # the user's line, for an error
    "topos.base.copies": frozenset({"own"}),  # a read-only copy the caller owns
    "topos.base.element": frozenset({"ELEMENTS", "float32", "convert", "convert_checked", "host_array",
                                     "short_name"}),  # element types
    "topos.base.errors": frozenset({"ArgumentError", "ShapeError"}),  # exported from topos too
    "topos.base.refmath": frozenset(),  # imported whole: the documented math topos.init draws with
    "topos.base.safetensors_io": frozenset({"header", "read", "read_metadata", "write"}),  # the checkpoint format
    "topos.views.display": frozenset({"module_card"}),  # the Jupyter card a module shows
    "topos.spec.parameters": frozenset({"check_keyed_by_name"}),  # slots keyed by name, or the error naming a key
    "topos.readings.differentiate": frozenset({"open_pairs"}),  # the Values of open Adjoints, or an error
    "topos.base.arguments": frozenset({"broadcasts", "element", "flag", "initial", "positive_rate", "rate_as",
                                       "real", "size", "size_list", "sizes"}),  # the core's own argument checks
}


def room_of(module: str) -> int:
    """The index in ROOMS of the room holding ``module`` (the most specific match)."""
    best, length = -1, -1
    for k, room in enumerate(ROOMS):
        for prefix in room.modules:
            exact = prefix in DOORS or prefix == "topos.layers"
            if module == prefix or (not exact and module.startswith(prefix + ".")):
                if len(prefix) > length:
                    best, length = k, len(prefix)
    if best < 0:
        raise KeyError(f"{module} is in no room of topos.layers.ROOMS; add its folder there")
    return best


__all__ = ["DOORS", "FACADE_HELPERS", "HOOKS", "ROOMS", "Hook", "Room", "room_of"]
