"""Offline binomial checkpointing (Griewank 1992; Griewank & Walther, ACM TOMS Alg. 799 "Revolve").

To reverse ``l`` steps while holding at most ``s`` checkpoints (stored states) at once, the initial
state included as in Revolve, the minimal number of plain (untaped) step evaluations is

    t(l, s) = r*l - beta(s+1, r-1),   beta(s, r) = C(s+r, s),   beta(s, r-1) < l <= beta(s, r),

with beta(., -1) = 0. ``t`` counts the first sweep's ``l-1`` steps; the ``l`` taped evaluations
come on top. The schedule below attains it exactly.

The recursion behind it: holding state ``lo``, advance ``m`` steps, store that state, reverse the
right part with one checkpoint fewer, then reverse the left part with all of them again::

    t(l, s) = min_m  m + t(l-m, s-1) + t(m, s),   t(1, s) = 0,   t(l, 1) = l(l-1)/2.

Because ``t(n+1, s) - t(n, s) = r(n+1, s)`` (the repetition number), the objective's increments in
``m`` are ``1 - r(l-m, s-1) + r(m+1, s)``: non-decreasing, so the smallest ``m`` where that is
``>= 0`` is optimal. :func:`~bincheck.schedule.split` finds it in O(log r) binomial coefficients, which keeps planning
cheap enough to stream plans for millions of steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from math import comb

from .actions import Action, Advance, Free, Restore, Reverse, Snapshot
from .validate import NUM_CKPTS_RULE, check_positive_int


def beta(s: int, r: int) -> int:
    """Most steps reversible with ``s`` checkpoints and ``r`` repetitions: C(s+r, s); 0 for r<0."""
    return 0 if r < 0 else comb(s + r, s)


def _smallest(pred, lo: int) -> int:
    """Smallest integer k >= lo with pred(k), for a monotone pred (false..false true..true)."""
    hi = max(lo, 1)
    while not pred(hi):
        lo, hi = hi + 1, 2 * hi
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def repetitions(l: int, s: int) -> int:
    """The repetition number r: the unique r >= 0 with beta(s, r-1) < l <= beta(s, r)."""
    if l <= 1:
        return 0
    if s == 1:
        return l - 1
    return _smallest(lambda r: beta(s, r) >= l, 0)


def optimal_plain_steps(l: int, s: int) -> int:
    """t(l, s): minimal plain step evaluations to reverse ``l`` steps with ``s`` checkpoints."""
    r = repetitions(l, s)
    return r * l - beta(s + 1, r - 1)


def split(l: int, s: int) -> int:
    """An optimal number of steps to advance before storing the next state (``l >= 2, s >= 2``).

    Returns the smallest ``m`` in ``[1, l-1]`` with ``m + t(l-m, s-1) + t(m, s) == t(l, s)``.
    """
    if l == 2:
        return 1
    # Smallest level k = r(m+1, s) at which the increment condition r(m+1,s) + 1 >= r(l-m, s-1)
    # can hold; within level k it holds from m = l - beta(s-1, k+1) on.
    k = _smallest(lambda k: beta(s, k) + beta(s - 1, k + 1) >= l + 1, 1)
    return min(max(1, beta(s, k - 1), l - beta(s - 1, k + 1)), l - 1)


def binomial_actions(l: int, s: int, offset: int = 0, stored: bool = False) -> Iterator[Action]:
    """Yield the optimal schedule reversing ``l`` steps with ``s`` checkpoints, lazily.

    Indices start at ``offset``. With ``stored=True`` the caller has already stored state
    ``offset`` (and made it live) and frees it itself, as when reversing one segment of a longer
    loop. The work list replaces recursion so that ``s >= l`` (one frame per stored state) cannot
    hit Python's recursion limit. Frames: ``("rev", lo, hi, s)`` reverses ``[lo, hi)`` with the
    live state at ``lo`` and ``lo`` stored; ``("left", lo, mid, s)`` first frees ``mid`` and
    restores ``lo``, then reverses ``[lo, mid)``.
    """
    if not stored:
        yield Snapshot(offset)
    work = [("rev", offset, offset + l, s)]
    while work:
        kind, lo, hi, slots = work.pop()
        if kind == "left":
            yield Free(hi)
            yield Restore(lo)
        if hi - lo == 1:
            yield Reverse(lo, hi)
        elif slots == 1:
            # Only state lo is held: recompute from it for every step, last step first.
            for i in range(hi - 1, lo, -1):
                if i != hi - 1:
                    yield Restore(lo)
                yield Advance(lo, i)
                yield Reverse(i, i + 1)
            yield Restore(lo)
            yield Reverse(lo, lo + 1)
        else:
            mid = lo + split(hi - lo, slots)
            yield Advance(lo, mid)
            yield Snapshot(mid)
            work.append(("left", lo, mid, slots))
            work.append(("rev", mid, hi, slots - 1))
    if not stored:
        yield Free(offset)


def peak_checkpoints(l: int, s: int) -> int:
    """Checkpoints held at once by :func:`binomial_actions`: the first sweep's chain is deepest."""
    held, lo, slots = 1, 0, s
    while l - lo > 1 and slots > 1:
        lo += split(l - lo, slots)
        slots -= 1
        held += 1
    return held


