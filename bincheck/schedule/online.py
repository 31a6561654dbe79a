"""Online checkpointing: binomial-quality schedules when the number of steps is unknown.

Background: Stumm & Walther (2010), "New algorithms for optimal online checkpointing", show that
snapshots can be placed online so that the reversal is as cheap as the offline optimum for every
length up to beta(s, 2), and nearly so up to beta(s, 3); Wang, Moin & Iaccarino (2009) give a
dynamic checkpointing scheme with optimal repetition number for any length.

This module takes a direct route built on the offline closed form. With snapshots at
``0 = c_0 < c_1 < ... < c_k`` and the state before the last step still at hand (as in the offline
first sweep, the working state is not a slot), stopping after ``n`` steps costs, in plain steps
after the forward,

    R(C, n) = t(n-1-c_k, s-k) + sum_{j<k} t(c_{j+1} - c_j, s-j)

(reverse the last step from the working state, then every segment with the slots left once the
later snapshots are freed), while the offline optimum is ``R*(n) = t(n, s) - (n-1)``.

Policy: whenever the loop goes on, the state about to be dropped may be stored, replacing at most
one older snapshot. Of the candidate placements (keep; store it in a free slot; or store it and
drop ``c_i``) take the one whose cost if the loop stopped 1, 2, ..., ``horizon`` steps later is
lexicographically least. The costs are maintained with prefix/suffix sums, so a decision costs
O(s * horizon) closed-form evaluations.

Measured (tests/test_online.py, docs table in README): equal to the offline optimum for every
``n <= beta(s, 2)``; within 5 % for ``beta(s,2) < n <= beta(s,3)`` for every ``s >= 3``. For ``s = 2``
no online policy reaches 5 % there: exhaustive enumeration of all placements (the test repeats it)
shows the best achievable worst case is 16/15 (6.7 %) — this policy attains it.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

from .actions import Action, Advance, Free, Restore, Reverse, Snapshot
from .binomial import binomial_actions, optimal_plain_steps
from .validate import NUM_CKPTS_RULE, check_positive_int


@lru_cache(maxsize=4096)
def _t(l: int, s: int) -> int:
    """t(l, s), with t(0, s) = 0 (nothing left to reverse)."""
    return optimal_plain_steps(l, s) if l > 0 else 0


def offline_reverse_steps(n: int, s: int) -> int:
    """Plain steps the offline optimum spends after its first sweep: t(n, s) - (n - 1)."""
    return _t(n, s) - (n - 1) if n > 0 else 0


def reverse_steps(snaps: list[int], n: int, s: int) -> int:
    """R(C, n): plain steps to reverse ``n`` steps holding ``snaps`` and the working state n-1."""
    if n == 0:
        return 0
    k = len(snaps) - 1
    cost = _t(n - 1 - snaps[-1], s - k)
    for j in range(k):
        cost += _t(snaps[j + 1] - snaps[j], s - j)
    return cost


class OnlinePlanner:
    """Decides, step by step, which states to keep; then plans the reversal.

    Protocol (driven by :class:`bincheck.while_loop` or a test):

    * ``start()`` yields the actions before the first step (store state 0).
    * ``advance(n)``: ``n`` steps are done and the loop goes on; yields the actions that keep or
      drop snapshots and advance the working state from ``n-1`` to ``n``.
    * ``reverse(n)``: the loop stopped after ``n`` steps; yields the reversal.
    """

    def __init__(self, num_ckpts: int, horizon: int = 4) -> None:
        self.s = check_positive_int("num_ckpts", num_ckpts, NUM_CKPTS_RULE)
        self.horizon = horizon
        self.snaps: list[int] = [0]
        self._sums_for: tuple | None = None

    # ------------------------------------------------------------ forward
    def start(self) -> Iterator[Action]:
        yield Snapshot(0)

    def advance(self, n: int) -> Iterator[Action]:
        """``n >= 1`` steps done, the loop continues: maybe store state ``n-1``, then step on."""
        cand = n - 1
        if cand > self.snaps[-1]:
            choice = self._choose(n)
            if choice is not None:
                if choice > 0:
                    yield Free(self.snaps.pop(choice))
                self.snaps.append(cand)
                yield Snapshot(cand)
        yield Advance(n - 1, n)

    def _choose(self, n: int) -> int | None:
        """None: keep; 0: store n-1 in a free slot; i >= 1: store n-1 and drop snapshot i."""
        s, snaps, H = self.s, self.snaps, self.horizon
        k = len(snaps) - 1
        seg = [snaps[j + 1] - snaps[j] for j in range(k)]
        prefix = [0]                            # prefix[i] = sum_{j<i} t(seg_j, s-j)
        for j in range(k):
            prefix.append(prefix[-1] + _t(seg[j], s - j))
        shifted = [0] * (k + 1)                 # shifted[i] = sum_{i<=j<k} t(seg_j, s-j+1)
        for j in range(k - 1, -1, -1):
            shifted[j] = shifted[j + 1] + _t(seg[j], s - j + 1)
        closed = n - 1 - snaps[-1]              # the working segment, if n-1 gets stored

        best_key = tuple(prefix[k] + _t(n + h - snaps[-1], s - k) for h in range(H))
        best = None
        if k + 1 < s:
            fixed = prefix[k] + _t(closed, s - k)
            options = [(0, fixed, k + 1)]
        else:
            options = []
            for i in range(1, k + 1):
                if i < k:
                    fixed = (prefix[i - 1] + _t(seg[i - 1] + seg[i], s - i + 1) +
                             shifted[i + 1] + _t(closed, s - k + 1))
                else:
                    fixed = prefix[k - 1] + _t(seg[k - 1] + closed, s - k + 1)
                options.append((i, fixed, k))
        for choice, fixed, idx in options:
            key = tuple(fixed + _t(h + 1, s - idx) for h in range(H))   # open: h+1 steps
            if key < best_key:
                best_key, best = key, choice
        return best

    # ------------------------------------------------------------ reverse
    def predicted_reverse_steps(self, n: int) -> int:
        return reverse_steps(self.snaps, n, self.s)

    def reverse(self, n: int) -> Iterator[Action]:
        """The reversal after ``n`` steps: last step from the working state, then each segment
        with the offline binomial plan and the slots left."""
        if n == 0:
            yield Free(0)
            return
        snaps, s = self.snaps, self.s
        yield Reverse(n - 1, n)
        ends = snaps[1:] + [n - 1]
        for j in range(len(snaps) - 1, -1, -1):
            lo, hi = snaps[j], ends[j]
            if hi > lo:
                yield Restore(lo)
                yield from binomial_actions(hi - lo, s - j, offset=lo, stored=True)
            yield Free(lo)


class EveryKPlanner:
    """Store every ``k``-th state, reverse each segment under one tape (no recomputation chains).

    One level of equal segments (Chen et al. 2016's sqrt scheme): with ``k = ceil(sqrt(max_steps))``
    memory is ``n/k`` states plus a ``k``-step tape. Same protocol as :class:`OnlinePlanner`; used
    as a baseline by ``benchmarks/while_loop``. Its snapshot count grows with ``n``.
    """

    def __init__(self, k: int) -> None:
        self.k = check_positive_int("k", k)
        self.snaps: list[int] = [0]

    def start(self) -> Iterator[Action]:
        yield Snapshot(0)

    def advance(self, n: int) -> Iterator[Action]:
        if (n - 1) % self.k == 0 and n - 1 > self.snaps[-1]:
            self.snaps.append(n - 1)
            yield Snapshot(n - 1)
        yield Advance(n - 1, n)

    def predicted_reverse_steps(self, n: int) -> int:
        return 0                                # segments are taped from their first state

    def reverse(self, n: int) -> Iterator[Action]:
        if n == 0:
            yield Free(0)
            return
        ends = self.snaps[1:] + [n]
        for j in range(len(self.snaps) - 1, -1, -1):
            lo, hi = self.snaps[j], ends[j]
            yield Restore(lo)
            yield Reverse(lo, hi)
            yield Free(lo)


def disk_period(cm: int, write_cost: float, read_cost: float, limit: int = 1 << 16) -> int:
    """The period P minimising the reverse cost per step of periodic disk checkpoints,
    ``(w + r + t(P, cm)) / P``: each completed period is written at its start, read back once
    and reversed with ``cm`` RAM slots (its first sweep included)."""
    best, best_cost = 1, float("inf")
    for p in range(1, limit + 1):
        cost = (write_cost + read_cost + _t(p, cm)) / p
        if cost < best_cost:
            best, best_cost = p, cost
        elif p > 4 * best and cost > 1.5 * best_cost:   # t(P)/P grows: the minimum is behind
            break
    return best


class DiskOnlinePlanner:
    """Online placement with a disk tier, for loops of unknown length.

    Every ``period`` steps the working state is written to disk and starts a new period; inside
    the current period an :class:`OnlinePlanner` places up to ``cm`` RAM snapshots (its start is
    the disk copy). When the loop stops: the current period is reversed from its RAM snapshots,
    then each completed period, last first, is read back from disk into RAM and reversed with
    Revolve's plan and ``cm`` slots. Periodic disk checkpointing is asymptotically optimal offline
    and online (Aupy & Herrmann, "Periodicity in optimal hierarchical checkpointing schemes for
    adjoint computations", Optim. Methods Softw. 32(3), 2017); :func:`disk_period` picks the
    period from the measured write and read costs.
    """

    def __init__(self, cm: int, period: int) -> None:
        self.cm = check_positive_int("cm", cm)
        self.period = check_positive_int("period", period)
        self.starts: list[int] = [0]             # disk checkpoints: each period's first state
        self.inner = OnlinePlanner(cm + 1)       # its slot 0 is the period's disk copy

    def _shift(self, actions: Iterator[Action]) -> Iterator[Action]:
        b = self.starts[-1]
        for a in actions:
            kind = type(a)
            if kind is Snapshot:
                yield Snapshot(a.index + b, "disk" if a.index == 0 else "ram")
            elif kind is Advance or kind is Reverse:
                yield kind(a.start + b, a.stop + b)
            else:
                yield kind(a.index + b)

    def start(self) -> Iterator[Action]:
        return self._shift(self.inner.start())

    def advance(self, n: int) -> Iterator[Action]:
        b = self.starts[-1]
        if n - 1 - b == self.period:            # the period is complete: a new one starts
            for i in self.inner.snaps[1:]:
                yield Free(i + b)               # its RAM snapshots; its start stays on disk
            self.starts.append(n - 1)
            self.inner = OnlinePlanner(self.cm + 1)
            yield from self._shift(self.inner.start())
        yield from self._shift(self.inner.advance(n - self.starts[-1]))

    def predicted_reverse_steps(self, n: int) -> int:
        return self.inner.predicted_reverse_steps(n - self.starts[-1]) + \
            (len(self.starts) - 1) * _t(self.period, self.cm)

    def reverse(self, n: int) -> Iterator[Action]:
        yield from self._shift(self.inner.reverse(n - self.starts[-1]))
        for b in reversed(self.starts[:-1]):
            yield Restore(b)                    # read the period's start back from disk,
            yield Free(b)                       # move it into a RAM slot,
            yield Snapshot(b)
            yield from binomial_actions(self.period, self.cm, offset=b, stored=True)
            yield Free(b)
