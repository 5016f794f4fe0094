"""topos-raise: elected fusion groups become the StableHLO they spell.

Convolution is recorded as pad/unfold/permute/reshape/matmul, max-pool as a
fold of ``maximum`` over window lanes, batch norm as its formula. The
catalog re-finds those groups in the spec (``topos-fuse``), the emission
consumer elects them (``topos-elect``), and this pass replaces each
elected group: a max-pool by ``stablehlo.reduce_window``, batch norm by
``stablehlo.batch_norm_training`` / ``_inference``, and a convolution in
one of two spellings (the ``convolution`` option). "columns", the
default, builds the whole batch's im2col matrix transposed,
``[C*kh*kw, B*OH*OW]``, from one strided slice of the padded,
channel-major input per kernel tap, and multiplies the weight by it in
one ``dot_general``: no six-axis transpose is left for IREE, and no
product runs per example. "named" is ``stablehlo.convolution``, the op
other tools recognise. The group's interior ops, now unread, are
erased; everything else is left for ``topos-lower-to-stablehlo``.

A training step adds the recorded gradients. A convolution's weight
gradient is, spelled as columns, dY times the same matrix (built once
for both), and its input gradient the weight's transpose times dY's,
each tap's plane placed back onto the padded extent and summed; spelled
named, both are ``stablehlo.convolution`` too (the batch contracted; the
kernel reversed with dY dilated by the stride). A max-pool's gradient
keeps its recorded rules, fed lanes recomputed from the input, with each
lane's gradient woven back by reshapes (windows that tile the input) or
placed by strided pads in the folds' order. A lent interior (the im2col
matrix, a pool's lanes) loses its last reader only when the gradient
that recomputes it is raised, so the erasing waits until every group is
raised.

Like the reference, bfloat16 groups compute in float32 and round once.
"""

from __future__ import annotations

import numpy as np
from iree.compiler import ir

from topos.dialect.passes.annotations import plan_of, spec_ops
from topos.dialect.passes.builders import (
    binary,
    concatenate,
    constant,
    convert,
    create,
    dot,
    element_type,
    like,
    maximum_of,
    one_result,
    pad,
    placed,
    reshape,
    shape_of,
    slice_along,
    tensor_type,
    transpose,
    widened,
)
from topos.dialect.passes.registry import OptionError, PassFailure, register_pass


def _value(ops, position: int) -> ir.Value:
    return ops[position].result


class _Raised:
    """The ops by position, where a group raised earlier answers with its replacement (its old root is erased)."""

    def __init__(self, ops, replaced: dict[int, ir.Value]):
        self._ops, self._replaced = ops, replaced
        self.columns: dict[tuple, ir.Value] = {}  # im2col matrices built so far, by input and window

    def __getitem__(self, position: int):
        if position in self._replaced:
            return _Result(self._replaced[position])
        return self._ops[position]


class _Result:
    __slots__ = ("result",)

    def __init__(self, result: ir.Value):
        self.result = result


def _padding(pairs) -> ir.Attribute:
    """A convolution's ((low, high), (low, high)) padding as the i64 tensor StableHLO wants."""
    return ir.DenseElementsAttr.get(np.array(pairs, dtype="int64"),
                                    type=tensor_type((2, 2), ir.IntegerType.get_signless(64)))


def _conv(lhs: ir.Value, rhs: ir.Value, shape, numbers: str, *, strides=(1, 1), padding=((0, 0), (0, 0)),
          lhs_dilation=(1, 1), rhs_dilation=(1, 1)) -> ir.Value:
    """One ``stablehlo.convolution`` (no feature or batch groups) with dimension numbers ``numbers``."""
    i64 = ir.IntegerType.get_signless(64)
    return create(
        "stablehlo.convolution", [lhs, rhs], tensor_type(shape, element_type(lhs)),
        {
            "dimension_numbers": ir.Attribute.parse(f"#stablehlo.conv<{numbers}>"),
            "window_strides": ir.DenseI64ArrayAttr.get(list(strides)),
            "padding": _padding(padding),
            "lhs_dilation": ir.DenseI64ArrayAttr.get(list(lhs_dilation)),
            "rhs_dilation": ir.DenseI64ArrayAttr.get(list(rhs_dilation)),
            "feature_group_count": ir.IntegerAttr.get(i64, 1),
            "batch_group_count": ir.IntegerAttr.get(i64, 1),
        },
    ).result