class Plan:
    """An offline binomial schedule: iterate it for the actions; counts come from the closed form.

    >>> p = plan(10, 3)          # 10 steps, at most 3 checkpoints (the initial state included)
    >>> p.plain_steps, p.taped_steps, p.peak_checkpoints
    (15, 10, 3)
    """

    def __init__(self, seq_len: int, num_ckpts: int) -> None:
        self.seq_len = check_positive_int("seq_len", seq_len)
        self.num_ckpts = check_positive_int("num_ckpts", num_ckpts, NUM_CKPTS_RULE)

    def __iter__(self) -> Iterator[Action]:
        return binomial_actions(self.seq_len, self.num_ckpts)

    @property
    def repetitions(self) -> int:
        return repetitions(self.seq_len, self.num_ckpts)

    @property
    def plain_steps(self) -> int:
        """Plain evaluations of the schedule: t(seq_len, num_ckpts), the first sweep included."""
        return optimal_plain_steps(self.seq_len, self.num_ckpts)

    @property
    def first_reverse_start(self) -> int:
        """Where the first sweep stops: the last step is the first one reversed."""
        return self.seq_len - 1

    @property
    def taped_steps(self) -> int:
        return self.seq_len

    @property
    def peak_checkpoints(self) -> int:
        """Most checkpoints held at once: min(seq_len, num_ckpts)."""
        return peak_checkpoints(self.seq_len, self.num_ckpts)

    peak_slots = peak_checkpoints           # the name before 0.2

    def __repr__(self) -> str:
        return f"plan({self.seq_len}, {self.num_ckpts})"

    def __str__(self) -> str:
        l = self.seq_len
        noun = "checkpoint" if self.num_ckpts == 1 else "checkpoints"
        return (f"binomial plan: {l} steps, {self.num_ckpts} {noun} (the initial state "
                f"included)\n"
                f"  plain evaluations : {self.plain_steps} ({self.plain_steps / l:.3g} per step; "
                f"repetition number r = {self.repetitions})\n"
                f"  taped evaluations : {self.taped_steps}\n"
                f"  peak checkpoints  : {self.peak_checkpoints}\n"
                f"  a gradient runs fn {self.plain_steps} times plain and {self.taped_steps} "
                f"times taped (the forward tapes the last step)")


def plan(seq_len: int, num_ckpts: int) -> Plan:
    """The optimal binomial schedule for ``seq_len`` steps holding ``num_ckpts`` checkpoints.

    ``num_ckpts`` counts the initial state: ``plan(l, 1)`` recomputes every step from the initial
    state; ``num_ckpts >= seq_len`` keeps every state. Iterating yields actions lazily.
    """
    return Plan(seq_len, num_ckpts)
