"""verify=True: a step that is not a pure function is caught instead of giving a wrong gradient."""

import autograd.numpy as np
import numpy
import pytest
from autograd import grad

from bincheck import CheckpointedLoop, EqualSegments, NondeterministicStepError, \
    binomial_checkpoint, checkpointed_while_loop
from helpers import assert_trees_close, plain_loop, plain_while, rnn_problem, tanh_rnn


def test_a_single_evaluation_has_nothing_to_compare():
    """seq_len=1: the one step is taped once in the forward; nothing is replayed, the gradient is
    that of the evaluation made (the first), and verify has nothing to flag."""
    def noisy_from(calls):
        def step(p, h, x):
            calls[0] += 1
            return np.tanh(tanh_rnn(p, h, x) * calls[0])      # differs on every evaluation
        return step
    params, h0, xs = rnn_problem(1)
    loop = binomial_checkpoint(noisy_from([0]), 1, 1, verify=True)
    g = grad(lambda W: np.sum(loop((W,) + params[1:], h0, xs)))(params[0])
    step = noisy_from([0])
    g0 = grad(lambda W: np.sum(step((W,) + params[1:], h0, xs[0])))(params[0])
    assert_trees_close(g, g0)


@pytest.mark.parametrize("l,s", [(1, 1), (7, 1), (12, 3), (10, 10), (30, 4)])
def test_deterministic_step_passes(l, s):
    params, h0, xs = rnn_problem(l)
    loop = binomial_checkpoint(tanh_rnn, l, s, verify=True)
    g = grad(lambda p: np.sum(loop(p, h0, xs)))(params)
    g0 = grad(lambda p: np.sum(plain_loop(tanh_rnn, p, h0, xs, l)))(params)
    assert_trees_close(g, g0)


@pytest.mark.parametrize("l,s", [(2, 1), (7, 1), (12, 3), (10, 10)])
def test_unseeded_randomness_is_caught(l, s):
    rng = numpy.random.RandomState(0)

    def noisy(params, h, x):                     # fresh noise on every call: not replayable
        return tanh_rnn(params, h, x) + 1e-3 * rng.randn(*h.shape)
    params, h0, xs = rnn_problem(l)
    loop = binomial_checkpoint(noisy, l, s, verify=True)
    # the last step is taped once, in the forward: the first replayed step is the one before it
    with pytest.raises(NondeterministicStepError, match=r"state %d .*step %d" % (l - 1, l - 2)):
        grad(lambda p: np.sum(loop(p, h0, xs)))(params)
    # without verify the same loop silently returns a gradient (that is the danger)
    loop = binomial_checkpoint(noisy, l, s)
    grad(lambda p: np.sum(loop(p, h0, xs)))(params)


def drifting_at(k):
    """A tanh RNN whose step k returns something different on every evaluation after its first."""
    calls = [0]

    def step(params, h, x):
        out = tanh_rnn(params, h, x["x"])
        if int(x["t"]) == k:
            out = out + 1e-3 * calls[0]
            calls[0] += 1
        return out
    return step


def schedules(l):
    return [binomial_checkpoint(tanh_rnn, l, s).plan for s in (1, 2, 3, 4)] + \
        [EqualSegments(l, 3)]


@pytest.mark.parametrize("l", [12, 20])
def test_every_drifting_step_is_caught_or_harmless(l):
    """For every step k and several schedules: with verify=True a step that changes on
    re-evaluation raises, or the gradient is still the plain loop's. Round 1 missed steps of the
    last forward segment at (12, 2), (12, 3), (20, 4)."""
    params, h0, xs = rnn_problem(l)
    inputs = {"x": xs, "t": numpy.arange(l)}
    g0 = grad(lambda p: np.sum(plain_loop(tanh_rnn, p, h0, xs, l) ** 2))(params)
    wrong_without_verify = 0
    for schedule in schedules(l):
        for k in range(l):
            loop = CheckpointedLoop(drifting_at(k), schedule, verify=True)
            try:
                g = grad(lambda p: np.sum(loop(p, h0, inputs) ** 2))(params)
            except NondeterministicStepError:
                continue
            assert_trees_close(g, g0)          # not caught: then it must not have mattered
        loop = CheckpointedLoop(drifting_at(0), schedule)
        g = grad(lambda p: np.sum(loop(p, h0, inputs) ** 2))(params)
        wrong_without_verify += not numpy.allclose(g[0], g0[0], rtol=1e-8)
    assert wrong_without_verify >= 3            # the drift does change gradients when unchecked


