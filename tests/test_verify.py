"""verify=True: a step that is not a pure function is caught instead of giving a wrong gradient."""

import autograd.numpy as np
import numpy
import pytest
from autograd import grad

from bincheck import NondeterministicStepError, binomial_checkpoint, checkpointed_while_loop
from models import assert_trees_close, plain_loop, rnn_problem, tanh_rnn


@pytest.mark.parametrize("l,s", [(1, 1), (7, 1), (12, 3), (10, 10), (30, 4)])
def test_deterministic_step_passes(l, s):
    params, h0, xs = rnn_problem(l)
    loop = binomial_checkpoint(tanh_rnn, l, s, verify=True)
    g = grad(lambda p: np.sum(loop(p, h0, xs)))(params)
    g0 = grad(lambda p: np.sum(plain_loop(tanh_rnn, p, h0, xs, l)))(params)
    assert_trees_close(g, g0)


@pytest.mark.parametrize("l,s", [(1, 1), (7, 1), (12, 3), (10, 10)])
def test_unseeded_randomness_is_caught(l, s):
    rng = numpy.random.RandomState(0)

    def noisy(params, h, x):                     # fresh noise on every call: not replayable
        return tanh_rnn(params, h, x) + 1e-3 * rng.randn(*h.shape)
    params, h0, xs = rnn_problem(l)
    loop = binomial_checkpoint(noisy, l, s, verify=True)
    with pytest.raises(NondeterministicStepError, match=r"state %d .*step %d" % (l, l - 1)):
        grad(lambda p: np.sum(loop(p, h0, xs)))(params)
    # without verify the same loop silently returns a gradient (that is the danger)
    loop = binomial_checkpoint(noisy, l, s)
    grad(lambda p: np.sum(loop(p, h0, xs)))(params)


def test_in_place_mutation_of_params_is_caught():
    def mutating(params, h, x):
        out = tanh_rnn(params, h, x)
        if isinstance(params[2], numpy.ndarray):
            params[2][...] += 0.01               # mutates the caller's bias on plain steps
        return out
    params, h0, xs = rnn_problem(9)
    params = (params[0], params[1], params[2].copy())
    loop = binomial_checkpoint(mutating, 9, 2, verify=True)
    with pytest.raises(NondeterministicStepError, match=r"verify=True: recomputing steps"):
        grad(lambda W: np.sum(loop((W, params[1], params[2]), h0, xs)))(params[0])


def test_while_loop_verify():
    rng = numpy.random.RandomState(1)
    body = lambda p, st: (st[0] + 1.0, st[1] * p + 1e-3 * rng.randn())
    run = checkpointed_while_loop(lambda p, st: st[0] < 20, body, 3, verify=True)
    with pytest.raises(NondeterministicStepError):
        grad(lambda p: run(p, (0.0, 1.0))[1])(0.9)
    good = checkpointed_while_loop(lambda p, st: st[0] < 20,
                                   lambda p, st: (st[0] + 1.0, st[1] * p), 3, verify=True)
    assert grad(lambda p: good(p, (0.0, 1.0))[1])(0.9) == pytest.approx(20 * 0.9 ** 19)


def test_verify_must_be_bool():
    with pytest.raises(TypeError, match="verify must be a bool"):
        binomial_checkpoint(tanh_rnn, 3, 2, verify="yes")
