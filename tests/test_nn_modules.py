"""topos.nn modules: PyTorch's names and shapes, the module tree, the readings, and every misuse."""

from __future__ import annotations

import numpy as np
import pytest

import topos
import topos.nn.functional as F
from topos import Tape, nn, selection
from topos.base.errors import ArgumentError, RecordingError, ShapeError

torch = pytest.importorskip("torch")

F32, F64 = np.float32, np.float64


class Block(nn.Module):
    """A pre-norm transformer block, written as a user would."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = nn.MultiHeadAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x), causal=True)
        return x + self.mlp(self.ln_2(x))


class TinyGpt(nn.Module):
    def __init__(self, vocabulary=11, width=8, heads=2, layers=2, context=4):
        super().__init__()
        self.wte = nn.Embedding(vocabulary, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.ModuleList([Block(width, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width)


class TorchBlock(torch.nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(width)
        self.attn = torch.nn.MultiheadAttention(width, heads, batch_first=True)
        self.ln_2 = torch.nn.LayerNorm(width)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))


class TorchGpt(torch.nn.Module):
    def __init__(self, vocabulary=11, width=8, heads=2, layers=2, context=4):
        super().__init__()
        self.wte = torch.nn.Embedding(vocabulary, width)
        self.wpe = torch.nn.Embedding(context, width)
        self.blocks = torch.nn.ModuleList([TorchBlock(width, heads) for _ in range(layers)])
        self.ln_f = torch.nn.LayerNorm(width)


def _shapes(named):
    return {name: tuple(value.shape) for name, value in named}


def test_parameter_names_and_shapes_equal_pytorchs():
    seen = {}

    def record(tape):
        model = TinyGpt()
        seen["named"] = _shapes(model.named_parameters())
        seen["order"] = [name for name, _ in model.named_parameters()]

    network, _ = Tape.record(record)
    theirs = TorchGpt()
    assert seen["named"] == _shapes(theirs.named_parameters())
    assert seen["order"] == [name for name, _ in theirs.named_parameters()]
    assert "blocks.0.attn.in_proj_weight" in seen["named"] and "blocks.1.mlp.2.bias" in seen["named"]
    assert set(network.names()) == set(seen["named"])


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (lambda: nn.Linear(3, 4), lambda: torch.nn.Linear(3, 4)),
        (lambda: nn.Linear(3, 4, bias=False), lambda: torch.nn.Linear(3, 4, bias=False)),
        (lambda: nn.Mlp([5, 4, 3, 2]), lambda: torch.nn.Sequential(
            torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))),
        (lambda: nn.Embedding(7, 3), lambda: torch.nn.Embedding(7, 3)),
        (lambda: nn.Conv2d(3, 5, (3, 2)), lambda: torch.nn.Conv2d(3, 5, (3, 2))),
        (lambda: nn.BatchNorm(6), lambda: torch.nn.BatchNorm1d(6)),
        (lambda: nn.LayerNorm(6), lambda: torch.nn.LayerNorm(6)),
        (lambda: nn.RmsNorm(6), lambda: torch.nn.RMSNorm(6)),
        (lambda: nn.MultiHeadAttention(6, 3), lambda: torch.nn.MultiheadAttention(6, 3, batch_first=True)),
    ],
    ids=["Linear", "Linear-no-bias", "Mlp", "Embedding", "Conv2d", "BatchNorm", "LayerNorm", "RmsNorm", "MHA"],
)
def test_each_layer_has_the_state_dict_of_its_pytorch_twin(ours, theirs):
    seen = {}

    def record(tape):
        module = ours()
        seen.update(_shapes(module.state_dict().items()))

    Tape.record(record)
    expected = {k: tuple(v.shape) for k, v in theirs().state_dict().items() if not k.endswith("num_batches_tracked")}
    assert seen == expected


def test_default_initialisation_follows_pytorchs_distributions():
    seen = {}

    def record(tape):
        seen["linear"], seen["embedding"], seen["mha"] = nn.ModuleList(
            [nn.Linear(400, 300), nn.Embedding(300, 200), nn.MultiHeadAttention(64, 4)])

    network, _ = Tape.record(record)
    table = network.parameters()
    weight = table[seen["linear"].weight.symbol]
    bound = 1 / np.sqrt(400)
    assert np.abs(weight).max() <= bound and np.abs(weight).max() > 0.99 * bound
    assert abs(np.std(table[seen["embedding"].weight.symbol]) - 1.0) < 0.02
    in_proj = table[seen["mha"].in_proj_weight.symbol]
    assert np.abs(in_proj).max() <= np.sqrt(6 / (64 + 192)) and not table[seen["mha"].in_proj_bias.symbol].any()


def test_initial_weights_come_from_the_recordings_seed_or_a_given_generator():
    def record(tape):
        return nn.Linear(3, 2).weight

    first, w1 = Tape.record(record)
    again, w2 = Tape.record(record)
    other, w3 = Tape.record(record, seed=1)
    assert np.array_equal(first.parameters()[w1], again.parameters()[w2])
    assert not np.array_equal(first.parameters()[w1], other.parameters()[w3])
    given, w4 = Tape.record(lambda tape: nn.Linear(3, 2, generator=topos.init.Generator(1)).weight)
    assert np.array_equal(given.parameters()[w4], other.parameters()[w3])
    ones, w5 = Tape.record(lambda tape: nn.Linear(3, 2, init=topos.init.ones()).weight)
    assert np.array_equal(ones.parameters()[w5], np.ones((2, 3), F32))
    norm, (scale, shift) = Tape.record(
        lambda tape: (lambda m: (m.weight, m.bias))(nn.LayerNorm(3, init=topos.init.constant(2.0),
                                                                 bias_init=topos.init.uniform(-1, 1))))
    assert np.array_equal(norm.parameters()[scale], np.full(3, 2.0, F32)) and norm.parameters()[shift].any()


def test_the_module_tree_is_walkable():
    seen = {}

    def record(tape):
        model = TinyGpt(layers=1)
        seen["modules"] = [path for path, _ in model.named_modules()]
        seen["children"] = [name for name, _ in model.named_children()]
        seen["repr"] = repr(model)
        seen["paths"] = model.blocks[0].attn.out_proj.path

    Tape.record(record)
    assert seen["children"] == ["wte", "wpe", "blocks", "ln_f"]
    assert seen["modules"][:5] == ["", "wte", "wpe", "blocks", "blocks.0"]
    assert seen["paths"] == "blocks.0.attn.out_proj"
    assert "(attn): MultiHeadAttention(8, num_heads=2" in seen["repr"]


def test_a_stack_of_like_blocks_prints_once_with_its_count():
    def record(tape):
        stack = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2), nn.Tanh(), nn.Linear(2, 3))
        blocks = nn.ModuleList([nn.Sequential(nn.Linear(4, 4), nn.GELU()) for _ in range(12)])
        return repr(stack), repr(blocks)

    _, (stack, blocks) = Tape.record(record)
    assert stack.splitlines() == ["Sequential(", "  (0-2): 3 x Linear(2, 2, bias=True)", "  (3): Tanh()",
                                  "  (4): Linear(2, 3, bias=True)", ")"]
    assert blocks.splitlines()[1] == "  (0-11): 12 x Sequential(" and len(blocks.splitlines()) == 6


def test_a_tied_weight_keeps_its_owners_name_and_appears_once():
    def record(tape):
        class Tied(nn.Module):
            def __init__(self):
                super().__init__()
                self.wte = nn.Embedding(5, 3)
                self.head = self.wte.weight  # tied, as GPT-2 ties its output projection

        model = Tied()
        return [name for name, _ in model.named_parameters()], model.head

    network, (names, head) = Tape.record(record)
    assert names == ["wte.weight"] and network.name(head) == "wte.weight"


def test_a_shared_module_keeps_its_first_path():
    def record(tape):
        shared = nn.Linear(2, 2)
        outer = nn.Sequential(shared, nn.Tanh(), shared)
        return [name for name, _ in outer.named_parameters()]

    _, names = Tape.record(record)
    assert names == ["0.weight", "0.bias"]


def test_two_outermost_modules_with_one_name_are_refused_with_the_fix():
    def record(tape):
        nn.Linear(2, 3)
        nn.Linear(3, 4)

    with pytest.raises(topos.SymbolError, match="named 'weight'.*parent Module"):
        Tape.record(record)


# ---- misuse ------------------------------------------------------------------------------------------


def test_a_module_built_outside_a_recording_names_the_line_and_the_fix():
    during = r"test_nn_modules.py:\d+.*Linear is built during a recording.*Tape.record"
    with pytest.raises(RecordingError, match=during):
        nn.Linear(3, 4)


def test_a_module_called_in_another_recording_says_to_record_again():
    built = {}
    Tape.record(lambda tape: built.setdefault("layer", nn.Linear(3, 4)))
    with pytest.raises(RecordingError, match=r"test_nn_modules.py:\d+.*Linear\(3, 4.*sealed.*network.parameters"):
        Tape.record(lambda tape: built["layer"](tape.input(np.ones((2, 3), F32))))


def test_a_wrong_feature_size_names_the_module_path_the_shapes_and_the_line():
    def record(tape):
        model = nn.Mlp([5, 4, 3])
        model(tape.input(np.ones((2, 6), F32)))

    mismatch = r"test_nn_modules.py:\d+.*0 \(Linear\(5, 4.*expects 5 features.*\[2, 6\] has 6"
    with pytest.raises(ShapeError, match=mismatch):
        Tape.record(record)


def test_a_wrong_dtype_names_both_types():
    def record(tape):
        nn.LayerNorm(4)(tape.input(np.ones((2, 4), F64)))

    with pytest.raises(ShapeError, match=r"LayerNorm\(4.*float32 parameters but the input \[2, 4\] is float64"):
        Tape.record(record)


def test_conv_checks_rank_and_channels_and_embedding_checks_its_selection():
    with pytest.raises(ShapeError, match="rank 4"):
        Tape.record(lambda tape: nn.Conv2d(3, 4, 3)(tape.input(np.ones((3, 5, 5), F32))))
    with pytest.raises(ShapeError, match="expects 3 channels along the axis 1"):
        Tape.record(lambda tape: nn.Conv2d(3, 4, 3)(tape.input(np.ones((1, 2, 5, 5), F32))))
    with pytest.raises(ShapeError, match="takes a selection"):
        Tape.record(lambda tape: nn.Embedding(5, 2)(tape.input(np.ones(3, F32))))
    with pytest.raises(ShapeError, match="has 5 rows but the selection indexes 6"):
        Tape.record(lambda tape: nn.Embedding(5, 2)(tape.input(selection([1], 6))))


def test_modules_refuse_bad_constructor_arguments():
    for build, words in [
        (lambda: nn.Mlp([3]), "at least two sizes"),
        (lambda: nn.Mlp([3, 2], activation="swish"), "activation must be one of"),
        (lambda: nn.Dropout(1.0), r"p must be in \[0, 1\)"),
        (lambda: nn.MultiHeadAttention(6, 4), "not divisible"),
        (lambda: nn.LayerNorm((2, 3)), "last axis"),
    ]:
        with pytest.raises(ValueError, match=words):
            Tape.record(lambda tape, build=build: build())


@pytest.mark.parametrize("build, words", [
    (lambda: nn.Linear(0, 3), r"Linear: in_features must be an int >= 1, got 0"),
    (lambda: nn.Linear(-1, 3), r"Linear: in_features must be an int >= 1, got -1"),
    (lambda: nn.Linear("3", 2), r"Linear: in_features must be an int >= 1, got '3'"),
    (lambda: nn.Linear(3.0, 2), r"Linear: in_features must be an int >= 1, got 3.0"),
    (lambda: nn.Linear(True, 2), r"Linear: in_features must be an int >= 1, got True"),
    (lambda: nn.Linear(3, 0), r"Linear: out_features must be an int >= 1, got 0"),
    (lambda: nn.Linear(3, 2, dtype="nonsense"), r"Linear: dtype must be float32, float64 or ml_dtypes.bfloat16"),
    (lambda: nn.Linear(3, 2, generator=7), r"Linear: generator must be a topos.init.Generator"),
    (lambda: nn.Embedding(0, 4), r"Embedding: num_embeddings must be an int >= 1, got 0"),
    (lambda: nn.Embedding(10, -4), r"Embedding: embedding_dim must be an int >= 1, got -4"),
    (lambda: nn.LayerNorm(0), r"LayerNorm: normalized_shape must be an int >= 1, got 0"),
    (lambda: nn.RmsNorm(0), r"RmsNorm: normalized_shape must be an int >= 1, got 0"),
    (lambda: nn.BatchNorm(0), r"BatchNorm: num_features must be an int >= 1, got 0"),
    (lambda: nn.Conv2d(1, 2, 0), r"Conv2d: kernel_size must be an int >= 1, got 0"),
    (lambda: nn.Conv2d(0, 2, 3), r"Conv2d: in_channels must be an int >= 1, got 0"),
    (lambda: nn.Conv2d(1, 2, (3,)),
     r"Conv2d: kernel_size must be an int or 2 ints \(height, width\), got tuple \(3,\)"),
    (lambda: nn.Conv2d(1, 2, 3, stride=0), r"Conv2d: stride must be an int >= 1, got 0"),
    (lambda: nn.Conv2d(1, 2, 3, padding=-1), r"Conv2d: padding must be an int >= 0, got -1"),
    (lambda: nn.Conv2d(1, 2, 3, padding=(1, 1, 1)), r"Conv2d: padding must be an int or 2 ints"),
    (lambda: nn.MaxPool2d(0), r"MaxPool2d: kernel_size must be an int >= 1, got 0"),
    (lambda: nn.MaxPool2d(2, stride=0), r"MaxPool2d: stride must be an int >= 1, got 0"),
    (lambda: nn.MultiHeadAttention(8, 0), r"MultiHeadAttention: num_heads must be an int >= 1, got 0"),
    (lambda: nn.MultiHeadAttention(0, 2), r"MultiHeadAttention: embed_dim must be an int >= 1, got 0"),
    (lambda: nn.Mlp(4), r"Mlp: sizes must be a list of ints"),
    (lambda: nn.Mlp([4, 0, 2]), r"Mlp: sizes\[1\] must be an int >= 1, got 0"),
    (lambda: nn.Dropout("0.5"), r"Dropout: p must be in \[0, 1\)"),
    (lambda: nn.Dropout(float("nan")), r"Dropout: p must be in \[0, 1\)"),
    (lambda: nn.GELU("fast"), r"GELU: approximate must be 'none' or 'tanh', got 'fast'"),
])
def test_a_bad_size_or_option_names_the_module_and_the_argument(build, words):
    with pytest.raises(ArgumentError, match=words) as caught:
        Tape.record(lambda tape: build())
    assert "test_nn_modules.py" in str(caught.value)  # the user's line comes first
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, TypeError)


def test_sizes_may_be_numpy_integers_and_kernel_pairs():
    def build(tape):
        linear, conv = nn.ModuleList([nn.Linear(np.int64(3), np.int32(2)),
                                      nn.Conv2d(1, 2, [3, 2], stride=(1, 2), padding=(1, 0))])
        return linear.weight, conv.weight

    network, (weight, kernel) = Tape.record(build)
    assert network.parameters()[weight].shape == (2, 3)
    assert network.parameters()[kernel].shape == (2, 1, 3, 2)


@pytest.mark.parametrize("build, words", [
    (lambda: nn.LayerNorm(4, eps=-1.0), r"LayerNorm: eps must be >= 0 \(a finite number\), got -1.0"),
    (lambda: nn.RmsNorm(4, eps=float("inf")), r"RmsNorm: eps must be >= 0"),
    (lambda: nn.BatchNorm(3, eps=-1e-5), r"BatchNorm: eps must be >= 0"),
    (lambda: nn.BatchNorm(3, momentum=float("nan")), r"BatchNorm: momentum must be in \[0, 1\]"),
    (lambda: nn.BatchNorm(3, momentum=1.5), r"BatchNorm: momentum must be in \[0, 1\]"),
])
def test_an_eps_or_momentum_that_would_give_nan_is_refused(build, words):
    with pytest.raises(ArgumentError, match=words):
        Tape.record(lambda tape: build())


def test_eps_zero_and_momentum_bounds_are_accepted():
    def build(tape):
        x = tape.input(np.array([[1.0, 2.0], [3.0, 5.0]], F32))
        layers = nn.ModuleList([nn.LayerNorm(2, eps=0.0), nn.RmsNorm(2, eps=0.0), nn.BatchNorm(2, momentum=0.0),
                                nn.BatchNorm(2, momentum=1.0, eps=0)])
        return tuple(layer(x) for layer in layers)

    network, results = Tape.record(build)
    run = network.forward(network.parameters())
    np.testing.assert_allclose(run[results[0]], [[-1.0, 1.0], [-1.0, 1.0]], atol=1e-6)
    for result in results:
        assert np.isfinite(run[result]).all()


def test_batch_norm_refuses_a_training_batch_of_one_and_reads_it_for_inference():
    with pytest.raises(ShapeError, match=r"BatchNorm\(3.*more than one value per channel.*\[1, 3\].*training=False"):
        Tape.record(lambda tape: nn.BatchNorm(3)(tape.input(np.ones((1, 3), F32))))
    with pytest.raises(ShapeError, match=r"more than one value per channel.*\[1, 3, 1, 1\]"):
        Tape.record(lambda tape: nn.BatchNorm(3)(tape.input(np.ones((1, 3, 1, 1), F32))))

    def inference(tape):
        bn = nn.BatchNorm(3)
        x = tape.input(np.ones((1, 3), F32))
        with nn.inference():
            return bn(x), bn(x, training=False)

    network, (a, b) = Tape.record(inference)
    run = network.forward(network.parameters())
    np.testing.assert_allclose(run[a], np.ones((1, 3)) / np.sqrt(1 + 1e-5), rtol=1e-6)
    np.testing.assert_array_equal(run[a], run[b])
    network, out = Tape.record(lambda tape: nn.BatchNorm(3)(tape.input(np.array([[0.0] * 3, [2.0] * 3], F32))))
    np.testing.assert_allclose(network.forward(network.parameters())[out], [[-1.0] * 3, [1.0] * 3], atol=1e-4)


@pytest.mark.parametrize("init, words", [
    (lambda g, s, d: np.zeros(s, np.float64),
     r"Linear.weight: init returned float64 \[2, 3\], expected float32 \[2, 3\]"),
    (lambda g, s, d: np.zeros(5, np.float32), r"Linear.weight: init returned float32 \[5\], expected float32 \[2, 3\]"),
    (lambda g, s, d: [[0.0] * 3] * 2, r"Linear.weight: init returned list .*expected a float32 \[2, 3\] array"),
    (0.5, r"Linear: init must be an initializer from topos.init"),
])
def test_an_init_that_returns_the_wrong_array_is_refused_at_construction(init, words):
    with pytest.raises(ArgumentError, match=words):
        Tape.record(lambda tape: nn.Linear(3, 2, init=init))


def test_an_init_that_returns_the_right_array_is_used():
    def build(tape):
        linear, norm = nn.ModuleList([nn.Linear(3, 2, init=lambda g, s, d: np.full(s, 0.5, d)),
                                      nn.LayerNorm(2, bias_init=topos.init.constant(2.0))])
        return linear.weight, norm.bias

    network, (weight, bias) = Tape.record(build)
    np.testing.assert_array_equal(network.parameters()[weight], np.full((2, 3), 0.5, F32))
    np.testing.assert_array_equal(network.parameters()[bias], [2.0, 2.0])
    with pytest.raises(ArgumentError, match=r"Embedding.weight: init returned float64"):
        Tape.record(lambda tape: nn.Embedding(3, 2, init=lambda g, s, d: np.zeros(s)))
    with pytest.raises(ArgumentError, match=r"LayerNorm.bias: init returned float32 \[3\], expected float32 \[2\]"):
        Tape.record(lambda tape: nn.LayerNorm(2, bias_init=lambda g, s, d: np.zeros(3, d)))


def test_flatten_refuses_inputs_without_a_batch_axis():
    for shape in [(5,), ()]:
        with pytest.raises(ShapeError, match=r"Flatten\(\) takes an input of rank 2 or more"):
            Tape.record(lambda tape, shape=shape: nn.Flatten()(tape.input(np.ones(shape, F32))))
    network, out = Tape.record(lambda tape: nn.Flatten()(tape.input(np.ones((2, 3, 4), F32))))
    assert network.forward(network.parameters())[out].shape == (2, 12)


def test_module_list_positions_and_a_missing_forward_are_explained():
    def build(tape):
        modules = nn.ModuleList([nn.Linear(2, 2), nn.Tanh()])
        assert isinstance(modules[-1], nn.Tanh) and len(modules[0:1]) == 1
        with pytest.raises(IndexError, match=r"ModuleList has 2 modules; position 3 is out of range \(use 0..1"):
            modules[3]
        with pytest.raises(ArgumentError, match=r"ModuleList is indexed by int positions, got str '0'; use \[0\]"):
            modules["0"]
        with pytest.raises(ArgumentError, match=r"ModuleList holds modules; item 2 is a int"):
            modules.append(3)
        assert modules.extend([nn.Linear(2, 3), nn.GELU()]) is modules and len(modules) == 4
        assert modules[2].weight.name == "2.weight" and [k for k, _ in modules.named_children()] == ["0", "1", "2", "3"]
        with pytest.raises(ArgumentError, match=r"ModuleList.extend takes a list of modules, got Linear; .*append"):
            modules.extend(nn.Linear(2, 2))

        class NoForward(nn.Module):
            pass

        with pytest.raises(NotImplementedError, match=r"NoForward defines no forward\(\); define forward\(self, ...\)"):
            NoForward()(tape.input(np.ones(2, F32)))

    Tape.record(build)


def test_dropout_feeds_need_a_generator():
    def build(tape):
        model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5))
        model(tape.input(np.ones((1, 2), F32)))
        with pytest.raises(ArgumentError, match=r"dropout_feeds: pass a topos.init.Generator .*got int 0"):
            model.dropout_feeds(0)
        assert len(model.dropout_feeds(topos.init.Generator(1))) == 1

    Tape.record(build)


def test_function_forms_check_their_options():
    x = lambda tape: tape.input(np.ones((1, 1, 4, 4), F32))  # noqa: E731
    w = lambda tape: tape.input(np.ones((1, 1, 2, 2), F32))  # noqa: E731
    for record, words in [
        (lambda t: F.conv2d(x(t), w(t), stride=0), r"conv2d: stride must be an int >= 1, got 0"),
        (lambda t: F.conv2d(x(t), w(t), padding=(1,)), r"conv2d: padding must be an int or 2 ints"),
        (lambda t: F.max_pool(x(t), 0), r"max_pool: size must be an int >= 1, got 0"),
        (lambda t: F.layer_norm(x(t), eps=-1.0), r"layer_norm: eps must be >= 0"),
        (lambda t: F.rms_norm(x(t), eps=float("nan")), r"rms_norm: eps must be >= 0"),
        (lambda t: F.gelu(x(t), "erf"), r"gelu: approximate must be 'none' or 'tanh'"),
        (lambda t: F.mse_loss(x(t), x(t), reduction="avg"), r"reduction must be one of"),
    ]:
        with pytest.raises(ArgumentError, match=words):
            Tape.record(record)


def test_a_subclass_that_skips_super_init_is_told_so():
    class Broken(nn.Module):
        def __init__(self):
            self.weight = nn.Parameter(np.ones(2, F32))

    with pytest.raises(RecordingError, match="must call super"):
        Tape.record(lambda tape: Broken())


# ---- readings: BatchNorm and Dropout ---------------------------------------------------------------


def test_batch_norm_readings_and_running_statistics_match_pytorch():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 4, 3, 3))

    def record(tape):
        bn = nn.BatchNorm(4, momentum=0.2, dtype=F64)
        image = tape.input(x, name="image")
        return bn(image), bn(image, training=False), bn.state_updates()

    network, (train, infer, updates) = Tape.record(record)
    table = network.parameters()
    run = network.forward(table)
    theirs = torch.nn.BatchNorm2d(4, momentum=0.2).double()
    with torch.no_grad():
        expected_train = theirs(torch.tensor(x)).numpy()
        theirs.eval()
        expected_infer = theirs(torch.tensor(x)).numpy()
    np.testing.assert_allclose(run[train], expected_train, atol=1e-12)
    after = updates.apply(table, run)
    np.testing.assert_allclose(after["running_mean"], theirs.running_mean.numpy(), atol=1e-14)
    np.testing.assert_allclose(after["running_var"], theirs.running_var.numpy(), atol=1e-14)
    np.testing.assert_allclose(network.forward(after)[infer], expected_infer, atol=1e-12)
    assert [network.name(p) for p, _ in updates.pairs()] == ["running_mean", "running_var"]
    assert not network.node(updates.pairs()[0][0]).trainable


def test_a_step_that_drops_the_running_statistics_is_refused_on_every_reading():
    """Updates without model.state_updates() would leave BatchNorm's statistics at their initials forever."""
    def record(tape):
        model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm(4), nn.Tanh(), nn.Linear(4, 2))
        loss = model(tape.input(np.ones((8, 3), F32), name="x")).sum()
        only = topos.optim.SGD(lr=0.1).record(tape.differentiate(loss, model.parameters()))
        return loss, only, only + model.state_updates()

    network, (loss, only, both) = Tape.record(record)
    table = network.parameters()
    entry = network.entry(both.roots(loss))
    run = entry.interpret(table, {})
    after = both.apply(table, run)
    assert not np.array_equal(after["1.running_mean"], table["1.running_mean"])
    dropped = r"leave out the state slots 1.running_mean, 1.running_var.*\+ model.state_updates\(\)"
    with pytest.raises(topos.FeedError, match=dropped):
        only.apply(table, run)
    with pytest.raises(topos.FeedError, match=dropped):
        topos.Updates(()).apply(table, run)
    pytest.importorskip("iree.compiler")
    compiled = entry.lower().compile("llvm-cpu")
    state = compiled.resident(table)
    with pytest.raises(topos.FeedError, match=dropped):
        compiled.step(state, {}, only)
    state, _ = compiled.step(state, {}, both)
    np.testing.assert_allclose(state.to_host()["1.running_mean"], after["1.running_mean"], rtol=1e-5, atol=1e-6)


