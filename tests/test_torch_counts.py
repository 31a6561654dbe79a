"""bincheck.torch does optimal work: t(l, s) plain and l taped steps, as the autograd front end."""

import pytest

torch = pytest.importorskip("torch")
import bincheck  # noqa: E402
import bincheck.torch as bt  # noqa: E402
from torch_helpers import Counter, closed_form, problem, requiring, tanh_cell  # noqa: E402

GRID = [(l, s) for l in (1, 2, 3, 5, 8, 13, 21, 34, 55) for s in (1, 2, 3, 4, 6, 10, 60)]


@pytest.mark.parametrize("l,s", GRID)
def test_gradient_does_optimal_work(l, s):
    params, h0, xs = problem(l, B=1, H=2, I=1)
    W, U, b = requiring(*params)
    cell = Counter(tanh_cell)
    loop = bt.binomial_checkpoint(cell, l, s)
    loop((W, U, b), h0, xs).sum().backward()
    assert (cell.plain, cell.taped) == (closed_form(l, s), l)
    assert (loop.stats.plain_steps, loop.stats.taped_steps) == (cell.plain, cell.taped)
    assert loop.stats.peak_checkpoints <= s


def test_forward_alone_runs_each_step_once_and_tapes_the_last_segment():
    l, s = 40, 5
    params, h0, xs = problem(l)
    W, U, b = requiring(*params)
    cell = Counter(tanh_cell)
    out = bt.binomial_checkpoint(cell, l, s)((W, U, b), h0, xs)
    first = bincheck.plan(l, s).first_reverse_start
    assert (cell.plain, cell.taped) == (first, l - first)
    out.sum().backward()
    assert (cell.plain, cell.taped) == (closed_form(l, s), l)


@pytest.mark.parametrize("l,s", [(1, 1), (7, 2), (30, 4), (50, 50)])
def test_output_fn_runs_once_plain_and_once_taped_per_step(l, s):
    params, h0, xs = problem(l)
    W, U, b = requiring(*params)
    cell, readout = Counter(tanh_cell), Counter(lambda p, h, x: h.pow(2).mean())
    final, ys = bt.binomial_checkpoint(cell, l, s, output_fn=readout)((W, U, b), h0, xs)
    (ys.sum() + final.sum()).backward()
    assert (cell.plain, cell.taped) == (closed_form(l, s), l)
    # the forward tapes the last step with its output, which the backward reverses first
    assert (readout.plain, readout.taped) == (l - 1, l)


def test_no_grad_runs_the_plain_loop_and_keeps_nothing():
    params, h0, xs = problem(20)
    W, U, b = requiring(*params)
    cell = Counter(tanh_cell)
    loop = bt.binomial_checkpoint(cell, 20, 3)
    with torch.no_grad():
        out = loop((W, U, b), h0, xs)
    with torch.inference_mode():
        loop((W, U, b), h0, xs)
    assert (cell.plain, cell.taped) == (40, 0) and out.grad_fn is None
    loop(tuple(p.detach() for p in (W, U, b)), h0, xs)     # nothing requires grad
    assert (cell.plain, cell.taped) == (60, 0) and loop.stats.peak_checkpoints == 0


def test_budget_plan_counts_equal_the_plan():
    l = 60
    params, h0, xs = problem(l, B=8, H=16, I=4)
    W, U, b = requiring(*params)
    cell = Counter(tanh_cell)
    loop = bt.binomial_checkpoint(cell, l, memory="120kB")
    plan = loop.preview((W, U, b), h0, xs)
    cell.plain = cell.taped = 0
    loop((W, U, b), h0, xs).sum().backward()
    assert (cell.plain, cell.taped) == (plan.plain_steps, l)
    assert loop.plan is plan


@pytest.mark.parametrize("n,s", [(0, 2), (1, 1), (9, 2), (30, 3), (64, 5)])
def test_while_loop_matches_the_autograd_front_end(n, s):
    """Gradients equal to the plain while loop's and to the autograd front end's, with the same
    number of step evaluations."""
    import autograd.numpy as anp
    import numpy
    from autograd import grad
    counts = {"torch": 0, "autograd": 0}

    def t_body(p, st):
        counts["torch"] += 1
        return (st[0] + 1, torch.sin(st[1] * p[0]) + p[1])

    def a_body(p, st):
        counts["autograd"] += 1
        return (st[0] + 1, anp.sin(st[1] * p[0]) + p[1])
    p = torch.tensor([1.1, 0.2], dtype=torch.float64, requires_grad=True)
    h0 = torch.tensor([0.3, 0.5], dtype=torch.float64)
    run = bt.checkpointed_while_loop(lambda p, st: st[0] < n, t_body, s)
    k, h = run(p, (torch.tensor(0), h0))
    (h ** 2).sum().backward()
    assert run.num_steps == n == int(k)
    arun = bincheck.checkpointed_while_loop(lambda p, st: st[0] < n, a_body, s)
    g_auto = grad(lambda q: anp.sum(arun(q, (numpy.array(0), h0.numpy()))[1] ** 2))(
        p.detach().numpy())
    assert counts["torch"] == counts["autograd"]
    if n:
        torch.testing.assert_close(p.grad, torch.from_numpy(g_auto), rtol=1e-10, atol=1e-12)
    state = (torch.tensor(0), h0)
    while state[0] < n:
        state = t_body(p, state)
    if n:
        g_plain = torch.autograd.grad((state[1] ** 2).sum(), [p])[0]
        torch.testing.assert_close(p.grad, g_plain, rtol=1e-10, atol=1e-12)
    else:
        assert p.grad is None or not p.grad.any()


