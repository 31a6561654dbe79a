"""Checkpointing a chain of unequal stages: the cost- and size-aware planner.

A recorded program is a chain of stages (primitive ops, or groups of them) whose times and sizes
differ: stage ``k`` takes the values live at cut ``k`` to those live at cut ``k + 1``.
:class:`Chain` states what each costs: ``plain[k]`` seconds to run stage ``k`` without a tape,
``taped[k]`` seconds to run it under a tape and pull the adjoint back through it, ``tape[k]``
bytes its tape holds, ``cuts[c]`` bytes a snapshot at cut ``c`` holds (the live set there, in
Dauvergne and Hascoet's sense), and ``work`` bytes held beside all that (cotangents, temporaries).

**The memory model** (:func:`chain_cost` checks a stream against it, action by action): bytes
held = ``work`` + the stored snapshots' ``cuts`` + the live cut's if it is not stored; while stage
``k`` runs plain, its output cut too; while ``Reverse(a, b)`` runs, the tapes of stages
``a..b-1``. With ``num_ckpts`` instead, at most that many snapshots are held (cut 0 included,
Revolve's convention) and one stage is taped at a time.

**The planner** solves, for the state at cut ``i`` stored and the adjoint at cut ``j``, with
``m`` bytes free::

    C(i, j, m) = min( sum taped[i..j-1]                        if sum tape[i..j-1] <= m
                      F(i, k) + C(k, j, m - cuts[k]) + C(i, k, m)   for i < k < j,
                      if cuts[k] <= m and every stage of the advance fits )

(advance plainly to ``k``, store it, reverse ``k..j`` below it, restore ``i``, reverse ``i..k``),
the recursion of rotor's "persistent" schedules (Beaumont et al. 2019) in bincheck's actions. With
``num_ckpts``, ``m`` counts snapshots and a segment is one stage, tapeable also from a live cut
that is not stored (Revolve's last step: on uniform unit chains it gives ``t(l, s)``). Bytes are
rounded up to ``units`` equal parts of the free memory, so a plan always fits its budget, and
the DP is exact for the rounded chain (exact when the bytes are whole units). The DP costs
``O(n^3 units / 6)`` elementwise work in numpy, ``O(n^2)`` vector operations; a chain longer than
``max_stages`` is first grouped (:func:`group`) into that many stages, cutting where the live
bytes are small, and the plan of the groups runs on the stages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from .actions import Action, Advance, Free, Restore, Reverse, Snapshot
from .binomial import Plan
from .simulate import ScheduleError, Tracker
from .validate import check_positive_int, short_repr

INF = float("inf")


@dataclass(frozen=True, eq=False)
class Chain:
    """Per-stage seconds and bytes of a chain of ``n`` stages and its ``n + 1`` cuts (numpy
    arrays: float seconds, integer bytes; any sequence of numbers is accepted)."""

    plain: Any
    taped: Any
    tape: Any
    cuts: Any
    work: int = 0

    def __post_init__(self) -> None:
        n = len(self.plain)
        if n < 1:
            raise ValueError("a chain has at least one stage; got plain=()")
        for name, want in (("taped", n), ("tape", n), ("cuts", n + 1)):
            got = len(getattr(self, name))
            if got != want:
                raise ValueError(f"{name} must have {want} entries for {n} stages "
                                 f"(cuts: one more than stages); got {got}")
        for name in ("plain", "taped", "tape", "cuts"):
            values = np.asarray(getattr(self, name))
            if values.dtype.kind not in "iuf" or not np.all(np.isfinite(values)) or \
                    np.any(values < 0):
                raise ValueError(f"{name} must hold finite numbers >= 0; got "
                                 f"{short_repr(getattr(self, name))}")
            if name in ("tape", "cuts"):
                if np.any(values != np.floor(values)):
                    raise ValueError(f"{name} must hold whole bytes; got {short_repr(values)}")
                values = values.astype(np.int64, copy=False)
            else:
                values = values.astype(np.float64, copy=False)
            values = values.view()              # read-only, never the caller's array
            values.flags.writeable = False
            object.__setattr__(self, name, values)
        if not isinstance(self.work, (int, np.integer)) or isinstance(self.work, bool) or \
                self.work < 0:
            raise ValueError(f"work must be an int of bytes >= 0; got {short_repr(self.work)}")
        object.__setattr__(self, "work", int(self.work))

    @property
    def n(self) -> int:
        return len(self.plain)


@dataclass(frozen=True)
class ChainCost:
    """What a stream costs on a chain: seconds, stage evaluations, peak bytes and snapshots."""

    plain_seconds: float
    taped_seconds: float
    plain_stages: int
    taped_stages: int
    peak_bytes: int
    peak_snapshots: int

    @property
    def seconds(self) -> float:
        return self.plain_seconds + self.taped_seconds


def chain_cost(chain: Chain, actions: Iterator[Action]) -> "ChainCost":
    """Run ``actions`` on ``chain`` symbolically (:class:`~.simulate.Tracker` checks every
    action) and price it with the module's memory model."""
    tracker = Tracker(chain.n)
    cuts, tape = chain.cuts.tolist(), chain.tape.tolist()
    plain, taped = chain.plain.tolist(), chain.taped.tolist()
    stored: set = set()
    stored_bytes = 0                           # sum of the stored cuts, kept as they change
    plain_s = taped_s = 0.0
    held = peak = chain.work
    live = 0

    def live_bytes() -> int:
        return 0 if live is None or live in stored else cuts[live]
    for action in actions:
        tracker.apply(action)
        kind = type(action)
        base = chain.work + stored_bytes
        if kind is Advance:
            for k in range(action.start, action.stop):
                held = base + (0 if k in stored else cuts[k]) + cuts[k + 1]
                peak = max(peak, held)
                plain_s += plain[k]
            live = action.stop
        elif kind is Reverse:
            peak = max(peak, base + live_bytes() + sum(tape[action.start:action.stop]))
            taped_s += sum(taped[action.start:action.stop])
            live = None
        elif kind is Snapshot:
            if action.index not in stored:
                stored.add(action.index)
                stored_bytes += cuts[action.index]
        elif kind is Restore:
            live = action.index
        elif kind is Free:
            if action.index in stored:
                stored.discard(action.index)
                stored_bytes -= cuts[action.index]
        peak = max(peak, chain.work + stored_bytes + live_bytes())
    tracker.finish()
    return ChainCost(plain_s, taped_s, tracker.plain_steps, tracker.taped_steps, peak,
                     tracker.peak_checkpoints)