def test_the_inference_reading_records_no_next_statistics_so_optimizer_updates_suffice():
    def record(tape):
        model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm(4), nn.Linear(4, 2))
        with nn.inference():
            loss = model(tape.input(np.ones((8, 3), F32), name="x")).sum()
        trainable = [p for p in model.parameters() if p.trainable]
        return loss, topos.optim.SGD(lr=0.1).record(tape.differentiate(loss, trainable))

    network, (loss, updates) = Tape.record(record)
    table = network.parameters()
    after = updates.apply(table, network.entry(updates.roots(loss)).interpret(table, {}))
    assert np.array_equal(after["1.running_mean"], table["1.running_mean"])


def test_inference_block_makes_a_whole_sequential_read_running_statistics():
    x = np.random.default_rng(1).standard_normal((5, 3))
    seen = {}

    def record(tape):
        model = nn.Sequential(nn.Linear(3, 3, dtype=F64), nn.BatchNorm(3, dtype=F64), nn.Tanh())
        image = tape.input(x)
        trained = model(image)
        with nn.inference():
            evaluated = model(image)
            seen["inside"] = (nn.training_reading(), nn.training_reading(True))
        seen["after"] = nn.training_reading()
        return trained, evaluated, model

    network, (trained, evaluated, model) = Tape.record(record)
    run = network.forward(network.parameters())
    assert seen == {"inside": (False, True), "after": True}  # the block reads inference; explicit wins
    assert not np.allclose(run[trained], run[evaluated])  # batch statistics against the initial running ones
    assert len(model.state_updates()) == 2  # only the training call records next statistics
    expected = np.tanh((x @ network.parameters()["0.weight"].T + network.parameters()["0.bias"]) / np.sqrt(1 + 1e-5))
    np.testing.assert_allclose(run[evaluated], expected, rtol=1e-12)


