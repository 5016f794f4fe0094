"""Raised training steps: a convolution's and a max-pool's gradient groups as StableHLO, graded on llvm-cpu.

The emission elects every gradient group by default (and, beside them,
the forward convolution and pool), and spells a convolution as columns:
the whole batch's im2col matrix, transposed, in one ``dot_general``. The named
spelling (``stablehlo.convolution``) is reached with
``convolution="named"``. The composition, both spellings' emissions are
pinned here by their StableHLO op counts and IREE dispatch counts for the
benchmark's conv net and a LeNet-like net, and compiled and graded: each
raised group's root against the group's EXACT walk on the very operand
values the compiled step produced (its local error, the way
``topos.dialect.iree.conformance`` judges a node), and every gradient end to
end against ``network.forward``.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("iree.compiler")

import topos  # noqa: E402
from topos import Numerics  # noqa: E402
from topos.dialect.iree import conformance  # noqa: E402
from topos.dialect.passes.raising import RAISABLE  # noqa: E402
from topos.dialect.passes.registry import load_pass_modules  # noqa: E402
from topos.readings.plan.patterns import (
    elect,  # noqa: E402
    pattern,  # noqa: E402
)
from topos.readings.plan.plan import Kernels  # noqa: E402

from iree_support import ELEMENT_PARAMETERS, compile_cache  # noqa: E402, F401  (fixture)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import _models  # noqa: E402
from test_patterns_training import conv_training, lenet  # noqa: E402

load_pass_modules()
EPS = {topos.float32: 2.0**-23, topos.float64: 2.0**-52, topos.bfloat16: 2.0**-7}
GRADIENTS = ("convolution_weight_gradient", "convolution_input_gradient", "max_pool_gradient")


def stablehlo(plan, kinds=None, convolution="columns") -> str:
    """The plan's StableHLO: the default emission, or with ``topos-elect{kinds=...}`` and a spelling."""
    return plan.emit_stablehlo(kinds=kinds, convolution=convolution)


def op_counts(text: str) -> Counter:
    return Counter(name.split(".")[1] for name in re.findall(r"\bstablehlo\.[a-z_]+\b", text))


PINNED = ("convolution", "reduce_window", "slice", "concatenate", "pad", "dot_general", "reverse", "transpose")


def _models_under_test():
    model = _models.conv_net()
    return {"benchmark conv net": (model.trained, model.adjoints.roots()), "LeNet-like": lenet()}


# Per model: (emission, total StableHLO ops, the pinned ops). "composition" elects nothing
# raisable: what a training step emitted before its gradients were recognised; "named" raises
# every kind as stablehlo.convolution.
COUNTS = {
    "benchmark conv net": {
        "composition": (160, {"slice": 20, "concatenate": 4, "pad": 12, "dot_general": 5, "transpose": 6}),
        "default": (141, {"reduce_window": 1, "slice": 18, "concatenate": 4, "pad": 2, "dot_general": 5,
                          "transpose": 7}),
        "named": (116, {"convolution": 2, "reduce_window": 1, "slice": 6, "concatenate": 3, "dot_general": 3,
                        "transpose": 4}),
    },
    "LeNet-like": {
        "composition": (293, {"slice": 50, "concatenate": 8, "pad": 28, "dot_general": 8, "transpose": 14}),
        "default": (328, {"reduce_window": 2, "slice": 63, "concatenate": 8, "pad": 20, "dot_general": 8,
                          "transpose": 16}),
        "named": (174, {"convolution": 5, "reduce_window": 2, "slice": 12, "concatenate": 6, "dot_general": 3,
                        "reverse": 1, "transpose": 9}),
    },
}


