"""RNN cells written with autograd.numpy, their parameters, and the two problems.

* ``final``: random real inputs, loss on the final hidden state (``final_loss``).
* ``char-lm``: a character-level language model on generated text (:mod:`.text`): the input
  character's embedding (a row of ``params["E"]``, indexed by the integer code in ``inputs``)
  feeds the cell, and every step's loss is the softmax cross-entropy of the next character,
  computed from the new hidden state by ``CharLM.readout`` — the bounded-memory per-step-loss
  pattern: ``readout`` is bincheck's ``output_fn`` and returns a scalar, so the loop stacks T
  scalars, not T hidden states.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import autograd.numpy as np
import numpy

from .text import VOCAB_SIZE, char_batches


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


CELLS = {"tanh": Cell("tanh", tanh_cell, 1, False),
         "lstm": Cell("lstm", lstm_cell, 4, True),
         "gru": Cell("gru", gru_cell, 3, False)}


def final_loss(cell: Cell, final_state) -> Any:
    return np.sum(cell.hidden(final_state) ** 2)


def cross_entropy(logits, targets) -> Any:
    """Mean softmax cross-entropy of ``logits`` (..., V) against integer ``targets`` (...)."""
    V = logits.shape[-1]
    flat = np.reshape(logits, (-1, V))
    codes = numpy.reshape(targets, -1)
    shift = np.max(flat, axis=1, keepdims=True)         # for exp's range; cancels exactly
    lse = np.log(np.sum(np.exp(flat - shift), axis=1)) + shift[:, 0]
    return np.mean(lse - flat[numpy.arange(flat.shape[0]), codes])


@dataclass(frozen=True)
class CharLM:
    """A character-level language model around ``cell``: embedded input, per-step loss.

    ``inputs`` is ``{"chars": (T, B) codes, "targets": (T, B) codes}`` (integers, carried
    through the loop, not differentiated); step t reads ``chars[t]`` and is scored on
    ``targets[t]``, the character after it.
    """

    cell: Cell

    def init(self, hidden: int, batch: int, seq_len: int, seed: int) -> tuple[Any, Any, Any]:
        params, state, _ = self.cell.init(hidden, batch, 1, seed)
        rng = numpy.random.RandomState(seed + 1)
        scale = 1.0 / numpy.sqrt(hidden)
        params["E"] = rng.randn(VOCAB_SIZE, hidden) * 0.1           # embedding, dim = hidden
        params["Wo"] = rng.uniform(-scale, scale, (hidden, VOCAB_SIZE))
        params["bo"] = numpy.zeros(VOCAB_SIZE)
        chars, targets = char_batches(seq_len, batch, seed)
        return params, state, {"chars": chars, "targets": targets}

    def step(self, params, state, x):
        """fn(params, state, x): the cell on the embedding of this step's characters."""
        return self.cell.fn(params, state, params["E"][x["chars"]])

    def readout(self, params, state, x):
        """output_fn(params, new_state, x): this step's loss, a scalar (mean over the batch)."""
        logits = np.dot(self.cell.hidden(state), params["Wo"]) + params["bo"]
        return cross_entropy(logits, x["targets"])

    def stacked_step(self, params, state, x):
        """The with_outputs=True variant: emits the hidden state, the loss comes after the loop."""
        new = self.step(params, state, x)
        return new, self.cell.hidden(new)

    @staticmethod
    def loss(step_losses) -> Any:
        """The total loss from the T per-step losses: mean cross-entropy per character."""
        return np.mean(step_losses)

    @staticmethod
    def stacked_loss(params, hs, targets) -> Any:
        """The same total loss from the stacked hidden states ``hs`` (T, B, H): every logit of
        every step is alive at once (T x B x V), with its cotangent."""
        return cross_entropy(np.dot(hs, params["Wo"]) + params["bo"], targets)