def test_batch_norm_called_twice_in_training_is_refused_when_its_updates_are_gathered():
    def record(tape):
        bn = nn.BatchNorm(2)
        x = tape.input(np.ones((3, 2), F32))
        bn(x)
        bn(x)
        bn.state_updates()

    with pytest.raises(RecordingError, match="more than once"):
        Tape.record(record)


def test_dropout_is_a_fed_mask_with_an_all_ones_default():
    x = np.arange(1, 9, dtype=F32).reshape(2, 4)

    def record(tape):
        model = nn.Sequential(nn.Linear(4, 4, init=topos.init.ones(), bias=False), nn.Dropout(0.5))
        out = model(tape.input(x))
        return model, out, model[1].mask

    network, (model, out, mask) = Tape.record(record)
    table = network.parameters()
    assert network.name(mask) == "1.mask"
    evaluated = network.forward(table)[out]
    assert np.array_equal(evaluated, x @ np.ones((4, 4), F32))
    feeds = model.dropout_feeds(topos.init.Generator(3))
    assert list(feeds) == [mask] and set(np.unique(feeds[mask])) <= {0.0, 2.0}
    dropped = network.forward(table, feeds)[out]
    assert np.array_equal(dropped, evaluated * feeds[mask])


# ---- functional forms against PyTorch's ------------------------------------------------------------