@pytest.mark.parametrize("model", list(COUNTS))
def test_training_steps_emit_the_pinned_stablehlo_op_counts(model):
    network, roots = _models_under_test()[model]
    plan = network.entry(roots).lower()
    emissions = {"composition": (["elementwise"], "columns"), "default": (None, "columns"),
                 "named": (None, "named")}
    for emission, (total, pinned) in COUNTS[model].items():
        counts = op_counts(stablehlo(plan, *emissions[emission]))
        got = {name: counts[name] for name in PINNED if counts[name]}
        assert (sum(counts.values()), got) == (total, pinned), f"{model}, {emission}: {dict(counts)}"


# Per model: the IREE dispatches (flow executables) of each emission's training step, IREE 3.13.
DISPATCHES = {"benchmark conv net": {"composition": 51, "default": 41, "named": 30},
              "LeNet-like": {"composition": 92, "default": 85, "named": 43}}


@pytest.mark.parametrize("model", list(DISPATCHES))
def test_training_steps_compile_to_the_pinned_dispatch_counts(model):
    """The kernel count per model: the default (columns) dispatches fewer kernels than the composition."""
    from iree.compiler import compile_str

    from topos.dialect.iree.compile import module_flags
    from topos.dialect.iree.targets import target

    network, roots = _models_under_test()[model]
    plan = network.entry(roots).lower()
    flags = [*module_flags(plan, target("llvm-cpu"), "generic", None), "--compile-to=flow"]
    emissions = {"composition": (["elementwise"], "columns"), "default": (None, "columns"),
                 "named": (None, "named")}
    got = {}
    for emission, (kinds, convolution) in emissions.items():
        flow = compile_str(stablehlo(plan, kinds, convolution), extra_args=flags).decode()
        got[emission] = len(re.findall(r"flow\.executable\.export public @", flow))
    assert got == DISPATCHES[model]


def test_raised_convolution_gradients_spell_their_dimension_numbers():
    network, roots = conv_training(np.float32, (1, 2, 9, 8), (3, 2, 3, 3), 2, 1)
    text = stablehlo(network.entry(roots).lower(), RAISABLE, "named")
    numbers = re.findall(r"dim_numbers = (\[[^\]]*\]x\[[^\]]*\]->\[[^\]]*\])", text)
    assert sorted(numbers) == sorted([
        "[b, f, 0, 1]x[i, 0, 1, o]->[b, 0, 1, f]",  # forward: NCHW input, [C, kh, kw, F] kernel
        "[f, b, 0, 1]x[i, 0, 1, o]->[b, 0, 1, f]",  # weight gradient: the batch is contracted
        "[b, 0, 1, f]x[i, o, 0, 1]->[b, f, 0, 1]",  # input gradient: dY by the reversed kernel
    ])
    assert "lhs_dilate = [2, 2]" in text  # the input gradient dilates dY by the stride
    assert "rhs_dilate = [2, 2]" in text  # the weight gradient's window steps by the stride
    assert "stablehlo.reverse" in text and '"topos.' not in text


def test_columns_spell_each_convolution_group_as_one_product_over_the_whole_batch():
    """Stride 2, padding 1: [1, 2, 9, 8] by [3, 2, 3, 3] gives 5 x 4 positions and a 2*3*3 = 18-row matrix."""
    network, roots = conv_training(np.float32, (1, 2, 9, 8), (3, 2, 3, 3), 2, 1)
    text = stablehlo(network.entry(roots).lower())
    products = re.findall(r"stablehlo\.dot_general .*: \((tensor<[^)]*)\) -> (tensor<\w+>)", text)
    assert sorted(f"{a} -> {b}" for a, b in products) == sorted([
        "tensor<18x3xf32>, tensor<18x20xf32> -> tensor<3x20xf32>",  # forward: W^T by the columns, then turned
        "tensor<20x3xf32>, tensor<18x20xf32> -> tensor<3x18xf32>",  # weight gradient: dY^T by columns^T, turned
        "tensor<3x18xf32>, tensor<20x3xf32> -> tensor<18x20xf32>",  # input gradient's columns: W^T by dY^T
    ])
    assert "-> tensor<2x9x1x5x4xf32>" in text  # nine taps, each a stride-2 slice of the padded, channel-major input
    assert "batching_dims" not in text  # no product per example, no weight copied per example
    assert "stablehlo.convolution" not in text and "stablehlo.reverse" not in text and '"topos.' not in text


