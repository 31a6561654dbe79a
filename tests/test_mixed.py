"""The mixed planner (snapshots and kept tapes under one byte budget): its model against an
exhaustive search, the fast table against the reference DP, the plans against Revolve and
checkpoint_schedules, every plan's validity, and planning time at realistic sizes."""

import contextlib
import io
import random
import time
import warnings
from collections import deque

import checkpoint_schedules
import pytest

from bincheck.schedule import simulate
from bincheck.schedule.binomial import optimal_plain_steps
from bincheck.schedule.mixed import MixedPlan, ReferenceTable, leaf_lengths
from bincheck.schedule.mixed_chain import INF, ChainTable, chain_formula_holds

KiB = 1024
RNN = (64 * KiB, 140 * KiB)           # (state_bytes, tape_bytes): tanh RNN, H=256, B=32
LSTM = (128 * KiB, 930 * KiB)
BIG = 10 ** 12                        # a tape that never fits


def exhaustive(n, memory, S, T):
    """Fewest plain steps over *all* action sequences (0-1 BFS), kept tapes of arbitrary steps.

    A configuration is (live state or None, stored states, kept tapes, frontier f: steps >= f are
    reversed). Moves: a plain step (cost 1); a taped step whose tape is kept (cost 0, T bytes);
    taping and reversing step f-1 from the live state; reversing step f-1 from its kept tape; storing,
    restoring or freeing a state (S bytes each). A kept tape never restarts the forward. The live
    state and the working tape are outside the budget, as in the planner's model.
    """
    start = (0, frozenset(), frozenset(), n)
    dist, queue = {start: 0}, deque([start])
    while queue:
        config = queue.popleft()
        d = dist[config]
        live, states, tapes, f = config
        if f == 0:
            return d
        moves = []
        if live is not None and live < f - 1:
            moves.append((1, (live + 1, states, tapes, f)))
            if len(states) * S + (len(tapes) + 1) * T <= memory:
                moves.append((0, (live + 1, states, tapes | {live}, f)))
        if live == f - 1:
            moves.append((0, (None, states, tapes, f - 1)))
        if f - 1 in tapes:
            keep = live if live is not None and live < f - 1 else None
            moves.append((0, (keep, states, tapes - {f - 1}, f - 1)))
        if live is not None and live not in states and \
                (len(states) + 1) * S + len(tapes) * T <= memory:
            moves.append((0, (live, states | {live}, tapes, f)))
        for k in states:
            if k < f:
                moves.append((0, (k, states, tapes, f)))
            moves.append((0, (live, states - {k}, tapes, f)))
        for cost, nxt in moves:
            if d + cost < dist.get(nxt, INF):
                dist[nxt] = d + cost
                (queue.appendleft if cost == 0 else queue.append)(nxt)
    return INF


@pytest.mark.parametrize("S, T", [(1, 1), (1, 2), (2, 3), (1, 3), (2, 1), (3, 1), (3, 2), (1, BIG)])
def test_reference_dp_equals_exhaustive_search(S, T):
    """Whole taped segments and Revolve's recursion lose nothing against any action sequence."""
    for memory in range(S, 7 * S + 1):
        leaves = leaf_lengths(memory, S, T)
        table = ReferenceTable(7, leaves)
        for n in range(1, 8):
            assert table.cost(n, len(leaves) - 1) == exhaustive(n, memory, S, T), (n, memory)


# (seq_len, state_bytes, tape_bytes, memory): T out of reach, T < S, T = S, T = 3S, rem > 0, and
# the two cells of the benchmark at small budgets (most cells below the chain region).
GRIDS = [(120, 5, BIG, 5 * 30), (300, 7, 3, 7 * 4 + 2), (300, 4, 4, 4 * 25), (300, 4, 12, 4 * 40 + 3),
         (300, 64, 140, 64 * 33 + 50), (300, 10, 7, 10 * 9 + 9), (250, 128, 930, 128 * 60 + 100),
         (300, 5, 2, 5 * 3)]


