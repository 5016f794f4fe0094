"""Every model of docs/performance.md as one step topos compiles, and (lazily) its jax.jit twin.

``MODELS`` names them; ``build(key)`` records one and returns a
:class:`Model`: the network, the roots its step computes, the feeds, the
updates (empty for a step that updates nothing: GPT-2's forward), the
value the step reads back (the loss, or GPT-2's logits) and the starting
parameters. ``jax_step(model)`` writes the same mathematics in JAX from
the same starting weights and returns a :class:`Twin`.

* ``mlp-s``, ``mlp-m``, ``gpt``: ``_gpt.py``'s workloads (one SGD step),
  twinned by ``_peers.jax_peer``.
* ``makemore-mlp`` (SGD), ``makemore-transformer`` (AdamW): the examples'
  own recordings and batches at their default sizes, twinned by
  ``makemore_twins.jax_column``.
* ``lenet``: ``examples/mnist/train.py``'s LeNet at MNIST's 28 x 28, batch
  64, one SGD step with cross-entropy over integer labels; its JAX twin is
  written here (``lax.conv_general_dilated``, ``reduce_window``).
* ``gpt2-124m-forward``: ``examples/gpt2``'s 124M model, batch 1, T=128,
  the prefill logits; twinned by ``_gpt2_twins.jax_twin``.

Used by ``versus_jax.py`` (the issue's table), ``data_tiling.py`` and
``gpu_check.py``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

import topos

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "examples")
for _path in (HERE, EXAMPLES, os.path.join(EXAMPLES, "gpt2")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

MODELS = ("mlp-s", "mlp-m", "gpt", "makemore-mlp", "makemore-transformer", "lenet", "gpt2-124m-forward")
# Steps per round of interleaved timing (_timing.interleaved): the larger models take tens of
# milliseconds to a second a step.
PER_ROUND = {"mlp-s": 20, "mlp-m": 3, "gpt": 3, "makemore-mlp": 20, "makemore-transformer": 5, "lenet": 5,
             "gpt2-124m-forward": 1}
# Memory a benchmark process needs for the model, topos and jax together (GiB, rounded up from
# versus_jax.py's peak resident set: GPT-2 124M holds its weights on the host, in IREE and in XLA).
NEEDS_GIB = {"gpt2-124m-forward": 4.0}


def too_large(key: str) -> str | None:
    """Why ``key`` should be skipped on this machine (it would not fit in the available memory), or None."""
    need = NEEDS_GIB.get(key, 1.0)
    try:
        with open("/proc/meminfo") as info:
            available = next(int(line.split()[1]) for line in info if line.startswith("MemAvailable:")) / 2**20
    except (OSError, StopIteration, ValueError):
        return None  # no way to tell: try it
    if available < need:
        return f"skipped {key}: it needs about {need:.0f} GiB and {available:.1f} GiB is available"
    return None
NOTHING = topos.Updates(())


def models_that_fit(keys):
    """(key, its model built) for each of ``keys`` this machine has the memory for, one at a time;
    the others are skipped with ``too_large``'s message printed."""
    for key in keys:
        if (reason := too_large(key)) is not None:
            print(reason, flush=True)
            continue
        yield key, build(key)


@dataclass
class Model:
    """One step of one model: what topos compiles and runs, and what its twin needs."""

    key: str
    name: str
    network: object
    roots: list
    feeds: Callable[[int], dict]  # step number -> feeds (the makemore examples read a new batch each step)
    updates: object
    read: object  # the Symbol each step reads back to the host
    parameters: object
    twin: dict = field(default_factory=dict)  # what jax_step needs: the workload the twin is written from


@dataclass
class Twin:
    """A jax.jit step: ``step(k)`` advances its own state by step ``k`` and returns what it reads back."""

    step: Callable[[int], np.ndarray]
    compile_seconds: float  # lower + compile, or the first call less one step where the twin has no lower()
    opening: list = field(default_factory=list)  # steps 0 and 1's values, where compiling had to run them
    analysis: Callable[[], dict | None] | None = None  # makes XLA's memory analysis when asked (memory.py)
    # -> (jax's Lowered step, the arguments it was lowered for): its StableHLO for front_ends.py
    lowering: Callable[[], tuple] | None = None

    @property
    def memory(self) -> dict | None:
        """XLA's memory analysis of the twin's step (``_peers.memory_analysis``), None where there is none."""
        return self.analysis() if self.analysis else None


