"""Small step functions and their plain (uncheckpointed) loops, shared by the tests."""

import autograd.numpy as np
import numpy


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


def plain_loop(fn, params, state, inputs, seq_len, with_outputs=False):
    ys = []
    for t in range(seq_len):
        x = None if inputs is None else _slice(inputs, t)
        out = fn(params, state, x)
        if with_outputs:
            state, y = out
            ys.append(y)
        else:
            state = out
    return (state, np.stack(ys)) if with_outputs else state


def _slice(tree, t):
    if isinstance(tree, dict):
        return {k: _slice(v, t) for k, v in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(_slice(v, t) for v in tree)
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
    la, lb = flat_leaves(a), flat_leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        numpy.testing.assert_allclose(x, y, rtol=rtol, atol=atol)