def _crop(x: ir.Value, axis: int, start: int, length: int) -> ir.Value:
    """``length`` elements of ``axis`` from ``start``: a slice, or ``x`` itself when that is all of it."""
    if start == 0 and length == shape_of(x)[axis]:
        return x
    return slice_along(x, axis, start, start + length)


def _convolution(candidate, ops) -> dict[int, ir.Value]:
    d = candidate.details
    x = widened(_value(ops, d["input"]))
    kernel = widened(_value(ops, d["kernel"]))  # the matmul's right side: [C*kh*kw, F]
    channels, filters = d["channels"], d["filters"]
    kh, kw = d["kernel_size"]
    batch, _, oh, ow = d["out_shape"]
    kernel = reshape(kernel, (channels, kh, kw, filters))
    out = _conv(x, kernel, (batch, oh, ow, filters), "[b, f, 0, 1]x[i, 0, 1, o]->[b, 0, 1, f]",
                strides=d["stride"], padding=d["padding"], rhs_dilation=d["dilation"])
    root = ops[candidate.root].result
    flat = reshape(out, (batch * oh * ow, filters))
    return {candidate.root: convert(flat, element_type(root))}


def _convolution_weight_gradient(candidate, ops) -> dict[int, ir.Value]:
    """dW[(c, i, j), f] = sum over (b, oh, ow) of x_padded[b, c, oh*sh + i*dh, ow*sw + j*dw] * dY[b, oh, ow, f].

    A convolution of the input by dY in which the batch is the contracted
    feature: the input's channels play the batch, dY's spatial axes the
    window (dilated by the forward stride), the forward dilation the
    window stride. The result is [C, kh, kw, F], the matmul's [C*kh*kw, F].
    """
    d = candidate.details
    x = widened(_value(ops, d["input"]))
    batch, channels, filters = d["batch"], d["channels"], d["filters"]
    (kh, kw), (oh, ow) = d["kernel_size"], d["count"]
    (sh, sw), (dh, dw) = d["stride"], d["dilation"]
    dy = reshape(widened(_value(ops, d["gradient"])), (batch, oh, ow, filters))
    (top, bottom), (left, right) = d["padding"]
    _, _, height, width = shape_of(x)
    # Rows past the last window's reach give extra taps: computed, then sliced away.
    rows = (height + top + bottom - sh * (oh - 1) - 1) // dh + 1
    columns = (width + left + right - sw * (ow - 1) - 1) // dw + 1
    out = _conv(x, dy, (channels, rows, columns, filters), "[f, b, 0, 1]x[i, 0, 1, o]->[b, 0, 1, f]",
                strides=(dh, dw), padding=d["padding"], rhs_dilation=(sh, sw))
    out = _crop(_crop(out, 1, 0, kh), 2, 0, kw)
    root = ops[candidate.root].result
    return {candidate.root: convert(reshape(out, (channels * kh * kw, filters)), element_type(root))}


def _convolution_input_gradient(candidate, ops) -> dict[int, ir.Value]:
    """dX = dY (dilated by the stride) convolved with the spatially reversed kernel, cropped as the narrows crop.

    The folds' extent is the padded input; the crop (the pads' adjoints)
    moves into the convolution's padding, and any part of it that would
    need negative padding is sliced off afterwards.
    """
    d = candidate.details
    batch, channels, filters = d["batch"], d["channels"], d["filters"]
    (kh, kw), (oh, ow) = d["kernel_size"], d["count"]
    dy = reshape(widened(_value(ops, d["gradient"])), (batch, oh, ow, filters))
    kernel = reshape(widened(_value(ops, d["kernel"])), (filters, channels, kh, kw))
    kernel = one_result("stablehlo.reverse", [kernel], kernel.type, dimensions=ir.DenseI64ArrayAttr.get([2, 3]))
    padding, trims, shape = [], [], [batch, channels]
    for size, stride, dilation, count, (start, length) in zip(
            (kh, kw), d["stride"], d["dilation"], (oh, ow), d["crop"]):
        low = (size - 1) * dilation - start
        high = start + length - stride * (count - 1) - 1
        padding.append((max(low, 0), max(high, 0)))
        trims.append(max(-low, 0))
        shape.append(length + trims[-1] + max(-high, 0))
    out = _conv(dy, kernel, shape, "[b, 0, 1, f]x[i, o, 0, 1]->[b, f, 0, 1]", padding=padding,
                lhs_dilation=d["stride"], rhs_dilation=d["dilation"])
    (_, height), (_, width) = d["crop"]
    out = _crop(_crop(out, 2, trims[0], height), 3, trims[1], width)
    return {candidate.root: convert(out, element_type(ops[candidate.root].result))}


