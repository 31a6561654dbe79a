"""Shared test helpers: small step functions and problems, the plain (uncheckpointed) reference
loops, an evaluation counter, a tracemalloc peak and the closed form t(l, s). Test modules import
from here only, never from each other."""

import gc
import tracemalloc
from math import comb

import autograd.numpy as np
import numpy
from autograd.tracer import isbox

from bincheck.schedule import Tracker


def tanh_rnn(params, h, x):
    W, U, b = params
    return np.tanh(np.dot(h, W) + np.dot(x, U) + b)


def lstm(params, state, x):
    h, c = state
    z = np.dot(h, params["W"]) + np.dot(x, params["U"]) + params["b"]
    H = h.shape[-1]
    i, f, o, g = (z[..., :H], z[..., H:2 * H], z[..., 2 * H:3 * H], z[..., 3 * H:])
    sig = lambda a: 0.5 * (np.tanh(0.5 * a) + 1.0)
    c = sig(f) * c + sig(i) * np.tanh(g)
    return (sig(o) * np.tanh(c), c)


def autonomous(params, state, x):
    """A damped nonlinear oscillator step: no inputs (x is None), float leaf in params."""
    assert x is None
    q, p = state
    dt, k = params["dt"], params["k"]
    p = p - dt * (k * np.sin(q) + 0.1 * p)
    return (q + dt * p, p)


def rnn_with_outputs(params, h, x):
    h = tanh_rnn(params[:3], h, x)
    return h, np.dot(h, params[3])


def plain_loop(fn, params, state, inputs, seq_len, with_outputs=False, output_fn=None):
    """The uncheckpointed reference loop; per-step outputs stacked leaf by leaf."""
    ys = []
    for t in range(seq_len):
        x = None if inputs is None else _slice(inputs, t)
        out = fn(params, state, x)
        if with_outputs:
            state, y = out
            ys.append(y)
        else:
            state = out
        if output_fn is not None:
            ys.append(output_fn(params, state, x))
    return (state, stack_trees(ys)) if with_outputs or output_fn else state


def stack_trees(trees):
    """np.stack over a list of same-shaped trees (tuple/list/dict of arrays), leaf by leaf."""
    first = trees[0]
    if isinstance(first, dict):
        return {k: stack_trees([t[k] for t in trees]) for k in first}
    if isinstance(first, (tuple, list)):
        return type(first)(stack_trees([t[i] for t in trees]) for i in range(len(first)))
    return np.stack(trees)


def _slice(tree, t):
    value = getattr(tree, "_value", tree)            # container boxes under autograd
    if isinstance(value, dict):
        return {k: _slice(tree[k], t) for k in value}
    if isinstance(value, (tuple, list)):
        return type(value)(_slice(tree[i], t) for i in range(len(value)))
    return tree[t]


def rnn_problem(seq_len, H=4, B=2, D=3, seed=0):
    rng = numpy.random.RandomState(seed)
    params = (rng.randn(H, H) * 0.4, rng.randn(D, H) * 0.4, rng.randn(H) * 0.1)
    return params, rng.randn(B, H), rng.randn(seq_len, B, D)


def lstm_problem(seq_len, H=3, B=2, D=2, seed=1):
    rng = numpy.random.RandomState(seed)
    params = {"W": rng.randn(H, 4 * H) * 0.4, "U": rng.randn(D, 4 * H) * 0.4,
              "b": rng.randn(4 * H) * 0.1}
    return params, (rng.randn(B, H), rng.randn(B, H)), rng.randn(seq_len, B, D)


def autonomous_problem(seed=2):
    rng = numpy.random.RandomState(seed)
    return {"dt": 0.1, "k": 1.3}, (rng.randn(3), rng.randn(3)), None


def outputs_problem(seq_len, H=4, B=2, D=3, O=2, seed=3):
    params, h0, xs = rnn_problem(seq_len, H, B, D, seed)
    rng = numpy.random.RandomState(seed + 10)
    return params + (rng.randn(H, O),), h0, xs


def flat_leaves(tree):
    if isinstance(tree, dict):
        return [leaf for k in sorted(tree) for leaf in flat_leaves(tree[k])]
    if isinstance(tree, (tuple, list)):
        return [leaf for v in tree for leaf in flat_leaves(v)]
    if tree is None:
        return []
    return [tree]


def assert_trees_close(a, b, rtol=1e-10, atol=1e-13):
    """Same leaves, shapes and dtype kinds; values within rtol/atol."""
    la, lb = flat_leaves(a), flat_leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert numpy.shape(x) == numpy.shape(y), (numpy.shape(x), numpy.shape(y))
        assert numpy.asarray(x).dtype.kind == numpy.asarray(y).dtype.kind, (x, y)
        numpy.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


def plain_while(cond, body):
    """The plain Python while loop (reference for checkpointed_while_loop)."""
    def run(params, state):
        while cond(params, state):
            state = body(params, state)
        return state
    return run


class Counter:
    """Wraps a step function; counts evaluations under autograd's tape vs on plain arrays."""

    def __init__(self, fn):
        self.fn, self.taped, self.plain = fn, 0, 0

    def __call__(self, *args):
        if any(isbox(leaf) for leaf in flat_leaves(args)):
            self.taped += 1
        else:
            self.plain += 1
        return self.fn(*args)

    @property
    def calls(self):
        return self.plain + self.taped


def peak_bytes(fn, *args):
    """(tracemalloc peak above the starting level while ``fn(*args)`` runs, its result)."""
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        result = fn(*args)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return peak, result


def closed_form(l, s):
    """t(l, s) written directly from the definition, independently of the library's helpers."""
    r = 0
    while comb(s + r, s) < l:
        r += 1
    return r * l - (comb(s + 1 + r - 1, s + 1) if r >= 1 else 0)


def drive_online(planner, n):
    """Drive an online planner for a loop that stops after ``n`` steps, validating every action.

    Returns the tracker (counts, reversed order) and the list of actions."""
    tracker, actions = Tracker(None, record=True), []

    def take(stream):
        for a in stream:
            actions.append(a)
            tracker.apply(a)
    take(planner.start())
    for m in range(1, n):
        take(planner.advance(m))
    tracker.end_forward(n)
    take(planner.reverse(n))
    tracker.finish()
    return tracker, actions
