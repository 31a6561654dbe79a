"""Revolve over groups of a long chain's stages: the plan for traces too long for the DP.

:class:`~.chain.ChainPlan` solves its DP over at most a few dozen stages (its tables grow as
``stages**2``), so on a long trace each of its groups is long, and a group's tape can exceed the
whole budget (a thousand implicit-Euler steps whose Newton iterations tape dense Jacobians: 1.5 GB
of tapes against a 20 MB budget). :class:`GroupedRevolve` instead cuts the chain into many groups
of about equal plain time, each boundary moved to a cut with few live bytes (:func:`~.chain.
group`), and runs Revolve's binomial schedule over the groups with as many snapshots as the
budget holds at the largest boundary's size: one group taped at a time. Among group counts a
factor sqrt(2) apart, it keeps the one with the least predicted time. Planning costs the grouping
per count and one pass over the chosen plan's actions, never a table.
"""

from __future__ import annotations

from typing import Iterable, Iterator

from .actions import Action, Advance, Reverse, Snapshot
from .binomial import Plan
from .chain import Chain, group, grouped


class GroupedRevolve:
    """Revolve over ``len(bounds) - 1`` groups of ``chain``'s stages within ``memory`` bytes, or
    :meth:`best` of several group counts. Iterate it for the actions (in stage indices);
    ``seconds``, ``peak_bytes``, ``plain_stages`` and ``taped_stages`` (stage evaluations) are
    its predictions: the peak bounded as Revolve holds it, the time from the groups' mean."""

    def __init__(self, chain: Chain, memory: int, groups: int,
                 bounds: list[int] | None = None) -> None:
        self.bounds = bounds = group(chain, groups) if bounds is None else bounds
        coarse = grouped(chain, bounds)
        g, big = coarse.n, int(coarse.cuts.max())
        # Revolve holds its snapshots (cut 0 included), the live cut and the next one while it
        # advances (inside a group: the live values at its own cuts, its spike), and one
        # group's tape
        live = max(2 * big, int(coarse.spike.max()))
        # an advance holds the live values (``live``); a reverse its input cut, its group's tape
        # and its back (beside its tapes up to the stage that holds it, :func:`~.chain.grouped`)
        # or a stage's spike: never both (a Reverse consumes the live state), and one group's
        # tape never beside another's back. Both may hold the adjoint (after the first reverse),
        # at most its largest (``adj``: none for autograd's chains, whose back is their spike)
        stage = coarse.back.clip(min=int(chain.spike.max()))
        held = max(live, big + int((coarse.tape + stage).max())) + int(chain.adj.max())
        # Revolve's first snapshot is cut 0, held throughout: its own bytes (a program's cut 0
        # holds no value, its inputs are held anyway), the other slots the largest boundary's
        first = int(coarse.cuts[0])
        room = memory - coarse.work - held - first
        slots = int(min(g, 1 + room // big if big else g))
        if room < 0:
            raise ValueError(f"memory={memory} bytes does not hold one of {g} groups taped alone")
        self.plan = Plan(g, slots)
        # priced by that bound and the groups' mean time (:func:`~.chain.group` balances them):
        # no per-stage table, so planning holds only the groups' arrays
        self.peak_bytes = coarse.work + first + (slots - 1) * big + held
        self.seconds = self.plan.plain_steps * float(coarse.plain.mean()) + \
            float(coarse.taped.sum())
        self.slots, self.stages, self.seq_len = slots, g, chain.n
        self.taped_stages = chain.n
        self._plain: int | None = None

    @property
    def plain_stages(self) -> int:
        """Stage evaluations without a tape: exact, counted over the actions once asked for
        (streaming them for every group count :meth:`best` tries took most of planning's time
        on a trace of 19,000 ops)."""
        if self._plain is None:
            b = self.bounds
            self._plain = sum(b[a.stop] - b[a.start] for a in self.plan if type(a) is Advance)
        return self._plain

    @classmethod
    def best(cls, chain: Chain, memory: int, smallest: int = 64,
             largest: int = 4096) -> "GroupedRevolve | None":
        """The plan of least predicted time (of least peak among those within 1 % of it) over
        group counts ``smallest, sqrt(2) * smallest, 2 * smallest, ...`` up to ``largest`` (and
        the chain's own stages where fewer); None if none fits. (Powers of two alone missed
        an RNN's step boundaries: 256 groups of 1202 ops hold one or two steps, 362 one.)"""
        found, worse = None, 0
        for count in group_counts(chain.n, smallest, largest):
            try:
                plan = cls(chain, memory, count)
            except ValueError:
                plan = None
            # the least time; within 1 % of it, the least memory (fewer bytes, same work)
            if plan is not None and (found is None or plan.seconds < 0.99 * found.seconds or
                                     (plan.seconds <= 1.01 * found.seconds and
                                      plan.peak_bytes < found.peak_bytes)):
                found = plan
            # finer groups cost more recomputation once the tape no longer limits the
            # snapshots: three counts in a row slower than the best end the search (grouping
            # every count up to 4096 took 0.2 s of planning on a trace of 30,000 ops)
            worse = worse + 1 if found is not None and plan is not None and \
                plan.seconds > 1.01 * found.seconds else 0
            if worse == 3:
                break
        for bounds in body_bounds(chain, smallest, largest):
            try:
                plan = cls(chain, memory, len(bounds) - 1, bounds)
            except ValueError:
                continue
            if found is None or plan.seconds < found.seconds:
                found = plan
        return found

    def release(self) -> None:
        """Nothing to drop: the plan is its bounds and Revolve's closed form."""

    def __iter__(self) -> Iterator[Action]:
        return on_stages(self.plan, self.bounds)


def group_counts(n: int, smallest: int, largest: int) -> Iterator[int]:
    """The group counts the many-group planners try on ``n`` stages: ``smallest, sqrt(2) *
    smallest, 2 * smallest, ...`` up to ``largest``, capped at ``n`` (then the last)."""
    k = 0
    while True:
        count = min(n, largest, round(smallest * 2 ** (k / 2)))
        yield count
        if count >= n or count >= largest:
            return
        k += 1


def period(chain: Chain, longest: int = 64) -> int:
    """The least ``p <= longest`` after which ``chain``'s sizes (live bytes, tapes, backs) repeat
    at 99 % of its stages, or 0: a loop's body recorded op by op."""
    n = chain.n
    for p in range(1, min(longest, n // 8) + 1):
        same = (chain.cuts[p:n] == chain.cuts[:n - p]) & (chain.tape[p:] == chain.tape[:-p]) & \
            (chain.back[p:] == chain.back[:-p])
        if same.mean() >= 0.99:
            return p
    return 0


def body_bounds(chain: Chain, smallest: int, largest: int) -> Iterator[list[int]]:
    """Groups of whole loop bodies, for a chain that repeats itself every ``p`` stages
    (:func:`period`): ``p``, ``2p``, ``4p``... stages a group (``smallest`` to ``largest``
    groups), all starting at the phase where a body is cheapest to cut and tape (the least
    boundary bytes, then the least tape and back of a body): on an RNN of 4 ops a step, 7 %
    fewer recomputations than :func:`~.chain.group`'s cuts. One phase is chosen for all sizes,
    so that planning prices a few candidates whatever ``p``."""
    p, n = period(chain), chain.n
    if not p:
        return

    def bodies(phase: int, size: int) -> list[int]:
        return sorted({0, n, *range(phase or size, n, size)})

    def cost(phase: int) -> tuple[int, int]:
        # by views of the chain and one value a body: planning's bytes are in the budget
        m = (n - phase) // p
        tape = chain.tape[phase:phase + m * p].reshape(m, p).sum(axis=1)
        tape += chain.back[phase:phase + m * p].reshape(m, p).max(axis=1)
        return int(chain.cuts[phase or p:n:p].max(initial=0)), int(tape.max(initial=0))
    phase = 0 if p == 1 else min(range(p), key=cost)
    for size in (p * 2 ** j for j in range(16)):
        if n // size < smallest:
            return
        if n // size <= largest:
            yield bodies(phase, size)


def on_stages(plan: Iterable[Action], bounds: list[int]) -> Iterator[Action]:
    """The actions of ``plan`` (over groups: group ``g`` is stages ``bounds[g]..bounds[g+1]-1``)
    in stage indices."""
    for a in plan:
        kind = type(a)
        if kind is Advance or kind is Reverse:
            yield kind(bounds[a.start], bounds[a.stop])
        elif kind is Snapshot:
            yield Snapshot(bounds[a.index], a.storage)
        else:
            yield kind(bounds[a.index])


__all__ = ["GroupedRevolve", "body_bounds", "on_stages", "period"]
