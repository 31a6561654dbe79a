"""Revolve inside the traced program, for segments whose lengths are known only at run time.

A while loop stops after ``n`` steps, a traced value, so its reversal cannot be compiled into tables
in Python. The online planner's reversal (:meth:`bincheck.schedule.online.OnlinePlanner.reverse`)
is simple enough to run in the program instead: the last step from the working state, then each
segment between the held snapshots, last first, with the binomial schedule and the slots left.

This module runs that reversal with an explicit stack of frames ``(position, slots)`` whose states
sit in the snapshot buffer at a slot fixed per depth. Reversing step ``hi - 1``: drop the frames at or
past ``hi``; from the top frame ``(c, s)``, while ``hi - c > 1`` and ``s > 1``, advance to
``c + split(hi - c, s)`` and push it with ``s - 1``; advance to ``hi - 1``; pull back through that
step. That is :func:`bincheck.schedule.binomial.binomial_actions`' recursion, step by step.

``split`` is :func:`bincheck.schedule.split` over a table of binomial coefficients built in Python
(:func:`beta_table`, saturated so that int32 never overflows); tests hold the traced split and the
traced action counts against the Python planner.
"""

from __future__ import annotations

from math import comb
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..schedule.binomial import repetitions


def beta_table(slots: int, max_len: int) -> np.ndarray:
    """``B[s, k] = min(C(s + k, s), max_len + 2)`` for ``s <= slots`` and every ``k`` a split of
    a segment of at most ``max_len`` steps can look at."""
    cap = max_len + 2
    top = repetitions(max(max_len, 2), 2) + 3 if slots >= 2 else 2
    table = np.empty((slots + 1, top + 2), np.int32)
    for s in range(slots + 1):
        for k in range(top + 2):
            table[s, k] = min(comb(s + k, s), cap)
    return table


def split(table: Any, l: Any, s: Any) -> Any:
    """The traced :func:`bincheck.schedule.split` (``l >= 2``, ``s >= 2``)."""
    k_all = jnp.arange(table.shape[1] - 1, dtype=jnp.int32)
    row_s, row_s1 = table[s], table[s - 1]
    ok = (row_s[k_all] + row_s1[k_all + 1] >= l + 1) & (k_all >= 1)
    k = 1 + jnp.sum(~ok[1:]).astype(jnp.int32)         # smallest k >= 1 with ok (monotone)
    m = jnp.minimum(jnp.maximum(jnp.maximum(1, row_s[k - 1]), l - row_s1[k + 1]), l - 1)
    return jnp.where(l == 2, 1, m)


def reverse(step_back: Callable, advance: Callable, table: Any, buf: list, where: Any,
            fpos: Any, fslots: Any, depth: Any, hi: Any, carry: Any) -> Any:
    """Reverse steps ``hi-1 .. 0`` from the frames ``0..depth`` (positions ascending, frame
    ``d``'s state in ``buf[where[d]]``; the slots ``where[depth+1:]`` are free). ``advance(h, start, stop)`` runs plain steps; ``step_back(carry, h,
    j)`` pulls the cotangent ``carry`` back through step ``j`` taken from state ``h``."""
    def one(c: tuple) -> tuple:
        hi, depth, buf, fpos, fslots, carry = c
        depth = lax.while_loop(lambda d: (d > 0) & (fpos[d] >= hi), lambda d: d - 1, depth)
        h = [lax.dynamic_index_in_dim(b, where[depth], keepdims=False) for b in buf]

        def push(c: tuple) -> tuple:
            pos, slots, depth, h, buf, fpos, fslots = c
            mid = pos + split(table, hi - pos, slots)
            h = advance(h, pos, mid)
            depth = depth + 1
            buf = [lax.dynamic_update_index_in_dim(b, v, where[depth], 0)
                   for b, v in zip(buf, h)]
            return (mid, slots - 1, depth, h, buf, fpos.at[depth].set(mid),
                    fslots.at[depth].set(slots - 1))
        pos, _, depth, h, buf, fpos, fslots = lax.while_loop(
            lambda c: (hi - c[0] > 1) & (c[1] > 1), push,
            (fpos[depth], fslots[depth], depth, h, buf, fpos, fslots))
        h = advance(h, pos, hi - 1)
        carry = step_back(carry, h, hi - 1)
        return hi - 1, depth, buf, fpos, fslots, carry

    out = lax.while_loop(lambda c: c[0] > 0, one, (hi, depth, buf, fpos, fslots, carry))
    return out[-1]
