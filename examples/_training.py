"""What every training example shares: the command line, the three readings of a step, the oracle check, the plot.

An example records its training network (the model, its loss, and an
optimizer recorded with ``optimizer.record``) and hands it here with a
function that gives the feeds of step k. The step runs in one of three
readings of the same spec, picked by ``--route``:

* ``oracle``: the training entry interpreted by the oracle (reference
  kernels, the truth: ``entry.interpret``, which runs only what the entry
  reads, so other entries of the same spec need no feeds) and ``updates.apply``;
* ``plan``: the same over a FAST plan of the training entry (BLAS, native math);
* ``iree``: ``plan.compile(target)`` and ``compiled.step``, one IREE call
  per step with the weights and the optimizer state on the device (the default;
  ``--target`` picks where: ``llvm-cpu`` by default, or ``vulkan`` for a GPU
  through Vulkan (Mesa's lavapipe runs it on the CPU), ``cuda``, ``rocm``).

Before training, the first ``--check`` steps of the chosen reading are run
beside the oracle's from the same weights, and the losses must agree
within the end-to-end envelope (``topos.dialect.iree.conformance.END_TO_END_ULPS``
ulps of the loss per step) or the example stops. Training shows a tqdm
progress bar with the running loss; ``--plot PATH`` writes the loss curve
with matplotlib.

Examples import this file as ``_training`` (it sits beside them; each adds
``examples/`` to ``sys.path``).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import topos
from topos import Numerics, ToposError
from topos.base.files import replacing
from topos.dialect.iree.targets import TARGETS

ROUTES = ("iree", "plan", "oracle")


def parser(description: str, steps: int, seed: int = 42) -> argparse.ArgumentParser:
    """The options every example takes; an example adds its own to the parser returned."""
    parser = argparse.ArgumentParser(description=description)
    add_reading_options(parser, "trains")
    parser.add_argument("--steps", type=positive, default=steps, help=f"training steps (default {steps})")
    parser.add_argument("--seed", type=seed_value, default=seed,
                        help=f"seed of the data split, batches and init (default {seed})")
    parser.add_argument("--plot", metavar="PATH", type=plot_path,
                        help=f"write the loss curve to PATH ({_PLOT_SUFFIXES}, by its suffix; with matplotlib)")
    parser.add_argument("--check", type=non_negative, default=3, metavar="N",
                        help="steps checked against the oracle before training (default 3; 0 skips)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def add_reading_options(parser: argparse.ArgumentParser, does: str = "runs") -> None:
    """``--route`` and ``--target``: which reading of the spec ``does`` the work, and where IREE's runs."""
    parser.add_argument("--route", choices=ROUTES, default="iree",
                        help=f"which reading of the spec {does}: iree (compiled, default), plan (FAST plan), oracle")
    parser.add_argument("--target", default="llvm-cpu", choices=sorted(TARGETS),
                        help="where the iree route compiles and runs (default llvm-cpu)")


def reading(args) -> str:
    """The route as a report line names it: ``iree on vulkan`` for the iree route off its default target."""
    return args.route if args.route != "iree" or args.target == "llvm-cpu" else f"iree on {args.target}"


def _option(name: str, convert: Callable[[str], float], accept: Callable[[float], bool], what: str):
    """An argparse type: ``convert`` the text, refuse a value ``accept`` rejects as "must be ``what``".

    argparse names the type by ``__name__`` when the conversion itself fails
    ("invalid positive value: 'abc'"), so each keeps its own name.
    """

    def parse(text: str):
        value = convert(text)
        if not accept(value):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value

    parse.__name__ = parse.__qualname__ = name
    return parse


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


