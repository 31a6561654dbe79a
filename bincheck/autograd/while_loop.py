"""The while-loop front end: :func:`checkpointed_while_loop`, a loop of unknown length.

The forward runs each step once and evaluates ``cond_fn`` on the new state; an online planner
(:mod:`bincheck.schedule.online`, one per call) decides after each step whether to keep the
state before it, holding at most ``num_ckpts`` states (or what fits ``memory``) whatever the
length turns out to be. The reverse replays the planner's reversal; derivatives of the sweep use
the tangent loop of a binomial plan over the length the call ran.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..runtime.disk import open_disk
from ..runtime.executor import Executor
from ..runtime.stats import LoopStats
from ..runtime.store import MemoryStore
from ..schedule.binomial import Plan
from ..schedule.budget import IO_STATES
from ..schedule.online_budget import online_planner
from ..schedule.online import DiskOnlinePlanner, OnlinePlanner
from ..schedule.validate import (NUM_CKPTS_RULE, check_bool, check_callable, check_int,
                                 check_positive_int, short_repr)
from ..tree import flatten, unflatten
from .boundary import Call, Pending
from .budgets import SizeCache, TapeGuard
from .loops import _LoopBase, _one_of, check_disk
from .steps import WhileStepper, call_fn, freeze, release


class WhileLoop(_LoopBase):
    """``run(params, init_state)``: see :func:`checkpointed_while_loop`."""

    def __init__(self, cond_fn: Callable, body_fn: Callable, num_ckpts: int | None = None,
                 max_steps: int | None = None, planner: Callable | None = None,
                 verify: bool = False, *, memory: int | str | None = None,
                 disk: bool | str | None = None) -> None:
        check_callable("cond_fn", cond_fn, "cond_fn(params, state) -> bool")
        check_callable("body_fn", body_fn, "body_fn(params, state) -> new_state")
        memory = _one_of(num_ckpts, memory)
        disk = check_disk(disk, memory)
        if memory is not None and planner is not None:
            raise TypeError("planner and memory cannot be combined: with memory=... the loop "
                            "places the states that fit the budget with its online planner")
        if memory is None:
            num_ckpts = check_positive_int("num_ckpts", num_ckpts, NUM_CKPTS_RULE)
        if max_steps is not None:
            max_steps = check_int("max_steps", max_steps, 0, " or None (unbounded)")
        verify = check_bool("verify", verify)
        if planner is not None and not callable(planner):
            raise TypeError(f"planner must be None or a callable returning an online planner; "
                            f"got {short_repr(planner)}")
        self.cond_fn, self.body_fn = cond_fn, body_fn
        self.fn = lambda params, state, x: body_fn(params, state)
        self.num_ckpts, self.max_steps, self.memory, self.disk = num_ckpts, max_steps, memory, \
            disk
        self.with_outputs, self.verify = False, verify
        self.budget = SizeCache() if memory is not None else None
        # A factory of online planners (see bincheck.schedule.online); the default places
        # num_ckpts snapshots with binomial quality. Each call gets its own planner.
        self.make_planner = planner or OnlinePlanner
        self._freeze()

    @property
    def num_steps(self) -> int | None:
        """Steps the last completed call ran (``stats.num_steps``; None before any call)."""
        return self.stats.num_steps

    def __repr__(self) -> str:
        names = [getattr(f, "__name__", repr(f)) for f in (self.cond_fn, self.body_fn)]
        budget = f"num_ckpts={self.num_ckpts}" if self.memory is None else \
            f"memory={self.memory}"
        return (f"checkpointed_while_loop({names[0]}, {names[1]}, {budget}, "
                f"max_steps={self.max_steps})")

    def derivative_schedule(self, call: Call) -> Any:
        return Plan(call.n, call.schedule)

    def _planner_for(self, call: Call, stepper: WhileStepper, state0: Any) -> Any:
        """This call's online planner: num_ckpts states, or what fits the memory budget (with a
        disk tier: periodic disk checkpoints, the period from the measured costs)."""
        if self.budget is None:
            call.schedule = self.num_ckpts
            planner = self.make_planner(self.num_ckpts)
            missing = [m for m in ("start", "advance", "reverse") if not hasattr(planner, m)]
            if missing:
                raise TypeError(f"planner(num_ckpts) must return an online planner with start, "
                                f"advance and reverse (see bincheck.schedule.online); got "
                                f"{short_repr(planner)}, lacking {', '.join(missing)}")
            return planner
        if not self._keep_going(stepper.params, state0, 0):
            call.schedule = 1                   # no step: nothing to plan
            return OnlinePlanner(1)
        probed = self.budget.probed(self, stepper, state0, call.boxed_leaves(0), [], self.disk)
        call.schedule, planner = online_planner(self.memory, probed.sizes, self.disk is not None)
        in_flight = IO_STATES * probed.sizes.state_bytes \
            if isinstance(planner, DiskOnlinePlanner) else 0
        call.guard = TapeGuard(self.memory, probed, in_flight, stepper.label)
        return planner

    def __call__(self, params: Any, init_state: Any) -> Any:
        out = self._enter((params, init_state, None))
        if out is not None:
            return out[0]
        # Not being differentiated: just run the loop, keep nothing.
        stats = LoopStats()
        stepper = self._stepper(params, init_state, stats)
        final, n = self._drive(stepper, freeze(init_state), None, None)
        stats.num_steps = n
        self.stats = stats
        return release(final)

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
        planner = self._planner_for(call, stepper, state0)
        if not any(call.vjp_args):
            # Forward mode only: no VJP can follow, so keep no snapshots (and write no files).
            final, call.n = self._drive(stepper, state0, None, None)
            call.pending = Pending(None, None, stepper, stats)
            self.publish(call, stats)
            return final
        store = MemoryStore(open_disk(self.disk if isinstance(planner, DiskOnlinePlanner)
                                      else None))
        try:
            executor = Executor(None, state0, store)
            final, n = self._drive(stepper, state0, executor, planner)
            executor.tracker.end_forward(n)
        except BaseException:
            if store.disk is not None:
                store.disk.close()              # the call's files go with the failed forward
            raise
        call.n = n
        call.pending = Pending(executor, planner.reverse(n), stepper, stats)
        return final


def checkpointed_while_loop(cond_fn: Callable, body_fn: Callable, num_ckpts: int | None = None,
                            max_steps: int | None = None, verify: bool = False, *,
                            memory: int | str | None = None,
                            disk: bool | str | None = None) -> WhileLoop:
    """A ``while cond_fn(params, state): state = body_fn(params, state)`` loop, differentiable with
    at most ``num_ckpts`` stored states (the initial one included) whatever its length.

    ``run = checkpointed_while_loop(cond_fn, body_fn, num_ckpts)``; ``run(params, init_state)``
    returns the final state. ``cond_fn`` is evaluated on plain values and not differentiated.
    Snapshots are placed online (see :mod:`bincheck.schedule.online`); each step runs once in the
    forward. ``max_steps=None`` means unbounded; otherwise a loop whose ``cond_fn`` is still true
    after ``max_steps`` steps raises RuntimeError. ``run.num_steps`` is the last call's length.
    ``memory=...`` instead of ``num_ckpts`` holds as many states as fit the bytes (states only:
    tapes of a loop of unknown length are not kept); ``disk=...`` adds periodic disk checkpoints
    (``DiskOnlinePlanner``, :mod:`bincheck.schedule.online`). ``verify=True``, in-place updates,
    ``memory`` and ``disk``: as for :func:`binomial_checkpoint`.
    """
    return WhileLoop(cond_fn, body_fn, num_ckpts, max_steps, verify=verify, memory=memory,
                     disk=disk)
