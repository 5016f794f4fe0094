"""A seeded mutation fuzzer for topos-opt: every mutant ends in output or a located diagnostic.

The seeds are modules topos emits for networks recorded with its public
API (topos IR from ``emit_mlir``, and StableHLO from ``emit_stablehlo``).
Each mutant (bytes flipped, lines deleted or repeated, tokens swapped,
numbers set to 0, -1 or huge, op names and SSA names changed, the text cut
short, non-UTF-8 bytes put in) runs through ``topos.dialect.opt.main``
in-process under a few pipelines. The contract (see ``dialect/opt.py``):
exit 0 with output, or exit 1 with an ``error:`` that names a place
(``file:line:col``); never a traceback, an internal error, or a topos pass
that crashed. The seed is fixed, so a failure names its mutant and its
command line, and reproduces.
"""

from __future__ import annotations

import functools
import io
import os
import random
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import pytest

pytest.importorskip("iree.compiler.ir")

import topos  # noqa: E402
from topos import Tape  # noqa: E402
from topos.dialect.opt import main  # noqa: E402

TOOL = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools", "topos-opt")
SEED = 20240611
DEFAULT_MUTANTS = 300  # about 10 s on 2 cores
SLOW_MUTANTS = 10000

LOWERING = "topos-fuse,topos-elect,topos-raise,topos-lower-to-stablehlo"
LOCATED_ERROR = re.compile(r"^\S.*:\d+:\d+: error: ", re.MULTILINE)
UNKNOWN_ERROR = re.compile(r"^<unknown>:0: error: ", re.MULTILINE)  # mlir-opt's form for loc(unknown)
# "crashed" is how run_pipeline reports a pass that raised a Python error:
# for the passes topos ships, a bug however it is worded.
FORBIDDEN = ("Traceback", "internal error", "crashed:")
# Flags that change how input is split, checked and printed, added to some runs.
# (--no-verify-each is not among them: it hands unverified IR to the passes,
# like mlir-opt's --mlir-very-unsafe-disable-verifier-on-parsing.)
FLAGS = ([],) * 6 + (["--split-input-file"], ["--verify-diagnostics"], ["--mlir-print-debuginfo"],
                     ["--mlir-print-op-generic"], ["--mlir-print-ir-after-all"])


# ---- the seeds: what topos emits ---------------------------------------------------------


def _walkthrough():
    def model(tape):
        w = tape.parameter(np.ones((2, 2), np.float32))
        x = tape.input(np.array([[1.0, 2.0]], np.float32))
        return ((x @ w).tanh() ** 2.0).sum()

    network, loss = Tape.record(model)
    return network.entry([loss]).lower()


def _mlp_with_gradient():
    def model(tape):
        rng = np.random.default_rng(0)
        x = tape.input(shape=(4, 3), name="x")
        w1 = tape.parameter(rng.standard_normal((3, 5)).astype(np.float32), name="fc1.weight")
        b1 = tape.parameter(np.zeros((5,), np.float32), name="fc1.bias")
        w2 = tape.parameter(rng.standard_normal((5, 2)).astype(np.float32), name="fc2.weight")
        hidden = (x @ w1 + b1.broadcast_along(0, 4)).tanh()
        loss = (hidden @ w2).log_softmax(1).sum()
        return loss, tape.differentiate(loss, [w1, b1, w2])

    network, (loss, adjoints) = Tape.record(model)
    return network.entry([loss, *adjoints.roots()]).lower()


def _conv():
    from topos.nn import functional as F

    def model(tape):
        rng = np.random.default_rng(1)
        x = tape.input(rng.standard_normal((1, 2, 4, 4)).astype(np.float32))
        w = tape.parameter(rng.standard_normal((2, 2, 3, 3)).astype(np.float32))
        return (F.conv2d(x, w, padding=1) ** 2.0).sum()

    network, loss = Tape.record(model)
    return network.entry([loss]).lower()


