"""Per-step outputs ``y``: stacked as they arrive, checked, compared under ``verify=True``.

A step's output is an array, a scalar, or a tuple/list/dict of them (e.g. ``(logprobs, loss)``);
``ys`` stacks each leaf along a new leading axis of length ``seq_len``, written straight into one
preallocated array per leaf (no list of per-step arrays, no stacking copy). Every step must give
the same structure and shapes. Only the first computation of a step records; a recomputation is
compared with the record when ``verify=True`` (``rtol`` set).

Where ``y`` comes from: with ``with_outputs=True`` the step returns ``(new_state, y)`` and replays
recompute it; with ``output_fn(params, new_state, x)`` it is computed once per step in the forward
and once under the tape when the step is reversed, never in replays.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from autograd.tracer import getval

from ..tree import describe, flatten, unflatten
from .verify import compare


class Outputs:
    """The stacked outputs of one call (see the module docstring)."""

    __slots__ = ("seq_len", "bufs", "y_def", "shapes", "count", "rtol", "label")

    def __init__(self, seq_len: int, rtol: float | None = None, label: str = "y") -> None:
        self.seq_len, self.rtol, self.label = seq_len, rtol, label
        self.bufs: list | None = None
        self.y_def = self.shapes = None
        self.count = 0

    @property
    def value(self) -> Any:
        """The stacked outputs: the tree of ``y`` with each leaf of shape (seq_len, ...)."""
        return unflatten(self.y_def, self.bufs)

    def check(self, y: Any, t: int) -> list:
        """The leaves of ``y``; raise unless it is numeric and shaped like the first step's."""
        leaves, y_def = flatten(y)
        if not leaves or any(not _numeric(v) for v in leaves):
            raise TypeError(f"{self.label} must be an array, a scalar, or a tuple/list/dict of "
                            f"them; step {t} gave {describe(y_def) if leaves else repr(y)[:80]}")
        shapes = [np.shape(v) for v in leaves]
        if self.y_def is None:
            self.y_def, self.shapes = y_def, shapes
        elif y_def != self.y_def or shapes != self.shapes:
            raise ValueError(f"every {self.label} must have the same structure and shapes; step "
                             f"{t} gave {describe(y_def)} with shapes {shapes}, earlier steps "
                             f"{describe(self.y_def)} with {self.shapes}")
        return leaves

    def add(self, t: int, y: Any) -> None:
        leaves = self.check(y, t)
        if t != self.count:
            if self.rtol is not None and t < self.count:
                compare(f"the output y of step {t}", [b[t] for b in self.bufs], leaves,
                        self.rtol, f"recomputing step {t}")
            return
        values = [np.asarray(getval(v)) for v in leaves]
        if self.bufs is None:
            self.bufs = [np.empty((self.seq_len,) + v.shape, dtype=v.dtype) for v in values]
        for k, v in enumerate(values):
            if v.dtype != self.bufs[k].dtype:
                dtype = np.result_type(self.bufs[k].dtype, v.dtype)   # promote, as np.stack
                if dtype != self.bufs[k].dtype:
                    self.bufs[k] = self.bufs[k].astype(dtype)
            self.bufs[k][t] = v
        self.count += 1


def _numeric(value: Any) -> bool:
    if isinstance(value, (int, float, complex)) and not isinstance(value, bool):
        return True
    dtype = getattr(getval(value), "dtype", None)
    return dtype is not None and dtype.kind in "biufc"
