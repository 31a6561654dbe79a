"""Byte budgets for the front ends: measuring a loop's step once, and the schedule for a call.

A loop built with ``memory=...`` has no schedule until it has seen its data: the first call that
needs one probes step 0 (:mod:`.probe`: four extra evaluations of ``fn``), keeps the measured
sizes in a cache keyed by the shapes and dtypes of the arguments and by which of them are being
differentiated (a cache, not per-call state: a repeat measurement would give the same plan), and
plans within the budget (:class:`~bincheck.schedule.budget.BudgetPlan`).

The plan assumes every step is like step 0. :class:`TapeGuard` checks that as the gradient runs:
each taped segment (the forward's last one, each ``Reverse`` of the sweep) counts the nodes its
steps build and the bytes of the arrays they compute, and the node that takes its steps, priced
from these counts as step 0's tape was, over the bytes the plan left them (plus one step's tape,
the allowance) raises a ValueError naming its step and saying what to do. Steps that build what
step 0 built cost exactly its measured tape and are never refused.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..runtime.stats import LoopStats
from ..runtime.front import SizeCache as BaseCache
from ..schedule.budget import Sizes, format_bytes
from ..tree import flatten
from .probe import NODE_BYTES, Probe, probe
from .tape import Meter
from .outputs import Outputs
from .steps import PlainStepper


def signature(stepper: PlainStepper, state: Any, p_box: list, x_box: list) -> tuple:
    def shapes(leaves: list) -> tuple:
        return tuple((np.shape(v), getattr(v, "dtype", type(v))) for v in leaves)
    return (shapes(flatten(stepper.params)[0]), shapes(flatten(state)[0]),
            shapes([v[0] for v in stepper.x_leaves]), tuple(p_box), tuple(x_box))


class SizeCache(BaseCache):
    """Measured :class:`Sizes` and the plans made from them, per argument signature."""

    def probed(self, loop: Any, stepper: PlainStepper, state: Any, p_box: list,
               x_box: list, disk: Any = None) -> Probe:
        def measure() -> Probe:
            probe_stepper = PlainStepper(loop.fn, loop.with_outputs, stepper.params, state,
                                         stepper.x_leaves, stepper.x_def, LoopStats(),
                                         Outputs(1) if loop.has_outputs else None,
                                         stepper.label, loop.output_fn)
            return probe(probe_stepper, state, p_box, x_box, disk)
        return self.measured(signature(stepper, state, p_box, x_box) + (disk is not None,),
                             measure)

    def sizes(self, loop: Any, stepper: PlainStepper, state: Any, p_box: list,
              x_box: list, disk: Any = None) -> Sizes:
        return self.probed(loop, stepper, state, p_box, x_box, disk).sizes


class TapeGuard:
    """One call's check that its taped steps keep no more than the budget planned for them.

    A taped segment of ``k`` steps was planned as ``k`` of step 0's tapes (``tape_bytes``: its
    input state, ``NODE_BYTES`` per node and the array bytes its nodes keep): one in the working
    set, the rest beside the snapshots. What the budget *leaves* a segment is the budget less the
    working set, the planner's tables and the snapshots stored now, plus the working set's one
    tape. The segment's steps are priced from what their nodes build (``tape.Meter``):
    ``NODE_BYTES`` per node and the array bytes they compute at step 0's ratio of bytes kept to
    bytes computed, plus, per step, the rest of step 0's measured tape (its input state, its
    roots), so that a step that builds what step 0 built costs exactly ``tape_bytes``. The first
    node that takes the price over what the budget leaves plus one step's tape (the allowance)
    raises, naming its step."""

    __slots__ = ("memory", "sizes", "reserved", "nodes0", "ratio", "base", "label")

    def __init__(self, memory: int, probed: Probe, table_bytes: int, label: str) -> None:
        s = probed.sizes
        self.memory, self.sizes, self.label = memory, s, label
        self.reserved = s.work_bytes + table_bytes
        self.nodes0, bytes0 = probed.step_nodes, probed.step_array_bytes
        kept = s.tape_bytes - s.state_bytes - NODE_BYTES * self.nodes0   # step 0's array bytes
        self.ratio = max(kept, 0) / bytes0 if bytes0 else 1.0
        self.base = s.tape_bytes - NODE_BYTES * self.nodes0 - self.ratio * bytes0

    def segment(self, start: int, store: Any) -> Callable[[int, Meter], None]:
        """The guard of a segment taped from step ``start`` while ``store`` holds the snapshots:
        ``guard(t, meter)`` before step ``t`` sets the meter's cap for steps ``start..t``."""
        s = self.sizes
        stored = max(len(store) * s.state_bytes, store.nbytes)
        left = self.memory - self.reserved - stored + s.tape_bytes
        begun = [start, 0, 0]           # the current step, the meter's counts before it

        def over(meter: Meter) -> None:
            raise ValueError(self._message(start, begun, meter, left))

        def guard(t: int, meter: Meter) -> None:
            if t == start:
                meter.node_bytes, meter.ratio, meter.over = NODE_BYTES, self.ratio, over
            begun[:] = t, meter.nodes, meter.nbytes
            meter.cap = left + s.tape_bytes - (t - start + 1) * self.base
            if meter.price > meter.cap:
                over(meter)
        return guard

    def _message(self, start: int, begun: list, meter: Meter, left: int) -> str:
        s, label = self.sizes, self.label
        t, nodes = begun[0], meter.nodes - begun[1]
        step = self.base + NODE_BYTES * nodes + self.ratio * (meter.nbytes - begun[2])
        held = (t - start + 1) * self.base + meter.price
        steps = f"steps {start}..{t}" if t > start else f"step {t}"
        return (
            f"{label}'s step {t} keeps a bigger tape than step 0, which the memory budget was "
            f"planned from: step 0's tape had {self.nodes0} nodes ({format_bytes(s.tape_bytes)} "
            f"measured), step {t}'s has {nodes} so far (about {format_bytes(int(step))}). Taped "
            f"together, {steps} would hold about {format_bytes(int(held))} where "
            f"memory={self.memory} bytes leaves them {format_bytes(left)} (allowance: "
            f"{format_bytes(s.tape_bytes)}, one step's tape). The budget assumes every step is "
            f"like step 0: make the step's work the same at every step (e.g. a fixed number of "
            f"inner iterations), or give memory= room for the larger steps, or use num_ckpts="
            f"..., which counts stored states and tapes one step at a time.")
