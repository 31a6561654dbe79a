"""checkpoint_program's replay and byte model: what a reverse holds at once, the planners' bounds
(issue 30, benchmark (b)'s findings)."""

import tracemalloc

import autograd.numpy as np
import numpy
import pytest
from autograd import grad
from autograd.core import VJPNode
from autograd.tracer import new_box, trace_stack

from bincheck import checkpoint_program
from bincheck.autograd.replay import accumulate, pull_back
from bincheck.schedule.binomial import Plan
from bincheck.schedule.chain import Chain, chain_cost, group
from bincheck.schedule.grouped import GroupedRevolve

rng = numpy.random.RandomState(0)


def test_pull_back_hands_over_one_input_sized_cotangent_at_a_time():
    """An RNN step reaches W and U (512 kB each): each cotangent reaching them goes to the sink
    as it arrives, and the previous one is gone by then (the loop's names held W's while U's
    was made: two at once at the peak)."""
    H = 256
    W, U, h, x = rng.randn(H, H) * 0.05, rng.randn(H, H) * 0.05, rng.randn(4, H), rng.randn(4, H)
    with trace_stack.new_trace() as level:
        roots = [VJPNode.new_root(), VJPNode.new_root()]
        bW, bU = new_box(W, level, roots[0]), new_box(U, level, roots[1])
        nodes = []
        ran = lambda v: nodes.append(v._node) or v  # noqa: E731  (each op's node, in order)
        a = ran(np.tanh(ran(ran(np.dot(h, bW)) + ran(np.dot(x, bU)))))
        out = ran(np.tanh(ran(ran(np.dot(a, bW)) + ran(np.dot(x, bU)))))
    seen = []
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    pull_back([out], [numpy.ones((4, H))], roots, level, lambda i, c: seen.append(i), nodes)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    assert sorted(seen) == [0, 0, 1, 1]                  # each use of W and U, as it arrives
    # the cotangent being made or handed over (512 kB) and small ones, never two of W's size
    assert peak < 1.5 * W.nbytes, peak


def test_a_side_branchs_cotangents_do_not_wait_down_the_chain():
    """x = solve(A0 + w*I, x), 60 times: pulled back last op first, each 8 kB cotangent of A
    goes as soon as w's share is taken. Autograd's depth-first order followed the chain of x
    first and held all 60 (480 kB) until its end: more than any plan priced (issue 30's
    review: a loop of solves peaked at 1.06 of memory=)."""
    n, steps = 32, 60
    A0, I = rng.randn(n, n) + n * numpy.eye(n), numpy.eye(n)
    with trace_stack.new_trace() as level:
        roots = [VJPNode.new_root(), VJPNode.new_root()]
        w, x = new_box(0.5, level, roots[0]), new_box(rng.randn(n), level, roots[1])
        nodes = []
        ran = lambda v: nodes.append(v._node) or v  # noqa: E731
        for _ in range(steps):
            x = ran(np.linalg.solve(ran(A0 + ran(w * I)), x))
    seen = []
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    pull_back([x], [numpy.ones(n)], roots, level, lambda i, c: seen.append(i), nodes)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    assert sorted(seen) == [0] * steps + [1]
    assert peak < 8 * I.nbytes, peak                     # a few of A's size at once


def test_an_inputs_cotangent_is_summed_in_its_own_layout():
    """dot's VJP returns W's cotangent transposed: its copy keeps that layout, so the sums that
    follow add like to like (a C-ordered copy made each add 10x slower)."""
    c = rng.randn(64, 64).T
    ct = {}
    accumulate(ct, 0, c, True)
    assert ct[0] is not c and ct[0].flags.f_contiguous
    accumulate(ct, 0, c, True)
    numpy.testing.assert_array_equal(ct[0], c + c)


def test_the_plan_counts_the_callers_sum_of_the_returned_cotangents():
    """grad over several arguments sums the returned cotangents into a zero container of its
    own: the inputs twice at the end, whatever the plan."""
    W, U = rng.randn(128, 128), rng.randn(128, 128)

    def f(W, U, h):
        for _ in range(5):
            h = np.tanh(np.dot(h, W) + U[0])
        return np.sum(h)
    h = rng.randn(2, 128)
    g = checkpoint_program(f, memory=1_000_000)
    assert g.preview(W, U, h).peak_bytes >= 2 * (W.nbytes + U.nbytes + h.nbytes)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    grad(g, (0, 1, 2))(W, U, h)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    assert 2 * (W.nbytes + U.nbytes) < peak <= 1_000_000


def _rnn(T):
    H, B = 64, 8
    xs = rng.randn(T, B, H)

    def natural(W, U, h):
        for t in range(T):
            h = np.tanh(np.dot(h, W) + np.dot(xs[t], U))
        return np.sum(h ** 2)
    return natural, (rng.randn(H, H) / 8, rng.randn(H, H) / 8, rng.randn(B, H) * 0.1)


@pytest.mark.parametrize("memory", [760_000, 1_160_000])
def test_a_natural_rnn_snapshots_at_step_boundaries_within_the_budget(memory):
    """Groups cut where one state is live (a step boundary: 4 kB), not mid-step (8 kB): fewer
    recomputations in the same bytes than Revolve over the ops, and the peak within the
    budget."""
    f, args = _rnn(100)
    g = checkpoint_program(f, memory=memory)
    want = grad(f, (0, 1, 2))(*args)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    got = grad(g, (0, 1, 2))(*args)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    for a, b in zip(got, want):
        numpy.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    st = g.stats
    assert peak <= memory
    # not Revolve over the ops (slots of the largest, mid-step cut): groups, or the DP's
    assert not isinstance(g.preview(*args).actions, Plan)
    assert st.plain_ops <= 4 * st.ops