@pytest.mark.parametrize("N, S, T, memory", GRIDS)
def test_chain_table_equals_reference_on_every_cell(N, S, T, memory):
    leaves = leaf_lengths(memory, S, T)
    assert chain_formula_holds(leaves)
    ref, fast = ReferenceTable(N, leaves), ChainTable(N, leaves)
    R = ref.rows
    for s in range(len(leaves)):
        for n in range(1, N + 1):
            assert fast.cost(n, s) == ref.cost(n, s), (n, s)
            if s == 0 or R[s][n] == INF:
                continue
            j = fast.split(n, s)
            if n <= fast.region(s):                    # the chain region: the reference's split
                assert j == ref.split(n, s), (n, s)
            elif j:                                     # elsewhere: an optimal one
                assert 1 <= j < n and j + R[s][j] + R[s - 1][n - j] == R[s][n], (n, s)
            else:
                assert n <= leaves[s]


def test_grids_reach_every_part_of_the_table():
    parts = set()
    for N, S, T, memory in GRIDS:
        leaves = leaf_lengths(memory, S, T)
        table = ChainTable(N, leaves)
        for s in range(1, len(leaves)):
            for n in range(leaves[s] + 1, N + 1):
                parts.add("chain" if n <= table.region(s) else "second band"
                          if table.in_second_band(n, s) else "revolve" if leaves[s] == 1
                          else "dp")
    assert parts == {"chain", "second band", "revolve", "dp"}


def test_chain_formula_on_any_leaves_meeting_its_hypothesis():
    """The theorem is about L, not about leaf_lengths: random L with increments q or q + 1."""
    rng = random.Random(7)
    for _ in range(60):
        q = rng.randint(0, 4)
        leaves = [rng.randint(1, 4)]
        for _ in range(rng.randint(1, 8)):
            leaves.append(leaves[-1] + q + rng.randint(0, 1))
        ref, fast = ReferenceTable(80, leaves), ChainTable(80, leaves)
        for s in range(len(leaves)):
            for n in range(1, fast.region(s) + 1):
                if n <= 80:
                    assert fast.cost(n, s) == ref.cost(n, s), (leaves, n, s)


def test_chain_table_is_exact_for_any_nondecreasing_leaves():
    """Second band, Revolve rows and DP hold for any nondecreasing L, the hypothesis or not."""
    rng = random.Random(11)
    for _ in range(120):
        leaves = [rng.randint(1, 4)]
        for _ in range(rng.randint(1, 7)):
            leaves.append(leaves[-1] + rng.choice([0, 0, 1, 2, 5, 9]))
        n_max = rng.randint(5, 90)
        ref, fast = ReferenceTable(n_max, leaves), ChainTable(n_max, leaves)
        R = ref.rows
        for s in range(len(leaves)):
            for n in range(1, n_max + 1):
                assert fast.cost(n, s) == R[s][n], (leaves, n, s)
                if s and leaves[s] < n and R[s][n] < INF:
                    j = fast.split(n, s)
                    assert 1 <= j < n and j + R[s][j] + R[s - 1][n - j] == R[s][n]


def test_without_the_hypothesis_the_formula_fails_and_the_table_stays_exact():
    leaves = [1, 6, 7]
    assert not chain_formula_holds(leaves)
    ref, fast = ReferenceTable(16, leaves), ChainTable(16, leaves)
    assert ref.cost(14, 2) == 10 and 14 - leaves[0] == 13        # the formula would say 13
    assert all(fast.cost(n, s) == ref.cost(n, s) for s in range(3) for n in range(1, 17))
    with pytest.raises(ValueError, match="nondecreasing"):
        ChainTable(5, [2, 1])


def multistage_plain(n, s):
    plain = 0
    for action in checkpoint_schedules.MultistageCheckpointSchedule(n, s, 0):
        if isinstance(action, checkpoint_schedules.Forward) and not action.write_adj_deps:
            plain += action.n1 - action.n0
        elif isinstance(action, checkpoint_schedules.EndReverse):
            break
    return plain


@pytest.mark.parametrize("n", [1, 2, 3, 10, 57, 200, 1000])
def test_without_room_for_a_tape_the_plan_is_revolve(n):
    for s in (1, 2, 3, 5, 10, 50):
        p = MixedPlan(n, s * 8, 8, 10 ** 9)
        expected = optimal_plain_steps(n, s)
        assert p.plain_steps == expected, (n, s)
        if n > 1:
            assert multistage_plain(n, s) == expected, (n, s)
        if n <= 200:
            assert simulate(p).plain_steps == expected