positive = _option("positive", int, lambda v: v >= 1, "a positive integer")
non_negative = _option("non_negative", int, lambda v: v >= 0, "an integer >= 0")
# The generators take 64-bit seeds; the bound leaves room for the seed + 1 an example derives from its seed.
seed_value = _option("seed_value", int, lambda v: 0 <= v < 2**63, "an integer in 0..2**63-1")
rate = _option("rate", _finite, lambda v: v > 0, "a positive number")  # a learning rate
fraction = _option("fraction", _finite, lambda v: 0 <= v <= 1, "a number in 0..1")  # batch norm's momentum
non_negative_number = _option("non_negative_number", _finite, lambda v: v >= 0, "a number >= 0")  # temperature


def output_path(text: str) -> str:
    """A file the run will write at its end: its folder is checked now, so a finished run is not thrown away."""
    target = os.path.realpath(text)  # through a symlink, as the write will go
    if os.path.isdir(target):
        raise argparse.ArgumentTypeError(f"{text} is a folder; name a file in it")
    if os.path.exists(target) and not os.access(target, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text} is read-only; name another file or make it writable")
    folder = os.path.dirname(target)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"a file stands at {folder}, where the folder of {text} should be; "
                                         "name a file in a folder")
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"the folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"the folder {folder} takes no new files; name a file in another")
    return text


def output_folder(text: str) -> Path:
    """A folder the run will write into, made if missing: the part of it that exists must be a folder taking files."""
    folder = Path(text)
    for place in (folder.absolute(), *folder.absolute().parents):
        if not place.exists():
            continue
        if not place.is_dir():
            raise argparse.ArgumentTypeError(f"a file stands at {place}, where the folder {text} should be; "
                                             "name a folder")
        if not os.access(place, os.W_OK | os.X_OK):
            raise argparse.ArgumentTypeError(f"the folder {place} takes no new files; name another")
        break
    return folder


PLOT_FORMATS = ("png", "svg", "pdf")  # what matplotlib writes without a backend beyond Agg
_PLOT_SUFFIXES = ".png, .svg or .pdf"


def plot_path(text: str) -> str:
    """``--plot``: a .png, .svg or .pdf file in a folder that exists, with matplotlib installed."""
    suffix = os.path.splitext(text)[1].lower().lstrip(".")
    if suffix not in PLOT_FORMATS:
        raise argparse.ArgumentTypeError(f"{text!r} does not end in {_PLOT_SUFFIXES}; name the file with one "
                                         "of them")
    if importlib.util.find_spec("matplotlib") is None:
        raise argparse.ArgumentTypeError("needs matplotlib: pip install -e '.[examples]'")
    return output_path(text)


class ExampleError(ToposError):
    """An example's data or options are wrong; the message names the file or option and the fix."""


@dataclass
class Trainer:
    """One training network read one way: ``step(feeds)`` advances the weights and returns the loss."""

    network: object
    loss: object
    updates: object
    route: str
    parameters: object = None  # the starting table (default: the network's initials)
    target: str = "llvm-cpu"  # where the iree route compiles and runs
    compile_seconds: float = 0.0
    _state: object = field(default=None, repr=False)

    def __post_init__(self):
        if self.route not in ROUTES:
            raise ExampleError(f"unknown route {self.route!r}; pick one of {', '.join(ROUTES)}")
        roots = self.updates.roots(self.loss)
        if self.route == "oracle":
            self._entry = self.network.entry(roots, numerics=Numerics.EXACT)
        elif self.route == "plan":
            self._plan = self.network.entry(roots, numerics=Numerics.FAST).lower()
        elif self.route == "iree":
            began = time.perf_counter()
            self._compiled = self.network.entry(roots).lower().compile(self.target)
            self.compile_seconds = time.perf_counter() - began
        self.reset()

    def reset(self) -> None:
        """Back to the starting weights (the compiled module is kept)."""
        table = self.network.parameters() if self.parameters is None else self.parameters
        self._state = self._compiled.resident(table) if self.route == "iree" else table

    def step(self, feeds) -> float:
        if self.route == "iree":
            self._state, run = self._compiled.step(self._state, feeds, self.updates)
        else:
            run = (self._entry.interpret(self._state, feeds) if self.route == "oracle"
                   else self._plan.forward(self._state, feeds))
            self._state = self.updates.apply(self._state, run)
        return float(run[self.loss])

    def table(self):
        """The current weights (and optimizer state) as a host Parameters table."""
        return self._state.to_host() if self.route == "iree" else self._state


