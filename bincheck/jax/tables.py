"""A plan compiled into integer tables that a traced program replays (no jax here: numpy only).

Under ``jit`` the schedule cannot be interpreted action by action at run time, and unrolling it at
trace time would trace the step once per action (compile time growing with the length, the
failure mode of earlier JAX attempts). Instead the planner's own action stream is walked once in
Python, through the schedule layer's :class:`~bincheck.schedule.simulate.Tracker` (so an invalid
stream fails here, loudly), and recorded as a few int32 arrays that a fixed-size program indexes
(:func:`revolve_tables` builds a Revolve plan's without the stream, and is tested against this):

* ``store_slot[t]`` (``t < seq_len - 1``): the slot the first sweep writes the state before step
  ``t`` into, or ``-1``;
* for the reverse of step ``j`` (``j < seq_len - 1``; the last step is taped by the forward):
  ``restore_slot[j]`` / ``restore_index[j]``, the stored state the recomputation starts from, and
  the snapshots taken while advancing to ``j``: ``snap_pos[q]`` / ``snap_slot[q]`` for ``q`` in
  ``snap_ptr[j] : snap_ptr[j+1]`` (compressed rows).

A plan with kept taped segments (``Reverse`` of up to ``max_seg`` steps, from
:class:`~bincheck.schedule.mixed.FixedLeafPlan`) compiles the same way with each segment entered
under its *last* step ``e``: ``seg_len[e]`` steps end there (the rows of the other steps are
unused), and ``first_lo`` is where the forward's own taped segment starts.

Slots are ids handed out from a free list as the stream snapshots and frees states, so the traced
program needs exactly ``slots`` state buffers.

:func:`online_table` does the same for the while loop's online planner: which slot (if any) the
forward writes the state before each step into, for every step count up to ``max_steps``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from ..schedule.actions import Advance, Free, Restore, Reverse, Snapshot
from ..schedule.binomial import split
from ..schedule.online import OnlinePlanner
from ..schedule.simulate import Tracker


@dataclass(frozen=True)
class Tables:
    """An offline plan as arrays (see the module docstring); ``plain_steps`` counts the plan's
    plain evaluations as compiled, so a test can hold it against the planner's."""

    seq_len: int
    slots: int
    store_slot: np.ndarray
    restore_slot: np.ndarray
    restore_index: np.ndarray
    snap_ptr: np.ndarray
    snap_pos: np.ndarray
    snap_slot: np.ndarray
    plain_steps: int
    seg_len: np.ndarray | None = None     # with kept segments: steps ending at each step
    max_seg: int = 1                      # the longest taped segment
    first_lo: int = -1                    # where the forward's taped segment starts

    def arrays(self) -> tuple[np.ndarray, ...]:
        extra = () if self.max_seg == 1 else (self.seg_len,)
        return (self.store_slot, self.restore_slot, self.restore_index, self.snap_ptr,
                self.snap_pos, self.snap_slot) + extra


class _Slots:
    """Slot ids for stored state indices, recycled through a free list."""

    def __init__(self) -> None:
        self.of: dict[int, int] = {}
        self.free: list[int] = []
        self.count = 0

    def put(self, index: int) -> int:
        slot = self.free.pop() if self.free else self.count
        self.count = max(self.count, slot + 1)
        self.of[index] = slot
        return slot

    def pop(self, index: int) -> None:
        self.free.append(self.of.pop(index))


def compile_plan(actions: Iterable[Any], seq_len: int, max_seg: int = 1) -> Tables:
    """Walk a plan's actions (validated) into :class:`Tables`: taped segments of at most
    ``max_seg`` steps (1: states only)."""
    n = seq_len
    tracker, slots = Tracker(n), _Slots()
    store_slot = np.full(max(n - 1, 0), -1, np.int32)
    restore_slot = np.zeros(max(n - 1, 0), np.int32)
    restore_index = np.zeros(max(n - 1, 0), np.int32)
    seg_len = np.ones(max(n - 1, 0), np.int32)
    rows: dict[int, list[tuple[int, int]]] = {}
    pending: list[tuple[int, int]] = []
    first_sweep, live_from, plain, first_lo = True, 0, 0, n - 1
    for action in actions:
        tracker.apply(action)
        kind = type(action)
        if kind is Snapshot:
            if action.storage != "ram":
                raise ValueError("bincheck.jax keeps states in device memory only (no disk tier)")
            slot = slots.put(action.index)
            if first_sweep:
                if action.index < n - 1:    # the state before the last step is taped anyway
                    store_slot[action.index] = slot
            else:
                pending.append((action.index, slot))
        elif kind is Free:
            slots.pop(action.index)
        elif kind is Restore:
            live_from = action.index
            live_slot = slots.of[action.index]
            pending = []
        elif kind is Advance:
            plain += action.stop - action.start
        elif kind is Reverse:
            m = action.stop - action.start
            if m > max_seg:
                raise ValueError(f"these tables hold taped segments of at most {max_seg} "
                                 f"step(s); this plan tapes {m} steps at once ({action})")
            if first_sweep:
                if action.stop != n:
                    raise ValueError(f"the first reverse must end at the last step; got {action}")
                first_sweep, first_lo = False, action.start
                continue
            j = action.stop - 1                 # the segment's last step names it
            restore_slot[j], restore_index[j], seg_len[j] = live_slot, live_from, m
            rows[j] = pending
            pending = []
    owner = [j for j, row in rows.items() for _ in row]
    snaps = [entry for row in rows.values() for entry in row]
    return _tables(n, slots.count, store_slot, restore_slot, restore_index, owner, snaps, plain,
                   seg_len, max_seg, first_lo)


