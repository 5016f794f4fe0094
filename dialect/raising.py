"""topos-raise: elected fusion groups become the named StableHLO ops they spell.

Convolution is recorded as pad/unfold/permute/reshape/matmul, max-pool as a
fold of ``maximum`` over window lanes, batch norm as its formula. The
catalog re-finds those groups in the spec (``topos-fuse``), the emission
consumer elects them (``topos-elect``), and this pass replaces each
elected group by ``stablehlo.convolution``, ``stablehlo.reduce_window``
or ``stablehlo.batch_norm_training`` / ``_inference`` — the form IREE's
own kernels recognise. The group's interior ops, now unread, are erased;
everything else is left for ``topos-lower-to-stablehlo``.

Like the reference, bfloat16 groups compute in float32 and round once.
"""

from __future__ import annotations

from iree.compiler import ir

from .lowering import _constant, _convert, _create, _element, _reshape, _tensor, _widened
from .passes import PassFailure, register_pass
from .plan_passes import RAISABLE, _plan, _topos_ops


def _value(ops, position: int) -> ir.Value:
    return ops[position].result


class _Raised:
    """The ops by position, where a group raised earlier answers with its replacement (its old root is erased)."""

    def __init__(self, ops, replaced: dict[int, ir.Value]):
        self._ops, self._replaced = ops, replaced

    def __getitem__(self, position: int):
        if position in self._replaced:
            return _Result(self._replaced[position])
        return self._ops[position]


class _Result:
    __slots__ = ("result",)

    def __init__(self, result: ir.Value):
        self.result = result


def _convolution(candidate, ops) -> dict[int, ir.Value]:
    d = candidate.details
    x = _widened(_value(ops, d["input"]))
    kernel = _widened(_value(ops, d["kernel"]))  # the matmul's right side: [C*kh*kw, F]
    channels, filters = d["channels"], d["filters"]
    kh, kw = d["kernel_size"]
    batch, _, oh, ow = d["out_shape"]
    kernel = _reshape(kernel, (channels, kh, kw, filters))
    (top, bottom), (left, right) = d["padding"]
    padding = ir.DenseElementsAttr.get(
        __import__("numpy").array([[top, bottom], [left, right]], dtype="int64"),
        type=_tensor((2, 2), ir.IntegerType.get_signless(64)),
    )
    i64 = ir.IntegerType.get_signless(64)
    out = _create(
        "stablehlo.convolution", [x, kernel], _tensor((batch, oh, ow, filters), _element(x)),
        {
            "dimension_numbers": ir.Attribute.parse("#stablehlo.conv<[b, f, 0, 1]x[i, 0, 1, o]->[b, 0, 1, f]>"),
            "window_strides": ir.DenseI64ArrayAttr.get(list(d["stride"])),
            "padding": padding,
            "lhs_dilation": ir.DenseI64ArrayAttr.get([1, 1]),
            "rhs_dilation": ir.DenseI64ArrayAttr.get(list(d["dilation"])),
            "feature_group_count": ir.IntegerAttr.get(i64, 1),
            "batch_group_count": ir.IntegerAttr.get(i64, 1),
        },
    ).result
    root = ops[candidate.root].result
    flat = _reshape(out, (batch * oh * ow, filters))
    return {candidate.root: _convert(flat, _element(root))}


def _max_pool(candidate, ops) -> dict[int, ir.Value]:
    d = candidate.details
    x = _value(ops, d["input"])
    element = _element(x)
    sh, sw = d["window"]
    th, tw = d["stride"]
    dh, dw = d["dilation"]
    scalar = _tensor((), element)
    window = _create(
        "stablehlo.reduce_window", [x, _constant(float("-inf"), (), element)],
        _tensor(d["out_shape"], element),
        {
            "window_dimensions": ir.DenseI64ArrayAttr.get([1, 1, sh, sw]),
            "window_strides": ir.DenseI64ArrayAttr.get([1, 1, th, tw]),
            "window_dilations": ir.DenseI64ArrayAttr.get([1, 1, dh, dw]),
        },
        regions=1,
    )
    body = window.regions[0].blocks.append(scalar, scalar)
    with ir.InsertionPoint(body):
        biggest = _create("stablehlo.maximum", list(body.arguments), scalar).result
        _create("stablehlo.return", [biggest], None)
    root = ops[candidate.root].result
    return {candidate.root: _reshape(window.result, tuple(ir.RankedTensorType(root.type).shape))}


