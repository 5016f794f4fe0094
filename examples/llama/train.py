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

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # examples/: _training
sys.path.insert(0, str(HERE.parent / "gpt2"))  # corpus, kv_cache, sampling: shared with the GPT-2 example
sys.path.insert(0, str(HERE))  # llama, hf_llama

import hf_llama  # noqa: E402
from _training import ExampleError, parser, positive, run  # noqa: E402
from byte_model import add_options, train_and_sample  # noqa: E402
from llama import Config, record_generation, record_training  # noqa: E402


def options():
    options = parser(__doc__.splitlines()[0], steps=2000)
    defaults = Config()
    for name in ("layers", "heads", "kv_heads", "width", "intermediate", "context"):
        options.add_argument(f"--{name.replace('_', '-')}", type=positive, default=getattr(defaults, name))
    options.add_argument("--tied", action="store_true", help="tie the output projection to the token table")
    return add_options(options, "Llama")


def main(argv=None) -> None:
    args = options().parse_args(argv)
    config = Config(layers=args.layers, heads=args.heads, kv_heads=args.kv_heads, width=args.width,
                    intermediate=args.intermediate, context=args.context, tied=args.tied)
    try:
        config.check()
    except ExampleError as error:
        raise ExampleError(f"{error}; change --width, --heads or --kv-heads") from None
    train_and_sample(args, config, record_training, record_generation, "Llama", hf_llama.hf_config)


if __name__ == "__main__":
    run(main)
