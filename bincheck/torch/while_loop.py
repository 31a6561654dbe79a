"""The while-loop front end for PyTorch: :func:`checkpointed_while_loop`, a loop of unknown length.

The forward runs each step once and evaluates ``cond_fn`` on the new state; an online planner
(:mod:`bincheck.schedule.online`, one per call) decides after each step whether to keep the state
before it, holding at most ``num_ckpts`` states (or what fits ``memory``) whatever the length
turns out to be. The backward replays the planner's reversal. A second backward over a retained
graph replays the offline binomial plan for the length the call ran, with as many states.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..runtime.executor import Executor
from ..runtime.stats import LoopStats
from ..schedule.binomial import Plan
from ..schedule.budget import parse_bytes
from ..schedule.online_budget import online_planner
from ..schedule.online import DiskOnlinePlanner, OnlinePlanner
from ..schedule.validate import (NUM_CKPTS_RULE, check_bool, check_callable, check_disk,
                                 check_int, check_positive_int, exactly_one_budget)
from ..tree import flatten
from .boundary import Args
from .function import Call, close
from .offload import check_offload
from .loops import SizeCache, _TorchLoop
from .steps import Steps
from .store import TorchStore


class _HandOff:
    """The forward's stepper: each step is computed once, by the loop itself (``cond_fn`` must see
    the new state first), and handed to the planner's ``Advance(n-1, n)`` instead of recomputed."""

    __slots__ = ("steps", "handoff")

    def __init__(self, steps: Steps) -> None:
        self.steps, self.handoff = steps, {}

    def advance(self, state: Any, start: int, stop: int) -> Any:
        if stop == start + 1 and start in self.handoff:
            return self.handoff.pop(start)
        return self.steps.advance(state, start, stop)


class WhileCall(Call):
    """One call of a while loop: the forward drives the online planner."""

    def first_sweep(self, store: TorchStore) -> tuple:
        loop, planner = self.loop, self.schedule
        executor = Executor(None, self.state0, store)
        steps, handoff = self.steps, _HandOff(self.steps)
        # The loop runs a step before the planner decides to keep the state before it: a
        # snapshot of state n-1 must keep the RNG state and buffer values from before step n-1,
        # not the current ones, and so must the state the reversal starts from.
        watch, before = store.watches, None
        try:
            executor.run(planner.start(), handoff)
            n, cur = 0, self.state0
            while loop.keep_going(self.args, cur, n):
                if n >= 1:
                    handoff.handoff[n - 1] = cur
                    store.given = before
                    executor.run(planner.advance(n), handoff)
                    store.given = None
                if watch:
                    before = store.ambient()
                cur = steps.advance(cur, n, n + 1)
                n += 1
            executor.tracker.end_forward(n)
            self.live_ambient = before
            loop._num_steps = n
        except BaseException:
            close(store)
            raise
        self.n = n
        return executor, planner.reverse(n), None, flatten(cur)[0]

    def replay_schedule(self) -> Any:
        return Plan(self.n, self.slots) if self.n else ()


