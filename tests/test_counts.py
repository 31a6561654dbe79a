"""The optimal-work clause, measured on an instrumented step function."""

import autograd.numpy as np
import pytest
from autograd import grad

from bincheck import binomial_checkpoint
from helpers import Counter, closed_form, rnn_problem, tanh_rnn


GRID = [(l, s) for l in (1, 2, 3, 5, 8, 13, 21, 34, 55, 89) for s in (1, 2, 3, 4, 6, 10, 25, 100)]


@pytest.mark.parametrize("l,s", GRID)
def test_gradient_does_optimal_work(l, s):
    params, h0, xs = rnn_problem(l, H=2, B=1, D=1)
    cell = Counter(tanh_rnn)
    loop = binomial_checkpoint(cell, l, s)
    grad(lambda p, h, x: np.sum(loop(p, h, x)), (0, 1, 2))(params, h0, xs)
    assert cell.taped == l
    # exactly the optimum: the forward tapes the last step (no extra plain evaluation for the
    # output), and the bound is attained, not undercut by luck
    assert cell.plain == closed_form(l, s) == loop.predicted_plain_steps
    assert (loop.stats.plain_steps, loop.stats.taped_steps) == (cell.plain, cell.taped)


def test_forward_alone_runs_each_step_once():
    params, h0, xs = rnn_problem(50)
    cell = Counter(tanh_rnn)
    binomial_checkpoint(cell, 50, 4)(params, h0, xs)
    assert (cell.plain, cell.taped) == (50, 0)


def test_checkpoints_are_placed_in_the_forward_pass():
    """The reverse never replays from the initial state: its plain work excludes the first sweep."""
    l, s = 200, 8
    params, h0, xs = rnn_problem(l, H=2, B=1, D=1)
    cell = Counter(tanh_rnn)
    loop = binomial_checkpoint(cell, l, s)
    from autograd import make_vjp
    vjp, ans = make_vjp(lambda p: loop(p, h0, xs))(params)
    assert (cell.plain, cell.taped) == (l - 1, 1)  # forward: one sweep, the last step taped
    vjp(np.ones_like(ans))
    reverse_plain = cell.plain - (l - 1)
    # replaying from the initial state would cost the l - 1 first-sweep steps again
    assert reverse_plain == closed_form(l, s) - (l - 1)
    assert cell.taped == l


def test_forward_mode_tapes_nothing_in_the_forward():
    from autograd import make_jvp
    params, h0, xs = rnn_problem(30, H=2, B=1, D=1)
    cell = Counter(tanh_rnn)
    loop = binomial_checkpoint(cell, 30, 4)
    make_jvp(lambda h: loop(params, h, xs))(h0)(np.ones_like(h0))
    # the primal forward runs plain (a JVP trace wants no tape), then the tangent loop
    assert cell.plain >= 30
