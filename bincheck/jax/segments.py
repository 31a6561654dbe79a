"""Taped segments of one static length, with a byte budget (``memory=``, unless
``keep_segments=False``).

XLA allocates every buffer for the whole program, so a taped segment cannot borrow the bytes of
a freed snapshot slot, and a segment whose length varies needs a ``lax.cond`` per step to skip
the steps past its end, which XLA's CPU backend runs slowly (``keep_segments="masked"``,
:class:`~bincheck.schedule.mixed.FixedLeafPlan`). Nested √T remat shows what XLA runs fast:
segments of one static length, each a ``lax.scan`` reversed by JAX's own transpose.

So here ``L`` consecutive steps become one super-step (:class:`BlockFlat`, a ``lax.scan`` of
``L`` steps, its per-step outputs stacked), and the loop of ``seq_len / L`` super-steps is
checkpointed as any loop is: the planner's Revolve plan over the super-steps, each reversed
super-step taped and pulled back whole. ``L`` divides ``seq_len``. :func:`choose_measured`
measures the bytes of at most :data:`MEASURED_LENGTHS` candidate lengths (each a compiled
gradient of the sweep over a few super-steps, :func:`.sizes.measure_sweep`), plans the others
from the straight line between them, and picks the plan that evaluates the step the fewest
times, ``L * plain super-steps + seq_len``, or none when that saves less than
:data:`SEGMENT_MIN_GAIN` of the states-only plan's evaluations. Fewer evaluations are not less
time: a step can cost more inside a segment than taped alone, so the pick is kept only where
:func:`.prices.pays` predicts it faster than states only at prices measured on compiled
sweeps (:func:`.prices.step_prices`). The reverse mode makes the choice, once it knows whether
the inputs are differentiated (:func:`.sweep.routed_forward`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable

import jax
import numpy as np
from jax import lax

from ..schedule.binomial import optimal_plain_steps
from ..schedule.budget import BudgetPlan, Sizes
from .boundary import Flat

#: Longest segment considered, and at most this many candidate lengths (each is compiled once).
MAX_SEGMENT = 64
MAX_CANDIDATES = 8
#: Least share of the states-only plan's evaluations (plain + taped) that segments must save
#: to be kept. On the CPU a step costs more inside a segment's ``lax.scan`` than taped alone
#: (the full JAX benchmark of 2026-11-24, H=256: segment plans at 1.02-1.11x the per-step
#: bound, states only at 0.98-1.06x). Segments saving 2.6 % (scan-remat's bytes, 50-step
#: segments) ran at 0.99-1.04x states only's time (tanh 1.04, LSTM 0.99, GRU 1.03) and 3.9 %
#: (Equinox C=50's on tanh, 5-step ones) at 1.02x; those saving 18-28 % (nested remat's
#: bytes, 5 % of lax.scan's) were 7-14 % faster.
SEGMENT_MIN_GAIN = 0.10
#: Fewest segments: with two, XLA held both segments' residuals at once (a loop of 120 tanh steps
#: as 2 x 60 took 47 kB of temporaries where its plan predicted 26 kB; 3 x 40 and shorter held).
MIN_SEGMENTS = 3


class BlockFlat(Flat):
    """``L`` consecutive steps of ``flat`` as one super-step on flat leaf lists: a ``lax.scan``
    over a window of ``L`` inputs, returning the state after ``L`` steps and the ``L`` outputs
    stacked. The leaves and their masks are ``flat``'s (so the same parameter and state lists
    feed either); the inputs are ``(seq_len / L, L, ...)`` windows, a reshape, described here
    by shapes only."""

    def __init__(self, flat: Flat, L: int) -> None:       # noqa: super().__init__ not called
        self.__dict__.update({k: v for k, v in flat.__dict__.items()})
        self.step, self.L = flat, L
        self.seq_len = n = flat.seq_len // L
        self.x = [jax.ShapeDtypeStruct((n, L) + tuple(np.shape(v))[1:], v.dtype)
                  for v in flat.x]
        self.y_shapes = [jax.ShapeDtypeStruct((L,) + tuple(s.shape), s.dtype)
                         for s in flat.y_shapes]

    def signature(self) -> tuple:
        return self.step.signature() + (self.L,)

    def _call(self, P: list, h: list, x: list) -> tuple[list, list]:
        def body(h: list, x: list) -> tuple[list, list]:
            return self.step.full(P, h, x)
        return lax.scan(body, h, x, length=self.L)


def to_windows(vs: list, L: int) -> list:
    """Each ``(T, ...)`` leaf as ``(T / L, L, ...)`` (a reshape, no copy)."""
    return [v.reshape((v.shape[0] // L, L) + v.shape[1:]) for v in vs]


def from_windows(vs: list) -> list:
    """:func:`to_windows` undone."""
    return [v.reshape((v.shape[0] * v.shape[1],) + v.shape[2:]) for v in vs]


class StaticSegmentsPlan:
    """A plan with static segments, in steps: ``inner`` is the plan over the super-steps (a
    :class:`~bincheck.schedule.budget.BudgetPlan`). It has ``seq_len``, ``segment_len``,
    ``memory``, ``sizes`` (the super-step's), ``plain_steps`` and ``taped_steps`` (in steps),
    ``checkpoints`` (segment starts that fit) and ``peak_bytes``; the actions are ``inner``'s."""

    def __init__(self, seq_len: int, L: int, inner: BudgetPlan) -> None:
        self.seq_len, self.segment_len, self.inner = seq_len, L, inner
        self.memory, self.sizes = inner.memory, inner.sizes

    @property
    def plain_steps(self) -> int:
        return self.segment_len * self.inner.plain_steps

    @property
    def taped_steps(self) -> int:
        return self.seq_len

    @property
    def checkpoints(self) -> int:
        return self.inner.checkpoints

    @property
    def peak_bytes(self) -> int:
        return self.inner.peak_bytes

    @property
    def schedule(self) -> Any:
        return self

    @property
    def leaf(self) -> int:          # the segment length, under the name FixedLeafPlan uses
        return self.segment_len

    def __repr__(self) -> str:
        return f"StaticSegmentsPlan({self.seq_len}, L={self.segment_len}, {self.inner!r})"

    def __str__(self) -> str:
        L, n, l = self.segment_len, self.seq_len // self.segment_len, self.seq_len
        inner = str(self.inner).split("\n")
        return "\n".join([
            f"static segments plan: {l} steps as {n} taped segments of {L} steps, within "
            f"{inner[0].rsplit('within ', 1)[-1]}",
            f"  segment {L} steps (one lax.scan); per segment: {inner[1].strip()}",
            f"  checkpoints       : {self.checkpoints} segment starts fit",
            f"  plain evaluations : {self.plain_steps} ({self.plain_steps / l:.3g} per step)",
            f"  taped evaluations : {l}",
            f"  peak bytes        : at most {self.peak_bytes} bytes"])


def candidates(seq_len: int) -> list[int]:
    """Segment lengths to try: divisors of ``seq_len`` from 2 to :data:`MAX_SEGMENT` that leave
    at least :data:`MIN_SEGMENTS` segments, at most :data:`MAX_CANDIDATES` of them, spread evenly
    on a log scale."""
    found = [L for L in range(2, min(MAX_SEGMENT, seq_len // MIN_SEGMENTS) + 1)
             if seq_len % L == 0]
    if not found:
        return found
    if len(found) <= MAX_CANDIDATES:
        return found
    lo, hi = math.log(found[0]), math.log(found[-1])
    picks = {min(found, key=lambda L: abs(math.log(L) - (lo + k * (hi - lo) /
                                                          (MAX_CANDIDATES - 1))))
             for k in range(MAX_CANDIDATES)}
    return sorted(picks)


def choose(seq_len: int, states_only_plain: int, plan_for_length: Callable[[int], Any],
           most_slots: int | None = None) -> tuple[int, Any] | None:
    """``(L, plan over the super-steps)`` with the fewest step evaluations (the shortest ``L``
    among equals), if it saves :data:`SEGMENT_MIN_GAIN` of the evaluations of the states-only
    plan (``states_only_plain`` plain steps);
    ``plan_for_length(L)`` plans the loop of super-steps (None where the budget is below its
    minimum). With ``most_slots`` (the states the budget could hold with no working set at
    all), lengths are tried longest first and a length is skipped, unplanned, when even that
    many slots could not beat the best so far: ``L * t(seq_len / L, most_slots)`` bounds its
    plain steps from below (planning a length compiles a sweep)."""
    # the most plain steps segments may take: they must save SEGMENT_MIN_GAIN of the
    # evaluations (a step costs more inside a segment's scan than taped alone)
    limit = int((1 - SEGMENT_MIN_GAIN) * (states_only_plain + seq_len)) - seq_len
    best, best_plain = None, limit
    for L in sorted(candidates(seq_len), reverse=True):
        if most_slots is not None and \
                L * optimal_plain_steps(seq_len // L, max(1, most_slots)) > best_plain:
            continue
        plan = plan_for_length(L)
        if plan is not None and L * plan.plain_steps <= best_plain:    # ties: the shorter L
            best, best_plain = (L, plan), L * plan.plain_steps
    return best


# ------------------------------------------------------------------ measured, not every length
#: Sweeps compiled to measure a length's bytes (:func:`.sizes.measure_sweep`), at most: the
#: shortest and the longest candidate that could win, then the lengths that the line through
#: the measured ones predicts best, one at a time.
MEASURED_LENGTHS = 4
#: A length is guessed from its bytes on the line less this share: the line can lie above
#: what XLA holds (see :func:`interpolated`), and a guess is measured before it is planned.
GUESS_SLACK = 0.05


def interpolated(lo: tuple[int, Sizes], hi: tuple[int, Sizes], L: int) -> Sizes:
    """Sizes of the loop of ``L``-step super-steps on the straight line between two measured
    lengths. What a segment holds grows with ``L`` (its residuals, its windows), nearly in
    proportion: on a tanh cell at H=128 the line between 2 and 50 steps lay above the measured
    bytes by up to 7 %; on states of 96 bytes XLA's packing moved them by a few hundred bytes
    either way (an LSTM: 3 steps 270 bytes below the line, 4 steps 360 above). So a length is
    only planned from measured sizes (:func:`choose_measured`)."""
    (a, sa), (b, sb) = lo, hi
    if a == b:
        return sa
    work = sa.work_bytes + (sb.work_bytes - sa.work_bytes) * (L - a) / (b - a)
    return replace(sa, work_bytes=max(1, int(math.ceil(work))))


def choose_measured(seq_len: int, states_only_plain: int, sizes_for_length: Callable[[int], Sizes],
                    plan_for_sizes: Callable[[int, Sizes], Any],
                    most_slots: int | None = None) -> tuple[int, Any] | None:
    """:func:`choose` with at most :data:`MEASURED_LENGTHS` lengths measured
    (``sizes_for_length(L)`` compiles a sweep): the shortest and the longest candidate that
    the slot bound of :func:`choose` leaves, then, one at a time, the length that the
    lines through the measured ones (:func:`interpolated`, less :data:`GUESS_SLACK`) predict
    best, while one is predicted to beat the best measured. Only measured sizes are planned
    for the answer: the budget holds as with every length measured."""
    limit = int((1 - SEGMENT_MIN_GAIN) * (states_only_plain + seq_len)) - seq_len
    found = [L for L in candidates(seq_len) if most_slots is None or
             L * optimal_plain_steps(seq_len // L, max(1, most_slots)) <= limit]
    if not found:
        return None
    measured = {L: sizes_for_length(L) for L in {found[0], found[-1]}}

    def plain(L: int, sizes: Sizes) -> int | None:
        plan = plan_for_sizes(L, sizes)
        return None if plan is None else L * plan.plain_steps

    def best_measured() -> tuple[int, Any] | None:
        pick, pick_plain = None, limit
        for L in sorted(measured, reverse=True):                # ties: the shorter
            plan = plan_for_sizes(L, measured[L])
            if plan is not None and L * plan.plain_steps <= pick_plain:
                pick, pick_plain = (L, plan), L * plan.plain_steps
        return pick
    while len(measured) < MEASURED_LENGTHS:
        pick = best_measured()
        bar = limit if pick is None else pick[0] * pick[1].plain_steps - 1
        known = sorted(measured)
        guess, guess_plain = None, bar
        for L in sorted(set(found) - set(measured), reverse=True):
            a = max(k for k in known if k < L)
            b = min(k for k in known if k > L)
            line = interpolated((a, measured[a]), (b, measured[b]), L)
            p = plain(L, replace(line, work_bytes=max(1, int(line.work_bytes *
                                                             (1 - GUESS_SLACK)))))
            if p is not None and p <= guess_plain:
                guess, guess_plain = L, p
        if guess is None:
            break
        measured[guess] = sizes_for_length(guess)
    return best_measured()
