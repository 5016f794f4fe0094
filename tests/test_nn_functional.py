"""topos.nn.functional: conv2d, max_pool and batch norm against independent float64 NumPy.

The references here never unfold or reshape: convolution is a loop over
kernel offsets, pooling a loop over window offsets, batch norm the
textbook formula. Gradients are graded by ``check_gradients`` (float64
finite differences).
"""

from __future__ import annotations

import numpy as np
import pytest

import topos
from topos import Tape
from topos.nn import batch_norm, batch_norm_inference, conv2d, max_pool
from topos.readings.gradcheck import check_gradients

from conftest import ELEMENT_IDS, ELEMENTS, assert_close, generator

# ---- independent references ---------------------------------------------------------------


def conv_reference(x, weight, bias, stride, padding):
    """Direct convolution in float64: for each kernel offset, add channel-contracted shifted slices."""
    x, weight = np.asarray(x, np.float64), np.asarray(weight, np.float64)
    (sh, sw), (ph, pw) = stride, padding
    padded = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    filters, _, kh, kw = weight.shape
    oh = (padded.shape[2] - kh) // sh + 1
    ow = (padded.shape[3] - kw) // sw + 1
    out = np.zeros((x.shape[0], filters, oh, ow))
    magnitude = np.zeros_like(out)  # sum of |terms|, the yardstick for rounding error
    for i in range(kh):
        for j in range(kw):
            window = padded[:, :, i : i + sh * (oh - 1) + 1 : sh, j : j + sw * (ow - 1) + 1 : sw]
            out += np.einsum("bchw,fc->bfhw", window, weight[:, :, i, j])
            magnitude += np.einsum("bchw,fc->bfhw", np.abs(window), np.abs(weight[:, :, i, j]))
    if bias is not None:
        out += np.asarray(bias, np.float64)[None, :, None, None]
        magnitude += np.abs(np.asarray(bias, np.float64))[None, :, None, None]
    return out, magnitude


def pool_reference(x, size, stride):
    """Sliding-window maximum: the largest element of each window, by direct indexing."""
    x = np.asarray(x, np.float64)
    oh = (x.shape[2] - size) // stride + 1
    ow = (x.shape[3] - size) // stride + 1
    out = np.empty(x.shape[:2] + (oh, ow))
    for r in range(oh):
        for c in range(ow):
            window = x[:, :, r * stride : r * stride + size, c * stride : c * stride + size]
            out[:, :, r, c] = window.max(axis=(2, 3))
    return out


def batch_norm_reference(x, scale, shift, eps):
    x = np.asarray(x, np.float64)
    mean = x.mean(axis=0)
    variance = ((x - mean) ** 2).mean(axis=0)
    out = (x - mean) / np.sqrt(variance + eps) * np.asarray(scale, np.float64) + np.asarray(shift, np.float64)
    return out, mean, variance


def _pair(v):
    return (v, v) if isinstance(v, int) else v


# ---- conv2d --------------------------------------------------------------------------------

CONV_CASES = [
    # (input shape, weight shape, stride, padding, bias)
    ((2, 3, 6, 6), (4, 3, 3, 3), 1, 0, True),
    ((2, 3, 7, 10), (4, 3, 3, 3), 1, 1, True),  # non-square input, padding
    ((1, 2, 9, 8), (3, 2, 3, 3), 2, 1, False),  # stride 2
    ((2, 1, 8, 11), (2, 1, 2, 3), (2, 3), (0, 2), True),  # non-square kernel, stride, padding
    ((1, 4, 5, 5), (6, 4, 1, 1), 1, 0, True),  # pointwise
]


@pytest.mark.parametrize("dtype", ELEMENTS, ids=ELEMENT_IDS)
@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"{c[0]}*{c[1]}-s{c[2]}-p{c[3]}")
def test_conv2d_matches_direct_convolution(case, dtype):
    shape, weight_shape, stride, padding, with_bias = case
    rng = generator("conv2d", case)
    x0 = rng.standard_normal(shape).astype(dtype)
    w0 = rng.standard_normal(weight_shape).astype(dtype)
    b0 = rng.standard_normal(weight_shape[0]).astype(dtype)

    def model(tape):
        x, w = tape.input(x0), tape.parameter(w0)
        b = tape.parameter(b0) if with_bias else None
        return conv2d(x, w, b, stride=stride, padding=padding)

    network, out = Tape.record(model)
    got = network.forward(network.parameters())[out]
    want, magnitude = conv_reference(x0, w0, b0 if with_bias else None, _pair(stride), _pair(padding))
    assert got.shape == want.shape
    # The classic bound for a sum of n products, plus one rounding for the bias.
    terms = weight_shape[1] * weight_shape[2] * weight_shape[3]
    assert_close(got, want, dtype, terms + 2, scale=magnitude, what="conv2d")