def _columns(ops, d, count) -> ir.Value:
    """The im2col matrix transposed, ``[C*kh*kw, B*OH*OW]``: k runs channel slowest, the rows as the matmul's.

    The input turned channel-major (``[C, B, H, W]``, one transpose of the
    input alone), padded, then one strided slice per kernel tap, stacked
    after the channel axis: each tap is a copy of whole output planes, where
    the composition's ``[B*OH*OW, C*kh*kw]`` matrix is a six-axis
    transpose. A convolution and its weight gradient read one matrix, built
    where the first of them is raised (the forward one, which comes first).
    """
    key = (d["input"], d["padding"], d["kernel_size"], d["stride"], d["dilation"], count)
    if key not in ops.columns:
        ops.columns[key] = _columns_of(widened(_value(ops, d["input"])), d, count)
    return ops.columns[key]


def _columns_of(x: ir.Value, d, count) -> ir.Value:
    (top, bottom), (left, right) = d["padding"]
    x = pad(pad(transpose(x, (1, 0, 2, 3)), 2, top, bottom, 0, 0.0), 3, left, right, 0, 0.0)
    (kh, kw), (sh, sw), (dh, dw) = d["kernel_size"], d["stride"], d["dilation"]
    channels, batch = shape_of(x)[:2]
    oh, ow = count
    taps = []
    for i in range(kh):
        rows = slice_along(x, 2, i * dh, i * dh + sh * (oh - 1) + 1, sh)
        for j in range(kw):
            tap = slice_along(rows, 3, j * dw, j * dw + sw * (ow - 1) + 1, sw)
            taps.append(reshape(tap, (channels, 1, batch, oh, ow)))
    return reshape(concatenate(taps, 1), (channels * kh * kw, batch * oh * ow))


def _columns_convolution(candidate, ops) -> dict[int, ir.Value]:
    """Y[B*OH*OW, F] = (W^T @ columns)^T: one product over C*kh*kw for the whole batch, then turned.

    Computed as [F, B*OH*OW], a long row per filter: the other orientation,
    ``columns^T @ W`` straight into the matmul's rows, ran the forward plans
    about 2x slower on IREE 3.13's llvm-cpu (docs/performance.md,
    "Convolution spellings").
    """
    d = candidate.details
    kernel = widened(_value(ops, d["kernel"]))  # [C*kh*kw, F]
    batch, filters, oh, ow = d["out_shape"]
    columns = _columns(ops, d, (oh, ow))
    out = transpose(dot(kernel, columns, [], 0, 0, (filters, batch * oh * ow)), (1, 0))
    return {candidate.root: convert(out, element_type(ops[candidate.root].result))}


def _columns_weight_gradient(candidate, ops) -> dict[int, ir.Value]:
    """dW[C*kh*kw, F] = (dY^T @ columns^T)^T: one product over the batch's positions, as the composition's."""
    d = candidate.details
    dy = widened(_value(ops, d["gradient"]))  # [B*OH*OW, F]
    columns = _columns(ops, d, d["count"])
    out = transpose(dot(dy, columns, [], 0, 1, (d["filters"], shape_of(columns)[0])), (1, 0))
    return {candidate.root: convert(out, element_type(ops[candidate.root].result))}


