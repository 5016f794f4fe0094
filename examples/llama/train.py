"""Llama, tiny: a 2-layer Llama (RoPE, SwiGLU, grouped-query attention) trained byte by byte on the names, then sampled.

The model is ``llama.Llama`` at the tiny config: 2 layers, 4 query heads
sharing 2 key/value heads, width 64, SwiGLU width 192, context 64, the
256-symbol byte vocabulary, an untied output projection (``--tied`` ties
it). The data, the schedule and the harness are the GPT-2 example's
(``examples/gpt2/corpus.py``: the makemore names shuffled and joined with
newlines, 90/10; ``--route``, the oracle check, tqdm, ``--plot``); AdamW is
recorded into the graph. The sample runs the prefill and decode entries
of one spec with the rotated keys cached (``examples/gpt2/sampling.py``).

Run: python examples/llama/train.py [--steps 2000] [--route iree|plan|oracle] [--plot loss.png] [--save FILE]
Prints ``last-500 mean loss``, ``validation loss`` and ``sample`` as its last lines. ``--save`` writes the
weights under Hugging Face's Llama names, the config in the metadata: ``generate.py --weights`` reads them.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # examples/: _training
sys.path.insert(0, str(HERE.parent / "gpt2"))  # corpus, kv_cache, sampling: shared with the GPT-2 example
sys.path.insert(0, str(HERE))  # llama, hf_llama

import hf_llama  # noqa: E402
import numpy as np  # noqa: E402
from _training import ExampleError, Reader, Trainer, check_against_oracle, parser, plot, report, train  # noqa: E402
from corpus import encoded, learning_rate, split, windows  # noqa: E402
from llama import Config, record_generation, record_training  # noqa: E402
from sampling import Decoder, Sampling, generate  # noqa: E402

from topos import ToposError, checkpoint, init  # noqa: E402


def options():
    options = parser(__doc__.splitlines()[0], steps=2000)
    defaults = Config()
    options.add_argument("--batch", type=int, default=16, help="windows per step (default 16)")
    for name in ("layers", "heads", "kv_heads", "width", "intermediate", "context"):
        options.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    options.add_argument("--tied", action="store_true", help="tie the output projection to the token table")
    options.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default 3e-3)")
    options.add_argument("--samples", type=int, default=4, help="rows of the sample (default 4)")
    options.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (0 is greedy)")
    options.add_argument("--top-k", type=int, default=None, help="sample among the k likeliest bytes only")
    options.add_argument("--data", help="a UTF-8 text file of your own to train on")
    options.add_argument("--save", metavar="PATH", help="write the trained weights (Hugging Face Llama names)")
    return options


def main(argv=None) -> None:
    args = options().parse_args(argv)
    config = Config(layers=args.layers, heads=args.heads, kv_heads=args.kv_heads, width=args.width,
                    intermediate=args.intermediate, context=args.context, tied=args.tied)
    try:
        config.check()
    except ValueError as error:
        raise ExampleError(f"{error}; change --width, --heads or --kv-heads") from None
    data = encoded(args.data, args.seed)
    train_data, validation = split(data, config.context)
    batches = init.Generator(args.seed)
    starts = [batches.integers((args.batch,), 0, len(train_data) - config.context) for _ in range(args.steps)]

    def feeds_of(step: int) -> dict:
        x, y = windows(train_data, starts[step % len(starts)], config.context)
        return {"tokens": x, "targets": y, "optim.lr": learning_rate(args, step)}

    network, (_, loss, updates) = record_training(config, args.batch, config.context, args.lr, seed=args.seed)
    checked = check_against_oracle(network, loss, updates, args.route, feeds_of, min(args.check, args.steps))
    trainer = Trainer(network, loss, updates, args.route)
    began = time.perf_counter()
    losses = train(trainer, feeds_of, args.steps, args.quiet, "llama tiny")
    seconds = time.perf_counter() - began
    trained = trainer.table()

    count = (len(validation) - 1) // config.context
    x, y = windows(validation, np.arange(count) * config.context, config.context)
    evaluation, (_, validation_loss, _) = record_training(config, count, config.context, train=False)
    value = float(Reader(evaluation, [validation_loss], args.route)(evaluation.parameters(trained),
                                                                  {"tokens": x, "targets": y})[validation_loss])

    sampler, generation = record_generation(config, batch=args.samples)
    weights = sampler.parameters(trained)
    prompt = np.full((args.samples, 1), ord("\n"), dtype=np.int64)
    drawn = generate(Decoder(sampler, generation, weights, args.route), prompt, config.context - 1,
                     Sampling(args.temperature, args.top_k), init.Generator(args.seed + 1))
    text = [bytes(int(b) for b in row).decode("utf-8", errors="replace") for row in drawn]
    words = [w for row in text for w in row.split("\n")[:-1] if w]  # whole lines only
    if args.save:
        checkpoint.save(args.save, weights, metadata={"format": "pt", "config": json.dumps(hf_llama.hf_config(config))})
    if args.plot:
        plot(losses, args.plot, f"Llama tiny, bytes of names ({args.route})")
    print(report(args.route, trainer, seconds, args.steps, checked))
    print(f"last-500 mean loss: {np.mean(losses[-500:]):.4f}")
    print(f"validation loss: {value:.4f}")
    print("sample: " + " ".join(words))


if __name__ == "__main__":
    try:
        main()
    except ToposError as error:  # ExampleError, CheckpointError, ...: the message says what to do
        sys.exit(f"error: {error}")
