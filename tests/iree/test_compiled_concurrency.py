"""Threads sharing one compiled plan, each with its own parameter table and feeds, get the serial bits."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import topos.nn.functional as F
from topos import Tape, nn

from iree_support import compile_cache  # noqa: F401  (fixture)

THREADS = 8


@pytest.mark.parametrize("driver, storage", [("local-sync", None), ("local-task", None), ("local-task", True)])
def test_threads_sharing_a_compiled_plan_get_the_serial_bits(driver, storage):  # True: the transient storage path
    def record(tape):
        model = nn.Mlp([6, 16, 3])
        loss = F.cross_entropy(model(tape.input(shape=(8, 6), name="x")),
                               tape.input(shape=(8,), extent=3, name="labels"))
        return loss, tape.differentiate(loss, model.parameters())

    network, (loss, adjoints) = Tape.record(record)
    compiled = network.entry(adjoints.roots()).lower().compile("llvm-cpu", driver=driver, transient_storage=storage)

    def work(k):
        rng = np.random.default_rng(k)
        table = network.parameters().map(lambda a: (a * (1 + 0.1 * k)).astype(a.dtype))
        feeds = {"x": rng.standard_normal((8, 6)).astype(np.float32), "labels": rng.integers(0, 3, 8)}
        run = compiled.forward(table, feeds)
        return [run[s].tobytes() for s in adjoints.roots()]

    serial = [work(k) for k in range(THREADS)]
    # loads under the race
    fresh = network.entry(adjoints.roots()).lower().compile("llvm-cpu", driver=driver, transient_storage=storage)
    compiled = fresh
    barrier = threading.Barrier(THREADS)

    def together(k):
        barrier.wait()
        return work(k)

    with ThreadPoolExecutor(THREADS) as pool:
        assert list(pool.map(together, range(THREADS))) == serial