def _columns_input_gradient(candidate, ops) -> dict[int, ir.Value]:
    """dColumns = W^T @ dY^T, each tap's plane placed back onto the padded extent and summed, then cropped."""
    d = candidate.details
    batch, channels = d["batch"], d["channels"]
    (kh, kw), (oh, ow) = d["kernel_size"], d["count"]
    (sh, sw), (dh, dw) = d["stride"], d["dilation"]
    height, width = d["extent"]
    dy = widened(_value(ops, d["gradient"]))  # [B*OH*OW, F]
    kernel = widened(_value(ops, d["kernel"]))  # [F, C*kh*kw]
    columns = dot(kernel, dy, [], 0, 1, (channels * kh * kw, batch * oh * ow))
    taps = reshape(columns, (channels, kh * kw, batch, oh, ow))
    total = constant(0.0, (channels, batch, height, width), element_type(taps))
    # Each tap's plane spread onto the padded extent by edge padding alone (builders.placed: IREE
    # 3.13 miscompiles an interior pad of a pad, iree-pad-of-pad) and summed.
    for i in range(kh):
        for j in range(kw):
            tap = reshape(slice_along(taps, 1, i * kw + j, i * kw + j + 1), (channels, batch, oh, 1, ow))
            rows = reshape(placed(tap, 2, i * dh, height, sh), (channels, batch, height, ow, 1))
            total = binary("stablehlo.add", total, placed(rows, 3, j * dw, width, sw))
    (top, kept_height), (left, kept_width) = d["crop"]
    out = transpose(_crop(_crop(total, 2, top, kept_height), 3, left, kept_width), (1, 0, 2, 3))
    return {candidate.root: convert(out, element_type(ops[candidate.root].result))}


def _max_pool(candidate, ops) -> dict[int, ir.Value]:
    d = candidate.details
    x = _value(ops, d["input"])
    element = element_type(x)
    sh, sw = d["window"]
    th, tw = d["stride"]
    dh, dw = d["dilation"]
    scalar = tensor_type((), element)
    window = create(
        "stablehlo.reduce_window", [x, constant(float("-inf"), (), element)],
        tensor_type(d["out_shape"], element),
        {
            "window_dimensions": ir.DenseI64ArrayAttr.get([1, 1, sh, sw]),
            "window_strides": ir.DenseI64ArrayAttr.get([1, 1, th, tw]),
            "window_dilations": ir.DenseI64ArrayAttr.get([1, 1, dh, dw]),
        },
        regions=1,
    )
    body = window.regions[0].blocks.append(scalar, scalar)
    with ir.InsertionPoint(body):
        biggest = create("stablehlo.maximum", list(body.arguments), scalar).result
        create("stablehlo.return", [biggest], None)
    root = ops[candidate.root].result
    return {candidate.root: reshape(window.result, tuple(ir.RankedTensorType(root.type).shape))}


def _max_pool_gradient(candidate, ops) -> dict[int, ir.Value]:
    """The recorded gradient's own nodes, fed recomputed lanes and maxima, placed back onto the input.

    The region (step, sub, mul) stays as recorded and is lowered as usual;
    only what it reads from the forward pool is rebuilt here (a lane is a
    strided slice of the input, a maximum the reference's select), and the
    lane stack, its pads and the two folds become the folds' own placement
    of each lane gradient (zeros start, lanes in fold order), so the bits
    are the composition's. Windows that tile the input (stride = window,
    no dilation) are woven back by reshapes (``_interleaved``); overlapping
    or dilated ones are placed by strided pads and summed.
    """
    d = candidate.details
    x = _value(ops, d["input"])
    (sh, sw), (th, tw), (dh, dw) = d["window"], d["stride"], d["dilation"]
    oh, ow = d["count"]
    lanes = {}
    with ir.InsertionPoint(ops[min(d["region"])]):  # before the first region node reads them
        for lane, index in d["lanes"]:
            i, j = divmod(index, sw)
            rows = slice_along(x, 2, i * dh, i * dh + th * (oh - 1) + 1, th)
            lanes[lane] = reshape(slice_along(rows, 3, j * dw, j * dw + tw * (ow - 1) + 1, tw),
                                  (*shape_of(rows)[:3], ow, 1))
        ordered = [lanes[lane] for lane, _ in d["lanes"]]
        rebuilt, best = dict(lanes), ordered[0]
        for step, lane in zip(d["maxima"], ordered[1:]):
            best = rebuilt[step] = maximum_of(best, lane)
    for n in d["region"]:
        operands = ops[n].operands
        for k in range(len(operands)):
            for node, value in rebuilt.items():
                if operands[k] == ops[node].result:
                    operands[k] = value
                    break
    gradients = [widened(ops[g].result) for g in d["lane_gradients"]]
    # Windows that tile the input (stride = window, no dilation): 5-12% faster steps, same bits (performance.md).
    tiles = (th, tw) == (sh, sw) and (dh, dw) == (1, 1)
    place = _interleaved if tiles else _strided
    element = element_type(ops[candidate.root].result)
    return {candidate.root: convert(place(gradients, d, element), element)}


