"""Kept segments must pay (issue 29 items 9 and 10): a segment plan is kept only where it is
predicted faster than states only at *measured* prices (``prices.step_prices``), its length
is chosen with a few compiled sweeps rather than one per candidate, and ``memory=`` considers
segments by default.

The prices are timings, so every test here replaces ``prices.step_prices`` with fixed ones
(``monkeypatch``): the tests assert plan choices and counts, never times."""

import pytest

from jax_helpers import jax, problem, tanh_cell, temp_bytes  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import bincheck.jax as bj  # noqa: E402
from bincheck.jax import loops, segments  # noqa: E402
try:                                   # before issue 29 item 9 there were no prices
    from bincheck.jax import prices
except ImportError:
    prices = segments
from bincheck.jax.segments import BlockFlat, StaticSegmentsPlan, candidates  # noqa: E402

T = 120                     # 8 candidate lengths
BUDGET = 10_000             # 96-byte states: 12-step segments, 108 plain steps against 161


class Prices:
    def __init__(self, step, recompute):
        self.step, self.recompute = step, recompute

    def time(self, seq_len, plain_steps, forward_plain):
        return seq_len * self.step + (plain_steps - forward_plain) * self.recompute


def priced(monkeypatch, segment_step):
    """Fixed prices: a states-only step 1.0, a step in a segment ``segment_step``, a
    recomputation 0.3 either way. ``raising=False``: before the prices existed this set an
    attribute nobody read, and the test fails on its assertion, not here."""
    def fake(flat, L, x_wanted):
        return Prices(1.0, 0.3), Prices(segment_step, 0.3)
    monkeypatch.setattr(prices, "step_prices", fake, raising=False)


def loss(loop):
    return lambda p, h, x: jnp.sum(loop(p, h, x) ** 2)


# --------------------------------------------------------------------------- item 9
def test_segments_fewer_evaluations_but_slower_at_their_price_are_declined(monkeypatch):
    # jax-cfd (issue 29 item 9): a step cost 1.5x as much inside a segment, and the plan
    # chosen by evaluations ran 1.5x states only's time. At that price segments must go.
    args = problem(T)
    priced(monkeypatch, 1.5)
    loop = bj.binomial_checkpoint(tanh_cell, T, memory=BUDGET, keep_segments=True)
    plan = loop.preview(*args)
    states_only = bj.binomial_checkpoint(tanh_cell, T, memory=BUDGET,
                                         keep_segments=False).preview(*args)
    assert not isinstance(plan, StaticSegmentsPlan), str(plan)
    assert plan.plain_steps == states_only.plain_steps


def test_segments_that_pay_at_their_price_are_kept(monkeypatch):
    args = problem(T)
    priced(monkeypatch, 1.0)
    plan = bj.binomial_checkpoint(tanh_cell, T, memory=BUDGET, keep_segments=True).preview(*args)
    assert isinstance(plan, StaticSegmentsPlan), str(plan)


def test_the_prediction_compares_times_with_the_margin():
    # 100 steps, states only 150 plain (99 in the forward): 100 * 1.0 + 51 * 0.5 = 125.5;
    # segments of 10 with 90 plain (90 in the forward): 100 * p.
    states = prices.Prices(1.0, 0.5)
    assert states.time(100, 150, 99) == 125.5
    assert prices.Prices(1.19, 0.5).time(100, 90, 90) <= \
        (1 - prices.PRICE_MARGIN) * 125.5 < prices.Prices(1.20, 0.5).time(100, 90, 90)


# --------------------------------------------------------------------------- item 10
def test_memory_keeps_segments_by_default_where_they_pay(monkeypatch):
    # The default was states only (1.15x nested remat's time at its bytes, issue 29 item
    # 10); now memory= considers segments unless keep_segments=False.
    args = problem(T)
    priced(monkeypatch, 1.0)
    loop = bj.binomial_checkpoint(tanh_cell, T, memory=BUDGET)
    plan = loop.preview(*args)
    assert isinstance(plan, StaticSegmentsPlan), str(plan)
    assert temp_bytes(jax.grad(loss(loop)), *args) <= BUDGET      # traced: the gradient's plan
    assert isinstance(loop.plan, StaticSegmentsPlan)
    # and bj.scan's default considers them too: it measures a segment length's sweep
    class Measured(Exception):
        pass

    real = loops.measure_sweep

    def measure_sweep(flat, *a, **k):       # a segment length's sweep (BlockFlat)
        if isinstance(flat, BlockFlat):
            raise Measured
        return real(flat, *a, **k)
    monkeypatch.setattr(loops, "measure_sweep", measure_sweep)
    p, h0, xs = args
    with pytest.raises(Measured):
        jax.grad(lambda h: jnp.sum(bj.scan(lambda h, x: (tanh_cell(p, h, x), None), h, xs,
                                           memory=BUDGET)[0] ** 2))(h0)


