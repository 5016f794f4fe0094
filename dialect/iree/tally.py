"""Which IREE dispatch computes each node: the compiled side of the dispatch tally (topos.readings.plan.tally).

IREE groups ops into dispatch regions in its flow phase and keeps every
op's location there, and the StableHLO topos emits locates each op at its
node (``"%12 matmul"``). Compiling the located text to the flow phase
and reading which node locations stand inside each ``flow.executable``
therefore says which dispatch computed which node. A node may appear in
two dispatches (IREE recomputes a cheap producer inside each consumer);
a node in none was folded (an element move IREE turns into indexing, a
multiplication by a constant one) or is a source.
"""

from __future__ import annotations

import re

from topos.readings.plan.tally import Dispatch

_EXPORT = re.compile(r"\s*flow\.executable\.export public @(\S+)")
_NODE = re.compile(r'"%(\d+) \w+')


def dispatches_by_node(compiled) -> dict[int, tuple[str, ...]]:
    """Node index -> the names of the IREE dispatches whose regions compute it."""
    from iree.compiler import compile_str

    from topos.dialect.pipeline import stablehlo

    located = stablehlo(compiled.plan, target=compiled.target).located  # with the target's rewrites, as compiled
    text = compile_str(located, extra_args=[*compiled.flags, "--compile-to=flow", "--mlir-print-debuginfo",
                                            "--mlir-print-local-scope"])
    text = text.decode() if isinstance(text, bytes) else text
    found: dict[int, set[str]] = {}
    current = None
    for line in text.splitlines():
        export = _EXPORT.match(line)
        if export:
            current = export.group(1)
        elif line.lstrip().startswith("util.func"):
            current = None  # the host program: dispatch calls, not dispatch bodies
        elif current is not None:
            for node in _NODE.findall(line):
                found.setdefault(int(node), set()).add(current)
    return {node: tuple(sorted(names)) for node, names in found.items()}


def compiled_tally(compiled) -> tuple[Dispatch, ...]:
    network, backend = compiled.plan.network, f"iree:{compiled.target.name}"
    by_node = dispatches_by_node(compiled)
    tally = []
    for n in compiled.plan.schedule:
        opcode = network.columns.opcodes[n]
        if opcode.is_source:
            held = compiled.frozen is not None and n in compiled.frozen
            tally.append(Dispatch(n, opcode.name, "source", "a frozen module global (compile(frozen=...))" if held
                                  else "an argument of main, or a constant"))
        elif n in by_node:
            tally.append(Dispatch(n, opcode.name, backend, " + ".join(by_node[n])))
        else:
            tally.append(Dispatch(n, opcode.name, backend, "(no dispatch: folded into its neighbours' indexing)"))
    return tuple(tally)


__all__ = ["compiled_tally", "dispatches_by_node"]