def _torch_function_cases():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((5, 4))
    q, k, v = (rng.standard_normal((2, 3, 4, 6)) for _ in range(3))
    labels = np.array([0, 3, 1, 2, 3])
    tf = torch.nn.functional
    t = torch.tensor
    return {
        "gelu": (lambda tape: F.gelu(tape.leaf(x)), lambda: tf.gelu(t(x))),
        "gelu-tanh": (lambda tape: F.gelu(tape.leaf(x), "tanh"), lambda: tf.gelu(t(x), approximate="tanh")),
        "silu": (lambda tape: F.silu(tape.leaf(x)), lambda: tf.silu(t(x))),
        "sigmoid": (lambda tape: F.sigmoid(tape.leaf(x)), lambda: torch.sigmoid(t(x))),
        "softmax": (lambda tape: F.softmax(tape.leaf(x), 0), lambda: tf.softmax(t(x), 0)),
        "attention": (
            lambda tape: F.scaled_dot_product_attention(tape.leaf(q), tape.leaf(k), tape.leaf(v)),
            lambda: tf.scaled_dot_product_attention(t(q), t(k), t(v)),
        ),
        "attention-causal": (
            lambda tape: F.scaled_dot_product_attention(tape.leaf(q), tape.leaf(k), tape.leaf(v), causal=True),
            lambda: tf.scaled_dot_product_attention(t(q), t(k), t(v), is_causal=True),
        ),
        "cross_entropy": (
            lambda tape: F.cross_entropy(tape.leaf(x), tape.leaf(selection(labels, 4))),
            lambda: tf.cross_entropy(t(x), t(labels)),
        ),
        "cross_entropy-sum": (
            lambda tape: F.cross_entropy(tape.leaf(x), tape.leaf(selection(labels, 4)), reduction="sum"),
            lambda: tf.cross_entropy(t(x), t(labels), reduction="sum"),
        ),
        "cross_entropy-none": (
            lambda tape: F.cross_entropy(tape.leaf(x), tape.leaf(selection(labels, 4)), reduction="none"),
            lambda: tf.cross_entropy(t(x), t(labels), reduction="none"),
        ),
        "cross_entropy-ignore": (
            lambda tape: F.cross_entropy(tape.leaf(x), tape.leaf(selection(labels, 4)), ignore_index=3),
            lambda: tf.cross_entropy(t(x), t(labels), ignore_index=3),
        ),
        "cross_entropy-probabilities": (
            lambda tape: F.cross_entropy(tape.leaf(x), tape.leaf(tf.softmax(t(x[::-1].copy()), 1).numpy())),
            lambda: tf.cross_entropy(t(x), tf.softmax(t(x[::-1].copy()), 1)),
        ),
        "mse_loss": (lambda tape: F.mse_loss(tape.leaf(x), tape.leaf(x * x)), lambda: tf.mse_loss(t(x), t(x * x))),
        "layer_norm": (lambda tape: F.layer_norm(tape.leaf(x)), lambda: tf.layer_norm(t(x), (4,))),
        "rms_norm": (lambda tape: F.rms_norm(tape.leaf(x)), lambda: tf.rms_norm(t(x), (4,))),
    }