def test_grouped_revolve_bounds_a_group_whose_inside_holds_more_than_its_boundaries():
    """A group's own cuts (and spikes) can exceed two boundary cuts: advancing through it holds
    them, and the prediction bounds the simulation (it counted two boundaries before)."""
    rs = numpy.random.RandomState(3)
    n = 200
    cuts = rs.randint(10_000, 20_000, n + 1)
    cuts[::4] = 100                                     # cheap boundaries every 4 stages
    chain = Chain(rs.rand(n) + 0.1, rs.rand(n) + 0.3, numpy.full(n, 10), cuts, 500,
                  rs.randint(0, 30_000, n))
    for groups in (25, 50):
        plan = GroupedRevolve(chain, 400_000, groups)
        assert chain_cost(chain, iter(plan)).peak_bytes <= plan.peak_bytes <= 400_000


def _group_reference(chain, stages):
    """group()'s loop as it was (one numpy window per boundary), to compare against."""
    n = chain.n
    if stages >= n:
        return list(range(n + 1))
    total = numpy.concatenate([[0.0], numpy.cumsum(chain.plain)])
    width = max(1, n // (2 * stages))
    bounds = [0]
    for g in range(1, stages):
        target = int(numpy.searchsorted(total, total[-1] * g / stages))
        lo, hi = max(bounds[-1] + 1, target - width), min(n - 1, target + width)
        if lo > hi:
            continue
        best = lo + int(numpy.argmin(chain.cuts[lo:hi + 1]))
        if lo > target - width and \
                chain.cuts[best] > chain.cuts[max(0, target - width):hi + 1].min():
            continue
        bounds.append(best)
    bounds.append(n)
    return sorted(set(bounds))


@pytest.mark.parametrize("seed", range(20))
def test_group_finds_the_windows_least_cuts_as_the_loop_did(seed):
    rs = numpy.random.RandomState(seed)
    n = rs.randint(2, 400)
    plain = rs.rand(n) ** rs.choice([1, 3, 8])
    plain[rs.randint(n)] *= 100                         # a pause gathers targets in one stage
    chain = Chain(plain, plain, numpy.zeros(n, int), rs.randint(0, rs.choice([3, 10 ** 6]), n + 1))
    for stages in (1, 2, 3, 16, 64, rs.randint(1, n + 2)):
        assert group(chain, stages) == _group_reference(chain, stages)


def test_group_holds_a_few_bytes_an_op_while_it_plans():
    """Planning's bytes are counted inside the budget: grouping a long chain holds about two
    arrays of its length (a list of every cut held 40 bytes an op more: benchmark (c) went
    over its budget while planning)."""
    rs = numpy.random.RandomState(1)
    n = 80_000
    chain = Chain(rs.rand(n), rs.rand(n), numpy.zeros(n, int), rs.randint(0, 10 ** 5, n + 1))
    for stages in (64, 4096):
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        group(chain, stages)
        peak = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
        assert peak < 24 * n, (stages, peak / n)


def test_a_least_budget_set_by_planning_holds_under_tracemalloc():
    """A solver of two floats whose Newton loop runs ~1,400 ops: its least budget is what
    planning's per-op arrays need beside the trace; the first gradient at exactly that budget
    peaked at 1.003 of it while planning counted 96 bytes an op."""
    import re
    import sys
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from test_program import implicit_euler
    p, y = numpy.array([3.0]), numpy.array([1.0, 0.5])
    grad(implicit_euler, (0, 1))(p, y)                      # autograd's own first-call caches
    with pytest.raises(ValueError, match="bytes in all") as err:
        grad(checkpoint_program(implicit_euler, memory=1), (0, 1))(p, y)
    least = int(re.search(r"(\d+) bytes in all", str(err.value)).group(1))
    del err                 # its traceback's frames: 27 kB more at the peak when kept (measured)
    g = checkpoint_program(implicit_euler, memory=least)
    tracemalloc.start()
    try:
        grad(g, (0, 1))(p, y)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert g.stats.ops > 1000 and peak <= least, (peak, least)


@pytest.mark.parametrize("seed", range(8))
def test_grouped_revolve_prices_an_advance_or_a_reverse_never_both(seed):
    """An advance holds the live values, a reverse its input cut and its group's tape: the
    prediction, their larger (not their sum, which cost an RNN at binomial's peak for 10 two of
    its snapshots), still bounds the chain model's simulation of every action."""
    rs = numpy.random.RandomState(seed)
    n = int(rs.randint(60, 300))
    cuts = rs.randint(1_000, 20_000, n + 1)
    chain = Chain(rs.rand(n) + 0.1, rs.rand(n) + 0.3, rs.randint(0, 40_000, n), cuts,
                  int(rs.randint(0, 50_000)), rs.randint(0, 60_000, n))
    for groups in (16, 32, 64):
        try:
            plan = GroupedRevolve(chain, 600_000, groups)
        except ValueError:
            continue
        assert chain_cost(chain, iter(plan)).peak_bytes <= plan.peak_bytes <= 600_000