def _gather_scatter():
    def model(tape):
        table = tape.parameter(np.arange(12, dtype=np.float32).reshape(4, 3))
        picks = tape.input(topos.selection([0, 3, 3], 4))
        rows = table.gather(picks)
        back = rows.scatter(picks, 4)
        return (back * table).permute((1, 0)).sum_along(1).sum()

    network, loss = Tape.record(model)
    return network.entry([loss]).lower()


@functools.cache
def seeds() -> dict[str, str]:
    """Seed texts by name: topos IR of four networks (with locations, with an election), StableHLO."""
    plans = {"walkthrough": _walkthrough(), "mlp": _mlp_with_gradient(), "conv": _conv(),
             "gather": _gather_scatter()}
    # Without locations the mutations land on ops more often than on #loc lines.
    found = {name: plan.emit_mlir(debug_info=False) for name, plan in plans.items()}
    found["mlp.located"] = plans["mlp"].emit_mlir()  # names and roles of sources ride in locations
    found["conv.elected"] = _elected(found["conv"])  # what topos-raise reads back
    found["walkthrough.stablehlo"] = plans["walkthrough"].emit_stablehlo()
    found["gather.stablehlo"] = plans["gather"].emit_stablehlo(debug_info=True)
    return found


def _elected(text: str) -> str:
    status, out, err = run_mutant(text.encode(), ["-", "-p", "topos-fuse,topos-elect"])
    assert status == 0 and "topos.fusion_kind" in out, err
    return out


def loss_node(text: str) -> int:
    """The node index of the last rank-0 topos op: a target topos-differentiate accepts."""
    found = re.findall(r"node = (\d+) : i64.*-> tensor<f32>", text)
    return int(found[-1]) if found else 0


# ---- mutations --------------------------------------------------------------------------

NUMBERS = (b"0", b"-1", b"1", b"3", b"99999999999", b"9223372036854775807", b"18446744073709551616")
OP_NAMES = (b"topos.add", b"topos.sum", b"topos.leaf", b"topos.gather", b"topos.reshape", b"topos.map",
            b"topos.bogus", b"foo.bar", b"func.return", b"stablehlo.add", b"func.func")
BAD_BYTES = (b"\xff", b"\xc3", b"\x80", b"\xed\xa0\x80", b"\x00", b"\xf4\x90\x80\x80")
SNIPPETS = (b'axis = "x"', b"axis = -1 : i64", b"order = array<i64: 0, 0>", b"bogus = 1 : i64", b"node = -3 : i64",
            b"tensor<?x2xf32>", b"tensor<*xf32>", b"tensor<0x2xf32>", b"i32", b"!foo.bar", b"{", b"}", b"(", b")",
            b"return", b"^bb1:", b"@main", b'loc("x.py":1:2)', b"dense<1.0> : tensor<99999999999xf32>",
            b"tensor<99999999999x99999999999xf32>", b"memref<2xf32>", b"f16", b"\n// -----\n",
            b"// expected-error @+1 {{node}}\n", b"loc(unknown)")
TOKEN = re.compile(rb"%[\w#]+|@\w+|\"[^\"\n]*\"|[A-Za-z_][\w.$-]*|-?\d+(?:\.\d+)?(?:e[+-]?\d+)?|\S")


def _lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True) or [b""]


def _flip_byte(rng, data):
    if not data:
        return data
    i = rng.randrange(len(data))
    return data[:i] + bytes([data[i] ^ rng.randrange(1, 256)]) + data[i + 1 :]


def _delete_line(rng, data):
    lines = _lines(data)
    del lines[rng.randrange(len(lines))]
    return b"".join(lines)


def _duplicate_line(rng, data):
    lines = _lines(data)
    i = rng.randrange(len(lines))
    lines.insert(rng.randrange(len(lines) + 1), lines[i])
    return b"".join(lines)


def _swap_lines(rng, data):
    lines = _lines(data)
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    lines[i], lines[j] = lines[j], lines[i]
    return b"".join(lines)