class WhileLoop(_TorchLoop):
    """``run(params, init_state)``: see :func:`checkpointed_while_loop`."""

    label = "body_fn"
    _published = ("stats", "last_plan", "_num_steps")

    def __init__(self, cond_fn: Callable, body_fn: Callable, num_ckpts: int | None = None,
                 max_steps: int | None = None, *, memory: int | str | None = None,
                 disk: bool | str | None = None, verify: bool = False,
                 preserve_rng_state: bool = True, offload: Any = None) -> None:
        check_callable("cond_fn", cond_fn, "cond_fn(params, state) -> bool")
        check_callable("body_fn", body_fn, "body_fn(params, state) -> new_state")
        exactly_one_budget(num_ckpts, memory)
        if memory is None:
            num_ckpts = check_positive_int("num_ckpts", num_ckpts, NUM_CKPTS_RULE)
        else:
            memory = parse_bytes(memory)
        self.disk = check_offload(offload, memory, disk) or check_disk(disk, memory)
        if max_steps is not None:
            max_steps = check_int("max_steps", max_steps, 0, " or None (unbounded)")
        self.cond_fn, self.body_fn = cond_fn, body_fn
        self.fn = lambda params, state, x: body_fn(params, state)
        self.num_ckpts, self.max_steps, self.memory = num_ckpts, max_steps, memory
        self.verify = check_bool("verify", verify)
        self.preserve_rng_state = check_bool("preserve_rng_state", preserve_rng_state)
        self.budget = SizeCache() if memory is not None else None
        self.seq_len = None
        self.last_plan = None
        self._num_steps: int | None = None
        self._freeze()

    @property
    def num_steps(self) -> int | None:
        """Steps the last call ran, differentiated or not (``stats.num_steps`` is the last
        gradient's); None before any call."""
        return self._num_steps

    def __repr__(self) -> str:
        names = [getattr(f, "__name__", repr(f)) for f in (self.cond_fn, self.body_fn)]
        budget = f"num_ckpts={self.num_ckpts}" if self.memory is None else \
            f"memory={self.memory}"
        return (f"bincheck.torch.checkpointed_while_loop({names[0]}, {names[1]}, {budget}, "
                f"max_steps={self.max_steps})")

    @torch.compiler.disable
    def __call__(self, params: Any, init_state: Any) -> Any:
        return self._run(Args(params, init_state, None, None))

    def new_call(self, args: Args) -> WhileCall:
        return WhileCall(self, args)

    def schedule_for(self, call: Call) -> Any:
        return self.planner_for(call)   # the schedule is planned online, step by step

    def disk_for(self, schedule: Any) -> Any:
        return self.disk if isinstance(schedule, DiskOnlinePlanner) else None

    def planner_for(self, call: WhileCall) -> Any:
        """This call's online planner: num_ckpts states, or what fits the memory budget (with a
        disk tier: periodic disk checkpoints)."""
        if self.budget is None:
            call.slots = self.num_ckpts
            return OnlinePlanner(self.num_ckpts)
        if not self.keep_going(call.args, call.state0, 0):
            call.slots = 1
            return OnlinePlanner(1)
        call.slots, planner = online_planner(
            self.memory, self.budget.sizes(call, self.disk).states_only, self.disk is not None)
        return planner

    def keep_going(self, args: Args, state: Any, n: int) -> bool:
        verdict = args.call_with(None, self.cond_fn, state)
        try:
            go = bool(verdict)
        except (TypeError, RuntimeError, ValueError) as err:
            raise TypeError(f"cond_fn must return a bool or a one-element tensor; after {n} steps "
                            f"it returned {type(verdict).__name__}: {err}") from None
        if go and n == self.max_steps:
            raise RuntimeError(
                f"checkpointed_while_loop: cond_fn is still true after max_steps="
                f"{self.max_steps} steps; raise max_steps or pass max_steps=None (unbounded)")
        return go

    def run_plain(self, args: Args) -> Any:
        # loop.stats keeps describing the last gradient; num_steps this call's length
        steps = Steps(self.fn, None, args, LoopStats(), None, False, self.label)
        n, state = 0, args.state([v.detach().clone() for v in args.s])
        with torch.no_grad():
            while self.keep_going(args, state, n):
                state = steps.advance(state, n, n + 1)
                n += 1
        self._num_steps = n
        return state

    def plain_graph(self, args: Args, p: list | None, s: list, x: list) -> tuple[list, Any]:
        def body(params: Any, state: Any) -> list:
            n = 0
            while self.keep_going(args, state, n):
                state = self.body_fn(params, state)
                n += 1
            return flatten(state)[0]
        return args.call_with(p, body, args.state(s)), None


def checkpointed_while_loop(cond_fn: Callable, body_fn: Callable, num_ckpts: int | None = None,
                            max_steps: int | None = None, *, memory: int | str | None = None,
                            disk: bool | str | None = None, verify: bool = False,
                            preserve_rng_state: bool = True, offload: Any = None) -> WhileLoop:
    """A ``while cond_fn(params, state): state = body_fn(params, state)`` loop on tensors,
    differentiable with at most ``num_ckpts`` stored states (the initial one included) whatever
    its length.

    ``run = checkpointed_while_loop(cond_fn, body_fn, num_ckpts)``; ``run(params, init_state)``
    returns the final state. ``cond_fn`` returns a bool or a one-element tensor (on CUDA, reading
    it synchronises every step) and is not differentiated. Snapshots are placed online
    (:mod:`bincheck.schedule.online`); each step runs once in the forward. ``max_steps=None`` is
    unbounded; otherwise a loop whose ``cond_fn`` is still true after ``max_steps`` steps raises
    RuntimeError. ``run.num_steps`` is the last call's length. ``memory``, ``disk``,
    ``offload``, ``verify``, ``preserve_rng_state`` and the rules for ``params`` and in-place
    updates: as for :func:`binomial_checkpoint` (with ``disk`` or ``offload``, the online planner
    sends periodic checkpoints to the second tier).
    """
    return WhileLoop(cond_fn, body_fn, num_ckpts, max_steps, memory=memory, disk=disk,
                     verify=verify, preserve_rng_state=preserve_rng_state, offload=offload)