class ChainPlan:
    """The optimal schedule for a :class:`Chain` within ``num_ckpts`` snapshots or ``memory``
    bytes: iterate it for the actions. ``seconds``, ``peak_bytes``, ``plain_stages`` and
    ``taped_stages`` are its predictions (:func:`chain_cost` of its actions)."""

    def __init__(self, chain: Chain, num_ckpts: int | None = None, memory: int | None = None,
                 units: int = 128, max_stages: int = 64,
                 table_budget: int | None = None) -> None:
        if (num_ckpts is None) == (memory is None):
            raise ValueError("pass exactly one of num_ckpts (snapshots held at once, cut 0 "
                             "included) and memory (bytes)")
        self.chain, self.num_ckpts, self.memory = chain, num_ckpts, memory
        units = check_positive_int("units", units)
        max_stages = check_positive_int("max_stages", max_stages)
        if table_budget is not None:
            # coarser memory units first, then fewer stages, until the DP's tables fit
            while table_bytes(min(max_stages, chain.n), units) > table_budget and units > 8:
                units //= 2
            while table_bytes(min(max_stages, chain.n), units) > table_budget and \
                    max_stages > 4:
                max_stages //= 2
        self.table_bytes = 0
        self.groups = self.revolve = None
        if num_ckpts is not None:
            num_ckpts = check_positive_int("num_ckpts", num_ckpts)
            if chain.n > max_stages:
                # one stage taped at a time: grouping would tape groups. Revolve's plan, optimal
                # in stage counts (exactly t(n, s)), not weighted by the stages' times.
                self.revolve = Plan(chain.n, num_ckpts)
            else:
                self._choice = _solve(chain, min(num_ckpts - 1, chain.n), None)
        else:
            self.groups = group(chain, max_stages) if chain.n > max_stages else None
            coarse = chain if self.groups is None else grouped(chain, self.groups)
            need = minimum_memory(coarse)
            if memory < need:
                raise ValueError(f"memory={memory} bytes is below the least this chain needs: "
                                 f"the input ({chain.cuts[0]} bytes), the working set and the "
                                 f"largest stage advanced or taped alone, {need} bytes in all")
            # with a table budget, the units it allows are the finest tried
            self._choice = _by_bytes(coarse, memory - coarse.work - int(coarse.cuts[0]), units,
                                     16 if table_budget is None else 1)
        self.table_bytes = self._choice.table_bytes if self.revolve is None else 0
        self._actions = None if self.revolve is not None else tuple(self._walk())
        self._choice = None                     # the DP's tables are freed once walked
        cost = chain_cost(chain, iter(self))
        self.seconds, self.peak_bytes = cost.seconds, cost.peak_bytes
        self.plain_stages, self.taped_stages = cost.plain_stages, cost.taped_stages
        self.peak_snapshots = cost.peak_snapshots
        self.seq_len = chain.n
        self.stages = chain.n if self.groups is None else len(self.groups) - 1

    def release(self) -> None:
        """Drop the chain (its per-stage tuples): only the actions are needed to run the plan."""
        self.chain = None

    def __iter__(self) -> Iterator[Action]:
        return iter(self.revolve if self.revolve is not None else self._actions)

    def _walk(self) -> Iterator[Action]:
        bounds = list(range(self.chain.n + 1)) if self.groups is None else self.groups
        choice = self._choice
        m0 = choice.top
        yield Snapshot(0)
        # an explicit stack: (i, j, m) sub-problems, or actions to emit between them
        stack: list = [(0, len(bounds) - 1, m0)]
        while stack:
            item = stack.pop()
            if not isinstance(item, tuple):
                yield item
                continue
            i, j, m = item
            k, live = choice(i, j, m)
            a, b = bounds[i], bounds[j]
            if k == j:                          # tape the whole segment from the stored cut
                yield Reverse(a, b)
                continue
            c = bounds[k]
            if c > a:
                yield Advance(a, c)
            if live:                            # tape k..j from the live cut, store nothing
                yield Reverse(c, b)
                stack.append((i, k, m))
                stack.append(Restore(a))
                continue
            yield Snapshot(c)
            stack.append((i, k, m))
            stack.append(Restore(a))
            stack.append(Free(c))
            stack.append((k, j, m - choice.cost_of(k)))
        yield Free(0)


