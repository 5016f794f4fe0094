"""GPT-2, tiny: a 2-layer GPT-2 trained byte by byte on the makemore names, compiled, then sampled with a KV cache.

The model is ``gpt2.Gpt2`` (Hugging Face's names, the tied head, GELU in
its tanh form) at the ``tiny`` config: 2 layers, 2 heads, width 64,
context 64, and the 256-symbol byte vocabulary. The data is the names of
``examples/makemore/names.txt`` shuffled and joined with newlines (or any
UTF-8 text, ``--data FILE``), 90% to train and 10% to validate; each step
reads ``--batch`` random windows of the training text and predicts every
next byte. AdamW (decay on matrices only) is recorded into the graph and
runs through the shared harness (``--route``, the oracle check, tqdm,
``--plot``), with a linear warm-up and a cosine decay of the rate fed per
step. The validation loss is the mean over every full window of the
validation text; the sample is drawn by ``sampling.generate`` (prefill
and decode entries of one spec, the caches fed and returned).

Run: python examples/gpt2/train.py [--steps 2000] [--route iree|plan|oracle] [--plot loss.png] [--save tiny.safetensors]
Prints ``last-500 mean loss``, ``validation loss`` and ``sample`` as its last lines. ``--save`` writes the
weights under Hugging Face's GPT-2 names: ``generate.py --weights`` reads them back.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # examples/: _training
sys.path.insert(0, str(HERE))  # gpt2, bpe, corpus, sampling, ...

import hf_gpt2  # noqa: E402
import numpy as np  # noqa: E402
from _training import ExampleError, Reader, Trainer, check_against_oracle, parser, plot, report, train  # noqa: E402
from bpe import Bytes  # noqa: E402
from corpus import encoded, learning_rate, split, windows  # noqa: E402
from gpt2 import Config, record_generation, record_training  # noqa: E402
from sampling import Decoder, Sampling, generate  # noqa: E402

from topos import ToposError, checkpoint, init  # noqa: E402


def options():
    options = parser(__doc__.splitlines()[0], steps=2000)
    options.add_argument("--batch", type=int, default=16, help="windows per step (default 16)")
    options.add_argument("--layers", type=int, default=2)
    options.add_argument("--heads", type=int, default=2)
    options.add_argument("--width", type=int, default=64)
    options.add_argument("--context", type=int, default=64, help="window length and the model's context")
    options.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default 3e-3)")
    options.add_argument("--samples", type=int, default=4, help="rows of the sample (default 4)")
    options.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (0 is greedy)")
    options.add_argument("--top-k", type=int, default=None, help="sample among the k likeliest bytes only")
    options.add_argument("--data", help="a UTF-8 text file of your own to train on")
    options.add_argument("--save", metavar="PATH", help="write the trained weights (Hugging Face GPT-2 names)")
    return options


def main(argv=None) -> None:
    args = options().parse_args(argv)
    try:
        config = Config(layers=args.layers, heads=args.heads, width=args.width, context=args.context,
                        vocabulary=Bytes.vocabulary)
        config.check()
    except ValueError as error:
        raise ExampleError(f"{error}; pick --width divisible by --heads and positive sizes") from None
    tokens = Bytes()
    data = encoded(args.data, args.seed)
    train_data, validation = split(data, config.context)
    batches = init.Generator(args.seed)
    starts = [batches.integers((args.batch,), 0, len(train_data) - config.context) for _ in range(args.steps)]

    def feeds_of(step: int) -> dict:
        x, y = windows(train_data, starts[step % len(starts)], config.context)
        return {"tokens": x, "targets": y, "optim.lr": learning_rate(args, step)}

    network, (model, loss, updates) = record_training(config, args.batch, config.context, args.lr, seed=args.seed)
    checked = check_against_oracle(network, loss, updates, args.route, feeds_of, min(args.check, args.steps))
    trainer = Trainer(network, loss, updates, args.route)
    began = time.perf_counter()
    losses = train(trainer, feeds_of, args.steps, args.quiet, "gpt2 tiny")
    seconds = time.perf_counter() - began
    trained = trainer.table()

    count = (len(validation) - 1) // config.context
    x, y = windows(validation, np.arange(count) * config.context, config.context)
    evaluation, (_, validation_loss, _) = record_training(config, count, config.context, train=False)
    value = float(Reader(evaluation, [validation_loss], args.route)(evaluation.parameters(trained),
                                                                  {"tokens": x, "targets": y})[validation_loss])

    sampler, generation = record_generation(config, batch=args.samples)
    weights = sampler.parameters(trained)
    decoder = Decoder(sampler, generation, weights, args.route)
    prompt = np.full((args.samples, 1), ord("\n"), dtype=np.int64)
    drawn = generate(decoder, prompt, config.context - 1, Sampling(args.temperature, args.top_k),
                     init.Generator(args.seed + 1))
    words = [w for row in drawn for w in tokens.decode(row).split("\n")[:-1] if w]  # whole lines only
    if args.save:
        metadata = {"format": "pt", "config": json.dumps(hf_gpt2.hf_config(config))}
        checkpoint.save(args.save, weights, metadata=metadata)
    if args.plot:
        plot(losses, args.plot, f"GPT-2 tiny, bytes of names ({args.route})")
    print(report(args.route, trainer, seconds, args.steps, checked))
    print(f"last-500 mean loss: {np.mean(losses[-500:]):.4f}")
    print(f"validation loss: {value:.4f}")
    print("sample: " + " ".join(words))


if __name__ == "__main__":
    try:
        main()
    except ToposError as error:  # ExampleError, CheckpointError, ...: the message says what to do
        sys.exit(f"error: {error}")
