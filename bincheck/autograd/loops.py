"""The front ends: :func:`binomial_checkpoint` and :func:`checkpointed_while_loop`.

A loop object holds configuration only (``fn``, the schedule or planner factory, flags), frozen
after construction. Everything one call needs — its planner, snapshots, executor, stepper, counters
— lives on that call (:class:`~.boundary.Call`), so one loop can be used from two threads, twice in
one loss, or from inside its own step. Two attributes are *published results*, replaced whole when
a call finishes: ``loop.stats`` (the last call whose reverse sweep completed: its forward and
reverse) and, for while loops, ``run.num_steps`` (the last call's length).

The loop is one primitive with its own VJP, as autograd's ``misc/fixed_points.py`` writes a loop;
its derivative is another loop (:meth:`_LoopBase.derivative_loop`), which is how the rules of
:mod:`.tangent` get higher orders without importing this module.
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Callable

import numpy as np
from autograd.tracer import isbox

from ..runtime.executor import Executor
from ..runtime.stats import LoopStats
from ..schedule.actions import Reverse
from ..schedule.binomial import Plan
from ..schedule.online import OnlinePlanner
from ..schedule.simulate import ScheduleError
from ..schedule.validate import (NUM_CKPTS_RULE, check_bool, check_callable, check_int,
                                 check_positive_int, short_repr)
from ..tree import flatten, unflatten
from .boundary import Call, Group, Pending, reverse_traced, values
from .primitives import loop_primitive
from .steps import Outputs, PlainStepper, WhileStepper, call_fn, freeze
from .tangent import ZERO, TangentStep
from .tape import tape_segment
from .verify import RTOL


class _LoopBase:
    """What both front ends share: entering the primitive and the derivative loop."""

    _published = ("stats", "num_steps")
    fn: Callable
    with_outputs: bool
    verify: bool

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._published and getattr(self, "_frozen", False):
            raise AttributeError(f"{type(self).__name__} is configured once: create a new loop "
                                 f"instead of setting {name!r}")
        object.__setattr__(self, name, value)

    def _freeze(self) -> None:
        self.stats = LoopStats()
        object.__setattr__(self, "_frozen", True)

    def _enter(self, trees: tuple) -> tuple | None:
        """Run through the primitive if anything is boxed (returns a 1-tuple), else None."""
        flat = [flatten(tree) for tree in trees]     # container boxes stay single arguments
        args = [a for leaves, _ in flat for a in leaves]
        if not any(isbox(a) for a in args):
            return None
        call = Call(self, [Group(d, len(leaves)) for leaves, d in flat],
                    [reverse_traced(a) for a in args])
        packed = loop_primitive(*args, call=call)
        # Hand back the containers the plain loop returns (a tuple of boxes, not a box of a tuple)
        # so that user code that unpacks or type-checks the result works unchanged.
        return (call.unpack([packed[i] for i in range(len(packed._value))]),)

    def _outputs(self, seq_len: int) -> Outputs | None:
        return Outputs(seq_len, RTOL if self.verify else None) if self.with_outputs else None

    def derivative_schedule(self, call: Call) -> Any:
        raise NotImplementedError

    def derivative_loop(self, call: Call) -> "CheckpointedLoop":
        """The loop over f~ (a step and its JVP), with this call's length and checkpoint budget."""
        return CheckpointedLoop(TangentStep(self.fn, self.with_outputs),
                                self.derivative_schedule(call), self.with_outputs)