def test_the_default_declines_segments_that_would_not_pay(monkeypatch):
    args = problem(T)
    priced(monkeypatch, 1.5)
    assert not isinstance(bj.binomial_checkpoint(tanh_cell, T, memory=BUDGET).preview(*args),
                          StaticSegmentsPlan)


def test_keep_segments_false_and_num_ckpts_store_states_only_and_compile_no_sweep(monkeypatch):
    args = problem(T)
    calls = []
    real = loops.measure_sweep

    def measure_sweep(flat, *a, **k):       # segment lengths' sweeps (BlockFlat) counted
        calls.extend([flat.L] if isinstance(flat, BlockFlat) else [])
        return real(flat, *a, **k)
    monkeypatch.setattr(loops, "measure_sweep", measure_sweep)
    plan = bj.binomial_checkpoint(tanh_cell, T, memory=BUDGET, keep_segments=False).preview(*args)
    assert not isinstance(plan, StaticSegmentsPlan)
    jax.grad(loss(bj.binomial_checkpoint(tanh_cell, T, 10)))(*args)
    assert calls == []


def test_a_few_lengths_are_compiled_not_every_candidate(monkeypatch):
    # Each measured length compiles a gradient of the sweep; the others are guessed from the
    # lines through the measured ones, and a guess is measured before it is planned. The plan
    # chosen is planned from measured sizes and holds the budget.
    args = problem(T)
    priced(monkeypatch, 0.9)
    measured = []
    real = loops.measure_sweep

    def counted(flat, *a, **k):
        measured.extend([flat.L] if isinstance(flat, BlockFlat) else [])
        return real(flat, *a, **k)
    monkeypatch.setattr(loops, "measure_sweep", counted)
    budget = 8_000          # before: all 8 candidates compiled (5-step segments, 150 plain)
    loop = bj.binomial_checkpoint(tanh_cell, T, memory=budget, keep_segments=True)
    plan = loop.preview(*args)
    assert len(candidates(T)) == 8
    assert len(measured) <= 4, measured
    assert len(measured) == len(set(measured)) and segments.MEASURED_LENGTHS == 4
    assert isinstance(plan, StaticSegmentsPlan) and plan.segment_len in measured
    assert plan.peak_bytes <= budget
    assert temp_bytes(jax.grad(loss(loop)), *args) <= budget


@pytest.mark.parametrize("lo,hi,L,want", [(2, 10, 6, 150), (2, 10, 2, 100), (4, 4, 4, 120)])
def test_interpolated_sizes_lie_on_the_line(lo, hi, L, want):
    from bincheck.schedule.budget import Sizes
    a = Sizes(state_bytes=8, work_bytes=100 if lo != hi else 120)
    b = Sizes(state_bytes=8, work_bytes=200 if lo != hi else 120)
    got = segments.interpolated((lo, a), (hi, b), L)
    assert got.work_bytes == want and got.state_bytes == 8


REAL_STEP_PRICES = getattr(prices, "step_prices", None)     # before conftest's stand-in


def test_the_prices_are_measured_per_step_on_compiled_sweeps():
    # the real measurement (whose numbers no test may assert): it runs, under an outer trace
    # too (the reverse mode prices at trace time), and gives positive seconds per step
    args = problem(T)
    flat = bj.binomial_checkpoint(tanh_cell, T, memory=BUDGET)._flat(*args)
    got = []
    jax.eval_shape(lambda *a: got.append(REAL_STEP_PRICES(flat, 12, False)) or 0, *args)
    (states, kept), = got
    assert 0 < states.step < 1 and 0 < kept.step < 1
    assert states.recompute == kept.recompute >= 0
