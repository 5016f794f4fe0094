"""Sources: nodes with no operands. Their payloads live beside the spec, not in it."""

from __future__ import annotations

from topos.spec.opcodes.base import Opcode, register


class _Source(Opcode):
    arity = 0

    def infer(self, *specs, **attributes):
        raise TypeError(f"{self.name} nodes are created by tape.{self.name}(...)")


@register
class Leaf(_Source):
    """A constant, frozen at record time."""

    name = "leaf"


@register
class Parameter(_Source):
    """A trainable slot: read from the caller's Parameters table on every run."""

    name = "parameter"


@register
class Input(_Source):
    """A per-run value: fed by the caller, or its recorded default when not fed."""

    name = "input"


LEAF, PARAMETER, INPUT = Leaf, Parameter, Input
