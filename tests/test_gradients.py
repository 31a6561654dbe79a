"""End-to-end: checkpointed gradients equal the plain autograd loop's (rtol 1e-10)."""

import autograd.numpy as np
import numpy
import pytest
from autograd import grad, jacobian, make_vjp, value_and_grad
from autograd.test_util import check_grads

from bincheck import binomial_checkpoint
from helpers import (assert_trees_close, autonomous, autonomous_problem, lstm, lstm_problem,
                    outputs_problem, plain_loop, rnn_problem, rnn_with_outputs, tanh_rnn)

CASES = [(1, 1), (1, 3), (2, 1), (5, 1), (5, 2), (7, 3), (12, 4), (20, 5), (9, 9), (6, 20)]


def both(fn, seq_len, num_ckpts, with_outputs=False):
    loop = binomial_checkpoint(fn, seq_len, num_ckpts, with_outputs=with_outputs)
    ref = lambda p, s, x: plain_loop(fn, p, s, x, seq_len, with_outputs)
    return loop, ref


def scalar_loss(out):
    """A loss touching every leaf of the output with different weights."""
    leaves = out if isinstance(out, (tuple, list)) else (out,)
    total = 0.0
    for k, leaf in enumerate(leaves):
        total = total + np.sum(np.sin(leaf * (k + 1.0)))
    return total


@pytest.mark.parametrize("l,s", CASES)
def test_tanh_rnn_all_arguments(l, s):
    params, h0, xs = rnn_problem(l)
    loop, ref = both(tanh_rnn, l, s)
    f = lambda p, h, x: scalar_loss(loop(p, h, x))
    f0 = lambda p, h, x: scalar_loss(ref(p, h, x))
    value, g = value_and_grad(f, (0, 1, 2))(params, h0, xs)
    value0, g0 = value_and_grad(f0, (0, 1, 2))(params, h0, xs)
    numpy.testing.assert_allclose(value, value0, rtol=1e-12)
    assert_trees_close(g, g0)


@pytest.mark.parametrize("l,s", CASES)
def test_lstm_dict_params_tuple_state(l, s):
    params, state, xs = lstm_problem(l)
    loop, ref = both(lstm, l, s)
    for argnum in [0, 1, 2, (0, 1, 2)]:
        g = grad(lambda p, st, x: scalar_loss(loop(p, st, x)), argnum)(params, state, xs)
        g0 = grad(lambda p, st, x: scalar_loss(ref(p, st, x)), argnum)(params, state, xs)
        assert_trees_close(g, g0)


@pytest.mark.parametrize("l,s", CASES)
def test_autonomous_iteration_without_inputs(l, s):
    params, state, _ = autonomous_problem()
    loop, ref = both(autonomous, l, s)
    g = grad(lambda p, st: scalar_loss(loop(p, st, None)), (0, 1))(params, state)
    g0 = grad(lambda p, st: scalar_loss(ref(p, st, None)), (0, 1))(params, state)
    assert_trees_close(g, g0)
    assert numpy.shape(g[0]["dt"]) == numpy.shape(g0[0]["dt"]) == ()   # scalar leaf, scalar cotangent


@pytest.mark.parametrize("l,s", CASES)
def test_with_outputs(l, s):
    params, h0, xs = outputs_problem(l)
    loop, ref = both(rnn_with_outputs, l, s, with_outputs=True)

    def loss(run):
        def f(p, h, x):
            h_final, ys = run(p, h, x)
            return np.sum(ys ** 2 * np.arange(1.0, l + 1.0)[:, None, None]) + np.sum(h_final)
        return f

    out, out0 = loop(params, h0, xs), ref(params, h0, xs)
    assert_trees_close(out, out0, rtol=1e-14)
    g = grad(loss(loop), (0, 1, 2))(params, h0, xs)
    g0 = grad(loss(ref), (0, 1, 2))(params, h0, xs)
    assert_trees_close(g, g0)
    # only the outputs feed the loss: the final state's cotangent is zero
    g = grad(lambda p: np.sum(loop(p, h0, xs)[1]))(params)
    g0 = grad(lambda p: np.sum(ref(p, h0, xs)[1]))(params)
    assert_trees_close(g, g0)


def test_boxes_nested_in_plain_containers():
    """grad w.r.t. separate arrays that the user packs into a tuple inside the loss."""
    params, h0, xs = rnn_problem(8)
    loop, ref = both(tanh_rnn, 8, 3)
    f = lambda W, U, b: scalar_loss(loop((W, U, b), h0, xs))
    f0 = lambda W, U, b: scalar_loss(ref((W, U, b), h0, xs))
    assert_trees_close(grad(f, (0, 1, 2))(*params), grad(f0, (0, 1, 2))(*params))


def test_make_vjp_is_reusable_and_jacobian_matches():
    params, h0, xs = rnn_problem(6, H=3, B=1)
    loop, ref = both(tanh_rnn, 6, 2)
    vjp, ans = make_vjp(lambda h: loop(params, h, xs))(h0)
    vjp0, ans0 = make_vjp(lambda h: ref(params, h, xs))(h0)
    for seed in range(3):                      # repeated calls must all be right
        g = numpy.random.RandomState(seed).randn(*ans.shape)
        assert_trees_close(vjp(g), vjp0(g))
    J = jacobian(lambda x: loop(params, h0, x))(xs)
    J0 = jacobian(lambda x: ref(params, h0, x))(xs)
    assert_trees_close(J, J0)


@pytest.mark.parametrize("l,s", [(1, 1), (6, 2), (9, 20)])
def test_check_grads_reverse_mode(l, s):
    params, h0, xs = rnn_problem(l, H=3, B=2, D=2)
    loop = binomial_checkpoint(tanh_rnn, l, s)
    check_grads(lambda p, h, x: scalar_loss(loop(p, h, x)), modes=["rev"], order=1)(
        params, h0, xs)
    params, state, xs = lstm_problem(l)
    loop = binomial_checkpoint(lstm, l, s)
    check_grads(lambda p, st, x: scalar_loss(loop(p, st, x)), modes=["rev"], order=1)(
        params, state, xs)


def test_outside_autograd_runs_plain_and_matches():
    params, state, xs = lstm_problem(10)
    loop, ref = both(lstm, 10, 2)
    assert_trees_close(loop(params, state, xs), ref(params, state, xs), rtol=0, atol=0)


@pytest.mark.parametrize("l,n", [(1, 1), (10, 3), (12, 12)])
def test_equal_segments_loop_matches(l, n):
    from bincheck import CheckpointedLoop, EqualSegments
    params, state, xs = lstm_problem(l)
    loop = CheckpointedLoop(lstm, EqualSegments(l, n))
    ref = lambda p, st, x: plain_loop(lstm, p, st, x, l)
    g = grad(lambda p, st, x: scalar_loss(loop(p, st, x)), (0, 1, 2))(params, state, xs)
    g0 = grad(lambda p, st, x: scalar_loss(ref(p, st, x)), (0, 1, 2))(params, state, xs)
    assert_trees_close(g, g0)
    # each step once: plain up to the last segment, which the forward tapes
    assert loop.stats.plain_steps == loop.predicted_plain_steps == loop.plan.bounds[-2]
    assert loop.stats.taped_steps == l
