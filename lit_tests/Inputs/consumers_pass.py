"""A worked example of a topos pass (docs/dialect.md, "Writing a new pass").

It annotates every topos op with how many ops read its result, the first
fact a liveness or fusion pass needs. Load it into topos-opt with
``--load-pass-module consumers_pass``.
"""

from iree.compiler import ir

from topos.dialect.ir.ops import topos_operations
from topos.dialect.passes.registry import PassFailure, register_pass


@register_pass("topos-count-consumers", "Annotate each topos op with topos.consumers = <readers>")
def count_consumers(module, *, minimum="0"):
    """Set ``topos.consumers`` on every topos op; fail on an op read fewer than ``minimum`` times."""
    i64 = ir.IntegerType.get_signless(64)
    for op in topos_operations(module):
        readers = len({use.owner for use in op.results[0].uses})
        if readers < int(minimum):
            raise PassFailure.at(op, f"node {op.attributes['node'].value} has {readers} readers, fewer than {minimum}")
        op.attributes["topos.consumers"] = ir.IntegerAttr.get(i64, readers)
