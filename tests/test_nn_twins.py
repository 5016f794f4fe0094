"""Rule 5 for every facade: the facade and its hand-written twin record the same spec and the same bits.

Each case is a pair of recordings: one through ``topos.nn`` (a function
form or a module), one spelled with tape methods only, drawing initial
weights from the recording's generator in the same order. Both must print
the same ``describe()`` (names included) and give bit-identical results.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import topos.nn.functional as F
from topos import Tape, init, nn, selection

F32 = np.float32
RNG = np.random.default_rng(3)
X = RNG.standard_normal((4, 6)).astype(F32)
SEQ = RNG.standard_normal((2, 5, 8)).astype(F32)
IMAGE = RNG.standard_normal((2, 3, 6, 6)).astype(F32)
LABELS = np.array([0, 2, 1, 2])


def _uniform(tape, fan_in, shape):
    bound = 1.0 / math.sqrt(fan_in)
    return init.uniform(-bound, bound)(tape.generator, shape, F32)


def _hand_linear(tape, x, fan_in, fan_out, prefix=""):
    w = tape.parameter(_uniform(tape, fan_in, (fan_out, fan_in)), name=prefix + "weight")
    b = tape.parameter(_uniform(tape, fan_in, (fan_out,)), name=prefix + "bias")
    return x @ w.permute((1, 0)) + b.broadcast_along(0, x.shape[0])


def _last_mean(v):
    return v.mean_along(v.ndim - 1).broadcast_along(v.ndim - 1, v.shape[-1])


# ---- the pairs: (facade, hand-written), each fn(tape) -> Value ---------------------------------------

def _x(tape):
    return tape.leaf(X)


def _hand_silu(t):
    x = _x(t)
    return x / ((-x).exp() + 1.0)


def _hand_sigmoid(t):
    x = _x(t)
    return 1.0 / ((-x).exp() + 1.0)


def _hand_gelu(t):
    x = _x(t)
    return x * (1.0 + (x * math.sqrt(0.5)).erf()) * 0.5


def _hand_gelu_tanh(t):
    x = _x(t)
    inner = (x + x * x * x * 0.044715) * math.sqrt(2 / math.pi)
    return x * 0.5 * (inner.tanh() + 1.0)


def _facade_linear(t):
    x = _x(t)
    w, b = t.parameter(np.ones((3, 6), F32)), t.parameter(np.ones(3, F32))
    return F.linear(x, w, b)


def _hand_linear_function(t):
    x = _x(t)
    w, b = t.parameter(np.ones((3, 6), F32)), t.parameter(np.ones(3, F32))
    return x @ w.permute((1, 0)) + b.broadcast_along(0, 4)


def _hand_linear_rank3(t):
    x, w = t.leaf(SEQ), t.parameter(np.ones((3, 8), F32))
    return (x.reshape((10, 8)) @ w.permute((1, 0))).reshape((2, 5, 3))


def _facade_layer_norm(t):
    x, w, b = _x(t), t.parameter(np.ones(6, F32)), t.parameter(np.zeros(6, F32))
    return F.layer_norm(x, w, b)


def _hand_layer_norm(t):
    x, w, b = _x(t), t.parameter(np.ones(6, F32)), t.parameter(np.zeros(6, F32))
    centered = x - _last_mean(x)
    scale = (_last_mean(centered * centered) + 1e-5).sqrt()
    return centered / scale * w.broadcast_along(0, 4) + b.broadcast_along(0, 4)


def _facade_rms_norm(t):
    x, w = _x(t), t.parameter(np.ones(6, F32))
    return F.rms_norm(x, w, eps=1e-6)


def _hand_rms_norm(t):
    x, w = _x(t), t.parameter(np.ones(6, F32))
    return x / (_last_mean(x * x) + 1e-6).sqrt() * w.broadcast_along(0, 4)


def _facade_mse(t):
    x, y = _x(t), t.leaf(X * 2)
    return F.mse_loss(x, y)


def _hand_mse(t):
    x, y = _x(t), t.leaf(X * 2)
    error = x - y
    return (error * error).mean()


CASES = {
    "relu": (lambda t: F.relu(_x(t)), lambda t: _x(t).maximum(0.0)),
    "sigmoid": (lambda t: F.sigmoid(_x(t)), _hand_sigmoid),
    "silu": (lambda t: F.silu(_x(t)), _hand_silu),
    "gelu": (lambda t: F.gelu(_x(t)), _hand_gelu),
    "gelu-tanh": (lambda t: F.gelu(_x(t), approximate="tanh"), _hand_gelu_tanh),
    "softmax": (lambda t: F.softmax(_x(t), -1), lambda t: _x(t).log_softmax(1).exp()),
    "log_softmax": (lambda t: F.log_softmax(_x(t), 0), lambda t: _x(t).log_softmax(0)),
    "linear": (_facade_linear, _hand_linear_function),
    "linear-rank3": (lambda t: F.linear(t.leaf(SEQ), t.parameter(np.ones((3, 8), F32))), _hand_linear_rank3),
    "layer_norm": (_facade_layer_norm, _hand_layer_norm),
    "rms_norm": (_facade_rms_norm, _hand_rms_norm),
    "mse_loss": (_facade_mse, _hand_mse),
    "dropout": (lambda t: F.dropout(_x(t), t.input(np.ones_like(X))), lambda t: _x(t) * t.input(np.ones_like(X))),
    "embedding": (
        lambda t: F.embedding(t.parameter(np.eye(5, 3, dtype=F32)), t.leaf(selection([[0, 4], [2, 2]], 5))),
        lambda t: t.parameter(np.eye(5, 3, dtype=F32)).gather(t.leaf(selection([[0, 4], [2, 2]], 5))),
    ),
}


def _cross_entropy_labels(tape, reduction):
    logits = tape.leaf(X[:, :3])
    labels = tape.input(selection(LABELS, 3), name="labels")
    return F.cross_entropy(logits, labels, reduction=reduction)


def _cross_entropy_labels_by_hand(tape, reduction):
    logits = tape.leaf(X[:, :3])
    labels = tape.input(selection(LABELS, 3), name="labels")
    products = logits.log_softmax(1) * tape.leaf(np.eye(3, dtype=F32)).gather(labels)
    if reduction == "none":
        return -products.sum_along(1)
    return -products.sum() if reduction == "sum" else -products.sum() / 4.0


for _reduction in ("mean", "sum", "none"):
    CASES[f"cross_entropy-{_reduction}"] = (
        lambda t, r=_reduction: _cross_entropy_labels(t, r),
        lambda t, r=_reduction: _cross_entropy_labels_by_hand(t, r),
    )


def _ignore_by_hand(t):
    logits = t.leaf(X[:, :3])
    labels = t.input(selection([0, 3, 1, 3], 4), name="labels")
    log_probabilities = logits.log_softmax(1)
    table = np.eye(4, 3, dtype=F32)
    table[3] = 0
    weights = t.leaf(np.array([1, 1, 1, 0], F32)).gather(labels)
    products = log_probabilities * t.leaf(table).gather(labels)
    return -products.sum() / weights.sum()


CASES["cross_entropy-ignore"] = (
    lambda t: F.cross_entropy(t.leaf(X[:, :3]), t.input(selection([0, 3, 1, 3], 4), name="labels"), ignore_index=3),
    _ignore_by_hand,
)
def _hand_probabilities(t):
    logits, target = t.leaf(X[:, :3]), t.leaf(np.full((4, 3), 1 / 3, F32))
    return -(logits.log_softmax(1) * target).sum() / 4.0


CASES["cross_entropy-probabilities"] = (
    lambda t: F.cross_entropy(t.leaf(X[:, :3]), t.leaf(np.full((4, 3), 1 / 3, F32))),
    _hand_probabilities,
)


def _attention_by_hand(t, causal):
    q, k, v = (t.leaf(SEQ[:, i:i + 3]) for i in range(3))
    scores = (q @ k.permute((0, 2, 1))) * (1.0 / math.sqrt(8))
    if causal:
        mask = np.triu(np.full((3, 3), -1e9), k=1).astype(F32)
        scores = scores + t.leaf(mask).broadcast_along(0, 2)
    return scores.softmax(2) @ v


for _causal in (False, True):
    CASES[f"attention-causal={_causal}"] = (
        lambda t, c=_causal: F.scaled_dot_product_attention(*(t.leaf(SEQ[:, i:i + 3]) for i in range(3)), causal=c),
        lambda t, c=_causal: _attention_by_hand(t, c),
    )


# ---- modules ------------------------------------------------------------------------------------------

def _module_linear(t):
    x = _x(t)
    return nn.Linear(6, 3)(x)


def _module_mlp_first(t):
    x = _x(t)
    return nn.Mlp([6, 5])(x)


def _hand_mlp_first(t):
    return _hand_linear(t, _x(t), 6, 5, "0.")


def _module_mlp_two(t):
    model = nn.Mlp([6, 5, 3])
    return model(_x(t))


def _hand_mlp_two(t):
    generator = t.generator
    w0 = t.parameter(_uniform(t, 6, (5, 6)), name="0.weight")
    b0 = t.parameter(_uniform(t, 6, (5,)), name="0.bias")
    w2 = t.parameter(init.uniform(-1 / math.sqrt(5), 1 / math.sqrt(5))(generator, (3, 5), F32), name="2.weight")
    b2 = t.parameter(init.uniform(-1 / math.sqrt(5), 1 / math.sqrt(5))(generator, (3,), F32), name="2.bias")
    h = (_x(t) @ w0.permute((1, 0)) + b0.broadcast_along(0, 4)).tanh()
    return h @ w2.permute((1, 0)) + b2.broadcast_along(0, 4)


def _module_embedding(t):
    return nn.Embedding(5, 3)(t.input(selection([1, 4], 5), name="tokens"))


def _hand_embedding(t):
    table = t.parameter(init.normal(0.0, 1.0)(t.generator, (5, 3), F32), name="weight")
    return table.gather(t.input(selection([1, 4], 5), name="tokens"))


def _module_conv(t):
    return nn.Conv2d(3, 4, 3, padding=1)(t.leaf(IMAGE))


def _hand_conv(t):
    w = t.parameter(_uniform(t, 27, (4, 3, 3, 3)), name="weight")
    b = t.parameter(_uniform(t, 27, (4,)), name="bias")
    return F.conv2d(t.leaf(IMAGE), w, b, 1, 1)


def _module_norms_named(t):
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm(8)
            self.rms = nn.RmsNorm(8)

        def forward(self, x):
            return self.rms(self.ln(x))

    block = Block()
    return block(t.leaf(SEQ))


def _hand_norms_named(t):
    w, b = t.parameter(np.ones(8, F32), name="ln.weight"), t.parameter(np.zeros(8, F32), name="ln.bias")
    r = t.parameter(np.ones(8, F32), name="rms.weight")
    x = t.leaf(SEQ)
    centered = x - _last_mean(x)
    y = centered / (_last_mean(centered * centered) + 1e-5).sqrt() * w.broadcast_to(x.shape) + b.broadcast_to(x.shape)
    return y / (_last_mean(y * y) + float(np.finfo(F32).eps)).sqrt() * r.broadcast_to(y.shape)


def _module_batch_norm(t):
    bn = nn.BatchNorm(6)
    x = _x(t)
    train = bn(x)
    (mean_pair, var_pair) = bn.state_updates().pairs()
    return train + bn(x, training=False), mean_pair[1], var_pair[1]


def _hand_batch_norm(t):
    w, b = t.parameter(np.ones(6, F32), name="weight"), t.parameter(np.zeros(6, F32), name="bias")
    rm = t.parameter(np.zeros(6, F32), name="running_mean", trainable=False)
    rv = t.parameter(np.ones(6, F32), name="running_var", trainable=False)
    x = _x(t)
    out, mean, variance = F.batch_norm(x, w, b, 1e-5)
    unbiased = variance * (4 / 3)
    new_mean = rm * 0.9 + mean * 0.1
    new_var = rv * 0.9 + unbiased * 0.1
    return out + F.batch_norm_inference(x, rm, rv, w, b, 1e-5), new_mean, new_var


def _module_batch_norm_2d(t):
    bn = nn.BatchNorm(3)
    return bn(t.leaf(IMAGE))


def _hand_batch_norm_2d(t):
    w, b = t.parameter(np.ones(3, F32), name="weight"), t.parameter(np.zeros(3, F32), name="bias")
    rm = t.parameter(np.zeros(3, F32), name="running_mean", trainable=False)
    rv = t.parameter(np.ones(3, F32), name="running_var", trainable=False)
    moved = t.leaf(IMAGE).permute((0, 2, 3, 1))
    out, mean, variance = F.batch_norm(moved.reshape((72, 3)), w, b, 1e-5)
    unbiased = variance * (72 / 71)
    rm * 0.9 + mean * 0.1
    rv * 0.9 + unbiased * 0.1
    return out.reshape((2, 6, 6, 3)).permute((0, 3, 1, 2))


def _module_dropout(t):
    return nn.Sequential(nn.Dropout(0.2), nn.Flatten())(t.leaf(IMAGE))


def _hand_dropout(t):
    x = t.leaf(IMAGE)
    return (x * t.input(np.ones_like(IMAGE), name="0.mask")).reshape((2, 108))


def _module_attention(t):
    return nn.MultiHeadAttention(8, 2)(t.leaf(SEQ), causal=True)


def _hand_attention(t):
    g = t.generator
    w = t.parameter(init.xavier_uniform()(g, (24, 8), F32), name="in_proj_weight")
    b = t.parameter(np.zeros(24, F32), name="in_proj_bias")
    ow = t.parameter(_uniform(t, 8, (8, 8)), name="out_proj.weight")
    ob = t.parameter(init.zeros()(g, (8,), F32), name="out_proj.bias")
    x = t.leaf(SEQ)
    qkv = (x.reshape((10, 8)) @ w.permute((1, 0)) + b.broadcast_along(0, 10)).reshape((2, 5, 24))
    q, k, v = [qkv.narrow(2, i * 8, 8) for i in range(3)]
    q, k, v = (y.reshape((2, 5, 2, 4)).permute((0, 2, 1, 3)) for y in (q, k, v))
    scores = (q @ k.permute((0, 1, 3, 2))) * 0.5
    mask = t.leaf(np.triu(np.full((5, 5), -1e9), k=1).astype(F32))
    scores = scores + mask.broadcast_along(0, 2).broadcast_along(1, 2)
    y = (scores.softmax(3) @ v).permute((0, 2, 1, 3)).reshape((2, 5, 8))
    return (y.reshape((10, 8)) @ ow.permute((1, 0)) + ob.broadcast_along(0, 10)).reshape((2, 5, 8))


def _module_pool(t):
    return nn.MaxPool2d(2)(nn.ReLU()(t.leaf(IMAGE)))


def _hand_pool(t):
    return F.max_pool(t.leaf(IMAGE).maximum(0.0), 2)


CASES.update({
    "Linear": (_module_linear, lambda t: _hand_linear(t, _x(t), 6, 3)),
    "Mlp-first-layer": (_module_mlp_first, _hand_mlp_first),
    "Mlp": (_module_mlp_two, _hand_mlp_two),
    "Embedding": (_module_embedding, _hand_embedding),
    "Conv2d": (_module_conv, _hand_conv),
    "LayerNorm+RmsNorm": (_module_norms_named, _hand_norms_named),
    "BatchNorm": (_module_batch_norm, _hand_batch_norm),
    "BatchNorm-NCHW": (_module_batch_norm_2d, _hand_batch_norm_2d),
    "Dropout+Flatten": (_module_dropout, _hand_dropout),
    "MultiHeadAttention": (_module_attention, _hand_attention),
    "MaxPool2d+ReLU": (_module_pool, _hand_pool),
})


def _hand_conv2d(t):
    from test_patterns import hand_conv

    x, w, b = t.leaf(IMAGE), t.parameter(np.ones((4, 3, 3, 3), F32)), t.parameter(np.ones(4, F32))
    product = hand_conv(x, w, (2, 1), (1, 1))["product"]  # [B*OH*OW, F]
    out = product.reshape((2, 3, 6, 4)).permute((0, 3, 1, 2))
    return out + b.broadcast_along(1, 3).broadcast_along(2, 6).broadcast_along(0, 2)


def _facade_conv2d(t):
    x, w, b = t.leaf(IMAGE), t.parameter(np.ones((4, 3, 3, 3), F32)), t.parameter(np.ones(4, F32))
    return F.conv2d(x, w, b, stride=(2, 1), padding=1)


def _hand_max_pool(t):
    from test_patterns import hand_pool

    return hand_pool(t.leaf(IMAGE), 3, 2)["out"]


def _hand_batch_norm_function(t):
    from test_patterns import hand_batch_norm

    x, scale, shift = _x(t), t.parameter(np.ones(6, F32)), t.parameter(np.zeros(6, F32))
    steps = hand_batch_norm(x, scale, shift, 1e-5)
    return steps["out"], steps["mean"], steps["variance"]


def _facade_batch_norm_function(t):
    x, scale, shift = _x(t), t.parameter(np.ones(6, F32)), t.parameter(np.zeros(6, F32))
    return F.batch_norm(x, scale, shift, 1e-5)


CASES.update({
    "conv2d": (_facade_conv2d, _hand_conv2d),
    "max_pool": (lambda t: F.max_pool(t.leaf(IMAGE), 3, 2), _hand_max_pool),
    "batch_norm": (_facade_batch_norm_function, _hand_batch_norm_function),
})


@pytest.mark.parametrize("case", sorted(CASES))
def test_facade_and_hand_written_twin_record_the_same_spec_and_bits(case):
    facade, hand = CASES[case]
    network, results = Tape.record(lambda tape: facade(tape))
    twin, twin_results = Tape.record(lambda tape: hand(tape))
    assert network.describe() == twin.describe()
    results = results if isinstance(results, tuple) else (results,)
    twin_results = twin_results if isinstance(twin_results, tuple) else (twin_results,)
    run, twin_run = network.forward(network.parameters()), twin.forward(twin.parameters())
    for mine, theirs in zip(results, twin_results):
        assert run[mine].tobytes() == twin_run[theirs].tobytes()


def test_the_twins_differ_when_the_facade_changes():
    """Teeth: a twin that spells one node differently is caught by describe."""
    network, _ = Tape.record(lambda tape: F.gelu(_x(tape), approximate="tanh"))
    twin, _ = Tape.record(lambda tape: F.gelu(_x(tape)))
    assert network.describe() != twin.describe()


def test_an_mlp_records_as_many_nodes_as_the_hand_written_one():
    network, _ = Tape.record(_module_mlp_two)
    twin, _ = Tape.record(_hand_mlp_two)
    assert len(network) == len(twin)
