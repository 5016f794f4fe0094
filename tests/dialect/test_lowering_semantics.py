"""The lowered StableHLO computes what the oracle computes, checked by programs that are not topos.

Each opcode's StableHLO runs in the StableHLO reference interpreter
(jaxlib's, an independent MLIR build) for float32, float64 and bfloat16,
and is compared with ``network.forward`` within its envelope (see
``_hlo_eval.ENVELOPES``). A few whole graphs are also compiled with IREE
for llvm-cpu and run, to show IREE accepts what the lowering writes.
"""

from __future__ import annotations

import numpy as np
import pytest

import topos
from topos import Tape
from topos.dialect.pipeline import to_stablehlo

from ._hlo_eval import (
    CASES,
    ELEMENT_IDS,
    ELEMENTS,
    argument_values,
    check_envelope,
    data,
    emitted,
    evaluator,
    lowered_results,
)
from .graphs import mlp


@pytest.mark.parametrize("dtype", ELEMENTS, ids=ELEMENT_IDS.get)
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_lowered_opcode_matches_oracle_within_its_envelope(case, dtype):
    evaluator()
    network, root = Tape.record(lambda tape: case.record(tape, dtype))
    want = network.forward(network.parameters())[root]
    _, (got,) = lowered_results(network, [root])
    check_envelope(got, want, case.envelope, dtype, case.floor, f"{case.name} {ELEMENT_IDS[dtype]}")


def _mlp_with_gradients(dtype):
    """A loss and its recorded gradients: relu adds step, gather adds scatter, log_softmax its adjoint."""

    def model(tape):
        x = tape.input(data(dtype, (6, 4), "x"))
        labels = tape.input(topos.selection([0, 2, 1, 2, 2, 0], 3))
        w1 = tape.parameter(data(dtype, (4, 5), "w1", -1.0, 1.0))
        w2 = tape.parameter(data(dtype, (5, 3), "w2", -1.0, 1.0))
        table = tape.parameter(data(dtype, (3, 5), "table", -1.0, 1.0))
        hidden = (x @ w1).relu() + table.gather(labels)
        logits = hidden @ w2
        picked = tape.leaf(np.eye(3, dtype=dtype)).gather(labels)
        loss = -(logits.log_softmax(1) * picked).sum() / 6.0
        return loss, tape.differentiate(loss, [w1, w2, table]).roots()

    network, (loss, gradients) = Tape.record(model)
    return network, [loss, *gradients]


@pytest.mark.parametrize("dtype", ELEMENTS, ids=ELEMENT_IDS.get)
def test_lowered_training_graph_with_recorded_gradients_matches_oracle(dtype):
    evaluator()
    network, roots = _mlp_with_gradients(dtype)
    run = network.forward(network.parameters())
    _, results = lowered_results(network, roots)
    for k, (root, got) in enumerate(zip(roots, results)):
        check_envelope(got, run[root], "stable", dtype, floor=1.0, what=f"result {k}")


def test_lowered_scatter_with_repeated_indices_keeps_the_reference_order_bitwise():
    # Values chosen so that any other order of the three adds into row 1 rounds differently.
    values = np.array([[1.0], [2.0**-24], [2.0**-24], [-1.0]], dtype=np.float32)
    network, root = Tape.record(
        lambda tape: tape.input(values).scatter(tape.input(topos.selection([1, 1, 1, 1], 2)))
    )
    want = network.forward(network.parameters())[root]
    evaluator()
    _, (got,) = lowered_results(network, [root])
    assert want[1, 0] == 0.0  # ((1 + 2**-24) + 2**-24) - 1 rounds to 0 in float32
    assert got.tobytes() == want.tobytes()


# ---- IREE accepts what the lowering writes ------------------------------------------------

_IREE_FLAGS = ("--iree-llvmcpu-target-cpu=generic",)
# IREE keeps float64 only when asked, and its embedded linker has no libm for f64 tanh.
_IREE_F64_FLAGS = ("--iree-input-demote-f64-to-f32=false", "--iree-llvmcpu-link-embedded=false")


