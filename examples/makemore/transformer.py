"""makemore, the transformer: a small causal self-attention model over the last 8 characters, trained compiled.

Each of the 8 positions of a context window gets a token embedding plus a
position embedding (``nn.Embedding`` both; the positions are a leaf
selection 0..7). ``--layers`` pre-norm blocks follow (``x + attention(
LayerNorm(x))`` with ``nn.MultiHeadAttention(causal=True)``, then ``x +
Mlp(LayerNorm(x))`` with a GELU MLP four times as wide), a final
LayerNorm and a linear head to 27 logits at every position. Defaults: one
block, 2 heads of 16 (width 32), context 8, batch 32, AdamW at 5e-3 (a
tenth of it for the last fifth), 5000 steps.

Every position predicts the character after it, so one window gives 8
predictions: the targets are the window shifted by one, ending with the
window's next character. Windows start padded with '.' (index 0) before a
name begins; a position whose target is still padding has nothing to
predict and its target is ignored (label 27, ``ignore_index``). The
training loss is the mean cross-entropy over the remaining positions,
logits reshaped to ``[B*T, 27]``.

The spec holds a training entry (the loss, AdamW's updates) and an
evaluation entry over the same input: the per-position losses and the
next-character probabilities after the last position. The evaluation
entry reads the dev split a batch at a time (the dev loss is the same
mean as the training loss, summed on the host in float64) and draws the
samples: a window of 8, padded with '.', slides over each new character.

Run: python examples/makemore/transformer.py [--steps 5000] [--layers 1] [--heads 2] [--head-size 16] [--plot loss.png]
Prints ``last-500 mean loss``, ``dev loss`` and sampled names as its last lines.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/: _training
sys.path.insert(0, str(Path(__file__).resolve().parent))  # names, series

import numpy as np  # noqa: E402

import topos  # noqa: E402
import topos.nn.functional as F  # noqa: E402
from topos import Tape, nn, optim  # noqa: E402

from _training import Reader, fit, in_chunks, plot, positive, rate, run  # noqa: E402
from names import Names  # noqa: E402
from series import finish, parser, sample, windows  # noqa: E402


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention, then a GELU MLP, each around a residual."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = nn.MultiHeadAttention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Mlp([width, 4 * width, width], activation="gelu")

    def forward(self, x):
        x = x + self.attn(self.ln1(x), causal=True)
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    """Token and position embeddings, ``layers`` blocks, a final LayerNorm and the head (names as makemore's)."""

    def __init__(self, vocabulary: int, context: int, width: int, heads: int, layers: int):
        super().__init__()
        self.context = context
        self.token_embedding = nn.Embedding(vocabulary, width)
        self.position_embedding = nn.Embedding(context, width)
        self.blocks = nn.ModuleList([Block(width, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocabulary, bias=False)

    def forward(self, tokens):
        batch, length = tokens.shape
        positions = tokens.tape.leaf(topos.selection(np.arange(length), self.context))
        x = self.token_embedding(tokens) + self.position_embedding(positions).broadcast_along(0, batch)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))  # [batch, length, vocabulary]


def targets(names: Names, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Each position's next character: the window shifted by one, then the next; padding -> ``vocabulary`` (ignored)."""
    shifted = np.concatenate([xs[:, 1:], ys[:, None]], axis=1)
    shifted[:, :-1][xs[:, 1:] == 0] = names.vocabulary  # '.' inside a window is only ever padding
    return shifted


def recorder(names: Names, args):
    """One spec at the training batch size: (loss, updates, per-position losses, last-position probabilities)."""
    vocabulary, batch, context = names.vocabulary, args.batch, args.context

    def record(tape):
        model = Transformer(vocabulary, context, args.heads * args.head_size, args.heads, args.layers)
        tokens = tape.input(shape=(batch, context), extent=vocabulary, name="context")
        # A selection is only ever gather's index, never reshaped: the targets come in flat, [B*T].
        labels = tape.input(shape=(batch * context,), extent=vocabulary + 1, name="next")  # + 1: ignored
        logits = model(tokens)
        rows = logits.reshape((batch * context, vocabulary))
        loss = F.cross_entropy(rows, labels, ignore_index=vocabulary)
        optimizer = optim.AdamW(lr=args.lr)
        updates = optimizer.record(tape.differentiate(loss, model.parameters()))
        each = F.cross_entropy(rows, labels, reduction="none", ignore_index=vocabulary)  # 0 where ignored
        last = F.softmax(logits.narrow(1, context - 1, 1).reshape((batch, vocabulary)))
        return loss, updates, each, last

    return Tape.record(record, seed=args.seed)


def learning_rate(args, step: int) -> float:
    """``--lr``, then a tenth of it for the last fifth of the steps."""
    return args.lr / 10 if step >= int(0.8 * args.steps) else args.lr


def command_line() -> argparse.ArgumentParser:
    """The options: the series' (the harness's, --samples, --data) and this model's."""
    options = parser(__doc__.splitlines()[0], steps=5000)
    options.add_argument("--context", type=positive, default=8)
    options.add_argument("--layers", type=positive, default=1)
    options.add_argument("--heads", type=positive, default=2)
    options.add_argument("--head-size", type=positive, default=16, help="width = heads x head size (default 2 x 16)")
    options.add_argument("--batch", type=positive, default=32)
    options.add_argument("--lr", type=rate, default=5e-3, help="AdamW's rate (default 5e-3)")
    return options


def main(argv=None) -> None:
    args = command_line().parse_args(argv)

    names, (xs, ys), (dev_x, dev_y), picks = windows(args, args.context)
    train_targets, dev_targets = targets(names, xs, ys), targets(names, dev_x, dev_y)

    def feeds_of(step: int) -> dict:
        rows = picks[step % len(picks)]
        return {"context": xs[rows], "next": train_targets[rows].reshape(-1), "optim.lr": learning_rate(args, step)}

    network, (loss, updates, each, last) = recorder(names, args)
    trainer, losses, ran = fit(network, loss, updates, args, feeds_of, "makemore transformer")
    trained = trainer.table()

    evaluation = Reader(network, [each, last], args.route, args.target)

    def read(root, context, following=None):
        """One batch of the evaluation entry; sampling has no targets, so it feeds '.' (their losses go unread)."""
        following = np.zeros(context.shape, np.int64) if following is None else following
        outputs = evaluation(trained, {"context": context, "next": following.reshape(-1)})
        return np.asarray(outputs[root], np.float64).reshape(len(context), -1)

    per_position = in_chunks(lambda c, f: read(each, c, f), [dev_x, dev_targets], args.batch)  # 0 where ignored
    dev_value = float(per_position.sum() / (dev_targets != names.vocabulary).sum())
    words = sample(names, lambda window: in_chunks(lambda c: read(last, c), [window], args.batch),
                   args.samples, args.context, args.seed)
    if args.plot:
        blocks = f"{args.layers} block" + ("s" if args.layers > 1 else "")
        plot(losses, args.plot, f"makemore transformer ({blocks}, {args.route})")
    finish(ran, losses, dev_value, words)


if __name__ == "__main__":
    run(main)
