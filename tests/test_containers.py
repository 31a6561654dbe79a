"""States and outputs built with autograd.builtins containers give the plain loop's gradient, and a
structure mismatch between the taped state and its adjoint raises instead of dropping a cotangent."""

import collections

import autograd.numpy as np
import numpy
import pytest
from autograd import grad
from autograd.builtins import dict as ag_dict
from autograd.builtins import list as ag_list
from autograd.builtins import tuple as ag_tuple
from autograd.tracer import isbox

from bincheck import binomial_checkpoint, checkpointed_while_loop
from helpers import (assert_trees_close, lstm, lstm_problem, plain_loop, plain_while, rnn_problem,
                     tanh_rnn)


def lstm_ag_tuple(params, state, x):           # as Sargent's code returns its LSTM state
    h, c = lstm(params, state, x)
    return ag_tuple((h, c))


def lstm_ag_list(params, state, x):
    h, c = lstm(params, list(state), x)
    return ag_list([h, c])


def lstm_ag_dict(params, state, x):
    h, c = lstm(params, (state["h"], state["c"]), x)
    return ag_dict({"h": h, "c": c})


def lstm_ag_nested(params, state, x):          # a container box inside a container box
    h, c = lstm(params, (state[0], state[1][0]), x)
    return ag_tuple((h, ag_tuple((c,))))


PAIR = lambda out: [out[0], out[1]]


@pytest.mark.parametrize("step,wrap,leaves_of", [
    (lstm_ag_tuple, lambda s: s, PAIR), (lstm_ag_list, list, PAIR),
    (lstm_ag_dict, lambda s: {"h": s[0], "c": s[1]}, lambda out: [out["h"], out["c"]]),
    (lstm_ag_nested, lambda s: (s[0], (s[1],)), lambda out: [out[0], out[1][0]])])
@pytest.mark.parametrize("l,s", [(1, 1), (5, 2), (9, 3), (6, 10)])
def test_container_states_match_the_plain_loop(step, wrap, leaves_of, l, s):
    params, state, xs = lstm_problem(l)
    state = wrap(state)
    loop = binomial_checkpoint(step, l, s)

    def loss(run):
        def f(p, st, x):
            leaves = leaves_of(run(p, st, x))
            return sum(np.sum(np.sin(v * (k + 1.0))) for k, v in enumerate(leaves))
        return f
    ref = lambda p, st, x: plain_loop(step, p, st, x, l)
    g = grad(loss(loop), (0, 1, 2))(params, state, xs)
    g0 = grad(loss(ref), (0, 1, 2))(params, state, xs)
    assert_trees_close(g, g0)


@pytest.mark.parametrize("l,s", [(4, 2), (8, 3)])
def test_container_output_pair_with_outputs(l, s):
    """fn returning autograd.builtins.tuple((state, y)) under with_outputs=True."""
    params, state, xs = lstm_problem(l)

    def step(p, st, x):
        h, c = lstm(p, st, x)
        return ag_tuple((ag_tuple((h, c)), np.sum(h, axis=1)))
    loop = binomial_checkpoint(step, l, s, with_outputs=True)
    ref = lambda p, st, x: plain_loop(step, p, st, x, l, with_outputs=True)
    f = lambda run: lambda p: np.sum(run(p, state, xs)[1] ** 2) + np.sum(run(p, state, xs)[0][1])
    assert_trees_close(grad(f(loop))(params), grad(f(ref))(params))


def test_while_loop_container_state():
    body = lambda p, st: ag_tuple((st[0] + 1.0, np.sin(st[1] * p)))
    cond = lambda p, st: st[0] < 7
    run = checkpointed_while_loop(cond, body, 3)
    g = grad(lambda p: run(p, (0.0, 0.4))[1])(1.3)
    g0 = grad(lambda p: plain_while(cond, body)(p, (0.0, 0.4))[1])(1.3)
    assert g == pytest.approx(g0, rel=1e-12)


def test_taped_structure_mismatch_raises_instead_of_dropping_a_cotangent():
    """A step that builds a different state under the tape cannot silently lose a cotangent. It
    is the step's doing, not bincheck's: a ValueError at that step, as on plain arrays (before
    issue 17, point 3, an InternalError once the whole segment was taped)."""
    def shifty(params, h, x):
        new = tanh_rnn(params, h[0], x)
        if isbox(new):                          # under the tape: one leaf fewer
            return ag_tuple((new,))
        return (new, new)
    params, h0, xs = rnn_problem(5)
    loop = binomial_checkpoint(shifty, 5, 2)
    with pytest.raises(ValueError, match=r"taped step 4 got \(leaf, leaf\) and returned "
                                         r"\(leaf,\) \(refusing to drop a cotangent"):
        grad(lambda p: np.sum(loop(p, (h0, h0), xs)[1]))(params)


@pytest.mark.parametrize("kind", [collections.OrderedDict, dict])
def test_an_ordered_dict_state_or_params_carries_its_cotangents(kind):
    """An OrderedDict state was one leaf that differentiable() called integer: gradient 0.0 where
    plain autograd gives 1.49 (a review's probe)."""
    xs = numpy.random.RandomState(0).randn(6, 3)

    def step(p, s, x):
        return collections.OrderedDict(h=np.tanh(s["h"] * p["w"] + x))

    def plain(w, h):
        s, p = collections.OrderedDict(h=h), kind(w=w)
        for t in range(6):
            s = step(p, s, xs[t])
        return np.sum(s["h"] ** 2)
    loop = binomial_checkpoint(step, 6, num_ckpts=2)

    def checkpointed(w, h):
        return np.sum(loop(kind(w=w), collections.OrderedDict(h=h), xs)["h"] ** 2)
    h0 = numpy.array([0.1, -0.2, 0.3])
    for got, want in zip(grad(checkpointed, (0, 1))(0.7, h0), grad(plain, (0, 1))(0.7, h0)):
        numpy.testing.assert_allclose(got, want, rtol=1e-12)
    assert type(loop(kind(w=0.7), collections.OrderedDict(h=h0), xs)) is collections.OrderedDict


def test_a_state_bincheck_cannot_look_into_is_refused_not_dropped():
    """An object of the user's as the state (or given holding a traced value) raises a TypeError
    naming it; it gave a zero gradient."""
    class Holder:
        def __init__(self, v):
            self.v = v
    xs = numpy.random.RandomState(0).randn(4, 3)
    h0 = numpy.array([0.1, -0.2, 0.3])
    loop = binomial_checkpoint(lambda p, s, x: Holder(np.tanh(s.v * p + x)), 4, num_ckpts=2)
    with pytest.raises(TypeError, match=r"taped step 3\) returned a .*Holder that holds a value "
                                        r"being differentiated"):
        grad(lambda p: np.sum(loop(p, Holder(h0), xs).v))(0.7)
    with pytest.raises(TypeError, match=r"the loop was given a .*Holder that holds"):
        grad(lambda p: np.sum(loop(p, Holder(h0 * p), xs).v))(0.7)