@pytest.mark.parametrize("case", sorted(_torch_function_cases()))
def test_function_forms_agree_with_pytorch_in_float64(case):
    ours, theirs = _torch_function_cases()[case]
    network, out = Tape.record(ours)
    with torch.no_grad():
        expected = theirs().numpy()
    np.testing.assert_allclose(network.forward(network.parameters())[out], expected, rtol=1e-12, atol=1e-14)


def test_cross_entropy_refuses_what_it_cannot_read():
    logits = np.zeros((3, 4), F32)
    for target, options, words in [
        (selection([0, 1, 2], 5), {}, "labels index 5 values but the logits have 4 classes"),
        (selection([0, 1, 2], 4), {"ignore_index": 9}, "ignore_index 9 must be a label"),
        (selection([0, 1], 4), {}, r"labels \[2\] should be \[3\]"),
        (np.zeros((3, 3), F32), {}, r"probability targets \[3, 3\]"),
        (np.zeros((3, 4), F32), {"ignore_index": 0}, "applies to class labels"),
    ]:
        with pytest.raises(ShapeError, match=words):
            Tape.record(lambda tape, target=target, options=options:
                        F.cross_entropy(tape.leaf(logits), tape.leaf(target), **options))
    with pytest.raises(ShapeError, match=r"logits \[2, 3, 4\] must be \[rows, classes\].*reshape"):
        Tape.record(lambda tape: F.cross_entropy(tape.leaf(np.zeros((2, 3, 4), F32)), tape.leaf(selection([0], 4))))
    with pytest.raises(ValueError, match="reduction must be one of"):
        Tape.record(lambda tape: F.cross_entropy(tape.leaf(logits), tape.leaf(selection([0, 1, 2], 4)), "avg"))


def test_the_recorded_cross_entropy_gradient_is_softmax_minus_one_hot():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 3))
    labels = np.array([2, 0, 1, 1])

    def record(tape):
        logits = tape.parameter(x, name="logits")
        return logits, F.cross_entropy(logits, tape.input(selection(labels, 3)))

    network, (logits, loss) = Tape.record(record)
    gradient = network.forward(network.parameters()).backward(loss)[logits]
    softmax = np.exp(x) / np.exp(x).sum(1, keepdims=True)
    np.testing.assert_allclose(gradient, (softmax - np.eye(3)[labels]) / 4, atol=1e-15)
    report = topos.check_gradients(network, network.parameters(), {}, loss)
    report.assert_ok()
