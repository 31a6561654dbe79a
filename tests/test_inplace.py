"""Nothing fn does in place can corrupt a snapshot, a replay or the caller's arrays.

Plain steps get read-only views: an in-place update fails at once with a ValueError naming the
step and the argument written, in plain calls, under grad, and in while loops alike.
"""

import autograd.numpy as np
import numpy
import pytest
from autograd import grad

from bincheck import binomial_checkpoint, checkpointed_while_loop
from helpers import assert_trees_close, plain_loop, rnn_problem, tanh_rnn


def inplace_state(params, h, x):
    h += 0.1 * np.tanh(np.dot(h, params[0]) + np.dot(x, params[1]))   # the numpy habit
    return h


def inplace_inputs(params, h, x):
    x *= 2.0
    return tanh_rnn(params, h, x)


def inplace_params(params, h, x):
    params[2][0] = 0.0
    return tanh_rnn(params, h, x)


def fluidsim_project(params, state, x):
    """Like HIPS autograd's fluidsim: a projection step subtracting in place from the state."""
    vx, vy = state
    p = 0.25 * (numpy.roll(vx, 1) - vx)
    vx -= p                                   # writes into the state it received
    return (vx * params, vy + p)


CASES = [(inplace_state, "state"), (inplace_inputs, "inputs"), (inplace_params, "params")]


@pytest.mark.parametrize("fn,which", CASES)
@pytest.mark.parametrize("mode", ["plain", "grad"])
def test_in_place_update_is_refused_and_named(fn, which, mode):
    params, h0, xs = rnn_problem(6)
    params = tuple(p.copy() for p in params)
    before = [a.copy() for a in (h0, xs) + params]
    loop = binomial_checkpoint(fn, 6, 2)
    run = (lambda: loop(params, h0, xs)) if mode == "plain" else \
        (lambda: grad(lambda p: np.sum(loop(p, h0, xs)))(params))
    with pytest.raises(ValueError, match=rf"fn wrote into its {which} argument in place at step "
                                         rf"0.*s = s \+ \.\.\."):
        run()
    for a, b in zip((h0, xs) + params, before):      # the caller's arrays are untouched
        numpy.testing.assert_array_equal(a, b)
        assert a.flags.writeable                       # and so are their flags


def test_fluidsim_style_projection_is_refused_not_miscomputed():
    rng = numpy.random.RandomState(0)
    state = (rng.randn(16), rng.randn(16))
    kept = [s.copy() for s in state]
    loop = binomial_checkpoint(fluidsim_project, 10, 3)
    with pytest.raises(ValueError, match=r"state argument in place"):
        grad(lambda a: np.sum(loop(a, state, None)[0] ** 2))(0.9)
    assert_trees_close(state, kept, rtol=0, atol=0)


def test_the_out_of_place_version_matches_plain_autograd():
    def out_of_place(params, h, x):
        return h + 0.1 * np.tanh(np.dot(h, params[0]) + np.dot(x, params[1]))
    params, h0, xs = rnn_problem(9)
    loop = binomial_checkpoint(out_of_place, 9, 2)
    g = grad(lambda p: np.sum(loop(p, h0, xs) ** 2))(params)
    g0 = grad(lambda p: np.sum(plain_loop(out_of_place, p, h0, xs, 9) ** 2))(params)
    assert_trees_close(g, g0)


def test_while_loop_body_in_place_is_refused():
    def body(p, st):
        t, y = st
        y *= p                                 # in place on the state
        return (t + 1.0, y)
    run = checkpointed_while_loop(lambda p, st: st[0] < 5, body, 2)
    y0 = numpy.array([1.0, 2.0])
    for call in (lambda: run(0.5, (0.0, y0)), lambda: grad(lambda p: np.sum(run(p, (0.0, y0))[1]))(0.5)):
        with pytest.raises(ValueError, match=r"body_fn wrote into its state argument in place "
                                             r"at step 0"):
            call()
    numpy.testing.assert_array_equal(y0, [1.0, 2.0])


def test_later_step_is_named():
    def late(params, h, x):
        if x[0, 0] == xs[4, 0, 0]:
            h[...] = 0.0
        return tanh_rnn(params, h, x)
    params, h0, xs = rnn_problem(7)
    with pytest.raises(ValueError, match=r"state argument in place at step 4"):
        binomial_checkpoint(late, 7, 3)(params, h0, xs)


def test_read_only_views_cost_no_copy():
    """A snapshot is a view of the array the step returned, not a copy (memory stays bounded)."""
    seen = []

    def step(params, h, x):
        seen.append(h)
        return h * params
    h0 = numpy.ones(1000)
    binomial_checkpoint(step, 3, 3)(1.0, h0, None)
    assert numpy.shares_memory(seen[0], h0) and not seen[0].flags.writeable
    assert h0.flags.writeable


def test_results_of_plain_calls_are_writable():
    """A plain call's result is the caller's to modify, as the plain loop's would be (review)."""
    params, h0, xs = rnn_problem(5)
    out = binomial_checkpoint(tanh_rnn, 5, 2)(params, h0, xs)
    out += 1.0
    run = checkpointed_while_loop(lambda p, st: st[0] < 4, lambda p, st: (st[0] + 1, st[1] * p), 2)
    t, y = run(0.5, (0, numpy.ones(3)))
    y *= 2.0
    numpy.testing.assert_array_equal(y, 2 * 0.5 ** 4 * numpy.ones(3))
