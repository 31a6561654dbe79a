"""Checkpointing with a disk tier: a few states in RAM, as many as needed on disk.

Optimal offline schedule for ``cm`` checkpoints in RAM and unlimited disk, where writing a state costs
``w`` and reading one costs ``r`` (in units of one plain step), after Aupy, Herrmann, Hovland &
Robert, "Optimal multistage algorithm for adjoint computation", SIAM J. Sci. Comput. 38(3) 2016
(Disk-Revolve), in its multi-read form (a disk checkpoint may be read several times: strictly
better than reading each once, which is what checkpoint_schedules' DiskRevolve implements). Every
step is taped once whatever the schedule, so the cost is ``plain steps + w * writes + r * reads``.
With ``t(n) = t(n, cm)`` Revolve's closed form (the start one of the RAM checkpoints):

    D1(n)   = min( t(n),  min_{1<=k<n} k + t(n-k) + r + D1(k) )      start on disk and live
    Dinf(n) = min( t(n),  min_{1<=j<n} w + j + Dinf(n-j) + r + D1(j) ) start live, not stored

``Dinf``: keep everything in RAM (Revolve), or write the start to disk, advance ``j`` steps,
reverse the rest the same way, read the start back and reverse the first ``j`` steps with it on
disk. ``D1``: copy the start into RAM and run Revolve, or advance ``k`` steps, reverse the
right part in RAM, read the start again and recurse. ``D1(1) = Dinf(1) = 0``. Both minima are
min-plus convolutions of 1-D arrays (``min(map(add, ...))``), so the tables cost O(n^2)
arithmetic at C speed: about 0.2 s for 2000 steps. ``tests/test_disk.py`` compares them with an
exhaustive search over every action sequence (RAM and disk copies of any state) on small grids.

Kept tapes. ``t(n)`` is whatever reversing ``n`` steps in RAM alone costs, so the same recursion
holds with the RAM part run by the mixed policy (states and kept taped segments within the RAM
bytes, :mod:`bincheck.schedule.mixed`): ``MixedInner`` supplies its cost ``R(n, top)`` and
its actions. A budget planner (:class:`~bincheck.schedule.budget.BudgetPlan`) uses it where
the mixed table answers every length from closed forms.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterator
from operator import add
from typing import Any

from .actions import Action, Advance, Free, Restore, Reverse, Snapshot
from .binomial import binomial_actions, optimal_plain_steps
from .chain import group, grouped
from .grouped import on_stages
from .mixed import mixed_actions
from .validate import check_positive_int


class RevolveInner:
    """How a segment is reversed in RAM alone: Revolve with ``cm`` slots (its cost ``t(n, cm)``)."""

    def __init__(self, cm: int) -> None:
        self.cm = cm

    def cost(self, n: int) -> float:
        return optimal_plain_steps(n, self.cm)

    def actions(self, n: int, lo: int) -> Iterator[Action]:
        """Reverse ``lo .. lo+n`` from the live, unstored state ``lo``."""
        return binomial_actions(n, self.cm, offset=lo)

    def actions_stored(self, n: int, lo: int) -> Iterator[Action]:
        """The same with ``lo`` just stored in RAM; ends with that snapshot freed."""
        yield from binomial_actions(n, self.cm, offset=lo, stored=True)
        yield Free(lo)


class MixedInner:
    """Reversal in RAM with states *and* kept taped segments (Gruslys' mixed policy) within the
    RAM budget, for the lengths where :class:`~bincheck.schedule.mixed_chain.ChainTable` has a
    closed form for ``R(n, top)`` and it beats Revolve with ``cm`` slots; Revolve elsewhere (so
    planning never builds the mixed policy's exact-DP rows; see :mod:`bincheck.schedule.mixed`).
    """

    def __init__(self, table: Any, top: int, cm: int) -> None:
        self.table, self.top, self.revolve = table, top, RevolveInner(cm)

    def _mixed(self, n: int) -> bool:
        return self.table.dp_work(n, self.top) == 0 and \
            self.table.cost(n, self.top) < self.revolve.cost(n)

    def cost(self, n: int) -> float:
        return self.table.cost(n, self.top) if self._mixed(n) else self.revolve.cost(n)

    def actions(self, n: int, lo: int) -> Iterator[Action]:
        if not self._mixed(n):
            return self.revolve.actions(n, lo)
        return mixed_actions(n, self.top, self.table, offset=lo)

    def actions_stored(self, n: int, lo: int) -> Iterator[Action]:
        if not self._mixed(n):
            return self.revolve.actions_stored(n, lo)
        return mixed_actions(n, self.top, self.table, offset=lo, stored=True)   # frees lo


class DiskTable:
    """``D1`` and ``Dinf`` for every length up to ``seq_len`` (see the module docstring), with
    ``t(n)`` the cost of reversing ``n`` steps in RAM alone (``inner``: Revolve with ``cm``
    slots by default, or the mixed policy's states and kept tapes)."""

    def __init__(self, seq_len: int, cm: int, w: float, r: float, inner: Any = None) -> None:
        self.cm, self.w, self.r = cm, w, r
        self.inner = inner = RevolveInner(cm) if inner is None else inner
        N = seq_len
        zeros = array("d", [0.0]) * (N + 1)        # allocated exactly (bytes_for)
        self.t = t = array("d", zeros)
        for n in range(1, N + 1):
            t[n] = inner.cost(n)
        self.d1, self.dinf = d1, dinf = array("d", zeros), array("d", zeros)
        self.a = a = array("d", zeros)                  # a[k] = k + D1(k)
        a[1] = 1.0
        for n in range(2, N + 1):
            d1[n] = min(t[n], r + min(map(add, a[1:n], t[n - 1:0:-1])))
            dinf[n] = min(t[n], w + r + min(map(add, a[1:n], dinf[n - 1:0:-1])))
            a[n] = n + d1[n]

    @staticmethod
    def bytes_for(seq_len: int) -> int:
        """Bytes the table holds for ``seq_len`` steps: four ``array('d')`` of ``seq_len + 1``."""
        return 4 * (sys.getsizeof(array("d")) + 8 * (seq_len + 1))

    def split_inf(self, n: int) -> int:
        """0: all in RAM; else the advance ``j`` after writing the start to disk."""
        if n == 1 or self.dinf[n] == self.t[n]:
            return 0
        # the same floating-point expression as the table's, so equality is exact
        return next(j for j in range(1, n)
                    if self.w + self.r + (self.a[j] + self.dinf[n - j]) == self.dinf[n])

    def split_1(self, n: int) -> int:
        """0: copy the start to RAM; else the advance ``k`` before re-reading it from disk."""
        if n == 1 or self.d1[n] == self.t[n]:
            return 0
        return next(k for k in range(1, n)
                    if self.r + (self.a[k] + self.t[n - k]) == self.d1[n])


def disk_actions(seq_len: int, table: DiskTable) -> Iterator[Action]:
    """The optimal schedule. Frames: ("inf", lo, hi): start live, unstored; ("one", lo, hi):
    start live, on disk; ("read", lo): restore the disk copy of ``lo``."""
    inner = table.inner
    work: list[tuple] = [("inf", 0, seq_len)]
    while work:
        kind, lo, *rest = work.pop()
        if kind == "read":
            yield Restore(lo)
            continue
        hi = rest[0]
        n = hi - lo
        if kind == "inf":
            j = table.split_inf(n)
            if j == 0:
                yield from inner.actions(n, lo)
                continue
            yield Snapshot(lo, "disk")
            yield Advance(lo, lo + j)
            work += [("one", lo, lo + j), ("read", lo), ("inf", lo + j, hi)]
        else:
            if n == 1:
                yield Reverse(lo, hi)
                yield Free(lo)
                continue
            k = table.split_1(n)
            if k == 0:                           # move the start from disk into a RAM slot
                yield Free(lo)
                yield Snapshot(lo)
                yield from inner.actions_stored(n, lo)
                continue
            yield Advance(lo, lo + k)
            yield from inner.actions(n - k, lo + k)             # the right part, in RAM
            work += [("one", lo, lo + k), ("read", lo)]


class DiskPlan:
    """The optimal schedule for ``seq_len`` steps with ``checkpoints`` states in RAM (the initial
    one included while in RAM) and unlimited disk; same interface as the other plans, plus
    ``disk_writes`` / ``disk_reads`` and the predicted ``cost`` in plain-step units."""

    def __init__(self, seq_len: int, checkpoints: int, write_cost: float,
                 read_cost: float, inner: Any = None) -> None:
        self.seq_len = check_positive_int("seq_len", seq_len)
        self.checkpoints = check_positive_int("checkpoints", checkpoints)
        for name, value in (("write_cost", write_cost), ("read_cost", read_cost)):
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0 (plain steps); got {value!r}")
        self.write_cost, self.read_cost = float(write_cost), float(read_cost)
        self.table = DiskTable(seq_len, self.checkpoints, self.write_cost, self.read_cost, inner)
        self._counts: tuple | None = None

    def __iter__(self) -> Iterator[Action]:
        return disk_actions(self.seq_len, self.table)

    def _count(self) -> tuple:
        if self._counts is None:
            from .simulate import Tracker
            tracker = Tracker(self.seq_len)
            for action in self:
                tracker.apply(action)
            first = next(a.start for a in self if type(a) is Reverse)
            self._counts = (tracker.plain_steps, tracker.disk_writes, tracker.disk_reads,
                            tracker.peak_checkpoints, first)
        return self._counts

    @property
    def cost(self) -> float:
        """Predicted cost in plain-step units: plain steps + w * writes + r * reads."""
        return self.table.dinf[self.seq_len]

    @property
    def plain_steps(self) -> int:
        return self._count()[0]

    @property
    def disk_writes(self) -> int:
        return self._count()[1]

    @property
    def disk_reads(self) -> int:
        return self._count()[2]

    @property
    def peak_checkpoints(self) -> int:
        return self._count()[3]

    @property
    def taped_steps(self) -> int:
        return self.seq_len

    @property
    def first_reverse_start(self) -> int:
        """Where the first sweep stops: ``seq_len - 1`` with Revolve in RAM, the start of a
        taped segment with kept tapes."""
        return self._count()[4]

    def __repr__(self) -> str:
        return (f"DiskPlan({self.seq_len}, checkpoints={self.checkpoints}, "
                f"write_cost={self.write_cost:g}, read_cost={self.read_cost:g})")


class GroupedDisk:
    """Disk-Revolve (:class:`DiskPlan`) over groups of a chain's stages within ``memory`` bytes of
    RAM, for a recorded program with a disk tier: the chain is cut into ``groups`` groups of
    about equal plain time at cuts with few live bytes (``chain.group``), with as many RAM slots
    as the budget holds at the largest boundary's bytes once the working set, the live cut and
    the next one (or a group's inside, if more), ``in_flight`` snapshots in the disk's queues
    (one written behind, one read ahead), one group's tape and the disk table are set aside; a
    snapshot costs ``write_seconds`` to write and ``read_seconds`` to read (measured). Iterate
    it for the actions in stage indices; ``seconds``, ``peak_bytes``, ``plain_stages``,
    ``taped_stages``, ``disk_writes`` and ``disk_reads`` are its predictions, as
    ``grouped.GroupedRevolve``'s."""

    uses_disk = True

    def __init__(self, chain: Any, memory: int, groups: int, write_seconds: float,
                 read_seconds: float, in_flight: int = 2) -> None:
        self.bounds = bounds = group(chain, groups)
        coarse = grouped(chain, bounds)
        g, big, tape = coarse.n, int(coarse.cuts.max()), int(coarse.tape.max())
        table = DiskTable.bytes_for(g)
        # as GroupedRevolve: the live cut and the next one while advancing (inside a group, the
        # live values at its own cuts), one group's tape; and the snapshots in the disk queues
        live = max(2 * big, int(coarse.spike.max()))
        room = memory - coarse.work - live - in_flight * big - tape - table
        slots = min(g, room // big) if big else g
        if room < 0 or slots < 1:
            raise ValueError(f"memory={memory} bytes does not hold one RAM slot beside {g} "
                             f"groups' working set and disk queues")
        step = max(float(coarse.plain.mean()), 1e-9)
        # a read runs ahead, beside the group before its restore: one group's time is hidden
        self.plan = DiskPlan(g, slots, write_seconds / step,
                             max(0.0, read_seconds - step) / step)
        self.seconds = self.plan.cost * step + float(coarse.taped.sum())
        self.peak_bytes = coarse.work + (slots + in_flight) * big + live + tape + table
        self.slots, self.stages, self.seq_len = slots, g, chain.n
        plain = 0
        for action in self.plan:                 # stage evaluations: exact, streamed
            if type(action) is Advance:
                plain += bounds[action.stop] - bounds[action.start]
        self.plain_stages, self.taped_stages = plain, chain.n
        self.disk_writes, self.disk_reads = self.plan.disk_writes, self.plan.disk_reads

    @classmethod
    def best(cls, chain: Any, memory: int, write_seconds: float, read_seconds: float,
             in_flight: int = 2, smallest: int = 16,
             largest: int = 2048) -> "GroupedDisk | None":
        """The plan of least predicted time over group counts ``smallest, 2 * smallest, ...``
        up to ``largest`` (the disk table costs ``O(groups**2)``), and one stage a group where
        the chain has at most ``largest`` (a group of several holds their tapes at once);
        None if none fits."""
        found, g = None, smallest
        while True:
            count = chain.n if g >= chain.n or 2 * g > largest >= chain.n else g
            try:
                plan = cls(chain, memory, count, write_seconds, read_seconds, in_flight)
            except ValueError:
                plan = None
            if plan is not None and (found is None or plan.seconds < found.seconds):
                found = plan
            if count == chain.n or g >= largest:
                return found
            g *= 2

    def release(self) -> None:
        """Nothing to drop: the plan is its bounds and the disk table."""

    def __iter__(self) -> Iterator[Action]:
        return on_stages(self.plan, self.bounds)