def _run_with_iree(network, roots, dtype) -> list[np.ndarray]:
    iree_compiler = pytest.importorskip("iree.compiler")
    runtime = pytest.importorskip("iree.runtime")
    module = emitted(network, roots)
    flags = list(_IREE_FLAGS) + (list(_IREE_F64_FLAGS) if dtype == topos.float64 else [])
    binary = iree_compiler.compile_str(
        to_stablehlo(module), target_backends=["llvm-cpu"], input_type="stablehlo", extra_args=flags
    )
    loaded = runtime.load_vm_flatbuffer(binary, driver="local-sync")
    outputs = loaded.main(*argument_values(network, module, network.parameters()))
    outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    return [np.asarray(o.to_host()) for o in outputs]


@pytest.mark.parametrize(
    "dtype",
    [topos.float32, pytest.param(topos.float64, marks=pytest.mark.slow)],
    ids=ELEMENT_IDS.get,
)
def test_iree_runs_lowered_training_graph_within_envelope(dtype):
    network, roots = _mlp_with_gradients(dtype)
    run = network.forward(network.parameters())
    for k, (root, got) in enumerate(zip(roots, _run_with_iree(network, roots, dtype))):
        check_envelope(got, run[root], "stable", dtype, floor=1.0, what=f"result {k}")


def test_iree_runs_lowered_convolution_pieces_exactly():
    # pad/unfold/permute/reshape/matmul is how a convolution is recorded; fold and
    # scatter are exact in the reference order, so IREE must reproduce them bitwise.
    def model(tape):
        image = tape.input(data(topos.float32, (2, 7, 3), "image"))
        windows = image.pad(1, 1, 9).unfold(1, size=3, step=2, dilation=1)  # (2, 4, 3, 3)
        folded = windows.fold(1, size=3, step=2, dilation=1, extent=9)
        rows = tape.input(data(topos.float32, (5, 3), "rows")).scatter(
            tape.input(topos.selection([1, 0, 1, 3, 1], 4)))
        columns = windows.permute((0, 1, 3, 2)).reshape((8, 9))
        kernel = tape.input(data(topos.float32, (9, 2), "kernel"))
        return folded, rows, columns @ kernel

    network, (folded, rows, convolved) = Tape.record(model)
    run = network.forward(network.parameters())
    got = _run_with_iree(network, [folded, rows, convolved], topos.float32)
    assert got[0].tobytes() == run[folded].tobytes()
    assert got[1].tobytes() == run[rows].tobytes()
    check_envelope(got[2], run[convolved], "accumulation", topos.float32, floor=1.0, what="matmul")


@pytest.mark.slow
def test_iree_runs_the_shared_mlp_graph():
    network, roots, observes = mlp()
    run = network.forward(network.parameters())
    results = list(roots) + list(observes)
    for k, (root, got) in enumerate(zip(results, _run_with_iree(network, results, topos.float32))):
        check_envelope(got, run[root], "stable", topos.float32, floor=1.0, what=f"result {k}")


@pytest.mark.parametrize("dtype", [topos.float32, topos.float64], ids=ELEMENT_IDS.get)
def test_erf_derivative_of_a_scaled_input_has_the_bits_of_the_stored_product(dtype):
    # The lowering rebuilds y * c as (y * 2c) * 0.5 (GELU's backward); fed the product the
    # forward would have stored, the plain lowering must give the same bits everywhere:
    # normal, subnormal and overflowing products, zeros, infinities and NaN.
    evaluator()
    finfo = np.finfo(np.dtype(dtype))
    c = 0.7071067811865476
    y = np.concatenate([data(dtype, (64,), "y", -6.0, 6.0),
                        np.array([0.0, -0.0, np.inf, -np.inf, np.nan, finfo.max, -finfo.max, finfo.tiny,
                                  finfo.tiny * 3.0, finfo.smallest_subnormal * 5.0, 1.0, -1.0], dtype)])
    scaled, root = Tape.record(lambda tape: (tape.input(y) * c).erf_derivative())
    _, (got,) = lowered_results(scaled, [root])
    with np.errstate(over="ignore"):
        product = (y * np.asarray(c, dtype)).astype(dtype)
    stored, plain = Tape.record(lambda tape: tape.input(product).erf_derivative())
    _, (want,) = lowered_results(stored, [plain])
    assert got.tobytes() == want.tobytes()
