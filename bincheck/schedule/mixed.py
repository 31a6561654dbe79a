"""Checkpointing under a byte budget: stored states *and* stored tapes (Gruslys et al.'s mixed
policy, BPTT-MSM; also Beaumont et al.'s rotor and checkpoint_schedules' Mixed).

Model. A stored state costs ``state_bytes``; a step kept taped costs ``tape_bytes`` (everything its
tape holds alive, its input state included). Every step is taped exactly once whatever the
schedule, so the cost to minimise is the number of plain (untaped) step evaluations. Memory
``memory`` is what snapshots and kept tapes may use together (the working state, one step's tape
and its backward are outside it: see :mod:`bincheck.schedule.budget`).

Structure. A schedule keeps tapes only as whole taped segments: ``Reverse(lo, hi)`` tapes steps
``lo..hi-1`` in one trace and pulls the adjoint back through all of them. With the segment's start
freed first (its bytes are held by the tape), that holds ``(hi - lo - 1) * tape_bytes`` beyond the
working tape. This loses nothing: the exact dynamic program over *arbitrary* kept tapes (each
step's tape kept from any sweep, a kept tape never restarting the forward) gives the same optimum
on every grid compared (``tests/test_mixed.py``; an exhaustive search over all action sequences
agrees for small cases). The problem is therefore Revolve's recursion with taped leaves:

    R(n, s) = 0                                   if n <= L(s)   (tape the segment whole)
    R(n, s) = min_{1<=j<n} j + R(j, s) + R(n-j, s-1)             (store the start, advance j)

where ``s`` counts the state slots available to the subproblem (its own start included) and
``L(s) = 1 + (s * state_bytes + rem) // tape_bytes`` is the longest segment that fits when the
subproblem's ``s`` slots are freed for its tape (``rem`` the budget's bytes beyond whole slots).
With ``tape_bytes`` out of reach, ``L = 1`` and R is Revolve's ``t(n, s)``.

Solving it. :class:`ReferenceTable` is the exact DP, O(seq_len^2 * slots) time: the reference the
tests hold everything else to. :class:`~bincheck.schedule.mixed_chain.ChainTable`, which
:class:`MixedPlan` uses, is exact too: proven closed forms wherever the budget lets every step be
recomputed at most once or, a little below, at most twice along plateaus of ``L`` (at n = 10^4,
every budget from about 0.75 % of ``n * T`` for the RNN cell of the benchmark; O(log slots) per
query, O(slots) memory), and the same DP, restricted to the remaining cells, below that. Its module
states the proofs, what is only measured, and the costs.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterator
from operator import add

from .actions import Action, Advance, Free, Restore, Reverse, Snapshot
from .mixed_chain import INF, ChainTable
from .validate import check_positive_int


def leaf_lengths(memory: int, state_bytes: int, tape_bytes: int,
                 seq_len: int | None = None) -> list[int]:
    """``L[s]`` for ``s = 0 .. memory // state_bytes``: the longest segment reversible by taping it
    whole when ``s`` slots' bytes (and the remainder below one slot) are free.

    With ``seq_len``, only the top ``min(slots + 1, seq_len)`` rows: the only ones a schedule of
    ``seq_len`` steps reaches from the top row. Why: every level down the recursion takes one
    slot and at least one step (``R(n, s)`` reads row ``s - 1`` only for ``n - j <= n - 1``
    steps), so row ``top - d`` sees at most ``seq_len - d`` steps, and row ``top - seq_len + 1``
    only single steps, which are leaves whatever the budget. Indices then start at the lowest
    row kept; the rows cut off never mattered, so planning costs O(seq_len) whatever the budget.
    """
    slots, rem = divmod(memory, state_bytes)
    base = 0 if seq_len is None else max(0, slots - (seq_len - 1))
    return [1 + (s * state_bytes + rem) // tape_bytes for s in range(base, slots + 1)]


class ReferenceTable:
    """R(n, s) for every ``n <= seq_len`` and ``s <= len(L) - 1``, with an optimal split.

    The exact dynamic program, O(seq_len^2 * slots) time and O(seq_len * slots) memory; the inner
    minimum runs at C speed (``min(map(add, ...))``), about 2 s for 1000 steps and 90 slots. The
    reference for :class:`~bincheck.schedule.mixed_chain.ChainTable` (same interface).
    """

    def __init__(self, seq_len: int, leaves: list[int]) -> None:
        self.seq_len, self.leaves = seq_len, leaves
        N = seq_len
        self.rows: list[list[float]] = []
        for s, leaf in enumerate(leaves):
            row = [INF] * (N + 1)
            row[0] = 0
            shifted = [INF] * (N + 1)          # shifted[j] = j + R(j, s)
            prev = self.rows[s - 1] if s >= 1 else None
            for n in range(1, N + 1):
                if n <= leaf:
                    row[n] = 0
                elif prev is not None:
                    row[n] = min(map(add, shifted[1:n], prev[n - 1:0:-1]))
                shifted[n] = n + row[n]
            self.rows.append(row)

    def cost(self, n: int, s: int) -> float:
        """R(n, s): the fewest plain step evaluations (``inf`` if none fits)."""
        return self.rows[s][n]

    def split(self, n: int, s: int) -> int:
        """0 if the segment is taped whole; else the smallest optimal advance ``j``."""
        if n <= self.leaves[s]:
            return 0
        row, prev = self.rows[s], self.rows[s - 1]
        target = row[n]
        for j in range(1, n):
            if j + row[j] + prev[n - j] == target:
                return j
        raise AssertionError("no split attains the table's optimum")   # pragma: no cover


def mixed_actions(seq_len: int, slots: int, table: ChainTable | ReferenceTable,
                  offset: int = 0, stored: bool = False) -> Iterator[Action]:
    """The optimal schedule: store, advance and recurse; tape leaf segments whole.

    A subproblem entered with its start stored owns that snapshot and frees it *before* taping a
    leaf (from then on the tape holds the state). A right part that is a leaf is taped straight
    from the live state, unstored, as Revolve reverses its last step. ``offset``: the steps are
    ``offset .. offset + seq_len``; ``stored``: that start is already stored (and is freed).
    """
    work: list[tuple] = [("rev", offset, offset + seq_len, slots, stored)]
    while work:
        kind, lo, hi, s, stored = work.pop()
        if kind == "restore":
            yield Restore(lo)
            continue
        j = table.split(hi - lo, s)
        if j == 0:
            if stored:
                yield Free(lo)
            yield Reverse(lo, hi)
            continue
        if not stored:
            yield Snapshot(lo)
        yield Advance(lo, lo + j)
        work.append(("rev", lo, lo + j, s, True))             # the left part, last
        work.append(("restore", lo, None, None, None))
        work.append(("rev", lo + j, hi, s - 1, False))        # the right part, first


class _Recorder:
    """A table stand-in that answers from ``table`` and records each split asked for."""

    def __init__(self, table: ChainTable) -> None:
        self.table, self.splits = table, array("i")

    def split(self, n: int, s: int) -> int:
        j = self.table.split(n, s)
        self.splits.append(j)
        return j


class _Replay:
    """A table stand-in that replays recorded splits: valid for one walk in the recorded order
    (the walk is deterministic)."""

    def __init__(self, splits: array) -> None:
        self.splits, self.next = splits, 0

    def split(self, n: int, s: int) -> int:
        j = self.splits[self.next]
        self.next += 1
        return j


class MixedPlan:
    """The optimal mixed schedule for ``seq_len`` steps within ``memory`` bytes of snapshots and
    kept tapes. Same interface as :class:`~bincheck.schedule.binomial.Plan`.

    Planning takes O(min(slots, seq_len)) time and memory whenever
    :class:`~bincheck.schedule.mixed_chain.ChainTable`'s closed forms cover the
    problem (at 10^4 steps, budgets from about 0.75 % of ``seq_len * tape_bytes`` for a tape 2.2
    states big); below that it runs the exact DP, O(seq_len^2) per slot.
    """

    def __init__(self, seq_len: int, memory: int, state_bytes: int, tape_bytes: int) -> None:
        self.seq_len = check_positive_int("seq_len", seq_len)
        self.state_bytes = check_positive_int("state_bytes", state_bytes)
        self.tape_bytes = check_positive_int("tape_bytes", tape_bytes)
        if memory < state_bytes:
            raise ValueError(f"memory for snapshots must hold at least one state "
                             f"({state_bytes} bytes); got {memory}")
        # How many states fit, never more than there are states to store.
        self.checkpoints = min(memory // state_bytes, seq_len)
        # Taping every step at once (``Reverse(0, seq_len)``) holds ``(seq_len - 1) * tape_bytes``
        # and recomputes nothing: a budget above that buys nothing, so the plan uses no more.
        self.memory = min(memory, (seq_len - 1) * tape_bytes)
        leaves = leaf_lengths(self.memory, state_bytes, tape_bytes, seq_len)
        self.top = len(leaves) - 1              # the table's row for the whole loop
        self.table = ChainTable(seq_len, leaves)
        self._splits: array | None = None       # after compact(): the walk's splits, in order
        self.dp_rows_built = self.dp_row_bytes = 0

    def compact(self) -> None:
        """Record the schedule's splits in walk order (4 bytes each, at most 2 per step) and drop
        the exact-DP rows they came from (4 bytes per step per row): what a budgeted loop keeps
        during its gradients. The rows are built (and freed) here, when the plan is made."""
        if self._splits is not None:
            return
        self._plain = int(self.table.cost(self.seq_len, self.top))
        recorder = _Recorder(self.table)
        for _ in mixed_actions(self.seq_len, self.top, recorder):
            pass
        self.dp_rows_built, self.dp_row_bytes = self.table.dp_rows, self.table.nbytes
        if self.dp_rows_built:              # else closed forms answered everything: keep nothing
            self._splits = array("i", recorder.splits)      # allocated exactly
            self.table.drop_rows()

    @property
    def nbytes(self) -> int:
        """Bytes the plan holds for its walk: the recorded splits after :meth:`compact`, else the
        DP rows built so far (0 where closed forms answer every query)."""
        return sys.getsizeof(self._splits) if self._splits is not None else self.table.nbytes

    def _walker(self) -> ChainTable | _Replay:
        return self.table if self._splits is None else _Replay(self._splits)

    def __iter__(self) -> Iterator[Action]:
        return mixed_actions(self.seq_len, self.top, self._walker())

    @property
    def plain_steps(self) -> int:
        if self._splits is not None:
            return self._plain
        return int(self.table.cost(self.seq_len, self.top))

    @property
    def taped_steps(self) -> int:
        return self.seq_len

    @property
    def first_reverse_start(self) -> int:
        """Where the first sweep stops: the start of the last segment (taped whole)."""
        lo, s, walker = 0, self.top, self._walker()
        while True:             # the walk visits this spine first, so a replay serves it too
            j = walker.split(self.seq_len - lo, s)
            if j == 0:
                return lo
            lo, s = lo + j, s - 1

    def __repr__(self) -> str:
        return (f"MixedPlan({self.seq_len}, memory={self.memory}, state_bytes={self.state_bytes}, "
                f"tape_bytes={self.tape_bytes})")


class FixedLeafPlan:
    """The optimal schedule with at most ``slots`` stored states and taped segments of at most
    ``leaf`` steps, whatever is stored: the mixed recursion with a constant ``L`` (see the module
    docstring). This is the model of a program whose buffers are allocated statically (XLA):
    room for ``slots`` states and for one taped segment of ``leaf`` steps exists all the time,
    so tapes cannot borrow the bytes of freed slots. ``leaf=1`` is Revolve. Same interface as
    :class:`~bincheck.schedule.binomial.Plan`; ``dp_work`` is what the exact DP would cost
    where the closed forms do not answer (0 when they do)."""

    def __init__(self, seq_len: int, slots: int, leaf: int) -> None:
        self.seq_len = check_positive_int("seq_len", seq_len)
        self.slots = check_positive_int("slots", slots)
        self.leaf = check_positive_int("leaf", leaf)
        self.top = min(slots, seq_len)
        self.table = ChainTable(seq_len, [leaf] * (self.top + 1))
        self.dp_work = self.table.dp_work(seq_len, self.top)

    def __iter__(self) -> Iterator[Action]:
        return mixed_actions(self.seq_len, self.top, self.table)

    @property
    def plain_steps(self) -> int:
        return int(self.table.cost(self.seq_len, self.top))

    @property
    def taped_steps(self) -> int:
        return self.seq_len

    @property
    def first_reverse_start(self) -> int:
        lo, s = 0, self.top
        while True:
            j = self.table.split(self.seq_len - lo, s)
            if j == 0:
                return lo
            lo, s = lo + j, s - 1

    def __repr__(self) -> str:
        return f"FixedLeafPlan({self.seq_len}, slots={self.slots}, leaf={self.leaf})"


#: Segment lengths a statically allocated plan tries (beyond these, a budget that fits long
#: segments fits every state too, or the exact DP gets slow).
FIXED_LEAVES = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
#: Element operations of the exact DP a candidate may need (about 0.1 s at C speed).
FIXED_DP_LIMIT = 2_000_000


def best_fixed_leaf(seq_len: int, store: int, state_bytes: int, tape_bytes: int,
                    plain_steps: int) -> FixedLeafPlan | None:
    """The :class:`FixedLeafPlan` with fewer plain steps than ``plain_steps`` (the states-only
    plan's) whose ``slots * state_bytes + (leaf - 1) * tape_bytes`` fits ``store``, or None.
    Candidates whose exact DP would exceed :data:`FIXED_DP_LIMIT` are skipped."""
    best = None
    # the whole loop taped at once is a candidate too when it is shorter than the longest
    for leaf in sorted({*FIXED_LEAVES, seq_len} if seq_len <= FIXED_LEAVES[-1] else FIXED_LEAVES):
        if leaf > seq_len or leaf < 2:
            break
        slots = (store - (leaf - 1) * tape_bytes) // state_bytes
        if slots < 1:
            break
        plan = FixedLeafPlan(seq_len, slots, leaf)
        if plan.dp_work > FIXED_DP_LIMIT:
            continue
        if plan.plain_steps < plain_steps:
            best, plain_steps = plan, plan.plain_steps
    return best
