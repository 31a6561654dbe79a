"""Byte budgets for the front ends: measuring a loop's step once, and the schedule for a call.

A loop built with ``memory=...`` has no schedule until it has seen its data: the first call that
needs one probes step 0 (:mod:`.probe`: four extra evaluations of ``fn``), keeps the measured
sizes in a cache keyed by the shapes and dtypes of the arguments and by which of them are being
differentiated (a cache, not per-call state: a repeat measurement would give the same plan), and
plans within the budget (:class:`~bincheck.schedule.budget.BudgetPlan`).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ..runtime.stats import LoopStats
from ..schedule.budget import BudgetPlan, Sizes
from ..tree import flatten
from .probe import probe
from .outputs import Outputs
from .steps import PlainStepper


def signature(stepper: PlainStepper, state: Any, p_box: list, x_box: list) -> tuple:
    def shapes(leaves: list) -> tuple:
        return tuple((np.shape(v), getattr(v, "dtype", type(v))) for v in leaves)
    return (shapes(flatten(stepper.params)[0]), shapes(flatten(state)[0]),
            shapes([v[0] for v in stepper.x_leaves]), tuple(p_box), tuple(x_box))


class SizeCache:
    """Measured :class:`Sizes` and the plans made from them, per argument signature."""

    def __init__(self) -> None:
        self._sizes: dict = {}
        self._plans: dict = {}
        self._lock = threading.Lock()

    def sizes(self, loop: Any, stepper: PlainStepper, state: Any, p_box: list,
              x_box: list, disk: Any = None) -> Sizes:
        key = signature(stepper, state, p_box, x_box) + (disk is not None,)
        sizes = self._sizes.get(key)
        if sizes is None:
            probe_stepper = PlainStepper(loop.fn, loop.with_outputs, stepper.params, state,
                                         stepper.x_leaves, stepper.x_def, LoopStats(),
                                         Outputs(1) if loop.has_outputs else None,
                                         stepper.label, loop.output_fn)
            sizes = probe(probe_stepper, state, p_box, x_box, disk)
            with self._lock:
                sizes = self._sizes.setdefault(key, sizes)
        return sizes

    def plan(self, seq_len: int, memory: int, sizes: Sizes, disk: bool = False) -> BudgetPlan:
        key = (seq_len, memory, sizes, disk)
        plan = self._plans.get(key)
        if plan is None:
            plan = BudgetPlan(seq_len, memory, sizes, disk)
            with self._lock:
                plan = self._plans.setdefault(key, plan)
        return plan