def topos_step(model: Model, compiled) -> Callable[[int], np.ndarray]:
    """``step(k)``: step ``k`` of ``model`` on ``compiled`` (parameters resident, or frozen into the module
    for a compile(frozen=...)), returning the value it reads back."""
    if compiled.frozen is not None:
        return lambda k: np.asarray(compiled.forward(feeds=model.feeds(k))[model.read])
    state = [compiled.resident(model.parameters)]

    def step(k):
        state[0], run = compiled.step(state[0], model.feeds(k), model.updates)
        return np.asarray(run[model.read])

    return step


def build(key: str) -> Model:
    if key not in MODELS:
        raise KeyError(f"unknown model {key!r}; choose from {', '.join(MODELS)}")
    return _BUILDERS[key]()


def _workload(builder, key):
    workload = builder()
    return Model(key, workload.name, workload.trained, workload.updates.roots(workload.loss),
                 lambda k, feeds=workload.feeds: feeds, workload.updates, workload.loss, workload.parameters,
                 {"workload": workload})


def _makemore(key: str) -> Model:
    import makemore_twins

    work = (makemore_twins.mlp_workload if key == "makemore-mlp" else makemore_twins.transformer_workload)(
        200, tiny=False)
    batches = work.feeds
    return Model(key, f"makemore {work.name} ({'SGD' if work.name == 'mlp' else 'AdamW'}), "
                 f"batch {len(batches[0]['next']) if work.name == 'mlp' else work.args.batch}",
                 work.network, work.updates.roots(work.loss), lambda k: batches[k % len(batches)], work.updates,
                 work.loss, work.network.parameters(), {"work": work})


LENET_BATCH, LENET_SIDE, LENET_RATE = 64, 28, 0.1