def _tables(n: int, slots: int, store_slot: np.ndarray, restore_slot: np.ndarray,
            restore_index: np.ndarray, owner: list, snaps: list, plain: int,
            seg_len: np.ndarray | None = None, max_seg: int = 1, first_lo: int = -1) -> Tables:
    """:class:`Tables` with the reverse sweep's snapshots ``snaps`` (``(position, slot)`` pairs,
    taken before the reverse of step ``owner[q]``, in the order taken) as compressed rows."""
    owner_a = np.asarray(owner, np.int64)
    order = np.argsort(owner_a, kind="stable")
    pairs = np.asarray(snaps, np.int32).reshape(-1, 2)[order]
    snap_ptr = np.zeros(max(n - 1, 0) + 1, np.int32)
    if n > 1:
        snap_ptr[1:] = np.cumsum(np.bincount(owner_a, minlength=n - 1)[:n - 1])
    if not len(pairs):                   # a traced gather needs a non-empty operand
        pairs = np.zeros((1, 2), np.int32)
    return Tables(n, max(slots, 1), store_slot, restore_slot, restore_index, snap_ptr,
                  np.ascontiguousarray(pairs[:, 0]), np.ascontiguousarray(pairs[:, 1]), plain,
                  np.ones(max(n - 1, 0), np.int32) if seg_len is None else seg_len, max_seg,
                  first_lo)


def revolve_tables(n: int, s: int) -> Tables:
    """``compile_plan(Plan(n, s), n)`` without the action stream: the same walk of
    :func:`~bincheck.schedule.binomial.binomial_actions` (its frames, its
    :func:`~bincheck.schedule.binomial.split`), recording table entries where it would yield
    actions. About six times faster at 100,000 steps (the tables are built at trace time);
    tests hold the two equal."""
    store_slot = np.full(max(n - 1, 0), -1, np.int32)
    restore_slot = np.zeros(max(n - 1, 0), np.int32)
    restore_index = np.zeros(max(n - 1, 0), np.int32)
    of: dict[int, int] = {}
    free: list[int] = []
    count = 1
    of[0] = 0                                   # Snapshot(0)
    if n > 1:
        store_slot[0] = 0
    owner: list[int] = []
    snaps: list[tuple[int, int]] = []
    splits: dict[tuple[int, int], int] = {}
    first, live_from, live_slot, plain = True, 0, 0, 0
    work = [(False, 0, n, s)]
    while work:
        left, lo, hi, k = work.pop()
        if left:                                # Free(hi), Restore(lo)
            free.append(of.pop(hi))
            live_from, live_slot = lo, of[lo]
        if hi - lo == 1 or k == 1:
            # Reverse(hi-1, hi) from the live state's restore, with the snapshots taken since;
            # with one checkpoint, then Restore(lo) and Reverse(i, i+1) for every i below
            plain += (hi - lo) * (hi - lo - 1) // 2
            if first:
                first = False
            else:
                restore_slot[hi - 1], restore_index[hi - 1] = live_slot, live_from
                owner.extend([hi - 1] * (len(snaps) - len(owner)))
            if hi - lo > 1:
                live_from, live_slot = lo, of[lo]
                restore_slot[lo:hi - 1], restore_index[lo:hi - 1] = live_slot, lo
            continue
        m = splits.get((hi - lo, k))
        if m is None:
            m = splits[(hi - lo, k)] = split(hi - lo, k)
        mid = lo + m
        plain += m                              # Advance(lo, mid), Snapshot(mid)
        slot = free.pop() if free else count
        count = max(count, slot + 1)
        of[mid] = slot
        if first:
            if mid < n - 1:
                store_slot[mid] = slot
        else:
            snaps.append((mid, slot))
        work.append((True, lo, mid, k))
        work.append((False, mid, hi, k - 1))
    return _tables(n, count, store_slot, restore_slot, restore_index, owner, snaps, plain,
                   first_lo=n - 1)


@dataclass(frozen=True)
class OnlineTable:
    """The online planner's forward decisions for every step count below ``max_steps``:
    ``write_slot[n]`` is the slot the state before step ``n`` goes into once ``n + 1`` steps are
    being taken (``-1``: not stored); slot 0 holds state 0."""

    max_steps: int
    slots: int
    write_slot: np.ndarray


def online_table(num_ckpts: int, max_steps: int) -> OnlineTable:
    """Drive :class:`OnlinePlanner` through ``max_steps`` steps and record where it stores."""
    planner = OnlinePlanner(num_ckpts)
    slots = _Slots()
    write = np.full(max(max_steps, 1), -1, np.int32)
    for action in planner.start():
        slots.put(action.index)
    for n in range(1, max_steps):
        for action in planner.advance(n):
            if type(action) is Free:
                slots.pop(action.index)
            elif type(action) is Snapshot:
                write[action.index] = slots.put(action.index)
    return OnlineTable(max_steps, max(slots.count, 1), write)