def _strided(gradients, d, element) -> ir.Value:
    """Each lane's gradient placed onto the input by strided pads, summed in the folds' order (zeros start)."""
    (sh, sw), (th, tw), (dh, dw) = d["window"], d["stride"], d["dilation"]
    (oh, ow), (height, width) = d["count"], d["extent"]
    batch, channels = shape_of(gradients[0])[:2]
    work = element_type(gradients[0])
    total = constant(0.0, (batch, channels, height, width), work)
    # Placed by interior padding, which IREE 3.13 miscompiles only when the padded value is itself a
    # pad (iree-pad-of-pad): these are the lane gradients' products, never pads. Spelled with edge
    # padding alone (builders.placed) the LeNet step measured 6-12% slower (docs/reliability.md).
    for i in range(sh):
        partial = constant(0.0, (batch, channels, oh, width), work)
        for j in range(sw):
            values = reshape(gradients[i * sw + j], (batch, channels, oh, ow))
            last = j * dw + (ow - 1) * tw
            partial = binary("stablehlo.add", partial, pad(values, 3, j * dw, width - last - 1, tw - 1, 0.0))
        partial = widened(convert(partial, element))  # the width fold rounds before the height fold reads it
        last = i * dh + (oh - 1) * th
        total = binary("stablehlo.add", total, pad(partial, 2, i * dh, height - last - 1, th - 1, 0.0))
    return total


def _interleaved(gradients, d, element) -> ir.Value:
    """Lane gradients of windows that tile the input, woven back into place by reshapes of stacks.

    Lane (i, j) of window (r, c) is element (r*sh + i, c*sw + j): stacking a
    row's lanes after the window's column axis and merging the two is the
    width, stacking the rows after the window's row axis and merging is the
    height. No pad strides over the input, and no position is written
    twice, so nothing rounds. Rows and columns past the last window get
    zeros; the final ``+ 0.0`` turns a -0.0 into the +0.0 the composition's
    folds (a sum that starts at +0.0) give.
    """
    (sh, sw), (oh, ow), (height, width) = d["window"], d["count"], d["extent"]
    batch, channels = shape_of(gradients[0])[:2]
    rows = []
    for i in range(sh):
        lanes = [reshape(gradients[i * sw + j], (batch, channels, oh, ow, 1)) for j in range(sw)]
        rows.append(reshape(concatenate(lanes, 4), (batch, channels, oh, 1, ow * sw)))
    woven = reshape(concatenate(rows, 3), (batch, channels, oh * sh, ow * sw))
    woven = pad(pad(woven, 2, 0, height - oh * sh, 0, 0.0), 3, 0, width - ow * sw, 0, 0.0)
    return binary("stablehlo.add", woven, like(0.0, woven))


def _vector(ops, position: int, features: int) -> ir.Value:
    return reshape(widened(_value(ops, position)), (features,))


def _batch_norm(candidate, ops) -> dict[int, ir.Value]:
    d = candidate.details
    x = widened(_value(ops, d["input"]))
    features = d["features"]
    work = element_type(x)
    vector = tensor_type((features,), work)
    attributes = {
        "epsilon": ir.FloatAttr.get(ir.F32Type.get(), float(d["epsilon"])),
        "feature_index": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), d["feature_index"]),
    }
    scale, shift = _vector(ops, d["scale"], features), _vector(ops, d["shift"], features)
    root_element = element_type(ops[candidate.root].result)
    if candidate.kind == "batch_norm_training":
        normalized = create("stablehlo.batch_norm_training", [x, scale, shift], None, attributes)
        # batch_norm_training has three results; create made one, so build it directly.
        normalized.erase()
        normalized = ir.Operation.create(
            "stablehlo.batch_norm_training", results=[x.type, vector, vector],
            operands=[x, scale, shift], attributes=attributes,
        )
        output, mean, variance = normalized.results
        named_mean, named_variance = d["results"]
        out = {candidate.root: convert(output, root_element)}
        for position, value in ((named_mean, mean), (named_variance, variance)):
            shape = tuple(ir.RankedTensorType(ops[position].result.type).shape)
            out[position] = convert(reshape(value, shape), root_element)
        return out
    mean, variance = _vector(ops, d["mean"], features), _vector(ops, d["variance"], features)
    output = create("stablehlo.batch_norm_inference", [x, scale, shift, mean, variance], x.type,
                    attributes).result
    return {candidate.root: convert(output, root_element)}


