"""Data-parallel training on XLA: the makemore MLP's training step with its batch split over N devices.

The step is the recording of ``examples/makemore/mlp.py`` (embedding,
tanh hidden layer, cross-entropy, SGD in the graph), planned and emitted
as StableHLO once, and run unchanged by XLA through
``topos.interop.jax.to_jax``. The same jitted step runs twice from the
same weights on the same batches:

* on one device, and
* on a ``Mesh`` of ``--devices`` devices, each batch split along its rows
  (``PartitionSpec("batch")``) and every parameter replicated
  (``PartitionSpec()``). XLA partitions the one program and adds the
  all-reduces the gradient sums need.

The two agree within the envelope, not bit for bit: splitting the batch
changes the order in which each gradient's sum is added. The example
grades the first sharded step node by node against the oracle
(``topos.interop.jax.grade``: the envelopes IREE is held to), trains
``--steps`` steps both ways, prints the largest relative difference of
the parameters, and times a step on 1, 2 and 4 devices (``--timing``).

On a CPU, ``--devices N`` splits the host into N XLA devices
(``--xla_force_host_platform_device_count``, set before jax loads); on
a GPU host jax's devices are the GPUs and the flag changes nothing.

Run: python examples/data_parallel.py [--devices 2] [--steps 500] [--batch 256] [--timing 1,2,4]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # _training
sys.path.insert(0, str(HERE / "makemore"))  # mlp, names, series

from _training import positive, run, seed_value  # noqa: E402  (topos only: jax must not be imported before --devices)

# XLA's CPU client runs every host device's share of an all-reduce on one shared thread pool: past a few
# hundred devices their rendezvous stalls (512 aborted after 80 s on 2 cores), and 65,536 hang at start-up.
MOST_DEVICES = 256


def _device_count(text: str) -> int:
    count = positive(text)
    if count > MOST_DEVICES:
        raise argparse.ArgumentTypeError(f"must be at most {MOST_DEVICES} devices (XLA stalls on more host "
                                         f"devices), got {text}")
    return count


def _counts(text: str) -> list[int]:
    """``--timing``: comma-separated device counts, each a positive integer (empty: no timing)."""
    try:
        return [_device_count(n) for n in text.split(",") if n.strip()]
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"takes device counts separated by commas (e.g. 1,2,4), each in "
                                         f"1..{MOST_DEVICES}, got {text!r}") from None


def command_line() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--devices", type=_device_count, default=2,
                         help=f"devices the sharded step runs on (default 2; at most {MOST_DEVICES}: on a CPU, "
                              "XLA's all-reduce stalls when the host is split into more)")
    options.add_argument("--steps", type=positive, default=500, help="training steps of each run (default 500)")
    options.add_argument("--batch", type=positive, default=256,
                         help="rows per step, split over the devices (default 256)")
    options.add_argument("--context", type=positive, default=3)
    options.add_argument("--embedding", type=positive, default=10)
    options.add_argument("--hidden", type=positive, default=200)
    options.add_argument("--timing", type=_counts, default="1,2,4",
                         help="device counts to time a step on (default 1,2,4; empty for none)")
    options.add_argument("--timing-steps", type=positive, default=100, help="steps in a timed round (default 100)")
    options.add_argument("--timing-rounds", type=positive, default=5,
                         help="timed rounds per device count (default 5)")
    options.add_argument("--seed", type=seed_value, default=42)
    options.add_argument("--data", help="a names file of your own (one lowercase name per line)")
    return options


def _split_host(count: int) -> None:
    """Make XLA's CPU client expose ``count`` devices; only works before jax initialises."""
    if "jax" in sys.modules:
        raise SystemExit("error: jax was imported before --devices could split the host; run this file directly")
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    os.environ["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={count}"])