class Reader:
    """A forward-only entry (evaluation, sampling) read the way the example trains: ``reader(table, feeds)``."""

    def __init__(self, network, roots, route: str, target: str = "llvm-cpu"):
        self.roots = list(roots)
        self.route = route
        if route == "oracle":
            self._entry = network.entry(self.roots, numerics=Numerics.EXACT)
        elif route == "plan":
            self._plan = network.entry(self.roots, numerics=Numerics.FAST).lower()
        else:
            self._compiled = network.entry(self.roots).lower().compile(target)

    def __call__(self, table, feeds):
        """The run of this entry: index it by the roots' symbols."""
        if self.route == "oracle":
            return self._entry.interpret(table, feeds)
        if self.route == "plan":
            return self._plan.forward(table, feeds)
        return self._compiled.forward(table, feeds)


def check_against_oracle(network, loss, updates, route: str, feeds_of: Callable[[int], dict], steps: int,
                         trainer: Trainer | None = None) -> float | None:
    """Run ``steps`` steps of ``route`` and of the oracle from the same weights; the worst loss gap in ulps.

    With ``trainer`` (of ``route``) its compiled module is used and it is reset afterwards, so
    training starts from the same weights without compiling twice. None when no step is
    checked (``--check 0``). Raises ExampleError when a gap leaves the end-to-end envelope.
    """
    if steps <= 0:
        return None
    if route == "oracle":
        return 0.0
    from topos.dialect.iree.conformance import END_TO_END_ULPS

    fast = trainer if trainer is not None else Trainer(network, loss, updates, route)
    oracle = Trainer(network, loss, updates, "oracle", parameters=fast.parameters)
    dtype = network.node(loss).dtype
    eps = 2.0**-7 if dtype == topos.bfloat16 else float(np.finfo(dtype).eps)
    worst = 0.0
    for k in range(steps):
        feeds = feeds_of(k)
        mine, truth = fast.step(feeds), oracle.step(feeds)
        ulps = abs(mine - truth) / (eps * max(1.0, abs(truth)))
        worst = max(worst, ulps)
        # Differences compound through the updates: allow the envelope once per step taken.
        if not math.isfinite(mine) or ulps > END_TO_END_ULPS * (k + 1):
            raise ExampleError(
                f"step {k}: the {route} loss {mine!r} and the oracle's {truth!r} differ by {ulps:.1f} ulps, "
                f"outside the envelope ({END_TO_END_ULPS * (k + 1):g}); run topos bisect on the training "
                "network to find the node"
            )
    fast.reset()
    return worst


def fit(network, loss, updates, args, feeds_of: Callable[[int], dict],
        description: str) -> tuple[Trainer, list[float], str]:
    """What every example does with its training network: check, train, time -> (trainer, losses, report line).

    The trainer of ``args.route`` is built once (one compile); its first
    ``args.check`` steps are checked against the oracle's from the same
    weights and undone; then ``args.steps`` steps train with the progress
    bar, and the report line says how it went.
    """
    trainer = Trainer(network, loss, updates, args.route, target=args.target)
    checked = check_against_oracle(network, loss, updates, args.route, feeds_of, min(args.check, args.steps), trainer)
    began = time.perf_counter()
    losses = train(trainer, feeds_of, args.steps, args.quiet, description)
    return trainer, losses, report(reading(args), trainer, time.perf_counter() - began, args.steps, checked)