def _swap_tokens(rng, data):
    spans = [m.span() for m in TOKEN.finditer(data)]
    if len(spans) < 2:
        return data
    (a, b), (c, d) = sorted(rng.sample(spans, 2))
    return data[:a] + data[c:d] + data[b:c] + data[a:b] + data[d:]


def _replace_match(rng, data, pattern: bytes, choices) -> bytes:
    matches = list(re.finditer(pattern, data))
    if not matches:
        return data
    m = rng.choice(matches)
    return data[: m.start()] + rng.choice(choices) + data[m.end() :]


def _change_number(rng, data):
    return _replace_match(rng, data, rb"(?<![\w.%#])\d+(?![\w.])", NUMBERS)


def _rename_op(rng, data):
    return _replace_match(rng, data, rb"\b(?:topos|stablehlo|func)\.\w+", OP_NAMES)


def _swap_ssa_name(rng, data):
    names = sorted(set(re.findall(rb"%\w+", data)))
    return _replace_match(rng, data, rb"%\w+", names) if names else data


def _change_dimension_everywhere(rng, data):
    # One extent changed in every type and attribute at once keeps more
    # mutants consistent, so they get past the verifier into the passes.
    extents = sorted(set(re.findall(rb"(?<=[<x])\d+(?=x)", data)))
    if not extents:
        return data
    old = rng.choice(extents)
    new = rng.choice(NUMBERS[1:] + (b"1", b"2", b"7"))
    return re.sub(rb"(?<![\w.%#-])" + old + rb"(?![\w.])", new, data)


def _renumber_node(rng, data):
    return _replace_match(rng, data, rb"node = \d+", [b"node = %d" % rng.randrange(40) for _ in range(3)])


def _truncate(rng, data):
    return data[: rng.randrange(len(data) + 1)]


def _insert_bad_bytes(rng, data):
    i = rng.randrange(len(data) + 1)
    return data[:i] + rng.choice(BAD_BYTES) + data[i:]


def _insert_snippet(rng, data):
    i = rng.randrange(len(data) + 1)
    return data[:i] + rng.choice(SNIPPETS) + data[i:]


def _replace_token(rng, data):
    spans = [m.span() for m in TOKEN.finditer(data)]
    if not spans:
        return data
    a, b = rng.choice(spans)
    return data[:a] + rng.choice(SNIPPETS + NUMBERS + OP_NAMES) + data[b:]


# Weighted towards mutations that keep the text parseable, so most mutants
# reach the verifiers and the passes rather than stopping at the parser.
MUTATIONS = (
    _flip_byte, _truncate, _insert_bad_bytes, _swap_tokens, _swap_lines, _duplicate_line,
    *(_change_number,) * 4, *(_change_dimension_everywhere,) * 3, _renumber_node,
    *(_rename_op,) * 2, *(_swap_ssa_name,) * 2, *(_delete_line,) * 2,
    *(_insert_snippet,) * 2, *(_replace_token,) * 2,
)


def mutate(rng: random.Random, data: bytes) -> tuple[bytes, list[str]]:
    """One to three mutations of ``data``, and their names."""
    names = []
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        mutation = rng.choice(MUTATIONS)
        data = mutation(rng, data)
        names.append(mutation.__name__[1:])
    return data, names


# ---- running ----------------------------------------------------------------------------


@dataclass
class Figures:
    ran: int = 0
    exit_0: int = 0
    exit_1: int = 0
    bad: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.ran} runs: {self.exit_0} exit 0, {self.exit_1} exit 1, {len(self.bad)} bad"


def verdict(data: bytes, status: int, out: str, err: str) -> str | None:
    """Why an outcome breaks the contract, or None when it keeps it."""
    broken = [word for word in FORBIDDEN if word in err]
    if broken:
        return f"stderr says {broken[0]!r}"
    if status == 0:
        return None if out.strip() else "exit 0 without output"
    if status == 1:
        if LOCATED_ERROR.search(err):
            return None
        # An error at an op the input itself placed at loc(unknown) has no better place.
        if b"loc(unknown)" in data and UNKNOWN_ERROR.search(err):
            return None
        return "exit 1 without a located error"
    return f"exit {status}"


