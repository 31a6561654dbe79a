"""``verify=True``: check that replaying steps reproduces what the first evaluation gave.

Checkpointing assumes ``fn`` is a pure function of ``(params, state, x)``; a step with unseeded
randomness, or one that mutates something it closes over, makes the replays differ and the gradient
wrong. The verifier is an executor observer (plus a hook on taped outputs) that compares every
recomputed state for which it holds a reference:

* every snapshot, forward or reverse, is kept after its ``Free`` until the sweep recomputes that
  state (it always does: the segment ending there is reversed next) and is compared then;
* every ``Advance`` that ends at a stored state is compared with it;
* every taped segment's output state is compared with the state the previous taped segment started
  from (the sweep runs backwards, so that is the same index): each step's taped evaluation is
  checked against an earlier evaluation, the last forward segment's included; the first taped
  output is compared with the forward's final state;
* every recomputed per-step output ``y`` is compared with the forward's.

Memory: the retired snapshots (at most the schedule's snapshots again) and one more state.
Tolerance: a float leaf matches when ``max|a - b| <= rtol * S``, ``rtol = 1e-9``, ``S`` the
leaf's largest magnitude but at least ``1e-6`` times the largest magnitude in the whole state (or
output): round-off is relative to the magnitudes a step combines, so a leaf that is a difference
of equal sums cannot raise on round-off, while a large leaf elsewhere in the state does not hide
a discrepancy in a small one. Integer leaves must match exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from autograd.tracer import getval

from ..runtime.errors import NondeterministicStepError
from ..schedule.actions import Action, Advance, Free, Restore
from ..tree import flatten

RTOL = 1e-9
FLOOR = 1e-6       # a leaf's scale is at least this fraction of the state's largest magnitude


def compare(what: str, reference: list, leaves: list, rtol: float, how: str,
            suspect: int | None = None) -> None:
    """Raise NondeterministicStepError unless ``leaves`` match ``reference`` (see module doc)."""
    pairs = [(np.asarray(getval(a)), np.asarray(getval(b))) for a, b in zip(leaves, reference)]
    scales = [float(np.max(np.abs(b))) if b.size and b.dtype.kind in "fc" else 0.0
              for _, b in pairs]
    floor = FLOOR * max(scales, default=0.0)
    for k, (a, b) in enumerate(pairs):
        if a.shape != b.shape:
            bad = f"shape {a.shape} instead of {b.shape}"
        elif a.dtype.kind in "fc" or b.dtype.kind in "fc":
            err = float(np.max(np.abs(a - b))) if a.size else 0.0
            scale = max(scales[k], floor)
            if err <= rtol * scale or (np.isnan(err) and np.array_equal(a, b, equal_nan=True)):
                continue
            bad = f"a difference of up to {err:.3g} (scale {scale:.3g})"
        elif np.array_equal(a, b):
            continue
        else:
            bad = "different integers"
        leaf = "" if len(leaves) == 1 else f" (leaf {k})"
        step = "" if suspect is None else f", first suspect step {suspect}"
        raise NondeterministicStepError(
            f"verify=True: {how} gave {what}{leaf} with {bad} from an earlier evaluation{step}. "
            f"A step is not a pure function of (params, state, x): unseeded randomness, or fn "
            f"mutating something it closes over? Checkpointing replays steps, so the gradient "
            f"would be wrong.")


class Verifier:
    """Executor observer for ``verify=True``; see the module docstring for what it compares."""

    __slots__ = ("retired", "origin", "prev_input", "rtol")

    def __init__(self, n: int, final_leaves: list, rtol: float = RTOL) -> None:
        self.retired: dict[int, list] = {n: list(final_leaves)}
        self.origin = 0                 # where the current replay started
        self.prev_input: tuple[int, list] | None = None
        self.rtol = rtol

    def before(self, action: Action, executor: Any) -> None:
        if type(action) is Free:
            self.retired[action.index] = flatten(executor.store.get(action.index))[0]

    def after(self, action: Action, executor: Any) -> None:
        kind = type(action)
        if kind is Restore:
            self.origin = action.index
        elif kind is Advance and action.stop > action.start:
            self._check(action.stop, flatten(executor.live)[0], executor,
                        f"recomputing steps {self.origin}..{action.stop - 1} from state "
                        f"{self.origin}")

    def taped(self, start: int, stop: int, input_leaves: list, output_leaves: list,
              executor: Any) -> None:
        """A taped segment ran from state ``start`` to ``stop``: check its output."""
        how = f"taping steps {start}..{stop - 1}"
        if self.prev_input is not None and self.prev_input[0] == stop:
            compare(f"state {stop}", self.prev_input[1], output_leaves, self.rtol, how, stop - 1)
        self._check(stop, output_leaves, executor, how)
        self.prev_input = (start, [getval(v) for v in input_leaves])

    def _check(self, index: int, leaves: list, executor: Any, how: str) -> None:
        ref = self.retired.pop(index, None)
        if ref is None and index in executor.store:
            ref = flatten(executor.store.get(index))[0]
        if ref is not None:
            compare(f"state {index}", ref, leaves, self.rtol, how, index - 1)
