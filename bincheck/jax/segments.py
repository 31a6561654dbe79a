"""Taped segments of one static length: ``keep_segments=True`` with a byte budget.

XLA allocates every buffer for the whole program, so a taped segment cannot borrow the bytes of
a freed snapshot slot, and a segment whose length varies needs a ``lax.cond`` per step to skip
the steps past its end, which XLA's CPU backend runs slowly (``keep_segments="masked"``,
:class:`~bincheck.schedule.mixed.FixedLeafPlan`). Nested √T remat shows what XLA runs fast:
segments of one static length, each a ``lax.scan`` reversed by JAX's own transpose.

So here ``L`` consecutive steps become one super-step (:class:`Block`, a ``lax.scan`` of ``L``
steps, its per-step outputs stacked), and the loop of ``seq_len / L`` super-steps is checkpointed
as any loop is: the planner's Revolve plan over the super-steps, each reversed super-step taped
and pulled back whole. ``L`` divides ``seq_len``. :func:`choose` measures each candidate length
(the super-step's sizes come from one compiled taped super-step, as a step's do) and keeps the one
whose plan evaluates the step the fewest times, ``L * plain super-steps + seq_len``, or none when
one-step segments (states only) evaluate it no more often.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from jax import lax

from ..schedule.budget import BudgetPlan

#: Longest segment considered, and at most this many candidate lengths (each is compiled once).
MAX_SEGMENT = 64
MAX_CANDIDATES = 8
#: Fewest segments: with two, XLA held both segments' residuals at once (a loop of 120 tanh steps
#: as 2 x 60 took 47 kB of temporaries where its plan predicted 26 kB; 3 x 40 and shorter held).
MIN_SEGMENTS = 3


class Block:
    """``L`` steps of ``whole(params, state, x) -> (new_state, y or None)`` as one step over a
    window of ``L`` inputs: ``(state after L steps, the L outputs stacked)``."""

    def __init__(self, whole: Callable, L: int, fn: Callable | None = None) -> None:
        self.whole, self.L, self.fn = whole, L, fn      # fn: the loop's own step, for messages
        self.__name__ = f"{getattr(fn or whole, '__name__', 'fn')} x{L}"

    def both(self, params: Any, state: Any, xs: Any) -> tuple[Any, Any]:
        return lax.scan(lambda h, x: self.whole(params, h, x), state, xs, length=self.L)

    def __call__(self, params: Any, state: Any, xs: Any) -> Any:
        return self.both(params, state, xs)[0]


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


def choose(seq_len: int, states_only_plain: int, plan_for_length: Callable[[int], Any]
           ) -> tuple[int, Any] | None:
    """``(L, plan over the super-steps)`` with the fewest step evaluations, if it beats the
    states-only plan's ``states_only_plain`` plain steps; ``plan_for_length(L)`` plans the loop of
    super-steps (None where the budget is below its minimum)."""
    best, best_plain = None, states_only_plain
    for L in candidates(seq_len):
        plan = plan_for_length(L)
        if plan is None:
            continue
        if L * plan.plain_steps < best_plain:
            best, best_plain = (L, plan), L * plan.plain_steps
    return best
