"""The closed vocabulary: 27 opcodes, each defined once in its family module."""

from topos.spec.opcodes import elementwise, index, linear, shape, sources, stable  # noqa: F401  (registers)
from topos.spec.opcodes.base import OUTPUT, REGISTRY, Opcode, Refusal, Spec, by_name
from topos.spec.opcodes.elementwise import MAP_FUNCTIONS

OPCODES: tuple[Opcode, ...] = tuple(REGISTRY.values())

__all__ = ["OPCODES", "OUTPUT", "MAP_FUNCTIONS", "Opcode", "Refusal", "Spec", "by_name"]