class CheckpointedLoop(_LoopBase):
    """``loop(params, init_state, inputs)`` driven by a schedule; see :func:`binomial_checkpoint`.

    ``schedule`` is any object with ``seq_len``, ``first_reverse_start``, ``plain_steps`` and
    ``__iter__`` yielding actions (:func:`bincheck.plan`, :class:`bincheck.EqualSegments`).
    """

    def __init__(self, fn: Callable, schedule: Any, with_outputs: bool = False,
                 verify: bool = False) -> None:
        check_callable("fn", fn, "fn(params, state, x) -> new_state")
        with_outputs = check_bool("with_outputs", with_outputs)
        verify = check_bool("verify", verify)
        missing = [a for a in ("seq_len", "first_reverse_start", "plain_steps", "__iter__")
                   if not hasattr(schedule, a)]
        if missing:
            raise TypeError(f"schedule must be a plan such as bincheck.plan(seq_len, num_ckpts) "
                            f"(with seq_len, first_reverse_start, plain_steps and __iter__); got "
                            f"{short_repr(schedule)} of type {type(schedule).__name__}, lacking "
                            f"{', '.join(missing)}")
        self.fn, self.plan, self.seq_len = fn, schedule, schedule.seq_len
        self.with_outputs, self.verify = with_outputs, verify
        self._freeze()

    def __repr__(self) -> str:
        name = getattr(self.fn, "__name__", repr(self.fn))
        return f"CheckpointedLoop({name}, {self.plan!r}, with_outputs={self.with_outputs})"

    @property
    def predicted_plain_steps(self) -> int:
        """Plain evaluations of one gradient: the schedule's (the forward tapes the last segment,
        which the reverse sweep then uses, so it adds no plain step)."""
        return self.plan.plain_steps

    def __call__(self, params: Any, init_state: Any, inputs: Any = None) -> Any:
        self._check_inputs(inputs)
        out = self._enter((params, init_state, inputs))
        if out is not None:
            return out[0]
        # Not being differentiated: just run the loop, keep nothing.
        x_leaves, x_def = flatten(inputs)
        ys = self._outputs(self.seq_len)
        stepper = PlainStepper(self.fn, self.with_outputs, params, init_state, x_leaves, x_def,
                               LoopStats(), ys)
        state = stepper.advance(freeze(init_state), 0, self.seq_len)
        return (state, ys.buf) if self.with_outputs else state

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

    def derivative_schedule(self, call: Call) -> Any:
        return self.plan

    def forward(self, call: Call, args: tuple) -> Any:
        """Run the schedule up to its first ``Reverse`` (the first sweep), then to the end."""
        call.n = self.seq_len
        groups = call.groups
        p_leaves, s_leaves, x_leaves = (grp.expand(a) for grp, a in zip(groups, call.split(args)))
        params = unflatten(groups[0].tree_def, p_leaves)
        state0 = unflatten(groups[1].tree_def, s_leaves)
        stats, ys = LoopStats(), self._outputs(self.seq_len)
        stepper = PlainStepper(self.fn, self.with_outputs, params, state0, x_leaves,
                               groups[2].tree_def, stats, ys)
        executor = Executor(self.seq_len, freeze(state0))
        actions = iter(self.plan)
        first = executor.run(actions, stepper, until=Reverse)
        if first is None:
            raise ScheduleError(f"the schedule {self.plan!r} yielded no Reverse action: a schedule "
                                f"must reverse every step, the last one first")
        if first.start != executor.tracker.live_index or first.stop != self.seq_len:
            executor.tracker.apply(first)       # raises the tracker's ScheduleError
        taped = None
        if any(call.vjp_args):
            # A gradient will reverse the last segment first: tape it now, instead of running it
            # plain for the output and taping it again in the reverse sweep.
            t0 = time.perf_counter()
            taped = tape_segment(stepper, *flatten(stepper.params)[::-1], call.boxed_leaves(0),
                                 executor.live, first.start > 0 or bool(call.boxed_leaves(1)),
                                 call.boxed_leaves(2), first.start, self.seq_len)
            final = unflatten(stepper.s_def, taped.output_values())
            stats.tape_seconds += time.perf_counter() - t0
            stats.taped_steps += self.seq_len - first.start
        else:
            final = stepper.advance(executor.live, first.start, self.seq_len)
        call.pending = Pending(executor, itertools.chain((first,), actions), stepper, stats, taped)
        return (final, ys.buf) if self.with_outputs else final