def _vector(ops, position: int, features: int) -> ir.Value:
    return _reshape(_widened(_value(ops, position)), (features,))


def _batch_norm(candidate, ops) -> dict[int, ir.Value]:
    d = candidate.details
    x = _widened(_value(ops, d["input"]))
    features = d["features"]
    work = _element(x)
    vector = _tensor((features,), work)
    attributes = {
        "epsilon": ir.FloatAttr.get(ir.F32Type.get(), float(d["epsilon"])),
        "feature_index": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), d["feature_index"]),
    }
    scale, shift = _vector(ops, d["scale"], features), _vector(ops, d["shift"], features)
    root_element = _element(ops[candidate.root].result)
    if candidate.kind == "batch_norm_training":
        normalized = _create("stablehlo.batch_norm_training", [x, scale, shift], None, attributes)
        # batch_norm_training has three results; _create made one, so build it directly.
        normalized.erase()
        normalized = ir.Operation.create(
            "stablehlo.batch_norm_training", results=[x.type, vector, vector],
            operands=[x, scale, shift], attributes=attributes,
        )
        output, mean, variance = normalized.results
        named_mean, named_variance = d["results"]
        out = {candidate.root: _convert(output, root_element)}
        for position, value in ((named_mean, mean), (named_variance, variance)):
            shape = tuple(ir.RankedTensorType(ops[position].result.type).shape)
            out[position] = _convert(_reshape(value, shape), root_element)
        return out
    mean, variance = _vector(ops, d["mean"], features), _vector(ops, d["variance"], features)
    output = _create("stablehlo.batch_norm_inference", [x, scale, shift, mean, variance], x.type,
                     attributes).result
    return {candidate.root: _convert(output, root_element)}


RAISES = {
    "convolution": _convolution,
    "max_pool": _max_pool,
    "batch_norm_training": _batch_norm,
    "batch_norm_inference": _batch_norm,
}
assert set(RAISES) == set(RAISABLE)


@register_pass("topos-raise", "Replace elected conv / max-pool / batch-norm groups by named StableHLO ops")
def raise_pass(module) -> None:
    """Raise every group topos-elect marked; the group's now-unread ops are erased."""
    from topos.plan import elect

    function, ops = _topos_ops(module)
    if "topos.fusions" not in list(function.attributes):
        raise PassFailure.at(module.operation, "topos-raise needs an election; run topos-fuse,topos-elect first")
    kinds = {ir.StringAttr(op.attributes["topos.fusion_kind"]).value
             for op in ops if "topos.fusion_kind" in list(op.attributes)}
    network, plan = _plan(module)
    chosen = elect(plan.candidates(), lambda c: c.kind in kinds)
    # A group's input may be the root of a group raised before it (a conv reading a max-pool):
    # that root is erased, so every raise reads through the replacements made so far.
    replaced: dict[int, ir.Value] = {}
    view = _Raised(ops, replaced)
    for candidate in chosen:
        if candidate.kind not in RAISES:
            continue
        root = ops[candidate.root]
        with root.location, ir.InsertionPoint(root):
            replacements = RAISES[candidate.kind](candidate, view)
        for position, value in replacements.items():
            ops[position].result.replace_all_uses_with(value)
        replaced.update(replacements)
        for position in sorted(candidate.nodes, reverse=True):
            op = ops[position]
            if not list(op.result.uses):
                op.erase()
