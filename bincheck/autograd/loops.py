"""The schedule-driven front end, :func:`binomial_checkpoint`, and what every front end shares.

A loop object holds configuration only (``fn``, the schedule or planner factory, flags), frozen
after construction. Everything one call needs — its planner, snapshots, executor, stepper, counters
— lives on that call (:class:`~.boundary.Call`), so one loop can be used from two threads, twice in
one loss, or from inside its own step. Two attributes are *published results*, replaced whole when
a call finishes: ``loop.stats`` (the last call whose reverse sweep completed: its forward and
reverse; ``run.num_steps`` of a while loop is ``run.stats.num_steps``) and, with a memory budget,
``loop.last_plan``, replaced at the same moment.

The loop is one primitive with its own VJP, as autograd's ``misc/fixed_points.py`` writes a loop;
its derivative is another loop (:meth:`_LoopBase.derivative_loop`), which is how the rules of
:mod:`.tangent` get higher orders without importing this module.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import replace
from typing import Any, Callable

import numpy as np
from autograd.tracer import isbox

from ..runtime.disk import open_disk
from ..runtime.executor import Executor
from ..runtime.front import Configured
from ..runtime.stats import LoopStats
from ..runtime.store import MemoryStore
from ..schedule.actions import Reverse
from ..schedule.binomial import Plan
from ..schedule.budget import BudgetPlan, MemoryBudget, Sizes, memory_for, parse_bytes
from ..schedule.simulate import ScheduleError, simulate
from ..schedule.validate import (check_bool, check_callable, check_disk, check_positive_int,
                                 exactly_one_budget, short_repr)
from ..tree import flatten, unflatten
from .boundary import Call, Group, Pending, refuse_hidden_boxes, reverse_traced, values
from .budgets import SizeCache, TapeGuard
from .primitives import loop_primitive
from .outputs import Outputs
from .steps import PlainStepper, freeze, release
from .tangent import ZERO, TangentOutput, TangentStep
from .tape import tape_segment
from .verify import RTOL


class _LoopBase(Configured):
    """What both front ends share: entering the primitive and the derivative loop."""

    fn: Callable
    with_outputs: bool
    verify: bool

    def _enter(self, trees: tuple) -> tuple | None:
        """Run through the primitive if anything is boxed (returns a 1-tuple), else None."""
        flat = [flatten(tree) for tree in trees]     # container boxes stay single arguments
        args = [a for leaves, _ in flat for a in leaves]
        if not any(isbox(a) for a in args):
            return None
        refuse_hidden_boxes(args, "the loop was given", {a._trace for a in args if isbox(a)})
        call = Call(self, [Group(d, len(leaves)) for leaves, d in flat],
                    [reverse_traced(a) for a in args])
        packed = loop_primitive(*args, call=call)
        # Hand back the containers the plain loop returns (a tuple of boxes, not a box of a tuple)
        # so that user code that unpacks or type-checks the result works unchanged.
        return (call.unpack([packed[i] for i in range(len(packed._value))]),)

    output_fn: Callable | None = None

    @property
    def has_outputs(self) -> bool:
        return self.with_outputs or self.output_fn is not None

    def publish(self, call: Call, stats: LoopStats) -> None:
        """Make one call's results the loop's published ones (called when the call completes)."""
        stats.num_steps = call.n
        self.stats = stats

    def _outputs(self, seq_len: int) -> Outputs | None:
        if not self.has_outputs:
            return None
        return Outputs(seq_len, RTOL if self.verify else None,
                       "y" if self.with_outputs else "output_fn's y")

    def _stepper(self, params: Any, state: Any, x_leaves: list, x_def: Any, stats: LoopStats,
                 ys: Outputs | None) -> PlainStepper:
        return PlainStepper(self.fn, self.with_outputs, params, state, x_leaves, x_def, stats,
                            ys, output_fn=self.output_fn)

    def derivative_schedule(self, call: Call) -> Any:
        raise NotImplementedError

    def derivative_loop(self, call: Call) -> "CheckpointedLoop":
        """The loop over f~ (a step and its JVP), with this call's length and checkpoint budget."""
        if self.output_fn is not None:
            return CheckpointedLoop(TangentStep(self.fn, False), self.derivative_schedule(call),
                                    output_fn=TangentOutput(self.output_fn))
        return CheckpointedLoop(TangentStep(self.fn, self.with_outputs),
                                self.derivative_schedule(call), self.with_outputs)