def _module(name: str, *path: str):
    """The file at ``path`` imported as module ``name`` (once): benchmarks/gpt2.py and the example's gpt2.py
    share a name, so neither may be found by sys.path order."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(*path))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _mnist():
    return _module("mnist_train", EXAMPLES, "mnist", "train.py")


def _lenet() -> Model:
    mnist = _mnist()
    digits = SimpleNamespace(side=(LENET_SIDE, LENET_SIDE))
    network, (loss, updates) = mnist.recorder(digits, SimpleNamespace(seed=0), LENET_BATCH, training=True)
    rng = np.random.default_rng(0)
    feeds = {"images": rng.standard_normal((LENET_BATCH, 1, LENET_SIDE, LENET_SIDE)).astype(np.float32),
             "labels": rng.integers(0, 10, LENET_BATCH), "optim.lr": LENET_RATE}
    return Model("lenet", f"LeNet (examples/mnist) 28x28, batch {LENET_BATCH}, SGD", network,
                 updates.roots(loss), lambda k: feeds, updates, loss, network.parameters(), {"feeds": feeds})


def _gpt2_forward() -> Model:
    example = _module("gpt2", EXAMPLES, "gpt2", "gpt2.py")  # the example; hf_gpt2 imports it by this name
    config = example.Config.preset("124M")
    network, generation = example.record_generation(config, batch=1, length=128, seed=0, draw=True)
    tokens = np.array(topos.init.Generator(1).integers((1, 128), 0, config.vocabulary))
    feeds = {generation.tokens: tokens}
    return Model("gpt2-124m-forward", "GPT-2 124M forward, batch 1, T=128", network, [generation.prefill_logits],
                 lambda k: feeds, NOTHING, generation.prefill_logits, network.parameters(),
                 {"config": config, "tokens": tokens})


def _gpt_models():
    from _gpt import mlp_m, mlp_s, small_gpt

    return {"mlp-s": lambda: _workload(mlp_s, "mlp-s"), "mlp-m": lambda: _workload(mlp_m, "mlp-m"),
            "gpt": lambda: _workload(small_gpt, "gpt")}


_BUILDERS = {**_gpt_models(), "makemore-mlp": lambda: _makemore("makemore-mlp"),
             "makemore-transformer": lambda: _makemore("makemore-transformer"), "lenet": _lenet,
             "gpt2-124m-forward": _gpt2_forward}


# ---- the jax.jit twins ---------------------------------------------------------------------------


def jax_step(model: Model) -> Twin:
    if "workload" in model.twin:
        return _gpt_twin(model.twin["workload"])
    if "work" in model.twin:
        return _makemore_twin(model.twin["work"])
    if model.key == "lenet":
        return _lenet_twin(model)
    return _gpt2_twin(model)


def _gpt_twin(workload) -> Twin:
    from _peers import jax_peer

    peer = jax_peer(workload)
    state = [peer.start()]

    def step(k):
        state[0], loss = peer.step(state[0])
        return np.asarray(loss)

    return Twin(step, peer.compile_seconds, analysis=lambda: peer.memory, lowering=lambda: peer.lowering(state[0]))


def _first_call(step: Callable[[int], np.ndarray]) -> tuple[float, list]:
    """A twin without lower(): (its first call (trace + compile + one step) less a second call, their values)."""
    began = time.perf_counter()
    opening = [step(0)]
    first = time.perf_counter() - began
    began = time.perf_counter()
    opening.append(step(1))
    return max(0.0, first - (time.perf_counter() - began)), opening


def _makemore_twin(work) -> Twin:
    import makemore_twins
    from _peers import memory_analysis

    makemore_twins.jax_column(work)
    column = work.columns.pop(next(label for label in work.columns if label.startswith("jax")))

    def step(k):
        return np.asarray(column(work.feeds[k % len(work.feeds)]))

    # The analysis compiles the step a second time: only memory.py asks for it.
    return Twin(step, *_first_call(step), analysis=lambda: memory_analysis(column.lower(work.feeds[0]).compile()),
                lowering=lambda: (column.lower(work.feeds[0]), column.arguments(work.feeds[0])))


def _lenet_twin(model: Model) -> Twin:
    """The example's LeNet in JAX: NCHW convolutions with OIHW kernels, 2x2 max-pools, flatten, linear."""
    import jax
    import jax.numpy as jnp

    from _peers import memory_analysis

    table = model.parameters
    named = {name: jnp.asarray(np.array(table[name])) for name in table.names() if table.trainable(name)}

    def conv(x, p, name):
        y = jax.lax.conv_general_dilated(x, p[name + ".weight"], (1, 1), ((1, 1), (1, 1)),
                                         dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return y + p[name + ".bias"][None, :, None, None]

    def pool(x):
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

    convs = sorted({n.rsplit(".", 1)[0] for n in named if n.startswith("features.")})
    linear = next(n.rsplit(".", 1)[0] for n in named if not n.startswith("features."))

    def loss_of(p, images, labels):
        x = images
        for name in convs:
            x = pool(jax.nn.relu(conv(x, p, name)))
        logits = x.reshape(x.shape[0], -1) @ p[linear + ".weight"].T + p[linear + ".bias"]
        log_p = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.take_along_axis(log_p, labels[:, None], axis=1).mean()

    def train(p, images, labels):
        loss, g = jax.value_and_grad(loss_of)(p, images, labels)
        return jax.tree_util.tree_map(lambda w, d: w - LENET_RATE * d, p, g), loss

    jitted = jax.jit(train, donate_argnums=0)
    feeds = model.twin["feeds"]
    images, labels = jnp.asarray(feeds["images"]), jnp.asarray(feeds["labels"].astype(np.int32))
    began = time.perf_counter()
    compiled = jitted.lower(named, images, labels).compile()
    seconds = time.perf_counter() - began
    state = [named]

    def step(k):
        state[0], loss = jitted(state[0], images, labels)
        return np.asarray(loss)

    return Twin(step, seconds, analysis=lambda: memory_analysis(compiled),
                lowering=lambda: (jitted.lower(state[0], images, labels), (state[0], images, labels)))


def _gpt2_twin(model: Model) -> Twin:
    from _gpt2_twins import jax_twin
    from _peers import memory_analysis

    config, tokens = model.twin["config"], model.twin["tokens"]
    forward, _, params = jax_twin(config, model.parameters.named(), tokens.shape[1])
    began = time.perf_counter()
    compiled = forward.lower(params, tokens).compile()
    seconds = time.perf_counter() - began
    return Twin(lambda k: np.asarray(forward(params, tokens)), seconds, analysis=lambda: memory_analysis(compiled),
                lowering=lambda: (forward.lower(params, tokens), (params, tokens)))