def pipelines(name: str, text: str) -> list[list[str]]:
    """The command lines a seed's mutants run under: ones its unmutated text passes."""
    if name.endswith(".stablehlo"):
        return [["--topos-verify"], ["-p", "topos-lower-to-stablehlo,canonicalize,cse"]]
    found = [["--topos-verify"], ["-p", LOWERING], [f"--topos-differentiate=target={loss_node(text)}"],
             ["--topos-plan"]]
    if name.endswith(".elected"):  # topos-raise reads the election from the text
        found.append(["-p", "topos-raise,topos-lower-to-stablehlo"])
    return found


def run_mutant(data: bytes, argv: list[str]) -> tuple[int, str, str]:
    """topos-opt in-process: ``data`` on stdin; (status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, stdin=io.BytesIO(data), stdout=out, stderr=err)
    return status, out.getvalue(), err.getvalue()


def run_script(data: bytes, argv: list[str]) -> tuple[int, str, str]:
    """The same through the console script in a fresh process."""
    done = subprocess.run([sys.executable, TOOL, *argv], input=data, capture_output=True, check=False)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def fuzz(count: int, seed: int = SEED) -> Figures:
    """Run ``count`` mutants of the seeds, each under one pipeline chosen with them."""
    rng = random.Random(seed)
    corpus = sorted(seeds().items())
    figures = Figures()
    for number in range(count):
        name, text = rng.choice(corpus)
        mutant, mutations = mutate(rng, text.encode())
        argv = ["-", *rng.choice(pipelines(name, text)), *rng.choice(FLAGS)]
        status, out, err = run_mutant(mutant, argv)
        figures.ran += 1
        figures.exit_0 += status == 0
        figures.exit_1 += status == 1
        problem = verdict(mutant, status, out, err)
        if problem:
            figures.bad.append(
                f"mutant {number} of {name} ({', '.join(mutations)}): {problem}\n"
                f"  command: topos-opt {' '.join(argv)} < mutant\n"
                f"  stderr: {err.strip()[:600]}\n"
                f"  mutant: {mutant!r}"
            )
    return figures


def _check(count: int) -> None:
    started = time.perf_counter()
    figures = fuzz(count)
    print(f"topos-opt fuzzer, seed {SEED}: {figures} in {time.perf_counter() - started:.1f} s")
    assert not figures.bad, f"{figures}\n\n" + "\n\n".join(figures.bad[:10])
    # The mutations must reach both outcomes, or they test nothing.
    assert figures.exit_0 > count // 20 and figures.exit_1 > count // 4, figures


def test_mutants_end_in_output_or_a_located_error():
    _check(DEFAULT_MUTANTS)


@pytest.mark.slow
def test_many_mutants_end_in_output_or_a_located_error():
    _check(SLOW_MUTANTS)


def test_the_seeds_pass_every_pipeline():
    for name, text in seeds().items():
        for argv in pipelines(name, text):
            status, out, err = run_mutant(text.encode(), ["-", *argv])
            assert (status, err) == (0, ""), (name, argv, err)
            assert out.strip()


def test_the_console_script_ends_mutants_as_main_does():
    # In-process runs stand in for the script only if both end every input alike.
    rng = random.Random(SEED)
    corpus = sorted(seeds().items())
    chosen: dict[int, list] = {0: [], 1: []}
    while len(chosen[0]) < 2 or len(chosen[1]) < 2:
        name, text = rng.choice(corpus)
        mutant, _ = mutate(rng, text.encode())
        argv = ["-", *rng.choice(pipelines(name, text))]
        outcome = run_mutant(mutant, argv)
        if outcome[0] in chosen and len(chosen[outcome[0]]) < 2:
            chosen[outcome[0]].append((mutant, argv, outcome))
    chosen[1].append((b"\xff", ["-"], run_mutant(b"\xff", ["-"])))
    for mutant, argv, outcome in chosen[0] + chosen[1]:
        assert run_script(mutant, argv) == outcome, (argv, mutant)
