"""FittedRevolve: Revolve over groups of a chain's stages with the snapshots the exact model
fits, the torch planner's candidate beside the DP over a few dozen groups."""

from __future__ import annotations

import numpy as np
import pytest

from bincheck.schedule.binomial import Plan
from bincheck.schedule.chain import Chain, ChainPlan, chain_cost, minimum_memory
from bincheck.schedule.fitted import FittedRevolve


def rnn_chain(steps: int = 1000, seed: int = 0) -> Chain:
    """A recorded tanh RNN's shape: four stages a step (three views that take no time and tape
    nothing, one that tapes the new state), every cut the state, the gradients held throughout
    (``adj``) and the weight's gradient made at each step's backward (``back``)."""
    rng = np.random.default_rng(seed)
    n = 4 * steps
    heavy = np.arange(n) % 4 == 3
    plain = np.where(heavy, 100e-6, 5e-6) * rng.uniform(0.8, 1.2, n)
    state = 33_000
    tape = np.where(heavy, 32_768, 0)
    back = np.where(heavy, 300_000, 0)
    return Chain(plain, plain * 3, tape, np.full(n + 1, state), 16_384, np.zeros(n, int),
                 np.full(n + 1, 526_000), back)


def old_fallback(chain: Chain, memory: int) -> Plan:
    big = int(chain.cuts.max())
    return Plan(chain.n, min(chain.n, 1 + (memory - minimum_memory(chain)) // big))


@pytest.mark.parametrize("memory", [1_200_000, 1_600_000])
def test_fits_where_the_dp_over_64_groups_does_not_and_recomputes_less(memory):
    chain = rnn_chain()
    with pytest.raises(ValueError):
        ChainPlan(chain, memory=memory, max_stages=64)     # a group tapes 16 steps at once
    plan = FittedRevolve.best(chain, memory)
    cost = chain_cost(chain, iter(plan))                    # valid: the tracker checks each
    assert cost.peak_bytes == plan.peak_bytes <= memory
    assert cost.taped_stages == chain.n
    fallback = old_fallback(chain, memory)
    assert chain_cost(chain, iter(fallback)).peak_bytes <= memory
    # fewer stage evaluations than Revolve over the stages (the torch planner's fallback)
    assert plan.plain_stages < 0.8 * fallback.plain_steps, (plan.plain_stages,
                                                            fallback.plain_steps)
    assert plan.seconds < chain_cost(chain, iter(fallback)).seconds


def test_each_snapshot_more_would_exceed_the_budget():
    chain = rnn_chain(300)
    memory = 1_500_000
    plan = FittedRevolve.best(chain, memory)
    more = FittedRevolve(chain, plan.bounds, plan.slots + 1)
    assert plan.peak_bytes <= memory < more.peak_bytes or more.slots == plan.slots


def test_none_where_one_snapshot_does_not_fit_or_the_plan_sweeps_too_often():
    chain = rnn_chain(300)
    assert FittedRevolve.best(chain, minimum_memory(chain) - 1) is None
    # one snapshot over hundreds of groups: thousands of sweeps, not priced
    assert FittedRevolve.fit(chain, minimum_memory(chain), list(range(chain.n + 1))) is None


def test_a_loop_is_also_tried_in_whole_bodies(monkeypatch):
    """Where a step's cuts differ (autograd's RNN: both dots' results live at one cut of four),
    groups of whole steps that all start at the same op hold fewer bytes than the balanced
    groups of chain.group (cut at the first cheap cut near equal times): a candidate priced by
    the same model, which wins here."""
    from test_grouped import _loop_chain

    from bincheck.schedule import grouped
    chain = _loop_chain(1000, noise=0.3)
    memory = 2_800_000
    plan = FittedRevolve.best(chain, memory)
    assert chain_cost(chain, iter(plan)).peak_bytes <= memory
    sizes = set(np.diff(plan.bounds[1:-1]).tolist())
    assert len(sizes) == 1 and sizes.pop() % 4 == 0, plan.bounds[:10]
    monkeypatch.setattr(grouped, "period", lambda chain: 0)
    balanced = FittedRevolve.best(chain, memory)
    assert plan.seconds < 0.97 * balanced.seconds, (plan.seconds, balanced.seconds)