def test_conv2d_output_shape_follows_the_usual_formula():
    def model(tape):
        x = tape.input(np.zeros((1, 2, 11, 7)))
        w = tape.parameter(np.zeros((5, 2, 3, 2)))
        return conv2d(x, w, stride=(2, 1), padding=(1, 2))

    network, out = Tape.record(model)
    # OH = (11 + 2 - 3) // 2 + 1 = 6, OW = (7 + 4 - 2) // 1 + 1 = 10
    assert network.node(out).shape == (1, 5, 6, 10)


def test_conv2d_channel_mismatch_names_both_shapes():
    tape = Tape()
    x = tape.input(np.zeros((1, 3, 5, 5)))
    w = tape.parameter(np.zeros((4, 2, 3, 3)))
    with pytest.raises(topos.ShapeError, match=r"\[4, 2, 3, 3\].*2 input channels.*\[1, 3, 5, 5\]"):
        conv2d(x, w)


def test_conv2d_bias_of_the_wrong_length_is_refused():
    tape = Tape()
    x = tape.input(np.zeros((1, 3, 5, 5)))
    w = tape.parameter(np.zeros((4, 3, 3, 3)))
    with pytest.raises(topos.ShapeError, match=r"bias \[3\] should be \[4\]"):
        conv2d(x, w, tape.parameter(np.zeros(3)))


def test_conv2d_gradients_match_finite_differences():
    rng = generator("conv2d gradients")

    def model(tape):
        x = tape.input(rng.standard_normal((2, 2, 6, 5)))
        w = tape.parameter(rng.standard_normal((3, 2, 3, 2)))
        b = tape.parameter(rng.standard_normal(3))
        probe = tape.leaf(rng.standard_normal((2, 3, 3, 3)))
        y = conv2d(x, w, b, stride=(2, 2), padding=1)
        return x, (y * probe).sum()

    network, (x, loss) = Tape.record(model)
    parameters = network.parameters()
    report = check_gradients(network, parameters, {}, loss, wrt=[*parameters.symbols(), x])
    report.assert_ok()


# ---- max_pool ------------------------------------------------------------------------------

POOL_CASES = [
    # (input shape, size, stride)
    ((2, 3, 6, 6), 2, None),
    ((1, 2, 7, 9), 2, None),  # non-square, ragged edge dropped
    ((2, 1, 7, 7), 3, 2),  # overlapping windows
    ((1, 2, 8, 5), 2, 1),
    ((1, 1, 9, 10), 3, 3),
]


@pytest.mark.parametrize("dtype", ELEMENTS, ids=ELEMENT_IDS)
@pytest.mark.parametrize("case", POOL_CASES, ids=lambda c: f"{c[0]}-k{c[1]}-s{c[2]}")
def test_max_pool_matches_sliding_maximum_exactly(case, dtype):
    shape, size, stride = case
    x0 = generator("max_pool", case).standard_normal(shape).astype(dtype)
    network, out = Tape.record(lambda tape: max_pool(tape.input(x0), size, stride))
    got = network.forward(network.parameters())[out]
    want = pool_reference(x0, size, size if stride is None else stride)
    np.testing.assert_array_equal(got.astype(np.float64), want)  # maximum rounds nothing


def test_max_pool_ties_go_to_the_earliest_window_element():
    # -0.0 == +0.0: the one that comes first in row-major window order must win.
    x0 = np.array([[[[-0.0, 0.0], [0.0, 0.0]], [[0.0, -0.0], [-0.0, -0.0]]]])
    network, out = Tape.record(lambda tape: max_pool(tape.input(x0), 2))
    got = network.forward(network.parameters())[out]
    assert np.signbit(got[0, 0, 0, 0]) and not np.signbit(got[0, 1, 0, 0])


def test_max_pool_gradient_flows_to_each_window_maximum():
    rng = generator("max_pool gradients")
    # Distinct values spaced far apart, so no finite-difference step crosses a tie.
    values = rng.permutation(2 * 2 * 6 * 7).reshape(2, 2, 6, 7) * 0.25

    def model(tape):
        x = tape.input(values)
        probe = tape.leaf(rng.standard_normal((2, 2, 2, 3)))
        return x, (max_pool(x, 3, 2) * probe).sum()

    network, (x, loss) = Tape.record(model)
    check_gradients(network, network.parameters(), {}, loss, wrt=[x]).assert_ok()


