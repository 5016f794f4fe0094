"""What the tiny GPT-2 and Llama examples share: their common options, and train -> validate -> sample -> print.

Both train a byte-level model of the corpus (``corpus.py``) through the
harness, read the validation loss with a second recording of the model
(every full window of the validation text, one batch), draw a sample with
the prefill and decode entries (``sampling.generate``), optionally save
the weights under Hugging Face's names with the config in the metadata,
and print the same last lines. A model supplies its ``record_training``
(``config, batch, length, lr, seed=`` / ``train=False``) and
``record_generation`` (``config, batch=``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import numpy as np

from topos import checkpoint, init

from _training import Reader, fit, non_negative_number, output_path, plot, positive, rate
from bpe import Bytes
from corpus import encoded, learning_rate, split, windows
from sampling import Decoder, Sampling, generate


def add_options(options: argparse.ArgumentParser, names: str) -> argparse.ArgumentParser:
    """The options beside the model's sizes: batch, rate, sampling, data and --save (under ``names``' names)."""
    options.add_argument("--batch", type=positive, default=16, help="windows per step (default 16)")
    options.add_argument("--lr", type=rate, default=3e-3, help="peak learning rate (default 3e-3)")
    options.add_argument("--samples", type=positive, default=4, help="rows of the sample (default 4)")
    options.add_argument("--temperature", type=non_negative_number, default=1.0,
                         help="sampling temperature (0 is greedy)")
    options.add_argument("--top-k", type=positive, default=None, help="sample among the k likeliest bytes only")
    options.add_argument("--data", help="a UTF-8 text file of your own to train on")
    options.add_argument("--save", metavar="PATH", type=output_path,
                         help=f"write the trained weights (Hugging Face {names} names)")
    return options


def train_and_sample(args, config, record_training: Callable, record_generation: Callable, name: str,
                     hf_config: Callable[[object], dict]) -> None:
    """Train ``config`` on the corpus by ``args``, then print the report, the losses and a sample (and save)."""
    data = encoded(args.data, args.seed)
    train_data, validation = split(data, config.context)
    batches = init.Generator(args.seed)
    starts = [batches.integers((args.batch,), 0, len(train_data) - config.context) for _ in range(args.steps)]

    def feeds_of(step: int) -> dict:
        x, y = windows(train_data, starts[step % len(starts)], config.context)
        return {"tokens": x, "targets": y, "optim.lr": learning_rate(args, step)}

    network, (_, loss, updates) = record_training(config, args.batch, config.context, args.lr, seed=args.seed)
    trainer, losses, ran = fit(network, loss, updates, args, feeds_of, f"{name} tiny")
    trained = trainer.table()

    count = (len(validation) - 1) // config.context
    x, y = windows(validation, np.arange(count) * config.context, config.context)
    evaluation, (_, validation_loss, _) = record_training(config, count, config.context, train=False)
    value = float(Reader(evaluation, [validation_loss], args.route, args.target)(evaluation.parameters(trained),
                                                                  {"tokens": x, "targets": y})[validation_loss])

    sampler, generation = record_generation(config, batch=args.samples)
    weights = sampler.parameters(trained)
    prompt = np.full((args.samples, 1), ord("\n"), dtype=np.int64)
    drawn = generate(Decoder(sampler, generation, weights, args.route, args.target), prompt, config.context - 1,
                     Sampling(args.temperature, args.top_k), init.Generator(args.seed + 1))
    words = [w for row in drawn for w in Bytes().decode(row).split("\n")[:-1] if w]  # whole lines only
    if args.save:
        checkpoint.save(args.save, weights, metadata={"format": "pt", "config": json.dumps(hf_config(config))})
    if args.plot:
        plot(losses, args.plot, f"{name} tiny, bytes of names ({args.route})")
    print(ran)
    print(f"last-500 mean loss: {np.mean(losses[-500:]):.4f}")
    print(f"validation loss: {value:.4f}")
    print("sample: " + " ".join(words))
