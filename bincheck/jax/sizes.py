"""Sizes for byte budgets, from shapes alone: nothing runs.

``state_bytes`` is the state leaves' bytes. ``work_bytes`` is what the checkpointed gradient holds
beside its stored states, under XLA's static allocation: the temporaries of one compiled taped
step and its backward (``memory_analysis``), plus the buffers the reverse scan carries (the live
state, its cotangent, the scratch slot the forward writes unstored steps into, and the parameter
cotangents being accumulated together with one step's share of them).
"""

from __future__ import annotations

import jax
import numpy as np

from ..schedule.budget import Sizes
from .boundary import Flat, _pick


def nbytes(leaves: list) -> int:
    return int(sum(np.prod(np.shape(v), dtype=np.int64) * np.dtype(v.dtype).itemsize
                   for v in leaves))


def measure(flat: Flat) -> Sizes:
    spec = lambda leaves: [jax.ShapeDtypeStruct(np.shape(v), v.dtype) for v in leaves]  # noqa
    x0 = [jax.ShapeDtypeStruct(np.shape(v)[1:], v.dtype) for v in flat.x]

    def one_step(P: list, h: list, x: list, gh: list, gy: list) -> tuple:
        _, pullback = flat.taped(P, h, x)
        return pullback((gh, gy))

    out = jax.eval_shape(lambda P, h, x: flat.taped(P, h, x)[0], spec(flat.p), spec(flat.h), x0)
    compiled = jax.jit(one_step).lower(spec(flat.p), spec(flat.h), x0, out[0], out[1]).compile()
    temp = int(compiled.memory_analysis().temp_size_in_bytes)
    state = nbytes(flat.h)
    grads = nbytes(_pick(flat.p, flat.p_diff))
    return Sizes(state_bytes=max(state, 1), tape_bytes=None,
                 work_bytes=temp + 3 * state + 2 * grads)