class WhileLoop(_LoopBase):
    """``run(params, init_state)``: see :func:`checkpointed_while_loop`."""

    def __init__(self, cond_fn: Callable, body_fn: Callable, num_ckpts: int,
                 max_steps: int | None = None, planner: Callable | None = None,
                 verify: bool = False) -> None:
        check_callable("cond_fn", cond_fn, "cond_fn(params, state) -> bool")
        check_callable("body_fn", body_fn, "body_fn(params, state) -> new_state")
        num_ckpts = check_positive_int("num_ckpts", num_ckpts, NUM_CKPTS_RULE)
        if max_steps is not None:
            max_steps = check_int("max_steps", max_steps, 0, " or None (unbounded)")
        verify = check_bool("verify", verify)
        if planner is not None and not callable(planner):
            raise TypeError(f"planner must be None or a callable returning an online planner; "
                            f"got {short_repr(planner)}")
        self.cond_fn, self.body_fn = cond_fn, body_fn
        self.fn = lambda params, state, x: body_fn(params, state)
        self.num_ckpts, self.max_steps = num_ckpts, max_steps
        self.with_outputs, self.verify = False, verify
        # A factory of online planners (see bincheck.schedule.online); the default places
        # num_ckpts snapshots with binomial quality. Each call gets its own planner.
        self.make_planner = planner or (lambda: OnlinePlanner(num_ckpts))
        self.num_steps: int | None = None       # steps taken by the last call
        self._freeze()

    def __repr__(self) -> str:
        names = [getattr(f, "__name__", repr(f)) for f in (self.cond_fn, self.body_fn)]
        return (f"checkpointed_while_loop({names[0]}, {names[1]}, num_ckpts={self.num_ckpts}, "
                f"max_steps={self.max_steps})")

    def derivative_schedule(self, call: Call) -> Any:
        return Plan(call.n, self.num_ckpts)

    def __call__(self, params: Any, init_state: Any) -> Any:
        out = self._enter((params, init_state, None))
        if out is not None:
            return out[0]
        # Not being differentiated: just run the loop, keep nothing.
        stepper = self._stepper(params, init_state, LoopStats())
        final, self.num_steps = self._drive(stepper, freeze(init_state), None, None)
        return final

    def _stepper(self, params: Any, state: Any, stats: LoopStats) -> WhileStepper:
        return WhileStepper(self.fn, False, params, state, [], flatten(None)[1], stats, None,
                            label="body_fn")

    def _drive(self, stepper: WhileStepper, state: Any, executor: Executor | None,
               planner: Any) -> tuple[Any, int]:
        """The while loop on plain values. With an executor, the planner keeps snapshots.

        The executor's live state is the state before the latest step (the reversal starts from
        it); ``cur`` is the newest state. When the loop goes on, the planner may store the live
        state before it moves to ``cur``, which is handed over instead of recomputed.
        """
        if executor is not None:
            executor.run(planner.start(), stepper)
        n, cur = 0, state
        while self._keep_going(stepper.params, cur, n):
            if n == self.max_steps:
                raise RuntimeError(
                    f"checkpointed_while_loop: cond_fn is still true after max_steps="
                    f"{self.max_steps} steps; raise max_steps or pass max_steps=None (unbounded)")
            if n >= 1 and executor is not None:
                stepper.hand_over(n - 1, cur)
                executor.run(planner.advance(n), stepper)
            cur = stepper.advance(cur, n, n + 1)
            n += 1
        return cur, n

    def _keep_going(self, params: Any, state: Any, n: int) -> bool:
        verdict = call_fn(lambda p, s, x: self.cond_fn(p, s), (params, state, None), n,
                          "cond_fn")
        try:
            return bool(verdict)
        except (TypeError, ValueError) as err:
            raise TypeError(f"cond_fn must return a bool; after {n} steps it returned "
                            f"{type(verdict).__name__} {np.shape(verdict)}: {err}") from None

    def forward(self, call: Call, args: tuple) -> Any:
        groups = call.groups
        p_args, s_args, _ = call.split(args)
        p_leaves, s_leaves = groups[0].expand(p_args), groups[1].expand(s_args)
        groups[2].expand([])
        params = unflatten(groups[0].tree_def, p_leaves)
        state0 = freeze(unflatten(groups[1].tree_def, s_leaves))
        stats = LoopStats()
        stepper = self._stepper(params, state0, stats)
        executor = Executor(None, state0)
        planner = self.make_planner()
        final, n = self._drive(stepper, state0, executor, planner)
        executor.tracker.end_forward(n)
        call.n = self.num_steps = n
        call.pending = Pending(executor, planner.reverse(n), stepper, stats)
        return final