def test_recomputed_outputs_are_compared():
    """The state is deterministic, the per-step output y is not: caught through y."""
    calls = [0]

    def step(params, h, x):
        calls[0] += 1
        new = tanh_rnn(params[:3], h, x)
        return new, np.dot(new, params[3]) + 1e-3 * calls[0]
    params, h0, xs = rnn_problem(9)
    params = params + (numpy.ones((4, 2)),)
    loop = binomial_checkpoint(step, 9, 2, with_outputs=True, verify=True)
    with pytest.raises(NondeterministicStepError, match=r"the output y of step"):
        grad(lambda p: np.sum(loop(p, h0, xs)[1] ** 2))(params)


def test_tolerance_is_relative_to_the_leaf_scale():
    """A leaf element at round-off level (a difference of equal sums) may differ by round-off
    between evaluations without being flagged; the gradient is right."""
    rng = numpy.random.RandomState(3)

    def step(a, st, x):
        big, tiny = st
        new_big = np.sin(big * a) + 1.0
        roundoff = 1e-17 * rng.randn(*np.shape(tiny))          # sums evaluated in another order
        return (new_big, np.concatenate([new_big[:1] - new_big[:1], roundoff[1:]]))
    st0 = (numpy.linspace(0.5, 1.5, 4), numpy.zeros(4))
    loop = binomial_checkpoint(step, 15, 3, verify=True)
    g = grad(lambda a: np.sum(loop(a, st0, None)[0]))(0.7)
    g0 = grad(lambda a: np.sum(plain_loop(step, a, st0, None, 15)[0]))(0.7)
    assert g == pytest.approx(g0, rel=1e-12)


def test_mutating_closed_over_state_is_caught():
    bias = numpy.zeros(4)

    def mutating(params, h, x):
        bias[0] += 0.01                          # a side effect outside the arguments
        return tanh_rnn(params, h, x) + bias
    params, h0, xs = rnn_problem(9)
    loop = binomial_checkpoint(mutating, 9, 2, verify=True)
    with pytest.raises(NondeterministicStepError, match=r"verify=True: (recomputing|taping)"):
        grad(lambda W: np.sum(loop((W, params[1], params[2]), h0, xs)))(params[0])


def test_while_loop_verify():
    rng = numpy.random.RandomState(1)
    body = lambda p, st: (st[0] + 1.0, st[1] * p + 1e-3 * rng.randn())
    run = checkpointed_while_loop(lambda p, st: st[0] < 20, body, 3, verify=True)
    with pytest.raises(NondeterministicStepError):
        grad(lambda p: run(p, (0.0, 1.0))[1])(0.9)
    cond = lambda p, st: st[0] < 20
    good_body = lambda p, st: (st[0] + 1.0, st[1] * p)
    good = checkpointed_while_loop(cond, good_body, 3, verify=True)
    g0 = grad(lambda p: plain_while(cond, good_body)(p, (0.0, 1.0))[1])(0.9)
    assert grad(lambda p: good(p, (0.0, 1.0))[1])(0.9) == pytest.approx(g0, rel=1e-12)


def test_verify_must_be_bool():
    with pytest.raises(TypeError, match="verify must be a bool"):
        binomial_checkpoint(tanh_rnn, 3, 2, verify="yes")


def test_a_large_leaf_does_not_hide_a_small_leafs_drift():
    """The tolerance is per leaf, floored by the state's scale: drift of 1e-7 in an O(1) leaf is
    caught beside a leaf of 1e3 (review finding: one scale for the whole state hid it)."""
    calls = [0]

    def step(a, st, x):
        calls[0] += 1
        big, small = st
        return (big + 1.0, np.sin(small * a) + 1e-7 * calls[0])
    loop = binomial_checkpoint(step, 12, 2, verify=True)
    with pytest.raises(NondeterministicStepError):
        grad(lambda a: np.sum(loop(a, (numpy.full(3, 1000.0), numpy.ones(3)), None)[1]))(0.9)
