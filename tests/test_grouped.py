"""GroupedRevolve: Revolve over groups of a long chain's stages (bincheck.schedule.grouped)."""

import numpy
import pytest

from bincheck.schedule.chain import Chain, chain_cost
from bincheck.schedule.grouped import GroupedRevolve


def _chain(n, seed, adjoint=False):
    rs = numpy.random.RandomState(seed)
    cuts = rs.randint(100, 5000, n + 1)
    cuts[rs.rand(n + 1) < 0.2] = 50                 # cheap boundaries, as between loop steps
    # torch's chains: the adjoint's bytes at each cut and a pull-back's own beside its spike
    more = dict(spike=rs.randint(0, 3000, n), adj=rs.randint(0, 8000, n + 1),
                back=rs.randint(0, 6000, n)) if adjoint else {}
    return Chain(rs.rand(n) + 0.1, 3 * rs.rand(n) + 0.3, rs.randint(1000, 20000, n), cuts, 500,
                 **more)


@pytest.mark.parametrize("adjoint", [False, True])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("groups", [8, 64, 300])
def test_plans_are_valid_and_predictions_bound_the_simulation(seed, groups, adjoint):
    chain = _chain(300, seed, adjoint)
    memory = 1_500_000
    plan = GroupedRevolve(chain, memory, groups)
    cost = chain_cost(chain, iter(plan))                  # raises on an invalid action
    assert cost.peak_bytes <= plan.peak_bytes <= memory
    assert cost.plain_stages == plan.plain_stages and cost.taped_stages == chain.n
    assert plan.stages <= groups


def test_enough_memory_stores_every_boundary_and_advances_each_stage_once():
    chain = _chain(500, 7)
    plan = GroupedRevolve.best(chain, 10 ** 9)
    assert plan.slots == plan.stages
    last = plan.bounds[-1] - plan.bounds[-2]
    assert chain_cost(chain, iter(plan)).plain_stages == plan.plain_stages == chain.n - last


def test_less_memory_means_more_recomputation_and_too_little_is_refused():
    chain = _chain(400, 3)
    plans = [GroupedRevolve.best(chain, m) for m in (2_000_000, 400_000, 150_000)]
    counts = [p.plain_stages for p in plans]
    assert counts == sorted(counts) and counts[0] < counts[-1]
    for p, m in zip(plans, (2_000_000, 400_000, 150_000)):
        assert chain_cost(chain, iter(p)).peak_bytes <= m
    assert GroupedRevolve.best(chain, 20_000) is None
    with pytest.raises(ValueError, match="does not hold one of 8 groups"):
        GroupedRevolve(chain, 20_000, 8)


def test_a_pause_recorded_in_one_stage_does_not_move_boundaries_onto_large_cuts():
    """Per-op times are measured: one op that took 500x its peers (a pause) gathers several
    equal-time targets around it; the boundaries there must still land on small cuts."""
    n = 1200
    cuts = numpy.tile([2000, 80000, 80000, 2000, 2000, 2000], n // 6 + 1)[:n + 1]
    plain = numpy.full(n, 1e-5)
    plain[603] = 5e-3           # the targets it gathers end at cut 603 + 1 + 1200 // 256 = 608
    chain = Chain(plain, 3 * plain, numpy.full(n, 1000), cuts, 0)
    from bincheck.schedule.chain import group
    bounds = group(chain, 128)
    assert max(cuts[b] for b in bounds) == 2000
    assert len(bounds) > 64                       # elsewhere the groups are as asked


def test_cut_zero_costs_its_own_bytes_not_a_slot_of_the_largest():
    """Revolve's first snapshot is cut 0, held throughout; a program's cut 0 holds no value (its
    inputs are held anyway). Priced as the largest boundary, it cost an RNN at
    binomial_checkpoint's peak for 10 one of its 64 kB snapshots (issue 30, benchmark (b))."""
    n, big, tape, work = 40, 10_000, 3_000, 5_000
    cuts = numpy.full(n + 1, big)
    cuts[0] = 100
    chain = Chain(numpy.ones(n), numpy.full(n, 3.0), numpy.full(n, tape), cuts, work)
    held = max(2 * big, big + tape)                   # a reverse: its input cut and one tape
    memory = work + held + 100 + 5 * big              # cut 0 and five more snapshots
    plan = GroupedRevolve(chain, memory, n)
    assert plan.slots == 6                            # it was 5: cut 0 priced at `big`
    cost = chain_cost(chain, iter(plan))
    assert cost.peak_snapshots == 6
    assert cost.peak_bytes <= plan.peak_bytes == memory


def _loop_chain(steps, noise=0.0, seed=0):
    """The chain of a tanh RNN recorded op by op (dot, dot, add, tanh a step): a state of 64 kB
    live at three of a step's four cuts, both dots' results at the fourth; the dots tape their
    inputs; plain times equal but for ``noise``."""
    rs = numpy.random.RandomState(seed)
    body_cuts, body_tape = [65_000, 65_000, 130_000, 65_000], [2_000, 2_000, 67_000, 67_000]
    cuts = numpy.array([1_500] + body_cuts[1:] + body_cuts * (steps - 1) + [65_000])
    n = 4 * steps
    plain = 1.0 + noise * rs.rand(n)
    back = numpy.tile([65_000, 130_000, 130_000, 0], steps)
    return Chain(plain, 3 * plain, numpy.tile(body_tape, steps), cuts, 1_900_000,
                 back=back)


def test_a_repeating_chain_is_grouped_in_whole_bodies_at_its_cheapest_phase(monkeypatch):
    """A loop's body recorded op by op repeats: groups of whole bodies that all start at the same
    phase tape no more than a body, so Revolve over them holds more snapshots than over groups
    cut at the first cheap cut near equal times (whose sizes vary, 1 to 7 ops on the T=1000 RNN):
    16,016 plain ops there, against 17,242 before; here 11 % fewer."""
    from bincheck.schedule.grouped import period
    chain = _loop_chain(1000, noise=0.3)
    assert period(chain) == 4
    plan = GroupedRevolve.best(chain, 2_800_000)
    cost = chain_cost(chain, iter(plan))
    assert cost.peak_bytes <= plan.peak_bytes <= 2_800_000
    sizes = numpy.diff(plan.bounds[1:-1])
    assert len(set(sizes.tolist())) == 1 and sizes[0] % 4 == 0, plan.bounds[:12]
    # against the balanced groups alone (the period unseen)
    from bincheck.schedule import grouped
    monkeypatch.setattr(grouped, "period", lambda chain: 0)
    balanced = GroupedRevolve.best(chain, 2_800_000)
    assert plan.plain_stages < 0.95 * balanced.plain_stages, (plan.plain_stages,
                                                              balanced.plain_stages)


def test_the_group_counts_both_many_group_planners_try():
    """sqrt(2) steps from the smallest, capped at the largest and at the chain's stages (one
    generator for GroupedRevolve.best and FittedRevolve.best)."""
    from bincheck.schedule.grouped import group_counts
    assert list(group_counts(10 ** 6, 64, 4096)) == [64, 91, 128, 181, 256, 362, 512, 724, 1024,
                                                    1448, 2048, 2896, 4096]
    assert list(group_counts(300, 64, 4096)) == [64, 91, 128, 181, 256, 300]
    assert list(group_counts(10 ** 6, 64, 100)) == [64, 91, 100]
    assert list(group_counts(40, 64, 4096)) == [40]
