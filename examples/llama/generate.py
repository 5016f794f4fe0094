"""Llama generation with a KV cache from Hugging Face weights at your path (what train.py --save wrote, or a hub model).

``--weights`` names a ``model.safetensors`` in ``LlamaForCausalLM``'s
format with its ``config.json`` beside it (or the config in its metadata,
as ``train.py --save`` writes). There is no SentencePiece here: the
prompt is bytes (``--prompt``, for the byte-level models this example
trains) or token ids (``--ids 1,15043``, for any other vocabulary; the
new ids are printed). Nothing is downloaded.

Run: python examples/llama/generate.py --weights tiny.safetensors --prompt "an" [--tokens 20] [--temperature 0]
     [--route iree|plan|oracle] [--target vulkan]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # examples/: _training
sys.path.insert(0, str(HERE.parent / "gpt2"))  # kv_cache, sampling
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402

from topos import init  # noqa: E402

import hf_llama  # noqa: E402
from _training import (  # noqa: E402
    ExampleError,
    add_reading_options,
    non_negative_number,
    positive,
    reading,
    run,
    seed_value,
)
from llama import record_generation  # noqa: E402
from sampling import Decoder, Sampling, generate  # noqa: E402

BYTES = 256  # the vocabulary of the byte-level models train.py writes, the only one --prompt can spell


def options() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--weights", metavar="PATH", required=True, help="a Llama model.safetensors")
    options.add_argument("--prompt", default="\n",
                         help="text, as bytes, for a model of the 256 byte tokens (default a newline)")
    options.add_argument("--ids", help="the prompt as comma-separated token ids instead")
    options.add_argument("--tokens", type=positive, default=40, help="new tokens (default 40)")
    options.add_argument("--temperature", type=non_negative_number, default=1.0, help="0 is greedy (default 1)")
    options.add_argument("--top-k", type=positive, default=None, help="sample among the k likeliest tokens")
    options.add_argument("--seed", type=seed_value, default=42)
    add_reading_options(options, "generates")
    return options


def main(argv=None) -> list[int]:
    args = options().parse_args(argv)
    config = hf_llama.config_of(args.weights)
    if args.ids is None and config.vocabulary != BYTES:
        # A prompt's bytes are ids of another vocabulary's tokens, and its new ids no bytes: the text would be noise.
        raise ExampleError(f"the model has {config.vocabulary} tokens, not the {BYTES} bytes --prompt is read as; "
                           "pass the prompt as token ids: --ids 1,15043")
    try:
        prompt = [int(i) for i in args.ids.split(",")] if args.ids is not None else list(args.prompt.encode("utf-8"))
    except ValueError:
        raise ExampleError(f"--ids must be comma-separated integers, got {args.ids!r}") from None
    if not prompt or not all(0 <= i < config.vocabulary for i in prompt):
        raise ExampleError(f"pass a non-empty prompt of ids in 0..{config.vocabulary - 1}")
    if len(prompt) + args.tokens > config.context:
        raise ExampleError(f"the prompt ({len(prompt)} tokens) and {args.tokens} new tokens need "
                           f"{len(prompt) + args.tokens} positions, but the model's context is {config.context}")
    began = time.perf_counter()
    network, generation = record_generation(config, length=len(prompt) + args.tokens, draw=False)
    decoder = Decoder(network, generation, hf_llama.load(args.weights, network, config), args.route,
                      args.target)
    ready = time.perf_counter()
    drawn = generate(decoder, np.array([prompt]), args.tokens, Sampling(args.temperature, args.top_k),
                     init.Generator(args.seed))[0]
    seconds = time.perf_counter() - ready - decoder.compile_seconds
    if args.ids is not None:
        print("ids: " + ",".join(str(int(i)) for i in drawn))
    else:
        print(args.prompt + bytes(int(b) for b in drawn).decode("utf-8", errors="replace"))
    print(f"route {reading(args)}: record and load {ready - began:.1f} s, compile {decoder.compile_seconds:.1f} s, "
          f"{args.tokens / seconds:.1f} tokens/s")
    return [int(i) for i in drawn]


if __name__ == "__main__":
    run(main)