class CheckpointedLoop(_LoopBase):
    """``loop(params, init_state, inputs)`` driven by a schedule; see :func:`binomial_checkpoint`.

    ``schedule`` is any object with ``seq_len``, ``first_reverse_start``, ``plain_steps`` and
    ``__iter__`` yielding actions (:func:`bincheck.plan`, :class:`bincheck.EqualSegments`).
    """

    _published = ("stats", "last_plan")

    def __init__(self, fn: Callable, schedule: Any, with_outputs: bool = False,
                 verify: bool = False, output_fn: Callable | None = None) -> None:
        check_callable("fn", fn, "fn(params, state, x) -> new_state")
        with_outputs = check_bool("with_outputs", with_outputs)
        verify = check_bool("verify", verify)
        if output_fn is not None:
            check_callable("output_fn", output_fn, "output_fn(params, new_state, x) -> y")
            if with_outputs:
                raise ValueError("output_fn and with_outputs=True are mutually exclusive: with "
                                 "output_fn, fn returns only the new state and output_fn(params, "
                                 "new_state, x) gives step t's output")
        if not isinstance(schedule, MemoryBudget):
            missing = [a for a in ("seq_len", "first_reverse_start", "plain_steps", "__iter__")
                       if not hasattr(schedule, a)]
            if missing:
                raise TypeError(
                    f"schedule must be a plan such as bincheck.plan(seq_len, num_ckpts) (with "
                    f"seq_len, first_reverse_start, plain_steps and __iter__) or a MemoryBudget; "
                    f"got {short_repr(schedule)} of type {type(schedule).__name__}, lacking "
                    f"{', '.join(missing)}")
        self.fn, self.schedule, self.seq_len = fn, schedule, schedule.seq_len
        self.with_outputs, self.verify, self.output_fn = with_outputs, verify, output_fn
        self.budget = SizeCache() if isinstance(schedule, MemoryBudget) else None
        self.last_plan = None        # with a memory budget: the plan the last call used
        self._freeze()

    def __repr__(self) -> str:
        name = getattr(self.fn, "__name__", repr(self.fn))
        outputs = f", output_fn={getattr(self.output_fn, '__name__', self.output_fn)}" \
            if self.output_fn is not None else f", with_outputs={self.with_outputs}"
        return f"CheckpointedLoop({name}, {self.schedule!r}{outputs})"

    @property
    def plan(self) -> Any:
        """The schedule: fixed, or with a memory budget the plan the last call used (None before
        the first gradient or :meth:`preview`)."""
        return self.last_plan if self.budget is not None else self.schedule

    @property
    def predicted_plain_steps(self) -> int | None:
        """Plain evaluations of one gradient: the schedule's (the forward tapes the last segment,
        which the reverse sweep then uses, so it adds no plain step)."""
        return None if self.plan is None else self.plan.plain_steps

    def preview(self, params: Any, init_state: Any, inputs: Any = None) -> BudgetPlan:
        """Measure one step (four evaluations of fn) and return the plan a gradient w.r.t. params
        would use: predicted evaluations, peak bytes and time relative to store-all."""
        sizes = self.measure(params, init_state, inputs)
        if self.budget is not None:
            plan = self.budget.plan(self.seq_len, self.schedule.memory, sizes,
                                    self.schedule.disk is not None)
            self.last_plan = plan           # a preview is published like a completed call
            return plan
        peak = getattr(self.schedule, "peak_checkpoints", None)
        if peak is None:                    # a custom schedule: count it
            peak = simulate(self.schedule).peak_checkpoints
        states = min(peak, self.seq_len)
        return BudgetPlan(self.seq_len, sizes.work_bytes + states * sizes.state_bytes,
                          replace(sizes, tape_bytes=None))

    def memory_for(self, max_relative_time: float, params: Any, init_state: Any,
                   inputs: Any = None) -> int:
        """The least ``memory`` (bytes) predicted to keep a gradient within ``max_relative_time``
        times store-all, measured on these arguments."""
        return memory_for(self.seq_len, max_relative_time,
                          self.measure(params, init_state, inputs))

    def measure(self, params: Any, init_state: Any, inputs: Any = None) -> Sizes:
        """The sizes and step times of this loop on these arguments (gradient w.r.t. params)."""
        self._check_inputs(inputs)
        x_leaves, x_def = flatten(inputs)
        stepper = self._stepper(params, init_state, x_leaves, x_def, LoopStats(), None)
        cache = self.budget or SizeCache()
        return cache.sizes(self, stepper, freeze(init_state),
                           list(range(len(flatten(params)[0]))), [], self._disk)

    @property
    def _disk(self) -> Any:
        return getattr(self.schedule, "disk", None)

    def __call__(self, params: Any, init_state: Any, inputs: Any = None) -> Any:
        self._check_inputs(inputs)
        out = self._enter((params, init_state, inputs))
        if out is not None:
            return out[0]
        # Not being differentiated: just run the loop, keep nothing.
        x_leaves, x_def = flatten(inputs)
        ys = self._outputs(self.seq_len)
        stepper = self._stepper(params, init_state, x_leaves, x_def, LoopStats(), ys)
        state = release(stepper.advance(freeze(init_state), 0, self.seq_len))
        return (state, ys.value) if self.has_outputs else state

    def _check_inputs(self, inputs: Any) -> None:
        leaves = flatten(values(inputs))[0]
        for k, leaf in enumerate(leaves):
            if leaf is ZERO:
                continue
            shape = np.shape(leaf)
            if len(shape) == 0 or shape[0] != self.seq_len:
                got = "a scalar" if len(shape) == 0 else f"leading length {shape[0]}"
                which = "" if len(leaves) == 1 else f" (leaf {k} of {len(leaves)})"
                hint = ""
                if type(inputs) in (list, tuple) and len(inputs) == self.seq_len:
                    hint = (f". inputs is a {type(inputs).__name__} of {self.seq_len} items: if "
                            f"they are the per-step inputs, pass numpy.stack(inputs), one array "
                            f"whose leading axis is the step")
                raise ValueError(
                    f"inputs must have leading axis of length seq_len={self.seq_len} "
                    f"(step t receives inputs[t]); got {got}{which} (shape {shape}){hint}")

    def publish(self, call: Call, stats: LoopStats) -> None:
        super().publish(call, stats)
        if self.budget is not None:
            self.last_plan = call.schedule

    def derivative_schedule(self, call: Call) -> Any:
        if self.budget is None:
            return self.schedule
        return Plan(call.n, max(1, call.schedule.checkpoints))   # the same states, no tapes

    def _schedule_for(self, call: Call, stepper: PlainStepper, state0: Any) -> Any:
        if self.budget is None:
            return self.schedule
        probed = self.budget.probed(self, stepper, state0, call.boxed_leaves(0),
                                    call.boxed_leaves(2), self._disk)
        plan = self.budget.plan(self.seq_len, self.schedule.memory, probed.sizes,
                                self._disk is not None)
        call.guard = TapeGuard(plan.memory, probed, plan.table_bytes + plan.io_bytes,
                               stepper.label)
        return plan

    def forward(self, call: Call, args: tuple) -> Any:
        """Run the schedule up to its first ``Reverse`` (the first sweep), then to the end."""
        call.n = self.seq_len
        groups = call.groups
        p_leaves, s_leaves, x_leaves = (grp.expand(a) for grp, a in zip(groups, call.split(args)))
        params = unflatten(groups[0].tree_def, p_leaves)
        state0 = freeze(unflatten(groups[1].tree_def, s_leaves))
        stats, ys = LoopStats(), self._outputs(self.seq_len)
        stepper = self._stepper(params, state0, x_leaves, groups[2].tree_def, stats, ys)
        schedule = call.schedule = self._schedule_for(call, stepper, state0)
        if not any(call.vjp_args):
            # Forward mode only: no VJP can follow, so keep no snapshots.
            final = stepper.advance(state0, 0, self.seq_len)
            call.pending = Pending(None, None, stepper, stats)
            self.publish(call, stats)
            return (final, ys.value) if self.has_outputs else final
        store = MemoryStore(open_disk(self._disk if getattr(schedule, "uses_disk", False)
                                      else None))
        try:
            return self._first_sweep(call, schedule, stepper, state0, store, stats, ys)
        except BaseException:
            if store.disk is not None:
                store.disk.close()          # the call's files go with the failed forward
            raise

    def _first_sweep(self, call: Call, schedule: Any, stepper: PlainStepper, state0: Any,
                     store: MemoryStore, stats: LoopStats, ys: Outputs | None) -> Any:
        executor = Executor(self.seq_len, state0, store)
        actions = iter(schedule)
        first = executor.run(actions, stepper, until=Reverse)
        if first is None:
            raise ScheduleError(f"the schedule {schedule!r} yielded no Reverse action: a schedule "
                                f"must reverse every step, the last one first")
        if first.start != executor.tracker.live_index or first.stop != self.seq_len:
            executor.tracker.apply(first)       # raises the tracker's ScheduleError
        taped = None
        if any(call.vjp_args):
            # A gradient will reverse the last segment first: tape it now, instead of running it
            # plain for the output and taping it again in the reverse sweep.
            t0 = time.perf_counter()
            guard = call.guard and call.guard.segment(first.start, store)
            taped = tape_segment(stepper, *flatten(stepper.params)[::-1], call.boxed_leaves(0),
                                 executor.live, first.start > 0 or bool(call.boxed_leaves(1)),
                                 call.boxed_leaves(2), first.start, self.seq_len,
                                 plain_outputs=True, guard=guard)
            final = unflatten(stepper.s_def, taped.output_values())
            stats.tape_seconds += time.perf_counter() - t0
            stats.taped_steps += self.seq_len - first.start
        else:
            final = stepper.advance(executor.live, first.start, self.seq_len)
        call.pending = Pending(executor, itertools.chain((first,), actions), stepper, stats, taped)
        return (final, ys.value) if self.has_outputs else final


