"""RNN cells written with autograd.numpy, their parameters, and the two losses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import autograd.numpy as np
import numpy


def _sigmoid(a):
    return 0.5 * (np.tanh(0.5 * a) + 1.0)


def tanh_cell(params, h, x):
    return np.tanh(np.dot(h, params["W"]) + np.dot(x, params["U"]) + params["b"])


def lstm_cell(params, state, x):
    h, c = state
    H = h.shape[-1]
    z = np.dot(h, params["W"]) + np.dot(x, params["U"]) + params["b"]
    i, f, o, g = z[:, :H], z[:, H:2 * H], z[:, 2 * H:3 * H], z[:, 3 * H:]
    c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
    return (_sigmoid(o) * np.tanh(c), c)


def gru_cell(params, h, x):
    H = h.shape[-1]
    zx = np.dot(x, params["U"]) + params["b"]
    zh = np.dot(h, params["W"][:, :2 * H])
    u = _sigmoid(zx[:, :H] + zh[:, :H])
    r = _sigmoid(zx[:, H:2 * H] + zh[:, H:])
    n = np.tanh(zx[:, 2 * H:] + np.dot(r * h, params["W"][:, 2 * H:]))
    return (1.0 - u) * n + u * h


@dataclass(frozen=True)
class Cell:
    name: str
    fn: Callable
    gates: int              # weight blocks per hidden unit
    two_states: bool        # LSTM carries (h, c)

    def init(self, hidden: int, batch: int, seq_len: int, seed: int) -> tuple[Any, Any, Any]:
        rng = numpy.random.RandomState(seed)
        G, H = self.gates, hidden
        scale = 1.0 / numpy.sqrt(H)
        params = {"W": rng.uniform(-scale, scale, (H, G * H)),
                  "U": rng.uniform(-scale, scale, (H, G * H)),
                  "b": numpy.zeros(G * H)}
        h0 = rng.randn(batch, H) * 0.1
        state = (h0, numpy.zeros((batch, H))) if self.two_states else h0
        xs = rng.randn(seq_len, batch, H)
        return params, state, xs

    def hidden(self, state):
        return state[0] if self.two_states else state

    def with_output(self, params, state, x):
        """The per-step-loss variant: the step also emits its hidden state as output y."""
        new = self.fn(params, state, x)
        return new, self.hidden(new)


CELLS = {"tanh": Cell("tanh", tanh_cell, 1, False),
         "lstm": Cell("lstm", lstm_cell, 4, True),
         "gru": Cell("gru", gru_cell, 3, False)}


def final_loss(cell: Cell, final_state) -> Any:
    return np.sum(cell.hidden(final_state) ** 2)


def per_step_loss(cell: Cell, final_state, ys) -> Any:
    return np.sum(ys ** 2) / ys.shape[0] + final_loss(cell, final_state)
