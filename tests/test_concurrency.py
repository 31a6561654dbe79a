"""Loop objects hold configuration only: threads, re-entrant and repeated calls are independent,
and ``loop.stats`` / ``run.num_steps`` always describe one whole call, never a mixture."""

import sys
import threading

import autograd.numpy as np
import numpy
import pytest
from autograd import grad

from bincheck import binomial_checkpoint, checkpointed_while_loop
from helpers import assert_trees_close, plain_loop, plain_while, rnn_problem, tanh_rnn

L, S = 20, 3


def run_threads(work, n_threads=2):
    errors = []

    def target(k):
        try:
            work(k)
        except BaseException as err:          # noqa: BLE001 - reported below
            errors.append(err)
    threads = [threading.Thread(target=target, args=(k,)) for k in range(n_threads)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)               # switch threads often: interleave the calls
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    if errors:
        raise errors[0]


def test_two_threads_share_one_binomial_loop():
    loop = binomial_checkpoint(tanh_rnn, L, S)
    problems = [rnn_problem(L, seed=k) for k in range(2)]
    refs = [grad(lambda p, h=h, x=x: np.sum(plain_loop(tanh_rnn, p, h, x, L) ** 2))(params)
            for params, h, x in problems]
    reads = []

    def work(k):
        params, h0, xs = problems[k]
        for _ in range(15):
            g = grad(lambda p: np.sum(loop(p, h0, xs) ** 2))(params)
            assert_trees_close(g, refs[k])
            st = loop.stats
            reads.append((st.plain_steps, st.taped_steps))
    run_threads(work)
    assert set(reads) == {(loop.predicted_plain_steps, L)}     # every read: one whole call


def test_two_threads_share_one_while_loop():
    cond = lambda p, st: st[0] < p[1]
    body = lambda p, st: (st[0] + 1.0, np.sin(st[1] * p[0]) + 0.1)
    run = checkpointed_while_loop(cond, body, 3)
    lengths = {0: 17.0, 1: 29.0}
    reads = []

    def work(k):
        p = numpy.array([1.1 + 0.1 * k, lengths[k]])
        g0 = grad(lambda p: plain_while(cond, body)(p, (0.0, 0.3))[1])(p)
        for _ in range(15):
            assert_trees_close(grad(lambda p: run(p, (0.0, 0.3))[1])(p), g0)
            st = run.stats                        # one read: one call's figures
            reads.append((st.num_steps, st.taped_steps, st.plain_steps))
    run_threads(work)
    assert {(n, t) for n, t, _ in reads} <= {(17, 17), (29, 29)}


def test_num_steps_and_stats_describe_the_same_call():
    """A loss calling one while loop twice (17 and 29 steps): the published figures are those of
    the last call to complete, together (review finding: num_steps came from the other call)."""
    cond = lambda p, st: st[0] < p[1]
    body = lambda p, st: (st[0] + 1.0, np.sin(st[1] * p[0]) + 0.1)
    run = checkpointed_while_loop(cond, body, 3)
    loss = lambda w: run(np.array([w, 17.0]), (0.0, 0.3))[1] + \
        run(np.array([w, 29.0]), (0.0, 0.3))[1]
    grad(loss)(1.1)
    assert run.num_steps == run.stats.num_steps == run.stats.taped_steps
    run(numpy.array([1.1, 5.0]), (0.0, 0.3))        # a plain call publishes its own figures
    assert (run.num_steps, run.stats.plain_steps) == (5, 5)


def test_while_loop_called_from_inside_its_own_body():
    """Nested loops with one loop object: the inner call has its own planner and snapshots."""
    def cond(p, st):
        return st[0] < st[2]

    def body(p, st):
        t, y, depth = st
        if depth > 3:                                 # outer level: run an inner loop of 3 steps
            y = run(p, (0.0, y, 3.0))[1]
        return (t + 1.0, np.sin(y * p) + 0.2, depth)
    run = checkpointed_while_loop(cond, body, 2)

    def plain_body(p, st):
        t, y, depth = st
        if depth > 3:
            y = plain_while(cond, plain_body)(p, (0.0, y, 3.0))[1]
        return (t + 1.0, np.sin(y * p) + 0.2, depth)
    f = lambda p: run(p, (0.0, 0.5, 6.0))[1]
    f0 = lambda p: plain_while(cond, plain_body)(p, (0.0, 0.5, 6.0))[1]
    assert f(1.2) == pytest.approx(f0(1.2), rel=1e-13)
    assert grad(f)(1.2) == pytest.approx(grad(f0)(1.2), rel=1e-10)


def test_one_loss_calling_the_same_loop_twice():
    params, h0, xs = rnn_problem(L)
    h1 = h0[::-1].copy()
    loop = binomial_checkpoint(tanh_rnn, L, S)
    f = lambda run: lambda p: np.sum(run(p, h0, xs) ** 2) + np.sum(np.sin(run(p, h1, xs)))
    ref = lambda p, h, x: plain_loop(tanh_rnn, p, h, x, L)
    assert_trees_close(grad(f(loop))(params), grad(f(ref))(params))
    # stats describe one call (its forward and reverse), not the sum of both
    assert (loop.stats.plain_steps, loop.stats.taped_steps) == (loop.predicted_plain_steps, L)


def test_loop_configuration_is_frozen():
    loop = binomial_checkpoint(tanh_rnn, L, S)
    with pytest.raises(AttributeError, match="configured once"):
        loop.fn = None
    run = checkpointed_while_loop(lambda p, s: False, lambda p, s: s, 2)
    with pytest.raises(AttributeError, match="configured once"):
        run.planner = None