def mixed_schedule_plain(n, s):
    forward = 0
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")                   # "Numba not available"
        schedule = checkpoint_schedules.MixedCheckpointSchedule(
            n, s, storage=checkpoint_schedules.StorageType.RAM)
        for action in schedule:
            if isinstance(action, checkpoint_schedules.Forward):
                forward += action.n1 - action.n0
            elif isinstance(action, checkpoint_schedules.EndReverse):
                break
    return forward - n


def test_equal_sizes_match_checkpoint_schedules_mixed_exactly():
    """T == S is Maddison's model (each unit holds a state or one step's tape, the live state and
    one working tape outside): the optimum is the same on every point, not just bounded by it."""
    for n in range(2, 41):
        for s in range(1, n + 1):
            assert MixedPlan(n, s * 8, 8, 8).plain_steps == mixed_schedule_plain(n, s), (n, s)
    for n, s in [(100, 10), (150, 4)]:
        assert MixedPlan(n, s * 8, 8, 8).plain_steps == mixed_schedule_plain(n, s), (n, s)


def check_plan(n, memory, S, T):
    p = MixedPlan(n, memory, S, T)
    cost = simulate(p)                                            # raises on any invalid action
    assert cost.reversed == list(range(n - 1, -1, -1))
    assert cost.taped_steps == p.taped_steps == n
    assert cost.peak_bytes <= memory
    assert cost.plain_steps == p.plain_steps <= optimal_plain_steps(n, memory // S)
    return p


def test_every_plan_is_valid_and_within_budget():
    rng = random.Random(3)
    for _ in range(300):
        S = rng.randint(1, 9)
        T = rng.choice([1, 2, 3, 5, 11, S, 3 * S, BIG])
        n = rng.randint(1, 150)
        check_plan(n, rng.randint(S, 40 * S), S, T)
    for n, (S, T) in [(1000, RNN), (1000, LSTM)]:
        for fraction in (0.01, 0.05, 0.25):
            check_plan(n, int(fraction * n * T), S, T)


def test_a_compacted_plan_replays_the_same_walk_without_its_rows():
    rng = random.Random(5)
    compacted = 0
    for _ in range(60):
        S = rng.randint(1, 9)
        T = rng.choice([2, 3, 5, 11, 3 * S])
        n = rng.randint(2, 200)
        memory = rng.randint(S, 30 * S)
        p, q = MixedPlan(n, memory, S, T), MixedPlan(n, memory, S, T)
        p.compact()
        assert list(p) == list(q) and list(p) == list(q)       # twice: each walk replays afresh
        assert p.plain_steps == q.plain_steps and p.first_reverse_start == q.first_reverse_start
        if p.dp_rows_built:
            compacted += 1
            assert p.table.dp_rows == 0 and p.nbytes < p.dp_row_bytes
    assert compacted >= 10


def test_first_reverse_start_is_the_start_of_the_last_segment():
    p = MixedPlan(500, 30 * 64 + 10, 64, 140)
    first = next(a for a in p if type(a).__name__ == "Reverse")
    assert first.stop == 500 and first.start == p.first_reverse_start


def test_planning_realistic_sizes_is_fast_and_exact_where_checkable():
    S, T = RNN
    n = 10 ** 4
    for fraction in (0.01, 0.02, 0.05, 0.1, 0.25):
        start = time.perf_counter()
        p = check_plan(n, int(fraction * n * T), S, T)
        assert time.perf_counter() - start < 20
        assert p.plain_steps < optimal_plain_steps(n, p.checkpoints)
    start = time.perf_counter()
    p = MixedPlan(10 ** 5, int(0.01 * 10 ** 5 * T), S, T)
    assert p.plain_steps == simulate(p).plain_steps
    assert time.perf_counter() - start < 20
    # Below the chain region, in the second band: still closed form, still valid and optimal-sized.
    start = time.perf_counter()
    p = check_plan(n, int(0.008 * n * T), S, T)
    assert n > p.table.region(p.checkpoints) and p.table.in_second_band(n, p.checkpoints)
    assert time.perf_counter() - start < 20
    # One case well below the chain region, at a realistic size, against the reference.
    leaves = leaf_lengths(int(0.01 * 1000 * T), S, T)
    assert ChainTable(1000, leaves).cost(1000, len(leaves) - 1) == \
        ReferenceTable(1000, leaves).cost(1000, len(leaves) - 1)