# How a convolution group is spelled (topos-raise{convolution=...}). "columns", the default:
# the batch's im2col matrix, transposed, in one dot_general, which IREE 3.13's llvm-cpu runs
# 2.1-3.1x faster than "named" (stablehlo.convolution, with its img2col preprocessing) on a
# forward pass and 2.1x faster than the composition on the MNIST LeNet's training step
# (docs/performance.md, "Convolution spellings"). "named" keeps the op other tools recognise.
CONVOLUTION_SPELLINGS = {
    "columns": {"convolution": _columns_convolution,
                "convolution_weight_gradient": _columns_weight_gradient,
                "convolution_input_gradient": _columns_input_gradient},
    "named": {"convolution": _convolution,
              "convolution_weight_gradient": _convolution_weight_gradient,
              "convolution_input_gradient": _convolution_input_gradient},
}
RAISES = {
    **CONVOLUTION_SPELLINGS["columns"],
    "max_pool": _max_pool,
    "max_pool_gradient": _max_pool_gradient,
    "batch_norm_training": _batch_norm,
    "batch_norm_inference": _batch_norm,
}
# Offers the emission consumer can serve: the kinds with a raise, in this table's order. topos-elect
# elects them by default (topos.dialect.passes.plan_passes.ELECTED_BY_DEFAULT).
RAISABLE: tuple[str, ...] = tuple(RAISES)


@register_pass("topos-raise", "Replace elected conv / max-pool / batch-norm groups by the StableHLO they spell")
def raise_pass(module, *, convolution: str = "columns") -> None:
    """Raise every group topos-elect marked; the group's now-unread ops are erased.

    ``convolution`` spells the convolution groups: "columns" (the batch's
    im2col matrix, transposed, in one product) or "named" (``stablehlo.convolution``).
    """
    from topos.readings.plan.patterns import elect

    if convolution not in CONVOLUTION_SPELLINGS:
        raise OptionError(f"convolution must be one of {', '.join(CONVOLUTION_SPELLINGS)}; got {convolution!r}")
    raises = {**RAISES, **CONVOLUTION_SPELLINGS[convolution]}

    function, ops = spec_ops(module)
    if "topos.fusions" not in list(function.attributes):
        raise PassFailure.at(module.operation, "topos-raise needs an election; run topos-fuse,topos-elect first")
    kinds = {ir.StringAttr(op.attributes["topos.fusion_kind"]).value
             for op in ops if "topos.fusion_kind" in list(op.attributes)}
    network, plan = plan_of(module)
    chosen = elect(plan.candidates(), lambda c: c.kind in kinds)
    # A group's input may be the root of a group raised before it (a conv reading a max-pool):
    # that root is erased, so every raise reads through the replacements made so far.
    replaced: dict[int, ir.Value] = {}
    view = _Raised(ops, replaced)
    for candidate in chosen:
        if candidate.kind not in raises:
            continue
        root = ops[candidate.root]
        with root.location, ir.InsertionPoint(root):
            replacements = raises[candidate.kind](candidate, view)
        for position, value in replacements.items():
            ops[position].result.replace_all_uses_with(value)
        replaced.update(replacements)
    # Erase what no longer has readers, last first. A group lent to a gradient
    # (the im2col matrix, a pool's lanes) loses its last reader only when that
    # gradient is raised, so every group is swept once all are raised.
    for position in sorted({n for c in chosen if c.kind in RAISES for n in (*c.nodes, *c.recomputes)}, reverse=True):
        op = ops[position]
        if not list(op.result.uses):
            op.erase()