def in_chunks(read: Callable[..., np.ndarray], arrays: Sequence[np.ndarray], rows: int) -> np.ndarray:
    """``read`` over fixed-size chunks of ``arrays`` (shapes are static: one recording per size), joined.

    The last chunk is padded with zeros to ``rows`` and its extra outputs
    dropped, so a recording of ``rows`` rows reads a split of any length.
    """
    count = len(arrays[0])
    outputs = []
    for start in range(0, count, rows):
        chunk = [a[start:start + rows] for a in arrays]
        short = rows - len(chunk[0])
        if short:
            chunk = [np.concatenate([c, np.zeros((short,) + c.shape[1:], c.dtype)]) for c in chunk]
        outputs.append(np.asarray(read(*chunk))[: rows - short])
    return np.concatenate(outputs)


def run(main: Callable[[], object]) -> None:
    """Call an example's ``main``; a ToposError (bad data or options, a ``--target`` this machine cannot run,
    a file that is not a checkpoint) is one line on stderr and exit status 1."""
    import sys

    try:
        main()
    except ToposError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(1) from None


def train(trainer: Trainer, feeds_of: Callable[[int], dict], steps: int, quiet: bool = False,
          description: str = "training") -> list[float]:
    """Run ``steps`` steps with a tqdm bar showing the running loss; returns every step's loss."""
    losses: list[float] = []
    bar = _progress(steps, quiet, description)
    running = None
    for k in range(steps):
        loss = trainer.step(feeds_of(k))
        if not math.isfinite(loss):
            raise ExampleError(f"step {k}: the loss is {loss}; lower the learning rate (or check the data)")
        losses.append(loss)
        running = loss if running is None else 0.95 * running + 0.05 * loss
        if bar is not None:
            bar.update(1)
            if k % 10 == 0 or k == steps - 1:
                bar.set_postfix(loss=f"{running:.4f}")
    if bar is not None:
        bar.close()
    return losses


def _progress(steps: int, quiet: bool, description: str):
    if quiet:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # the examples extra is not installed: train without a bar
        return None
    return tqdm(total=steps, desc=description, unit="step", leave=False)


def plot(losses: Sequence[float], path: str, title: str) -> None:
    """The loss curve (and its 100-step mean) at ``path``, in the format its suffix names (``PLOT_FORMATS``)."""
    suffix = os.path.splitext(path)[1].lower().lstrip(".")
    if suffix not in PLOT_FORMATS:
        raise ExampleError(f"cannot write the plot to {path}: name a {_PLOT_SUFFIXES} file")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ExampleError("--plot needs matplotlib: pip install -e '.[examples]'") from None
    figure, axes = plt.subplots(figsize=(7, 4))
    axes.plot(losses, linewidth=0.6, alpha=0.5, label="minibatch loss")
    window = max(1, min(100, len(losses) // 10))
    if len(losses) >= window:
        means = np.convolve(losses, np.ones(window) / window, mode="valid")
        axes.plot(range(window - 1, len(losses)), means, label=f"mean of {window}")
    axes.set_xlabel("step")
    axes.set_ylabel("loss")
    axes.set_title(title)
    axes.legend()
    figure.tight_layout()
    try:
        with replacing(path) as handle:
            figure.savefig(handle, format=suffix, dpi=120)
    except (OSError, ValueError) as error:
        raise ExampleError(f"cannot write the plot to {path}: {error}") from None
    finally:
        plt.close(figure)


def report(route: str, trainer: Trainer, seconds: float, steps: int, checked: float | None) -> str:
    """One line on how the run went: route, compile time, ms per step, the oracle check."""
    parts = [f"route {route}"]
    if trainer.compile_seconds:
        parts.append(f"compile {trainer.compile_seconds:.1f} s")
    parts.append(f"{seconds / steps * 1000:.2f} ms/step")
    if route != "oracle" and checked is not None:
        parts.append(f"first steps within {checked:.2f} ulps of the oracle")
    return ", ".join(parts)
