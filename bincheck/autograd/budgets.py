"""Byte budgets for the front ends: measuring a loop's step once, and the schedule for a call.

A loop built with ``memory=...`` has no schedule until it has seen its data: the first call that
needs one probes step 0 (:mod:`.probe`: four extra evaluations of ``fn``), keeps the measured
sizes in a cache keyed by the shapes and dtypes of the arguments and by which of them are being
differentiated (a cache, not per-call state: a repeat measurement would give the same plan), and
plans within the budget (:class:`~bincheck.schedule.budget.BudgetPlan`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime.stats import LoopStats
from ..runtime.front import SizeCache as BaseCache
from ..schedule.budget import Sizes
from ..tree import flatten
from .probe import probe
from .outputs import Outputs
from .steps import PlainStepper


def signature(stepper: PlainStepper, state: Any, p_box: list, x_box: list) -> tuple:
    def shapes(leaves: list) -> tuple:
        return tuple((np.shape(v), getattr(v, "dtype", type(v))) for v in leaves)
    return (shapes(flatten(stepper.params)[0]), shapes(flatten(state)[0]),
            shapes([v[0] for v in stepper.x_leaves]), tuple(p_box), tuple(x_box))


class SizeCache(BaseCache):
    """Measured :class:`Sizes` and the plans made from them, per argument signature."""

    def sizes(self, loop: Any, stepper: PlainStepper, state: Any, p_box: list,
              x_box: list, disk: Any = None) -> Sizes:
        def measure() -> Sizes:
            probe_stepper = PlainStepper(loop.fn, loop.with_outputs, stepper.params, state,
                                         stepper.x_leaves, stepper.x_def, LoopStats(),
                                         Outputs(1) if loop.has_outputs else None,
                                         stepper.label, loop.output_fn)
            return probe(probe_stepper, state, p_box, x_box, disk)
        return self.measured(signature(stepper, state, p_box, x_box) + (disk is not None,),
                             measure)
