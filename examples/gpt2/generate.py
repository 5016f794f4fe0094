"""GPT-2 text generation with a KV cache: Hugging Face weights from your path (or random ones), compiled.

Reads a GPT-2 ``model.safetensors`` in Hugging Face's format (``--weights``:
the released 124M to 1558M, or what ``train.py --save`` wrote), its
tokenizer from a folder holding ``vocab.json`` and ``merges.txt``
(``--tokenizer``; bytes without one), and continues ``--prompt``. Nothing
is downloaded: fetch the files yourself (for example the ``gpt2``
repository on the Hugging Face hub) and point at them. The config comes
from the file (``--config auto``: ``config.json`` beside it, else its
shapes), or name one (``tiny``, ``124M``, ...; random GPT-2 init without
``--weights``).

One recording holds the prefill graph (the prompt, padded to the cache
length) and the decode graph (one token, its position and the caches as
fed inputs); they compile as two entries over one device-resident copy of
the weights (``sampling.Decoder``). Sampling is greedy at
``--temperature 0``, else softmax at that temperature over the
``--top-k`` likeliest tokens.

Run: python examples/gpt2/generate.py --weights gpt2/model.safetensors --tokenizer gpt2/ --prompt "Hello, I'm"
     [--tokens 40] [--temperature 0.8 --top-k 40] [--route iree|plan|oracle] [--target vulkan]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # examples/: _training
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402

from topos import init  # noqa: E402

import bpe  # noqa: E402
import hf_gpt2  # noqa: E402
from _training import (  # noqa: E402
    ExampleError,
    add_reading_options,
    non_negative_number,
    positive,
    reading,
    run,
    seed_value,
)
from gpt2 import PRESETS, Config, record_generation  # noqa: E402
from sampling import Decoder, Sampling, generate  # noqa: E402


def options() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--weights", metavar="PATH", help="a GPT-2 model.safetensors (Hugging Face names)")
    options.add_argument("--config", default="auto", choices=("auto", *PRESETS),
                         help="auto: the file's sizes (tiny without --weights)")
    options.add_argument("--tokenizer", metavar="FOLDER", help="the folder of GPT-2's vocab.json and merges.txt")
    options.add_argument("--prompt", default="\n", help="the text to continue (default a newline)")
    options.add_argument("--tokens", type=positive, default=40, help="new tokens per row (default 40)")
    options.add_argument("--samples", type=positive, default=1, help="rows generated at once (default 1)")
    options.add_argument("--temperature", type=non_negative_number, default=1.0, help="0 is greedy (default 1)")
    options.add_argument("--top-k", type=positive, default=None, help="sample among the k likeliest tokens")
    options.add_argument("--seed", type=seed_value, default=42, help="seed of the sampling (and of random weights)")
    add_reading_options(options, "generates")
    return options


def choose_config(args) -> Config:
    if args.config != "auto":
        return Config.preset(args.config)
    return hf_gpt2.config_of(args.weights) if args.weights else Config.preset("tiny")


def main(argv=None) -> list[str]:
    args = options().parse_args(argv)
    config = choose_config(args)
    if args.tokenizer is None and config.vocabulary > bpe.Bytes.vocabulary:
        # Refused now: generating in full and then failing to decode an id past 255 throws the run away.
        raise ExampleError(f"the model has {config.vocabulary} tokens but no --tokenizer was given (bytes: "
                           f"{bpe.Bytes.vocabulary}); pass --tokenizer FOLDER")
    tokenizer = bpe.load(args.tokenizer)
    if tokenizer.vocabulary > config.vocabulary:
        raise ExampleError(f"the tokenizer has {tokenizer.vocabulary} tokens but the model only "
                           f"{config.vocabulary}; pass the tokenizer the weights were trained with")
    prompt = tokenizer.encode(args.prompt)
    if not prompt:
        raise ExampleError("the prompt encodes to no tokens; pass a non-empty --prompt")
    if len(prompt) + args.tokens > config.context:
        raise ExampleError(f"the prompt ({len(prompt)} tokens) and {args.tokens} new tokens need "
                           f"{len(prompt) + args.tokens} positions, but the model's context is {config.context}; "
                           "shorten the prompt or lower --tokens")
    began = time.perf_counter()
    network, generation = record_generation(config, batch=args.samples, length=len(prompt) + args.tokens,
                                            seed=args.seed, draw=args.weights is None)
    table = hf_gpt2.load(args.weights, network, config) if args.weights else network.parameters()
    decoder = Decoder(network, generation, table, args.route, args.target)
    ready = time.perf_counter()
    drawn = generate(decoder, np.tile(prompt, (args.samples, 1)), args.tokens,
                     Sampling(args.temperature, args.top_k), init.Generator(args.seed))
    done = time.perf_counter()
    texts = [args.prompt + tokenizer.decode(row) for row in drawn]
    for text in texts:
        print(text)
        print("---")
    running = done - ready - decoder.compile_seconds
    print(f"route {reading(args)}: record and load {ready - began:.1f} s, compile {decoder.compile_seconds:.1f} s, "
          f"{args.tokens * args.samples / running:.1f} tokens/s")
    return texts


if __name__ == "__main__":
    run(main)