def binomial_checkpoint(fn: Callable, seq_len: int, num_ckpts: int,
                        with_outputs: bool = False, verify: bool = False) -> CheckpointedLoop:
    """Wrap ``fn(params, state, x) -> new_state`` into a loop differentiable with binomial checkpoints.

    ``loop = binomial_checkpoint(fn, seq_len, num_ckpts)``; ``loop(params, init_state, inputs)``
    returns the state after ``seq_len`` steps, step ``t`` receiving ``inputs[t]`` (each leaf's
    ``t``-th slice; ``x=None`` when ``inputs`` is None). With ``with_outputs=True`` ``fn`` returns
    ``(new_state, y)`` and the loop returns ``(final_state, ys)``, ``ys`` stacking the ``y``.

    ``num_ckpts`` counts the states held at once **including the initial state** (Revolve's
    convention): with ``seq_len=10, num_ckpts=1`` only the initial state is kept and every step is
    recomputed from it (45 plain steps); ``num_ckpts=3`` keeps the initial state plus two more (15
    plain steps); ``num_ckpts >= 10`` keeps every state (9 plain steps, no recomputation).

    A gradient runs ``fn`` exactly ``seq_len`` times under autograd's tape and
    ``t(seq_len, num_ckpts) + 1`` times on plain arrays (see :func:`bincheck.plan`), in a single
    reverse sweep whatever is differentiated. Outside any autograd trace it simply runs the loop.

    ``fn`` must be a pure function of its arguments and must not update them in place: on plain
    steps it receives read-only views (snapshots are references), and an in-place update raises a
    ValueError naming the step and the argument.

    ``verify=True`` (a debugging aid, off by default) compares every recomputed state and output
    with an earlier evaluation of the same step (see :mod:`bincheck.autograd.verify`) and raises
    :class:`NondeterministicStepError` naming the steps if they differ.
    """
    check_callable("fn", fn, "fn(params, state, x) -> new_state")
    return CheckpointedLoop(fn, Plan(seq_len, num_ckpts), with_outputs, verify)


def checkpointed_while_loop(cond_fn: Callable, body_fn: Callable, num_ckpts: int,
                            max_steps: int | None = None, verify: bool = False) -> WhileLoop:
    """A ``while cond_fn(params, state): state = body_fn(params, state)`` loop, differentiable with
    at most ``num_ckpts`` stored states (the initial one included) whatever its length.

    ``run = checkpointed_while_loop(cond_fn, body_fn, num_ckpts)``; ``run(params, init_state)``
    returns the final state. ``cond_fn`` is evaluated on plain values and not differentiated.
    Snapshots are placed online (see :mod:`bincheck.schedule.online`); each step runs once in the
    forward. ``max_steps=None`` means unbounded; otherwise a loop whose ``cond_fn`` is still true
    after ``max_steps`` steps raises RuntimeError. ``run.num_steps`` is the last call's length.
    ``verify=True`` and in-place updates: as for :func:`binomial_checkpoint`.
    """
    return WhileLoop(cond_fn, body_fn, num_ckpts, max_steps, verify=verify)
