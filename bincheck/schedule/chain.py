"""Checkpointing a chain of unequal stages: the cost- and size-aware planner.

A recorded program is a chain of stages (primitive ops, or groups of them) whose times and sizes
differ: stage ``k`` takes the values live at cut ``k`` to those live at cut ``k + 1``.
:class:`Chain` states what each costs: ``plain[k]`` seconds to run stage ``k`` without a tape,
``taped[k]`` seconds to run it under a tape and pull the adjoint back through it, ``tape[k]``
bytes its tape holds, ``cuts[c]`` bytes a snapshot at cut ``c`` holds (the live set there, in
Dauvergne and Hascoet's sense), ``spike[k]`` bytes held only while stage ``k`` runs plain (its
temporaries), ``back[k]`` those held only while it is taped and pulled back (its temporaries
and the cotangents in flight within it; ``spike`` where not given), ``adj[c]`` bytes held while
the adjoint is at cut ``c`` (the cotangents there), and ``work`` bytes held throughout (what a
sweep holds whatever it does).

**The memory model** (:func:`chain_cost` checks a stream against it, action by action): bytes
held = ``work`` + the stored snapshots' ``cuts`` + the live cut's if it is not stored; while stage
``k`` runs plain, its output cut and ``spike[k]`` too; while ``Reverse(a, b)`` pulls stage ``k``
back, the tapes of stages ``a..k`` (those above are consumed), ``back[k]``, and the adjoint's
bytes at cut ``k + 1`` or at ``b`` (held while the segment is replayed), whichever is more.
With ``num_ckpts`` instead, at most that many snapshots are held (cut 0 included, Revolve's
convention) and one stage is taped at a time.

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
bytes are small, and the plan of the groups runs on the stages; where the groups' least is above
the budget and the stages' is not, a chain of at most ``finer_stages`` stages is planned
ungrouped.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from .actions import Action, Advance, Free, Restore, Reverse, Snapshot
from .binomial import Plan
from .simulate import ScheduleError, Tracker
from .chain_dp import _by_bytes, _solve, table_bytes
from .validate import check_positive_int, short_repr

@dataclass(frozen=True, eq=False)
class Chain:
    """Per-stage seconds and bytes of a chain of ``n`` stages and its ``n + 1`` cuts (numpy
    arrays: float seconds, integer bytes; any sequence of numbers is accepted)."""

    plain: Any
    taped: Any
    tape: Any
    cuts: Any
    work: int = 0
    spike: Any = None
    adj: Any = None
    back: Any = None

    def __post_init__(self) -> None:
        n = len(self.plain)
        if n < 1:
            raise ValueError("a chain has at least one stage; got plain=()")
        if self.spike is None:
            object.__setattr__(self, "spike", np.zeros(n, dtype=np.int64))
        if self.adj is None:
            object.__setattr__(self, "adj", np.zeros(n + 1, dtype=np.int64))
        if self.back is None:
            object.__setattr__(self, "back", self.spike)
        for name, want in (("taped", n), ("tape", n), ("cuts", n + 1), ("spike", n),
                           ("adj", n + 1), ("back", n)):
            got = len(getattr(self, name))
            if got != want:
                raise ValueError(f"{name} must have {want} entries for {n} stages "
                                 f"(cuts: one more than stages); got {got}")
        for name in ("plain", "taped", "tape", "cuts", "spike", "adj", "back"):
            values = np.asarray(getattr(self, name))
            if values.dtype.kind not in "iuf" or not np.all(np.isfinite(values)) or \
                    np.any(values < 0):
                raise ValueError(f"{name} must hold finite numbers >= 0; got "
                                 f"{short_repr(getattr(self, name))}")
            if name in ("tape", "cuts", "spike", "adj", "back"):
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


# an Advance is priced this many stages at a time: its temporaries stay a few dozen kB
COST_BLOCK = 1024


def chain_cost(chain: Chain, actions: Iterator[Action]) -> "ChainCost":
    """Run ``actions`` on ``chain`` symbolically (:class:`~.simulate.Tracker` checks every
    action) and price it with the module's memory model. It reads the chain's arrays in place:
    Python lists of them took about 200 B a stage while a program planned, inside its budget
    (a first gradient peaked at 1.24 of ``memory=`` on a loop of 8000 float ops)."""
    tracker = Tracker(chain.n)
    cuts, plain, taped, spike, adj = chain.cuts, chain.plain, chain.taped, chain.spike, chain.adj
    stored: list = []                          # sorted: those inside an Advance, by bisection
    stored_bytes = 0                           # sum of the stored cuts, kept as they change
    plain_s = taped_s = 0.0
    adjoint = chain.n
    peak = chain.work + int(adj[adjoint])
    live = 0

    def live_bytes() -> int:
        return 0 if live is None or is_stored(live) else int(cuts[live])

    def is_stored(i: int) -> bool:
        j = bisect_left(stored, i)
        return j < len(stored) and stored[j] == i
    for action in actions:
        tracker.apply(action)
        kind = type(action)
        base = chain.work + int(adj[adjoint]) + stored_bytes
        if kind is Advance:
            for lo in range(action.start, action.stop, COST_BLOCK):
                hi = min(action.stop, lo + COST_BLOCK)
                held = cuts[lo:hi] + cuts[lo + 1:hi + 1] + spike[lo:hi]
                for k in stored[bisect_left(stored, lo):bisect_left(stored, hi)]:
                    held[k - lo] -= cuts[k]            # a stored cut is counted once
                peak = max(peak, base + int(held.max()))
            plain_s += float(plain[action.start:action.stop].sum())
            live = action.stop
        elif kind is Reverse:
            peak = max(peak, base - int(adj[adjoint]) + live_bytes() +
                       reverse_bytes(chain, action.start, action.stop))
            taped_s += float(taped[action.start:action.stop].sum())
            live, adjoint = None, action.start
        elif kind is Snapshot:
            if not is_stored(action.index):
                insort(stored, action.index)
                stored_bytes += int(cuts[action.index])
        elif kind is Restore:
            live = action.index
        elif kind is Free:
            if is_stored(action.index):
                stored.remove(action.index)
                stored_bytes -= int(cuts[action.index])
        peak = max(peak, chain.work + int(adj[adjoint]) + stored_bytes + live_bytes())
    tracker.finish()
    return ChainCost(plain_s, taped_s, tracker.plain_steps, tracker.taped_steps, int(peak),
                     tracker.peak_checkpoints)


class ChainPlan:
    """The optimal schedule for a :class:`Chain` within ``num_ckpts`` snapshots or ``memory``
    bytes: iterate it for the actions. ``seconds``, ``peak_bytes``, ``plain_stages`` and
    ``taped_stages`` are its predictions (:func:`chain_cost` of its actions)."""

    def __init__(self, chain: Chain, num_ckpts: int | None = None, memory: int | None = None,
                 units: int = 128, max_stages: int = 64,
                 table_budget: int | None = None, finer_stages: int | None = None) -> None:
        if (num_ckpts is None) == (memory is None):
            raise ValueError("pass exactly one of num_ckpts (snapshots held at once, cut 0 "
                             "included) and memory (bytes)")
        self.chain, self.num_ckpts, self.memory = chain, num_ckpts, memory
        units = check_positive_int("units", units)
        max_stages = check_positive_int("max_stages", max_stages)
        finer = 0 if finer_stages is None else check_positive_int("finer_stages", finer_stages)
        if table_budget is not None:
            # coarser memory units first, then fewer stages, until the DP's tables fit
            while table_bytes(min(max_stages, chain.n), units) > table_budget and units > 8:
                units //= 2
            while table_bytes(min(max_stages, chain.n), units) > table_budget and \
                    max_stages > 4:
                max_stages //= 2
        self.table_bytes = 0
        self.groups = self.revolve = self._store_all = None
        if num_ckpts is not None:
            num_ckpts = check_positive_int("num_ckpts", num_ckpts)
            if chain.n > max_stages:
                # one stage taped at a time: grouping would tape groups. Revolve's plan, optimal
                # in stage counts (exactly t(n, s)), not weighted by the stages' times.
                self.revolve = Plan(chain.n, num_ckpts)
            else:
                self._choice = _solve(chain, min(num_ckpts - 1, chain.n), None)
        elif store_all_fits(chain, memory):
            # every stage taped once and none recomputed: no plan is faster, and the DP's
            # tables (stages^2 x units: 370 kB on 19 stages) would cost what the budget allows
            self._store_all = (Snapshot(0), Reverse(0, chain.n), Free(0))
        else:
            self.groups = group(chain, max_stages) if chain.n > max_stages else None
            coarse = chain if self.groups is None else grouped(chain, self.groups)
            need = minimum_memory(coarse)
            if memory < need and self.groups is not None and chain.n <= finer and \
                    (table_budget is None or table_bytes(chain.n, units) <= table_budget) and \
                    minimum_memory(chain) <= memory:
                # a group's tape can be what does not fit (a GPT's head with the block before)
                self.groups, coarse, need = None, chain, minimum_memory(chain)
            if memory < need:
                raise ValueError(f"memory={memory} bytes is below the least this chain needs: "
                                 f"the input ({chain.cuts[0]} bytes), the working set and the "
                                 f"largest stage advanced or taped alone, {need} bytes in all")
            # with a table budget, the units it allows are the finest tried
            self._choice = _by_bytes(coarse, memory - coarse.work - int(coarse.cuts[0]), units,
                                     16 if table_budget is None else 1)
        if self._store_all is not None:
            self.table_bytes, self._actions = 0, self._store_all
        else:
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


def reverse_bytes(chain: Chain, a: int, b: int) -> int:
    """What ``Reverse(a, b)`` holds at its worst beside the working set, the snapshots and its
    input cut: while it pulls stage ``k`` back, the tapes of stages ``a..k`` (those above are
    consumed), the adjoint's bytes at cut ``k + 1`` or at ``b`` (held while the segment is
    replayed), whichever is more, and ``back[k]``."""
    held = np.cumsum(chain.tape[a:b]) + np.maximum(chain.adj[a + 1:b + 1], chain.adj[b]) + \
        chain.back[a:b]
    return int(held.max())


def store_all_fits(chain: Chain, memory: int) -> bool:
    """Whether ``memory`` holds ``chain`` taped whole from cut 0, by a bound of what that
    holds at its worst (every tape, the largest cut, spike, adjoint and back at once) that
    makes no per-stage array: planning's own bytes count within the budget."""
    bound = chain.work + int(chain.cuts[0]) + int(chain.tape.sum()) + int(chain.cuts.max()) + \
        int(chain.spike.max()) + int(chain.adj.max()) + int(chain.back.max())
    return bound <= memory and memory >= minimum_memory(chain)


