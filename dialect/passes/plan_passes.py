"""Plans and fusion offers as MLIR passes: each is a thin reading of the spec the module holds.

The passes parse the module back into a spec (``parse_spec``), ask the
core (``Entry``/``Plan``, the fusion catalog, ``differentiate``) and write
the answer as discardable ``topos.*`` attributes — so the IR shows exactly
what the NumPy plan would do, and nothing is decided twice.

* ``topos-plan``: liveness (``topos.kept``, ``topos.freed_after = N`` or
  ``topos.fused_into = N`` for a group's interior, as the exact-posture
  NumPy plan runs it) and the live-byte summary on the function.
* ``topos-fuse``: every fusion offer the catalog finds, as data on the
  function (``topos.offers``) and on each claimed op (``topos.offered``).
* ``topos-elect``: the emission consumer's election (first wins, no node
  twice) as ``topos.fusion_group``/``topos.fusion_kind`` on claimed ops.
* ``topos-differentiate{target=N}``: append d(node N)/d(parameters) through
  the core's recorded reverse mode and re-emit.
"""

from __future__ import annotations

from iree.compiler import ir

from topos.dialect.passes.annotations import core_refusals, plan_of, spec_of, spec_ops
from topos.dialect.passes.raising import RAISABLE
from topos.dialect.passes.registry import OptionError, PassFailure, register_pass

# What topos-elect takes when not told otherwise: every kind topos-raise can raise (RAISABLE, read off
# its table; elementwise chains are left to IREE, which forms its own dispatch regions). A training
# step's convolution gradients were left to the composition while they were spelled
# stablehlo.convolution, which IREE 3.13's llvm-cpu ran slower than the composition's
# im2col matmuls; spelled as columns (topos-raise's default) the MNIST LeNet's step is
# 2.1x faster raised than composed (docs/performance.md, "Convolution spellings").
ELECTED_BY_DEFAULT = RAISABLE


def elected(plan, kinds=ELECTED_BY_DEFAULT) -> tuple:
    """The offers topos-elect raises in ``plan`` when it elects ``kinds``: known before any emission."""
    from topos.readings.plan.patterns import elect

    return elect(plan.candidates(), lambda c: c.kind in kinds)


def _i64(value: int) -> ir.Attribute:
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), int(value))


def _spans(numbers: list[int]) -> str:
    """``0..4, 7`` for [0, 1, 2, 3, 4, 7]: node indices, short."""
    spans: list[list[int]] = []
    for n in sorted(numbers):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in spans) or "none"


def _original(op) -> int:
    return ir.IntegerAttr(op.operation.attributes["node"]).value


def _attribute(value) -> ir.Attribute:
    if isinstance(value, bool):
        return ir.BoolAttr.get(value)
    if isinstance(value, int):
        return _i64(value)
    if isinstance(value, str):
        return ir.StringAttr.get(value)
    if isinstance(value, (tuple, list)) and all(isinstance(v, int) for v in value):
        return ir.DenseI64ArrayAttr.get([int(v) for v in value])
    if isinstance(value, (tuple, list)):
        return ir.ArrayAttr.get([_attribute(v) for v in value])
    return ir.StringAttr.get(str(value))


@register_pass("topos-plan", "Annotate liveness from the plan: topos.kept / topos.freed_after, peak bytes")
def plan_pass(module) -> None:
    """Write the plan's liveness on every op and its memory summary on @main."""
    network, plan = plan_of(module)
    function, ops = spec_ops(module)
    originals = [_original(op) for op in ops]
    readable = set(plan.entry._readable)
    for position, op in enumerate(ops):
        attributes = op.operation.attributes
        group = plan._group_of.get(position)
        if position in readable:
            attributes["topos.kept"] = ir.UnitAttr.get()
        elif group is not None and group.root != position:
            attributes["topos.fused_into"] = _i64(originals[group.root])
        elif position in plan._last_reader:
            attributes["topos.freed_after"] = _i64(originals[plan._last_reader[position]])
    peak, at = plan.peak()
    function.attributes["topos.peak_bytes"] = _i64(peak)
    function.attributes["topos.peak_node"] = _i64(originals[at] if at >= 0 else -1)
    function.attributes["topos.retain_all_bytes"] = _i64(plan.retain_all_bytes())