def _one_of(num_ckpts: Any, memory: Any) -> int | None:
    """Exactly one of num_ckpts and memory; returns memory in bytes (None with num_ckpts)."""
    exactly_one_budget(num_ckpts, memory)
    return None if memory is None else parse_bytes(memory)


def binomial_checkpoint(fn: Callable, seq_len: int, num_ckpts: int | None = None,
                        with_outputs: bool = False, verify: bool = False, *,
                        memory: int | str | None = None, disk: bool | str | None = None,
                        output_fn: Callable | None = None) -> CheckpointedLoop:
    """Wrap ``fn(params, state, x) -> new_state`` into a loop differentiable with binomial checkpoints.

    ``loop = binomial_checkpoint(fn, seq_len, num_ckpts)``; ``loop(params, init_state, inputs)``
    returns the state after ``seq_len`` steps, step ``t`` receiving ``inputs[t]`` (each leaf's
    ``t``-th slice; ``x=None`` when ``inputs`` is None).

    Per-step outputs: with ``output_fn=readout``, ``readout(params, new_state, x)`` gives step
    ``t``'s output from the state after step ``t``; it runs once per step in the forward and once
    under the tape when step ``t`` is reversed, never in recomputations (the recommended way to put
    a loss on every step). With ``with_outputs=True`` instead, ``fn`` returns ``(new_state, y)``
    and recomputations recompute ``y``. Either way the loop returns ``(final_state, ys)``; ``y``
    may be an array, a scalar or a tuple/list/dict of them, and ``ys`` stacks each leaf along a
    new leading axis of length ``seq_len``.

    ``num_ckpts`` counts the checkpoints (states held at once) **including the initial state**
    (Revolve's convention): with ``seq_len=10, num_ckpts=1`` only the initial state is kept and every step is
    recomputed from it (45 plain steps); ``num_ckpts=3`` keeps the initial state plus two more (15
    plain steps); ``num_ckpts >= 10`` keeps every state (9 plain steps, no recomputation).

    A gradient runs ``fn`` exactly ``seq_len`` times under autograd's tape and
    ``t(seq_len, num_ckpts)`` times on plain arrays (see :func:`bincheck.plan`), in a single
    reverse sweep whatever is differentiated. Outside any autograd trace it simply runs the loop.

    ``memory="200MB"`` (instead of ``num_ckpts``; a number is bytes; units B, kB, MB, GB and KiB,
    MiB, GiB; see :func:`bincheck.parse_bytes`: a budget above what the loop can use means that
    every state fits) bounds everything the loop holds during a gradient — snapshots, kept tapes, the
    tape being differentiated and its buffers, not the arguments, outputs or returned cotangents.
    The first gradient measures one step (four extra evaluations of ``fn``; ``loop.preview(...)``
    does it up front and returns the plan with its predictions) and plans the optimal mix of
    stored states and whole taped segments within the budget (Gruslys et al.'s mixed policy,
    :mod:`bincheck.schedule.mixed`). A budget below one state plus one step's working set raises
    a ValueError naming the minimum; a step whose tape outgrows what the budget leaves it (by more
    than one step's measured tape: the plan assumes every step is like step 0) raises a ValueError
    at that step (:ref:`byte-budgets`). ``disk=True`` (a private temporary directory) or
    ``disk="/some/dir"`` (a private subdirectory of it) adds a disk tier: states beyond the RAM
    budget go to ``.npy`` files, checked on reading and removed when freed, after the sweep and
    after any error (:mod:`bincheck.runtime.disk`), placed by the Disk-Revolve planner
    (:mod:`bincheck.schedule.disk`) with the measured write and read times.

    ``fn`` must be a pure function of its arguments and must not update them in place: on plain
    steps it receives read-only views (snapshots are references), and an in-place update raises a
    ValueError naming the step and the argument.

    ``verify=True`` (a debugging aid, off by default) compares every recomputed state and output
    with an earlier evaluation of the same step (see :mod:`bincheck.autograd.verify`) and raises
    :class:`NondeterministicStepError` naming the steps if they differ.
    """
    check_callable("fn", fn, "fn(params, state, x) -> new_state")
    memory = _one_of(num_ckpts, memory)
    disk = check_disk(disk, memory)
    if memory is not None:
        return CheckpointedLoop(fn, MemoryBudget(check_positive_int("seq_len", seq_len), memory,
                                                 disk), with_outputs, verify, output_fn)
    return CheckpointedLoop(fn, Plan(seq_len, num_ckpts), with_outputs, verify, output_fn)
