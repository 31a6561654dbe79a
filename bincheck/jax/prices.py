"""Prices of a step, measured: do kept segments pay? (issue 29 item 9)

:func:`.segments.choose_measured` picks the segment length with the fewest evaluations of the
step, but fewer evaluations are not less time: inside a segment's ``lax.scan`` a step can cost
more than taped alone (on jax-cfd at T=5000 the plan chosen so ran 1.5x states only's time).
So before a segment plan is kept, :func:`pays` predicts both plans' times from prices measured
on this machine (:func:`step_prices`): the sweep itself, compiled over a few dozen steps and
timed on zeros, states only and in segments (every state stored), and a ``lax.scan`` of plain
steps for the recomputations.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import jax
import numpy as np
from jax import lax

from .boundary import Flat
from .segments import BlockFlat
from .sizes import sweep_gradient


#: Least share of the states-only plan's predicted time that segments must save, the time
#: priced from measured sweeps (:func:`step_prices`). The evaluations alone misled: a step
#: inside a segment's ``lax.scan`` can cost much more than taped alone (issue 29 item 9: 1.5x
#: states only's time on jax-cfd at T=5000).
PRICE_MARGIN = 0.05
#: Steps each priced sweep runs (in segments: rounded up to whole ones, at least PRICE_SEGMENTS),
#: and the interleaved calls of each program whose median is taken.
PRICE_STEPS = 48
PRICE_SEGMENTS = 6
PRICE_REPS = 5


def _sweep_gradient(flat: Flat, n: int, x_wanted: bool) -> Callable:
    """A call of the compiled gradient of the checkpointed sweep over ``n`` (super-)steps of
    ``flat`` with every state stored (:func:`.sizes.sweep_gradient`), on arrays of zeros
    (timing only)."""
    grad, specs, _ = sweep_gradient(flat, n, n, x_wanted)
    args = [[np.zeros(s.shape, s.dtype) for s in group] for group in specs]
    compiled = jax.jit(grad).lower(*args).compile()
    return lambda: compiled(*args)


class Prices:
    """Seconds per step of a sweep, measured (:func:`step_prices`): ``step`` for each step run
    plain once in the forward and taped once in the reverse, with all the sweep does around
    it; ``recompute`` for each further plain evaluation (a recomputation in the reverse
    sweep, with the snapshots it writes)."""

    __slots__ = ("step", "recompute")

    def __init__(self, step: float, recompute: float) -> None:
        self.step, self.recompute = step, recompute

    def time(self, seq_len: int, plain_steps: int, forward_plain: int) -> float:
        """The predicted time of a plan: ``plain_steps`` evaluations (in steps), of which the
        forward sweep's ``forward_plain``."""
        return seq_len * self.step + (plain_steps - forward_plain) * self.recompute

    def __repr__(self) -> str:
        return f"Prices(step={self.step:.3g} s, recompute={self.recompute:.3g} s)"


def step_prices(flat: Flat, L: int, x_wanted: bool) -> tuple[Prices, Prices]:
    """The measured :class:`Prices` of the states-only sweep and of the sweep in segments of
    ``L`` steps: ``step`` from compiled gradients of the sweep itself with every state stored
    (over :data:`PRICE_STEPS` steps; in segments over at least that many and at least
    :data:`PRICE_SEGMENTS` segments), ``recompute`` from a compiled ``lax.scan`` of plain
    steps (the same for both: a sweep with two slots per plan measured about
    the same per recomputation, at twice the compile time: 5-9e-5 s against 5.8e-5 s on the
    stencil stand-in of benchmarks/jax/segments_pay.py). Called :data:`PRICE_REPS` times,
    interleaved, on zeros; medians."""
    n = max(PRICE_SEGMENTS, -(-PRICE_STEPS // L))
    calls = [_sweep_gradient(flat, PRICE_STEPS, x_wanted),
             _sweep_gradient(BlockFlat(flat, L), n, x_wanted)]
    P = [np.zeros(np.shape(v), np.dtype(v.dtype)) for v in flat.p]
    h = [np.zeros(np.shape(v), np.dtype(v.dtype)) for v in flat.h]
    xs = [np.zeros((PRICE_STEPS,) + tuple(np.shape(v))[1:], np.dtype(v.dtype)) for v in flat.x]

    def plain(P: list, h: list, xs: list) -> Any:
        return lax.scan(lambda h, x: (flat.state(P, h, x), None), h, xs, length=PRICE_STEPS)[0]
    compiled = jax.jit(plain).lower(P, h, xs).compile()
    calls.append(lambda: compiled(P, h, xs))
    times: list[list[float]] = [[] for _ in calls]
    for call in calls:
        jax.block_until_ready(call())
    for k in range(PRICE_REPS):
        for i in (range(len(calls)) if k % 2 == 0 else reversed(range(len(calls)))):
            t0 = time.perf_counter()
            jax.block_until_ready(calls[i]())
            times[i].append(time.perf_counter() - t0)
    states, segments, recompute = (statistics.median(v) for v in times)
    recompute /= PRICE_STEPS
    return Prices(states / PRICE_STEPS, recompute), Prices(segments / (n * L), recompute)


def pays(flat: Flat, seq_len: int, L: int, segment_plain: int, states_only_plain: int,
         x_wanted: bool) -> bool:
    """Whether segments of ``L`` steps (``segment_plain`` plain evaluations, in steps) are
    predicted, at measured prices (:func:`step_prices`), to take at most ``1 -
    PRICE_MARGIN`` of the time of the states-only plan (``states_only_plain``). Leaves of
    an extended dtype (typed PRNG keys) have no zeros to time on: states only."""
    if any(jax.dtypes.issubdtype(v.dtype, jax.dtypes.extended)
           for v in flat.p + flat.h + flat.x):
        return False
    states, kept = step_prices(flat, L, x_wanted)
    return kept.time(seq_len, segment_plain, seq_len - L) <= \
        (1 - PRICE_MARGIN) * states.time(seq_len, states_only_plain, seq_len - 1)
