"""Programs written as a user writes them (no step function), shared by the benchmarks of
``checkpoint_program``: an RNN as a Python loop and Siskind and Pearlmutter's nested loop."""

from __future__ import annotations

import autograd.numpy as np


def rnn(W, U, xs, h):
    for t in range(xs.shape[0]):
        h = np.tanh(np.dot(h, W) + np.dot(xs[t], U))
    return np.sum(h ** 2)


def nested(y, w, lengths=(1, 1, 30, 1, 2, 1, 50, 1, 1, 1)):
    """An inner loop whose length varies per outer step."""
    for n in lengths:
        for _ in range(n):
            y = np.sqrt(y * y + 0.1)
        y = y * w
    return np.sum(y)
