"""The concurrency contract: a network, an entry and a plan are shared by threads; reopening is atomic.

Specs and plans hold no state (rule 1), so eight threads running one of
them with their own parameter tables and feeds get the bits a serial run
gets. Recording is per tape: the recording in progress is per thread.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import topos.nn.functional as F
from topos import Numerics, SealedError, Tape, nn

THREADS = 8


def _model():
    def record(tape):
        model = nn.Mlp([6, 16, 3])
        x = tape.input(shape=(8, 6), name="x")
        labels = tape.input(shape=(8,), extent=3, name="labels")
        loss = F.cross_entropy(model(x), labels)
        return loss, tape.differentiate(loss, model.parameters())
    return Tape.record(record)


def _work(k, network):
    rng = np.random.default_rng(k)
    table = network.parameters().map(lambda a: (a * (1 + 0.1 * k)).astype(a.dtype))
    feeds = {"x": rng.standard_normal((8, 6)).astype(np.float32), "labels": rng.integers(0, 3, 8)}
    return table, feeds


def _together(fn):
    barrier = threading.Barrier(THREADS)

    def start(k):
        barrier.wait()  # every thread starts at once, to give a race its chance
        return fn(k)

    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(start, range(THREADS)))


def test_threads_sharing_a_network_and_its_plans_get_the_serial_bits():
    network, (loss, adjoints) = _model()
    plans = {numerics: network.entry(adjoints.roots(), numerics=numerics).lower()
             for numerics in (Numerics.EXACT, Numerics.FAST)}
    roots = adjoints.roots()

    def run_all(k):
        table, feeds = _work(k, network)
        oracle = network.forward(table, feeds)
        results = [oracle[s].tobytes() for s in roots]
        results += [oracle.backward(loss)[w].tobytes() for w, _ in adjoints.pairs()]
        for plan in plans.values():
            run = plan.forward(table, feeds)
            results += [run[s].tobytes() for s in roots]
        return results

    serial = [run_all(k) for k in range(THREADS)]
    assert _together(run_all) == serial


def test_threads_record_on_their_own_tapes():
    networks = _together(lambda k: _model()[0].describe())
    assert len(set(networks)) == 1


def test_reopening_is_atomic():
    network, _ = _model()

    def reopen(k):
        try:
            network.reopen()
        except SealedError:
            return False
        return True

    assert sorted(_together(reopen)) == [False] * (THREADS - 1) + [True]