@register_pass("topos-fuse", "Record every fusion offer of the catalog as data (no election)")
def fuse_pass(module) -> None:
    """Annotate the catalog's candidates: topos.offers on @main, topos.offered on claimed ops."""
    network, plan = plan_of(module)
    function, ops = spec_ops(module)
    originals = [_original(op) for op in ops]
    offers: list = []
    marks: dict = {}
    for k, candidate in enumerate(plan.candidates()):
        offers.append(ir.DictAttr.get({
            "id": _i64(k),
            "kind": ir.StringAttr.get(candidate.kind),
            "root": _i64(originals[candidate.root]),
            "nodes": ir.DenseI64ArrayAttr.get([originals[n] for n in candidate.nodes]),
            "reason": ir.StringAttr.get(candidate.reason),
            "bytes_saved": _i64(candidate.bytes_saved),
            "details": ir.DictAttr.get({str(key): _attribute(v) for key, v in candidate.details.items()}),
        }))
        for n in candidate.nodes:
            marks.setdefault(n, []).append(k)
    function.attributes["topos.offers"] = ir.ArrayAttr.get(offers)
    for n, ks in marks.items():
        ops[n].operation.attributes["topos.offered"] = ir.DenseI64ArrayAttr.get(ks)


@register_pass("topos-elect", "Elect the fusion offers emission can serve (first wins, no node twice)")
def elect_pass(module, *, kinds: str = ",".join(ELECTED_BY_DEFAULT)) -> None:
    """Mark elected groups: topos.fusion_group on every claimed op, topos.fusion_kind on the root."""
    from topos.readings.plan.patterns import CATALOG

    # The option first: a kind that does not exist is the mistake to name, whatever the IR holds.
    wanted = {k.strip() for k in kinds.split(",") if k.strip()}
    known = [p.kind for p in CATALOG]
    unknown = sorted(wanted - set(known))
    if unknown:
        raise OptionError(f"kinds names {unknown[0]!r}, which is no fusion kind (kinds: {', '.join(known)})")
    if "topos.offers" not in list(spec_ops(module)[0].attributes):
        raise PassFailure.at(module.operation, "topos-elect needs the offers of topos-fuse; run topos-fuse first")
    network, plan = plan_of(module)
    function, ops = spec_ops(module)
    chosen = elected(plan, wanted)
    for group, candidate in enumerate(chosen):
        for n in candidate.nodes:
            ops[n].operation.attributes["topos.fusion_group"] = _i64(group)
        ops[candidate.root].operation.attributes["topos.fusion_kind"] = ir.StringAttr.get(candidate.kind)
    function.attributes["topos.fusions"] = _i64(len(chosen))


@register_pass("topos-differentiate", "Append d(target)/d(parameters) via the core's recorded reverse mode")
def differentiate_pass(module, *, target: str = "") -> None:
    """Replace @main by the spec plus the gradient of node ``target`` w.r.t. every parameter."""
    from topos.dialect.ir.emit import emit_module

    try:
        wanted = int(target)
    except ValueError:
        raise OptionError(f"target must be a node index, as in target=<node>; got {target!r}") from None
    network, roots, observes = spec_of(module)
    function, ops = spec_ops(module)
    originals = [_original(op) for op in ops]
    if wanted not in originals:
        raise OptionError(f"target={wanted} names no op of @main (its nodes: {_spans(originals)})")
    position = originals.index(wanted)
    tape = network.reopen()
    loss = tape.resolve(network.symbol(position))
    if loss.shape != ():
        raise PassFailure.at(ops[position], f"target node {target} has shape {list(loss.shape)}; "
                             "differentiate needs a rank-0 target")
    with core_refusals(function):
        adjoints = tape.differentiate(loss, [tape.resolve(s) for s in network.parameter_symbols()])
        grown = tape.seal()
    gradients = [g.symbol for g in adjoints.gradients]
    rebuilt = emit_module(grown, list(roots) + gradients, list(observes), context=module.context)
    body = module.body
    for op in list(body.operations):
        op.operation.erase()
    for op in list(rebuilt.body.operations):
        op.operation.detach_from_parent()
        body.append(op.operation)
