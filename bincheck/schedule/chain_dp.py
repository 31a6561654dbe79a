"""The dynamic programme behind :class:`~bincheck.schedule.chain.ChainPlan` (its recursion is
stated in :mod:`bincheck.schedule.chain`'s docstring): vectorised over memory units and the split
in numpy, in whole bytes where that is small enough, else in rounded units."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .chain import Chain

INF = float("inf")

# The DP's groups: as many as fit in this share of a recorded run's time. Its time grows as
# stages^2 (a Python step per segment, ~25 us) and stages^3 x units (~18 ns an element, /6):
# measured 111 ms at 64 stages x 128 units, 23 ms at 32, 5 ms at 16; at 64 stages it took half
# of a 0.23 s gradient of the nested loop (n=316), whose recording took 0.03 s
DP_SHARE = 0.25
DP_STAGES = (64, 48, 32, 24, 16)


def dp_stages(recorded: float, units: int = 128) -> int:
    """The most DP stages whose estimated planning time is within DP_SHARE of ``recorded``
    seconds (16 at least: small traces plan exactly)."""
    for s in DP_STAGES:
        if 25e-6 * s * s / 2 + 18e-9 * s ** 3 / 6 * units <= DP_SHARE * recorded:
            return s
    return DP_STAGES[-1]


def _by_bytes(chain: Chain, free: int, units: int, finer: int = 16) -> "_Choice":
    """The DP in memory units: whole bytes' common divisor where that needs at most ``finer *
    units`` of them (the exact model), else ``units`` equal parts of ``free`` rounded up, then
    finer (up to ``finer`` times as many); where rounding leaves nothing feasible, the
    one-snapshot plan (its peak is :func:`minimum_memory`, which the caller checked)."""
    whole = math.gcd(int(free), int(np.gcd.reduce(np.concatenate([chain.cuts, chain.tape,
                                                                   chain.spike, chain.adj,
                                                                   chain.back]))))
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
    from .chain import reverse_bytes            # chain imports this module
    n, size = chain.n, slots + 1
    plain = np.concatenate([[0.0], np.cumsum(chain.plain)])
    taped = np.concatenate([[0.0], np.cumsum(chain.taped)])
    ms = np.arange(size)
    if unit is None:
        cost = np.ones(n + 1, dtype=np.int64)
        adv = np.zeros((n + 1, n + 1), dtype=np.int64)
        held = [0] * (n + 1)
    else:
        held = (-(-chain.adj // unit)).tolist()   # the adjoint's bytes at each cut, in units
        cost = -(-chain.cuts // unit)
        first = (-(-(chain.cuts[1:] + chain.spike) // unit)).tolist()
        pair = (-(-(chain.cuts[:-1] + chain.cuts[1:] + chain.spike) // unit)).tolist()
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
                need = math.ceil(reverse_bytes(chain, i, j) / unit)
            best = np.where(ms >= need, taped[j] - taped[i], INF)
            choice = np.full(size, j, dtype=np.int16)
            kept = np.zeros(size, dtype=bool)
            if d > 1:
                ks = slice(i + 1, j)
                shifted = ms[None, :] - cost[ks][:, None]
                right = np.take_along_axis(left[ks, j], np.maximum(shifted, 0), axis=1)
                right[shifted < 0] = INF
                total = (plain[ks] - plain[i])[:, None] + right + left[i, ks]
                total[ms[None, :] < adv[i, ks][:, None] + held[j]] = INF
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