def _decay_problem():
    p = torch.tensor([1.0, 0.1], dtype=torch.float64, requires_grad=True)
    body = lambda p, h: 1.1 * h * p[0] + torch.sin(h) * p[1]        # noqa: E731
    cond = lambda p, h: bool(h.abs().sum() < 40.0)                  # noqa: E731
    h0 = torch.linspace(0.1, 1.0, 8, dtype=torch.float64)
    return p, body, cond, h0


def _plain_while(p, body, cond, h0):
    h, n = h0, 0
    while cond(p, h):
        h, n = body(p, h), n + 1
    return h, n


def test_while_loop_retain_graph_and_memory_budget():
    p, body, cond, h0 = _decay_problem()
    h, n = _plain_while(p, body, cond, h0)
    want = torch.autograd.grad(h.pow(2).sum(), [p])[0]
    run = bt.checkpointed_while_loop(cond, body, 3)
    loss = run(p, h0).pow(2).sum()
    loss.backward(retain_graph=True)
    loss.backward()
    assert run.num_steps == n > 15
    torch.testing.assert_close(p.grad, 2 * want, rtol=1e-10, atol=1e-12)
    p.grad = None
    budget = bt.checkpointed_while_loop(cond, body, memory="60kB")
    budget(p, h0).pow(2).sum().backward()
    torch.testing.assert_close(p.grad, want, rtol=1e-10, atol=1e-12)
    assert budget.stats.taped_steps == n


@pytest.mark.parametrize("limit", [None, 10])
def test_a_loop_called_again_replays_its_plan_s_actions_exactly(limit, monkeypatch):
    """The second call iterates the first call's actions (a tuple) when the plan has at most
    ActionCache.LIMIT of them, and streams the planner's generator otherwise; both do t(l, s)
    plain and l taped steps and give the gradient of the first call."""
    from bincheck.runtime.front import ActionCache
    if limit is not None:
        monkeypatch.setattr(ActionCache, "LIMIT", limit)
    l, s = 30, 4
    params, h0, xs = problem(l)
    W, U, b = requiring(*params)
    cell = Counter(tanh_cell)
    loop = bt.binomial_checkpoint(cell, l, s)
    grads, kept = [], []
    for _ in range(3):
        cell.plain = cell.taped = 0
        grads.append(torch.autograd.grad(loop((W, U, b), h0, xs).pow(2).sum(), (W, U, b)))
        assert (cell.plain, cell.taped) == (closed_form(l, s), l)
        kept.append(loop.action_cache._last[2])
    if limit is None:
        assert kept[0] == tuple(bincheck.plan(l, s)) and kept[1] is kept[0] and kept[2] is kept[0]
    else:
        assert kept == [None, None, None]                  # over the limit: streamed each time
    for g in grads[1:]:
        for a, b_ in zip(g, grads[0]):
            torch.testing.assert_close(a, b_, rtol=0, atol=0)


def test_the_action_cache_keeps_only_fixed_plans_and_follows_their_settings():
    """memory= plans are never kept (the budget counts what the loop holds); a fixed plan whose
    checkpoint count is changed in place is planned again, not replayed."""
    l = 40
    params, h0, xs = problem(l)
    W, U, b = requiring(*params)
    budget = bt.binomial_checkpoint(tanh_cell, l, memory="20kB")
    budget((W, U, b), h0, xs).pow(2).sum().backward()
    assert budget.action_cache._last is None
    loop = bt.binomial_checkpoint(tanh_cell, l, 3)
    loop((W, U, b), h0, xs).pow(2).sum().backward()
    assert loop.stats.plain_steps == closed_form(l, 3)
    loop.schedule.num_ckpts = 5
    loop((W, U, b), h0, xs).pow(2).sum().backward()
    assert loop.stats.plain_steps == closed_form(l, 5)
    assert loop.action_cache._last[2] == tuple(bincheck.plan(l, 5))