# ---- batch norm ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ELEMENTS, ids=ELEMENT_IDS)
def test_batch_norm_matches_the_textbook_formula(dtype):
    rng = generator("batch_norm", str(dtype))
    x0 = (rng.standard_normal((16, 5)) * 3 + 1).astype(dtype)
    scale0 = rng.standard_normal(5).astype(dtype)
    shift0 = rng.standard_normal(5).astype(dtype)

    def model(tape):
        return batch_norm(tape.input(x0), tape.parameter(scale0), tape.parameter(shift0), eps=1e-3)

    network, (out, mean, variance) = Tape.record(model)
    run = network.forward(network.parameters())
    want, want_mean, want_variance = batch_norm_reference(x0, scale0, shift0, 1e-3)
    # Each value passes a handful of roundings (a pairwise sum of 16, a
    # division, a sqrt); errors are measured against the scale of what is
    # summed, and the output against |scale| * 4 standard deviations + |shift|.
    assert_close(run[mean], want_mean, dtype, 4, scale=np.abs(x0.astype(np.float64)).max(), what="mean")
    assert_close(run[variance], want_variance, dtype, 8, scale=want_variance.max(), what="variance")
    scale = np.abs(scale0.astype(np.float64)) * 4 + np.abs(shift0.astype(np.float64))
    assert_close(run[out], want, dtype, 8, scale=scale, what="output")


def test_batch_norm_output_is_standardized_per_feature():
    x0 = generator("standardized").standard_normal((64, 3)) * [1.0, 10.0, 0.1] + [5.0, -2.0, 0.0]

    def model(tape):
        ones, zeros = tape.parameter(np.ones(3)), tape.parameter(np.zeros(3))
        return batch_norm(tape.input(x0), ones, zeros, eps=0.0)[0]

    network, out = Tape.record(model)
    y = network.forward(network.parameters())[out]
    np.testing.assert_allclose(y.mean(axis=0), 0.0, atol=1e-14)
    np.testing.assert_allclose(y.var(axis=0), 1.0, rtol=1e-13)


@pytest.mark.parametrize("dtype", ELEMENTS, ids=ELEMENT_IDS)
def test_batch_norm_inference_matches_the_textbook_formula(dtype):
    rng = generator("batch_norm_inference", str(dtype))
    x0 = rng.standard_normal((8, 4)).astype(dtype)
    mean0 = rng.standard_normal(4).astype(dtype)
    variance0 = (rng.random(4) + 0.5).astype(dtype)
    scale0, shift0 = rng.standard_normal(4).astype(dtype), rng.standard_normal(4).astype(dtype)

    def model(tape):
        return batch_norm_inference(
            tape.input(x0), tape.input(mean0), tape.input(variance0),
            tape.parameter(scale0), tape.parameter(shift0), eps=1e-2,
        )

    network, out = Tape.record(model)
    got = network.forward(network.parameters())[out]
    f = lambda a: np.asarray(a, np.float64)  # noqa: E731
    normalized = (f(x0) - f(mean0)) / np.sqrt(f(variance0) + 1e-2)
    want = normalized * f(scale0) + f(shift0)
    scale = np.abs(normalized * f(scale0)) + np.abs(f(shift0))
    assert_close(got, want, dtype, 8, scale=scale, what="batch_norm_inference")


def test_batch_norm_gradients_match_finite_differences():
    rng = generator("batch_norm gradients")

    def model(tape):
        x = tape.input(rng.standard_normal((6, 3)) * 2 + 1)
        scale = tape.parameter(rng.standard_normal(3))
        shift = tape.parameter(rng.standard_normal(3))
        probe = tape.leaf(rng.standard_normal((6, 3)))
        out, mean, variance = batch_norm(x, scale, shift)
        return x, (out * probe).sum() + (mean * variance).sum()

    network, (x, loss) = Tape.record(model)
    parameters = network.parameters()
    check_gradients(network, parameters, {}, loss, wrt=[*parameters.symbols(), x]).assert_ok()


def test_batch_norm_of_a_non_matrix_is_refused():
    tape = Tape()
    x = tape.input(np.zeros((2, 3, 4)))
    with pytest.raises(topos.ShapeError, match=r"rank 2 \[batch, features\]"):
        batch_norm(x, tape.parameter(np.ones(3)), tape.parameter(np.zeros(3)))