def _compiled(plan, kinds, convolution="columns"):
    text = stablehlo(plan, kinds, convolution)
    return plan.compile("llvm-cpu", rewrite=lambda _: text)


def _group_inputs(network, group) -> set[int]:
    """Computed nodes a group's executor reads: operands outside the group and what it recomputes from."""
    inside = set(group.nodes) | set(group.recomputes)
    reads = {j for n in inside for j in network.columns.operands[n]} - inside
    return {j for j in reads if not network.columns.opcodes[j].is_source}


def _grade(network, roots, dtype, kinds=RAISABLE, convolution="columns"):
    """Compile with ``kinds`` raised; grade every raised gradient group locally and every root end to end."""
    plan = network.entry(roots).lower()
    groups = [c for c in elect(plan.candidates(), lambda c: c.kind in kinds) if c.kind in GRADIENTS]
    watched = sorted({g.root for g in groups} | {j for g in groups for j in _group_inputs(network, g)}
                     - {s.index for s in roots})
    entry = network.entry(roots, observe=[network.symbol(n) for n in watched])
    compiled = _compiled(entry.lower(), kinds, convolution)
    parameters = network.parameters()
    run, oracle = compiled.forward(parameters), network.forward(parameters)
    flush = conformance.FLUSHES_SUBNORMALS.get("llvm-cpu", False)

    declared = set(watched) | {s.index for s in roots}

    def compiled_value(n):
        value = run[network.symbol(n)] if n in declared else oracle[network.symbol(n)]
        return conformance.flush_subnormals(value) if flush else value

    exact = Kernels(network, Numerics.EXACT)
    absolute = lambda n: np.abs(compiled_value(n))  # noqa: E731
    graded = set()
    for group in groups:
        execute = pattern(group.kind).execute
        want = np.asarray(execute(group, compiled_value, network, exact))
        got = np.asarray(compiled_value(group.root))
        d = group.details
        if group.kind == "max_pool_gradient":
            # Routing reads the input's signs and order: scale by |dY| alone, taps overlapping at most
            # window / stride times; with windows that do not overlap the bits must agree.
            signed = lambda n, x=d["input"]: compiled_value(n) if n == x else np.abs(compiled_value(n))  # noqa: E731
            overlap = np.prod([-(-w // s) for w, s in zip(d["window"], d["stride"])])
            if overlap == 1:
                verdict = conformance.compare(got, want, conformance.BIT_EXACT)
                assert verdict.ok, f"{group.kind}: {verdict.detail}"
                graded.add(group.kind)
                continue
            terms, scale_of = overlap, signed
        else:
            kh, kw = d["kernel_size"]
            terms = (d["batch"] * d["count"][0] * d["count"][1] if group.kind == "convolution_weight_gradient"
                     else d["filters"] * kh * kw)
            scale_of = absolute
        ulps = conformance.envelope("matmul", None, dtype).ulps
        scale = terms * np.asarray(execute(group, scale_of, network, exact), dtype=np.float64)
        error = np.abs(got.astype(np.float64) - want.astype(np.float64))
        bound = ulps * EPS[np.dtype(dtype)] * scale + float(np.finfo(np.float32).tiny)
        assert (error <= bound).all(), f"{group.kind}: worst {float(np.max(error / np.maximum(bound, 1e-300))):.3g}"
        graded.add(group.kind)
    for symbol in roots:
        want = oracle[symbol].astype(np.float64)
        error = np.max(np.abs(run[symbol].astype(np.float64) - want))
        assert error <= conformance.END_TO_END_ULPS * EPS[np.dtype(dtype)] * np.max(np.abs(want)), repr(symbol)
    return graded


TRAINING_CASES = [
    # (input shape, weight shape, stride, padding, dilation, pool)
    ((2, 3, 8, 8), (4, 3, 3, 3), 1, 1, 1, (2,)),
    ((1, 2, 9, 8), (3, 2, 3, 3), 2, 1, 1, None),  # stride 2: the input gradient dilates dY
]


@pytest.mark.parametrize("convolution", ["columns", "named"])
@pytest.mark.parametrize("case", TRAINING_CASES, ids=lambda c: f"{c[0]}*{c[1]}-s{c[2]}-p{c[3]}-pool{c[5]}")
def test_raised_training_step_matches_the_oracle_within_the_envelopes(case, convolution):
    shape, weight_shape, stride, padding, dilation, pool = case
    network, roots = conv_training(np.float32, shape, weight_shape, stride, padding, dilation, pool)
    graded = _grade(network, roots, topos.float32, convolution=convolution)
    assert graded == set(GRADIENTS) - (set() if pool else {"max_pool_gradient"})


@pytest.mark.parametrize("convolution", ["columns", "named"])
def test_a_dilated_non_square_convolution_raised_in_training_matches_the_oracle(convolution):
    """Dilation 2, a 2 x 3 kernel, padding (1, 2): recorded by hand, since the facade takes no dilation."""
    network, roots = conv_training(np.float32, (1, 2, 9, 10), (3, 2, 2, 3), 1, (1, 2), 2, recording="hand")
    assert _grade(network, roots, topos.float32, convolution=convolution) == {
        "convolution_weight_gradient", "convolution_input_gradient"}


# float32 by default; float64 and bfloat16 (about 10 s more) under -m slow.
LENET_ELEMENTS = [p if p.id == "f32" else pytest.param(*p.values, id=p.id, marks=(*p.marks, pytest.mark.slow))
                  for p in ELEMENT_PARAMETERS]


@pytest.mark.parametrize("dtype", LENET_ELEMENTS)
def test_raised_lenet_step_matches_the_oracle_in_every_element_type(dtype):
    network, roots = lenet(np.dtype(dtype), side=12)
    assert _grade(network, roots, np.dtype(dtype)) == set(GRADIENTS)


def test_the_pool_gradient_raised_alone_matches_the_oracle_and_the_default_raises_every_group():
    network, roots = lenet(np.float32, side=12)
    assert _grade(network, roots, topos.float32, kinds=("max_pool", "max_pool_gradient")) == {"max_pool_gradient"}
    text = network.entry(roots).lower().emit_stablehlo()
    assert text == stablehlo(network.entry(roots).lower(), RAISABLE)
    assert op_counts(text)["reduce_window"] == 2 and not op_counts(text)["convolution"]


def test_the_named_lenet_step_matches_the_oracle():
    network, roots = lenet(np.float32, side=12)
    assert _grade(network, roots, topos.float32, convolution="named") == set(GRADIENTS)


@pytest.mark.slow
@pytest.mark.parametrize("case", [
    ((2, 2, 10, 9), (3, 2, 3, 3), 3, 4, 1, None),  # padding wider than the kernel: negative crop padding
    ((1, 2, 9, 9), (2, 2, 2, 2), 1, 0, 1, (3, 2)),  # overlapping pool windows
    ((2, 1, 10, 9), (2, 1, 3, 3), (2, 1), (2, 1), 1, (2, 1)),
    ((2, 3, 7, 7), (4, 3, 1, 1), 2, 0, 1, None),  # one kernel tap: no concatenate of taps
], ids=lambda c: f"{c[0]}*{c[1]}-s{c[2]}-p{c[3]}-pool{c[5]}")
@pytest.mark.parametrize("convolution", ["columns", "named"])
def test_raised_training_step_sweep(case, convolution):
    shape, weight_shape, stride, padding, dilation, pool = case
    network, roots = conv_training(np.float32, shape, weight_shape, stride, padding, dilation, pool)
    assert _grade(network, roots, topos.float32, convolution=convolution) >= {"convolution_weight_gradient",
                                                                             "convolution_input_gradient"}
