"""The walkthrough's graph (Plate 1), shared by the tests of drawings and Jupyter cards.

An input [1, 2] times a parameter [2, 2], tanh, square, sum; its gradient
recorded by ``differentiate`` and an SGD step by ``topos.sgd``, so a
drawing has all three shades. Recording sites point into this file.
"""

from __future__ import annotations

import numpy as np

import topos

W = np.array([[0.5, -0.25], [0.75, 1.0]], dtype=np.float32)
X = np.array([[1.0, 2.0]], dtype=np.float32)
PLATE_FILE = __file__


def plate(tape, name: str = "w"):
    w = tape.parameter(W, name=name)
    x = tape.input(X, name="x")
    h = (x @ w).tanh()
    loss = (h * h).sum()
    adjoints = tape.differentiate(loss, [w])
    updates = topos.sgd(tape, adjoints, 0.1)
    return w, x, loss, adjoints, updates


def long_chain(tape, links: int = 1500):
    """A graph far over max_nodes: ``links`` rounds of mul then tanh, summed."""
    v = tape.input(np.ones(4, np.float32))
    for _ in range(links):
        v = (v * v).tanh()
    return v.sum()
