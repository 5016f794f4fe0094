"""compiled.tally(): the IREE dispatch that computes each node, read off the locations IREE keeps."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from iree_support import compile_cache  # noqa: F401  (autouse fixture)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_backends import step  # noqa: E402


def test_every_computed_node_is_in_a_dispatch_or_folded_and_matmuls_always_dispatch():
    network, loss, updates = step()
    compiled = network.entry(updates.roots(loss)).lower().compile("llvm-cpu")
    tally = compiled.tally()
    assert [d.node for d in tally] == list(compiled.plan.schedule)
    names = set()
    for d in tally:
        node = network.nodes()[d.node]
        if node.is_source:
            assert d.backend == "source"
            continue
        assert d.backend == "iree:llvm-cpu"
        if node.opcode.name in ("matmul", "sum"):
            assert re.fullmatch(r"main_dispatch_\d+_\w+( \+ main_dispatch_\d+_\w+)*", d.kernel), d
        names.update(k for k in d.kernel.split(" + ") if k.startswith("main_dispatch_"))
    assert names, "the step runs in IREE dispatches"
    # Every dispatch IREE made computes some node, so the tally accounts for all of them.
    from iree.compiler import compile_str

    flow = compile_str(compiled.stablehlo, extra_args=[*compiled.flags, "--compile-to=flow"]).decode()
    assert names == set(re.findall(r"flow\.executable\.export public @(\S+)", flow))
