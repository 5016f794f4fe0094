"""The dispatch tally: per scheduled node, the backend and the kernel that serve it.

``plan.tally()`` reads it off a NumPy plan: the reference kernel, a fast
kernel of the FAST posture, a registered kernel, or the fused group that
claimed the node. ``compiled.tally()`` gives the same rows for an IREE
module (``topos.dialect.iree.tally``), and ``topos.views.backends``
prints either (``describe_tally``).
"""

from __future__ import annotations

from dataclasses import dataclass

from topos.readings.plan.numerics import FAST_KERNELS, REGISTERED, Fidelity, kernel_key


@dataclass(frozen=True)
class Dispatch:
    """Who served one node: the backend and the kernel (a function, a fused group, an IREE dispatch)."""

    node: int
    opcode: str
    backend: str
    kernel: str

    def __str__(self) -> str:
        return f"%{self.node:<5} {self.opcode:<14} {self.backend:<14} {self.kernel}"


def plan_tally(plan) -> tuple[Dispatch, ...]:
    """Per scheduled node: the backend and kernel a NumPy plan runs for it."""
    network = plan.network
    group_of = {n: (k, g) for k, g in enumerate(plan.fusions()) for n in g.nodes}
    tally = []
    for n in plan.schedule:
        opcode = network.columns.opcodes[n]
        if opcode.is_source:
            tally.append(Dispatch(n, opcode.name, "source", "the caller's table, a feed or a leaf"))
        elif n in group_of:
            k, group = group_of[n]
            tally.append(Dispatch(n, opcode.name, "numpy-fused", f"G{k} {group.kind} (root %{group.root})"))
        else:
            key = kernel_key(opcode.name, dict(network.columns.attributes[n]))
            registered = REGISTERED.get(key)
            if registered is not None and plan.numerics.accepts(registered[1]):
                tally.append(Dispatch(n, opcode.name, "registered", f"{getattr(registered[0], '__name__', key)} "
                                                                   f"({registered[1].value})"))
                continue
            fast = plan.numerics.accepts(Fidelity.ENVELOPE) and key in FAST_KERNELS
            tally.append(Dispatch(n, opcode.name, "numpy-fast" if fast else "oracle",
                                  FAST_KERNELS[key][1].note if fast else f"reference {key}"))
    return tuple(tally)


__all__ = ["Dispatch", "plan_tally"]