def minimum_memory(chain: Chain) -> int:
    """The least bytes the planner accepts for ``chain``: cut 0 and the working set, with each
    stage advanced to (two adjacent cuts) and taped alone from its input cut, the adjoint's
    bytes held where it is then. Revolve with one snapshot needs exactly this, and without
    ``adj`` no schedule needs less; with it, one that keeps more snapshots while the adjoint is
    heavy may (an exhaustive search found such budgets on 7 of 30 small random chains)."""
    cuts = chain.cuts.copy()
    cuts[0] = 0                                   # cut 0 is counted once, below
    rev = cuts[:-1] + chain.tape + chain.back + chain.adj[1:]     # stage k, adjoint at k + 1
    need = int(np.max(rev))
    if chain.n > 1:
        # advancing stage k while the adjoint is at any j >= k + 2
        adv = cuts[:-2] + cuts[1:-1] + chain.spike[:-1]
        later = np.maximum.accumulate(chain.adj[::-1])[::-1]    # later[c]: max adj[c:]
        need = max(need, int(np.max(adv + later[2:])))
    return chain.work + int(chain.cuts[0]) + need


def group(chain: Chain, stages: int) -> list[int]:
    """Cuts ``0 = c_0 < ... < c_g = n`` grouping ``chain`` into ``g <= stages`` stages of about
    equal plain time, each boundary moved to the cut with the fewest bytes within half a group of
    where equal times would put it (a snapshot there is cheapest)."""
    n = chain.n
    if stages >= n:
        return list(range(n + 1))
    total = np.concatenate([[0.0], np.cumsum(chain.plain)])
    width = max(1, n // (2 * stages))
    targets = np.searchsorted(total, total[-1] * np.arange(1, stages) / stages)
    del total
    cuts = chain.cuts
    # every whole window's first least cut, a block of windows at a time (cuts 0 and n never
    # qualify): a Python loop of numpy calls per boundary took most of planning's time on long
    # traces. It holds one padded copy of the cuts and blocks of at most 2^16 of them: planning's
    # bytes are counted inside the budget (a list of every cut took 3 MB on 82,000 ops)
    padded = np.full(n + 1 + 2 * width, np.iinfo(np.int64).max, dtype=np.int64)
    padded[width + 1:width + n] = cuts[1:n]
    view = np.lib.stride_tricks.sliding_window_view(padded, 2 * width + 1)
    block = max(1, 2 ** 16 // (2 * width + 1))
    least = np.concatenate([targets[i:i + block] - width +
                            np.argmin(view[targets[i:i + block]], axis=1)
                            for i in range(0, len(targets), block)] or [targets])
    del padded, view
    least_bytes = cuts[least].tolist()
    first = int(cuts[0])
    bounds = [0]
    for target, whole, low in zip(targets.tolist(), least.tolist(), least_bytes):
        lo, hi = max(bounds[-1] + 1, target - width), min(n - 1, target + width)
        if lo > hi:
            continue
        if lo > target - width:
            # a window cut short by the previous boundary (a pause recorded in one stage
            # gathers targets) may have lost its small cuts: skip it rather than cut where
            # bytes are live (its least, cut 0 included where the window reaches it)
            zero = target - width <= 0 and first < low      # the window's least is cut 0
            if whole < lo or zero:
                best = lo + int(np.argmin(cuts[lo:hi + 1]))
                if cuts[best] > (first if zero else low):
                    continue
            else:
                best = whole
        else:
            best = whole
        bounds.append(best)
    bounds.append(n)
    return sorted(set(bounds))


def grouped(chain: Chain, bounds: list[int]) -> Chain:
    """The chain of the groups ``bounds[g]..bounds[g+1]-1``: summed times and tapes, each
    group's boundary cuts; a group's back is its stages' largest, with what their adjoint
    exceeds the group's end cut's, less the tapes of the group's stages after it; its spike is
    its largest stage held with both its cuts (an advance through the group holds that at its
    worst)."""
    b = np.asarray(bounds)
    plain = np.add.reduceat(chain.plain, b[:-1])
    taped = np.add.reduceat(chain.taped, b[:-1])
    tape = np.add.reduceat(chain.tape, b[:-1])
    spike = np.maximum.reduceat(chain.cuts[:-1] + chain.cuts[1:] + chain.spike, b[:-1])
    # pulled back, a stage may hold more of the adjoint than its group's end cut
    end = np.repeat(chain.adj[b[1:]], np.diff(b))
    # a stage's back is held beside its group's tapes up to it, not the whole group's: less
    # what the group's later stages tape (a Reverse's bound adds the whole group's tape)
    cum = np.cumsum(chain.tape)
    lead = cum - np.repeat(cum[b[1:] - 1], np.diff(b))                 # <= 0
    back = np.maximum(np.maximum.reduceat(chain.back + np.maximum(chain.adj[1:] - end, 0) +
                                          lead, b[:-1]), 0)
    return Chain(plain, taped, tape, chain.cuts[b], chain.work, spike, chain.adj[b], back)


__all__ = ["Chain", "ChainPlan", "ChainCost", "chain_cost", "group", "grouped",
           "minimum_memory", "reverse_bytes", "ScheduleError"]