def main(argv=None) -> None:
    args = command_line().parse_args(argv)
    timing = args.timing
    counts = sorted({1, args.devices, *timing})
    for n in counts:
        if args.batch % n:
            raise SystemExit(f"error: --batch {args.batch} does not split over {n} devices; pick a multiple of {n}")
    _split_host(max(counts))

    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from topos.interop.jax import grade, to_jax

    from mlp import learning_rate, recorder
    from series import windows

    if len(jax.devices()) < max(counts):
        raise SystemExit(f"error: jax sees {len(jax.devices())} devices, {max(counts)} needed")
    settings = argparse.Namespace(**vars(args), optimizer="sgd")
    names, (xs, ys), _, picks = windows(settings, args.context)
    network, (loss, updates) = recorder(names, settings, args.batch, "sgd")
    entry = network.entry(updates.roots(loss))
    began = time.perf_counter()
    function = to_jax(entry.lower())
    print(f"makemore MLP, context {args.context}, embedding {args.embedding}, hidden {args.hidden}, "
          f"batch {args.batch}: {len(function.parameters)} parameters, emitted and exported in "
          f"{time.perf_counter() - began:.2f} s")
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}: {len(jax.devices())} devices")
    step = function.training_step(updates)
    start = function.parameter_arrays(network.parameters())

    def feeds_of(k: int) -> dict:
        rows = picks[k % len(picks)]
        return {"context": xs[rows], "next": ys[rows], "optim.lr": learning_rate(settings, k)}

    def compiled_on(count: int):
        """The jitted step on the first ``count`` devices: batch rows split, parameters replicated."""
        mesh = Mesh(np.array(jax.devices()[:count]), ("batch",))
        replicated = NamedSharding(mesh, P())
        rows = NamedSharding(mesh, P("batch"))
        inputs = tuple(rows if network.node(s).shape[:1] == (args.batch,) else replicated for s in function.inputs)
        parameters = (replicated,) * len(function.parameters)
        jitted = jax.jit(step, in_shardings=(parameters, inputs), out_shardings=(parameters, None))
        return jitted, parameters, inputs

    def train(count: int, steps: int):
        jitted, parameter_sharding, input_sharding = compiled_on(count)
        state = jax.device_put(start, parameter_sharding)
        losses = []
        for k in range(steps):
            state, results = jitted(state, jax.device_put(function.input_arrays(feeds_of(k)), input_sharding))
            # Wait for each step: XLA's CPU client can deadlock when several sharded steps are in flight on
            # more host devices than cores (the waiting devices of one step hold the threads another needs).
            jax.block_until_ready(state)
            losses.append(results[0])
        if count > 1:  # what XLA made of the one program: collectives, and where the weights live
            batch = jax.device_put(function.input_arrays(feeds_of(0)), input_sharding)
            collectives = jitted.lower(state, batch).compile().as_text().count("all-reduce(")
            holders = sorted({device.id for array in state for device in array.sharding.device_set})
            print(f"on {count} devices XLA partitioned the step with {collectives} "
                  f"all-reduce{'' if collectives == 1 else 's'}; every parameter is replicated on devices {holders}")
        return [np.asarray(a) for a in state], [float(v) for v in losses]

    def worst_relative(got, want) -> float:
        """max over parameters of max |got - want| / max |want|."""
        return max(float(np.max(np.abs(g.astype(np.float64) - w)) / max(float(np.max(np.abs(w))), 1e-30))
                   for g, w in zip(got, want))

    # A sharded step, every node graded against the oracle kernel on the operands XLA gave it, with the
    # envelopes IREE is held to: from the initial weights, and again from the weights after training.
    mesh = Mesh(np.array(jax.devices()[:args.devices]), ("batch",))
    split = {s: NamedSharding(mesh, P("batch")) for s in function.inputs if network.node(s).shape[:1] == (args.batch,)}
    split.update({s: NamedSharding(mesh, P()) for s in function.parameters})

    def graded_step(table, k: int, when: str) -> None:
        graded = grade(entry, table, feeds_of(k), shardings=split)
        worst = ", ".join(f"{key} {value:.2f}" for key, value in sorted(graded.worst().items()) if value)
        print(f"{when}: the step on {args.devices} devices graded against the oracle, {len(graded.reports)} nodes, "
              f"{len(graded.failures())} outside their envelopes (worst in each envelope's unit: {worst})")
        if not graded.ok:
            raise SystemExit("error: a node of the sharded step left its envelope:\n"
                             + "\n".join(str(r) for r in graded.failures()[:5]))

    graded_step(network.parameters(), 0, "step 0")
    eps = float(np.finfo(np.float32).eps)
    single, single_losses = train(1, args.steps)
    sharded, sharded_losses = train(args.devices, args.steps)
    drift = worst_relative(sharded, single)
    print(f"after {args.steps} steps: loss {single_losses[-1]:.4f} on 1 device, {sharded_losses[-1]:.4f} on "
          f"{args.devices}; max relative difference of the parameters {drift:.3g} ({drift / eps:.1f} eps of "
          f"each parameter's largest magnitude)")
    graded_step(function.as_parameters(sharded, network.parameters()), args.steps, f"step {args.steps}")

    if timing:
        # Rounds over the device counts in turn, the best round kept: background load on a shared machine
        # slows some rounds, and the fastest is the closest to what the program itself costs.
        print(f"\nper-step time: the best of {args.timing_rounds} rounds of {args.timing_steps} steps, each step "
              "waited for, feeds copied to the devices each step")
        print(f"{'devices':>8} {'ms/step':>9} {'vs 1':>6}")
        runners = {}
        for count in timing:
            jitted, parameter_sharding, input_sharding = compiled_on(count)
            state = jax.device_put(start, parameter_sharding)
            state, _ = jitted(state, jax.device_put(function.input_arrays(feeds_of(0)), input_sharding))  # compile
            jax.block_until_ready(state)
            runners[count] = [jitted, input_sharding, state]
        batches = [function.input_arrays(feeds_of(k)) for k in range(args.timing_steps)]
        times = {count: float("inf") for count in timing}
        for _ in range(args.timing_rounds):
            for count, runner in runners.items():
                jitted, input_sharding, state = runner
                began = time.perf_counter()
                for batch in batches:
                    state, _ = jitted(state, jax.device_put(batch, input_sharding))
                    jax.block_until_ready(state)  # one step at a time (see train)
                times[count] = min(times[count], (time.perf_counter() - began) / len(batches) * 1000)
                runner[2] = state
        for count, per_step in times.items():
            ratio = f"{per_step / times[1]:>5.2f}x" if 1 in times else "     -"
            print(f"{count:>8} {per_step:>9.3f} {ratio}")

if __name__ == "__main__":
    run(main)
