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

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # examples/: _training
sys.path.insert(0, str(HERE))  # gpt2, bpe, corpus, sampling, ...

import hf_gpt2  # noqa: E402
from _training import ExampleError, parser, positive, run  # noqa: E402
from bpe import Bytes  # noqa: E402
from byte_model import add_options, train_and_sample  # noqa: E402
from gpt2 import Config, record_generation, record_training  # noqa: E402


def options():
    options = parser(__doc__.splitlines()[0], steps=2000)
    options.add_argument("--layers", type=positive, default=2)
    options.add_argument("--heads", type=positive, default=2)
    options.add_argument("--width", type=positive, default=64)
    options.add_argument("--context", type=positive, default=64, help="window length and the model's context")
    return add_options(options, "GPT-2")


def main(argv=None) -> None:
    args = options().parse_args(argv)
    try:
        config = Config(layers=args.layers, heads=args.heads, width=args.width, context=args.context,
                        vocabulary=Bytes.vocabulary)
        config.check()
    except ExampleError as error:
        raise ExampleError(f"{error}; pick --width divisible by --heads and positive sizes") from None
    train_and_sample(args, config, record_training, record_generation, "GPT-2", hf_gpt2.hf_config)


if __name__ == "__main__":
    run(main)