def minimum_memory(chain: Chain) -> int:
    """The least bytes any schedule of ``chain`` needs: cut 0 and the working set, with each
    stage advanced to (two adjacent cuts) and taped alone from its input cut."""
    cuts = chain.cuts.copy()
    cuts[0] = 0                                   # cut 0 is counted once, below
    need = int(np.max(cuts[:-1] + chain.tape))
    if chain.n > 1:
        need = max(need, int(np.max(cuts[:-2] + cuts[1:-1])))
    return chain.work + int(chain.cuts[0]) + need


def _by_bytes(chain: Chain, free: int, units: int, finer: int = 16) -> "_Choice":
    """The DP in memory units: whole bytes' common divisor where that needs at most ``finer *
    units`` of them (the exact model), else ``units`` equal parts of ``free`` rounded up, then
    finer (up to ``finer`` times as many); where rounding leaves nothing feasible, the
    one-snapshot plan (its peak is :func:`minimum_memory`, which the caller checked)."""
    whole = math.gcd(int(free), int(np.gcd.reduce(np.concatenate([chain.cuts, chain.tape]))))
    if whole and free // whole <= finer * units:
        return _solve(chain, free // whole, whole)
    for parts in sorted({units, min(4, finer) * units, finer * units}):
        unit = max(1, math.ceil(free / parts))
        try:
            return _solve(chain, free // unit, unit)
        except ValueError:
            pass
    return _solve(chain, 0, None)


def _solve(chain: Chain, slots: int, unit: int | None) -> "_Choice":
    """The DP of the module docstring over ``m`` in ``0..slots``: snapshots (``unit`` None) or
    memory in units of ``unit`` bytes, vectorised over ``m`` and the split ``k``."""
    n, size = chain.n, slots + 1
    plain = np.concatenate([[0.0], np.cumsum(chain.plain)])
    taped = np.concatenate([[0.0], np.cumsum(chain.taped)])
    tape = np.concatenate([[0], np.cumsum(chain.tape)])
    ms = np.arange(size)
    if unit is None:
        cost = np.ones(n + 1, dtype=np.int64)
        adv = np.zeros((n + 1, n + 1), dtype=np.int64)
    else:
        cost = -(-chain.cuts // unit)
        first = (-(-chain.cuts[1:] // unit)).tolist()
        pair = (-(-(chain.cuts[:-1] + chain.cuts[1:]) // unit)).tolist()
        adv = np.zeros((n + 1, n + 1), dtype=np.int64)   # adv[i, k]: advancing i -> k holds
        for i in range(n):
            run = first[i]
            for k in range(i + 1, n + 1):
                adv[i, k] = run
                if k < n:
                    run = max(run, pair[k])
    # left[i, k] = C(i, k, .); the right part C(k, j, m - cost[k]) is read from left[k, j]
    left = np.full((n + 1, n + 1, size), INF)
    arg = np.zeros((n + 1, n + 1, size), dtype=np.int16)
    live = np.zeros((n + 1, n + 1, size), dtype=bool)
    for d in range(1, n + 1):
        for i in range(n - d + 1):
            j = i + d
            if unit is None:
                need = 0 if d == 1 else size
            else:
                need = math.ceil((tape[j] - tape[i]) / unit)
            best = np.where(ms >= need, taped[j] - taped[i], INF)
            choice = np.full(size, j, dtype=np.int16)
            kept = np.zeros(size, dtype=bool)
            if d > 1:
                ks = slice(i + 1, j)
                shifted = ms[None, :] - cost[ks][:, None]
                right = np.take_along_axis(left[ks, j], np.maximum(shifted, 0), axis=1)
                right[shifted < 0] = INF
                total = (plain[ks] - plain[i])[:, None] + right + left[i, ks]
                total[ms[None, :] < adv[i, ks][:, None]] = INF
                at = np.argmin(total, axis=0)
                low = total[at, ms]
                better = low < best
                best = np.where(better, low, best)
                choice[better] = at[better] + i + 1
                if unit is None:               # Revolve's last step: taped from the live cut
                    last = plain[j - 1] - plain[i] + taped[j] - taped[j - 1] + left[i, j - 1]
                    better = last < best
                    best = np.where(better, last, best)
                    choice[better] = j - 1
                    kept[better] = True
            left[i, j] = best
            arg[i, j], live[i, j] = choice, kept
    if not np.isfinite(left[0, n, slots]):
        raise ValueError("no schedule of this chain fits: give more snapshots or memory")
    return _Choice(arg, live, cost, slots, float(left[0, n, slots]),
                   left.nbytes + arg.nbytes + live.nbytes)


def table_bytes(stages: int, units: int) -> int:
    """The DP's tables for ``stages`` stages and ``units`` memory units (float64 costs, int16
    choices, a flag) and its largest temporaries, which planning holds at once (freed when the
    plan is made)."""
    return (stages + 1) ** 2 * (units + 1) * 11 + 6 * (stages + 1) * (units + 1) * 8


class _Choice:
    """The DP's decisions: ``choice(i, j, m)`` is ``(k, live)``; ``k == j`` tapes ``i..j``."""

    __slots__ = ("arg", "live", "cost", "top", "seconds", "table_bytes")

    def __init__(self, arg, live, cost, top, seconds, table_bytes) -> None:
        self.arg, self.live, self.cost, self.top = arg, live, cost, top
        self.seconds, self.table_bytes = seconds, table_bytes

    def __call__(self, i: int, j: int, m: int) -> tuple[int, bool]:
        return int(self.arg[i, j, m]), bool(self.live[i, j, m])

    def cost_of(self, k: int) -> int:
        return int(self.cost[k])


def group(chain: Chain, stages: int) -> list[int]:
    """Cuts ``0 = c_0 < ... < c_g = n`` grouping ``chain`` into ``g <= stages`` stages of about
    equal plain time, each boundary moved to the cut with the fewest bytes within half a group of
    where equal times would put it (a snapshot there is cheapest)."""
    n = chain.n
    if stages >= n:
        return list(range(n + 1))
    total = np.concatenate([[0.0], np.cumsum(chain.plain)])
    width = max(1, n // (2 * stages))
    bounds = [0]
    for g in range(1, stages):
        target = int(np.searchsorted(total, total[-1] * g / stages))
        lo, hi = max(bounds[-1] + 1, target - width), min(n - 1, target + width)
        if lo > hi:
            continue
        best = lo + int(np.argmin(chain.cuts[lo:hi + 1]))
        # a window cut short by the previous boundary (a pause recorded in one stage gathers
        # targets) may have lost its small cuts: skip it rather than cut where bytes are live
        if lo > target - width and \
                chain.cuts[best] > chain.cuts[max(0, target - width):hi + 1].min():
            continue
        bounds.append(best)
    bounds.append(n)
    return sorted(set(bounds))


def grouped(chain: Chain, bounds: list[int]) -> Chain:
    """The chain of the groups ``bounds[g]..bounds[g+1]-1``: summed times and tapes, each
    group's boundary cuts; a group's advance holds its largest pair of adjacent cuts (its
    ``work`` takes the excess over the boundary pair)."""
    b = np.asarray(bounds)
    plain = np.add.reduceat(chain.plain, b[:-1])
    taped = np.add.reduceat(chain.taped, b[:-1])
    tape = np.add.reduceat(chain.tape, b[:-1])
    inner = int(np.max(chain.cuts[:-1] + chain.cuts[1:]))
    return Chain(plain, taped, tape, chain.cuts[b], chain.work + inner)


__all__ = ["Chain", "ChainPlan", "ChainCost", "chain_cost", "group", "grouped",
           "minimum_memory", "ScheduleError"]
