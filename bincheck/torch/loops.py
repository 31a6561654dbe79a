"""The schedule-driven front end for PyTorch, :func:`binomial_checkpoint`.

A loop object holds configuration only, frozen after construction; everything one call needs
lives on that call (:class:`~.function.Call`), so one loop can serve two threads, two calls in one
loss, or a call from inside its own step. ``loop.stats`` (and, with a memory budget,
``loop.last_plan``) are published results, replaced whole when a call completes.

Entering a loop (:meth:`_TorchLoop._run`) picks one of three paths:

* nothing needs a gradient (``no_grad``, ``inference_mode``, or no tensor requiring grad): the
  plain loop under ``no_grad``, keeping nothing;
* a ``torch.func`` transform or forward-mode AD is tracing the arguments: the plain loop in the
  caller's modes, so the transform sees ordinary torch operations (exact, without checkpointing:
  forward mode needs no stored states; a reverse-mode ``torch.func`` transform stores all);
* otherwise, reverse mode: one :class:`~.function.LoopFunction` call, checkpointed.

The entry is hidden from ``torch.compile`` (``torch.compiler.disable``): a compiled loss breaks its
graph at the loop, and the step itself may be compiled (``binomial_checkpoint(torch.compile(cell),
...)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..runtime.front import ActionCache, Configured
from ..runtime.front import SizeCache as BaseCache
from ..runtime.stats import LoopStats
from ..schedule.binomial import Plan
from ..schedule.budget import BudgetPlan, MemoryBudget, memory_for, parse_bytes
from ..schedule.simulate import simulate
from ..schedule.validate import (check_bool, check_callable, check_disk, check_positive_int,
                                 exactly_one_budget, short_repr, NUM_CKPTS_RULE)
from ..tree import flatten, unflatten
from .boundary import Args, aliases, differentiable
from .function import Call, LoopFunction
from .offload import check_offload, planned
from .probe import Measured, probe
from .steps import Outputs, Steps


def _traced(v: Any) -> bool:
    """``v`` is being traced by a torch.func transform or carries a forward-mode tangent."""
    if not isinstance(v, torch.Tensor):
        return False
    if torch._C._functorch.is_functorch_wrapped_tensor(v):
        return True
    return torch.autograd.forward_ad.unpack_dual(v).tangent is not None


class _TorchLoop(Configured):
    """What both torch front ends share: configuration, the three entry paths, publishing."""

    _published = ("stats", "last_plan")
    label = "fn"
    output_fn: Callable | None = None

    def _run(self, args: Args) -> Any:
        leaves = args.leaves
        if any(_traced(v) for v in leaves):
            outs, y_def = self.plain_graph(args, None, args.s, args.x)
            return self.unpack(args, outs, y_def)
        if not torch.is_grad_enabled() or not any(
                isinstance(v, torch.Tensor) and v.requires_grad for v in leaves):
            return self.run_plain(args)
        call = self.new_call(args)
        outs = LoopFunction.apply(call, *leaves)
        return self.unpack(args, list(outs), call.ys.y_def if call.ys else None)

    def unpack(self, args: Args, outs: list, y_def: Any) -> Any:
        n_s = len(args.s)
        state = args.state(outs[:n_s])
        if self.output_fn is None:
            return state
        return state, unflatten(y_def, outs[n_s:])

    def new_call(self, args: Args) -> Call:
        return Call(self, args)


class CheckpointedLoop(_TorchLoop):
    """``loop(params, init_state, inputs)`` driven by a schedule; see :func:`binomial_checkpoint`."""

    def __init__(self, fn: Callable, schedule: Any, verify: bool = False,
                 output_fn: Callable | None = None, preserve_rng_state: bool = True,
                 disk: Any = None) -> None:
        check_callable("fn", fn, "fn(params, state, x) -> new_state")
        if output_fn is not None:
            check_callable("output_fn", output_fn, "output_fn(params, new_state, x) -> y")
        self.fn, self.schedule, self.seq_len = fn, schedule, schedule.seq_len
        self.plans: dict = {}            # seq_len=None, num_ckpts: a Plan per length seen
        self.output_fn = output_fn
        self.verify = check_bool("verify", verify)
        self.preserve_rng_state = check_bool("preserve_rng_state", preserve_rng_state)
        self.disk = disk
        self.budget = SizeCache() if isinstance(schedule, MemoryBudget) else None
        self.last_plan = None
        self.action_cache = ActionCache()
        self._freeze()

    def __repr__(self) -> str:
        name = getattr(self.fn, "__name__", repr(self.fn))
        return f"bincheck.torch.CheckpointedLoop({name}, {self.schedule!r})"

    @torch.compiler.disable
    def __call__(self, params: Any, init_state: Any, inputs: Any = None) -> Any:
        return self._run(Args(params, init_state, inputs, self.length(inputs)))

    def length(self, inputs: Any) -> int:
        """The call's length: ``seq_len``, or (not given) the leading length of ``inputs``."""
        if self.seq_len is not None:
            return self.seq_len
        leaves = flatten(inputs)[0]
        if not leaves or not isinstance(leaves[0], torch.Tensor) or leaves[0].dim() == 0:
            raise ValueError(f"this loop was built without seq_len, so each call takes its length "
                             f"from the leading axis of inputs; got inputs={short_repr(inputs)}. "
                             f"Pass inputs (step t receives inputs[t]) or build the loop with "
                             f"seq_len")
        n = int(leaves[0].shape[0])
        if n < 1:
            raise ValueError(f"inputs have leading length 0: a loop runs at least one step "
                             f"(shape {tuple(leaves[0].shape)})")
        return n

    @property
    def plan(self) -> Any:
        """The schedule: fixed, or with a memory budget (or without ``seq_len``) the plan of the
        last call (or preview)."""
        return self.last_plan if self.budget is not None or self.seq_len is None else \
            self.schedule

    def run_plain(self, args: Args) -> Any:
        # loop.stats keeps describing the last gradient: an evaluation publishes nothing
        ys = Outputs() if self.output_fn is not None else None
        steps = Steps(self.fn, self.output_fn, args, LoopStats(), ys, False, self.label)
        state0 = args.state([v.detach().clone() for v in args.s])
        state = steps.advance(state0, 0, args.seq_len)
        if ys is None:
            return state
        return state, unflatten(ys.y_def, ys.stacked())

    def plain_graph(self, args: Args, p: list | None, s: list, x: list) -> tuple[list, Any]:
        """The uncheckpointed loop in the current grad modes, from these leaves: its output
        leaves and the structure of ``output_fn``'s result."""
        n, out_fn = args.seq_len, self.output_fn
        ys = Outputs(keep_graph=True)

        def body(params: Any, state: Any) -> list:
            for t in range(n):
                xt = args.x_at(t, x) if x else None
                state = self.fn(params, state, xt)
                if out_fn is not None:
                    ys.add(t, out_fn(params, state, xt))
            return flatten(state)[0] + ys.stacked()
        return args.call_with(p, body, args.state(s)), ys.y_def

    def schedule_for(self, call: Call) -> Any:
        if self.budget is None:
            if self.seq_len is not None:
                return self.schedule
            plan = self.plans.get(call.n)
            if plan is None:
                if len(self.plans) >= 256:        # many lengths: keep the plans bounded
                    self.plans.clear()
                plan = self.plans.setdefault(call.n, Plan(call.n, self.schedule.num_ckpts))
            self.last_plan = plan
            return plan
        plan = self.budget.best_plan(call.n, self.schedule.memory,
                                     self.budget.sizes(call, self.disk), planned(self.disk))
        self.last_plan = plan
        return plan

    def disk_for(self, schedule: Any) -> Any:
        """The disk directory a call with this schedule writes to (None: RAM only)."""
        return self.disk if getattr(schedule, "uses_disk", False) else None

    def preview(self, params: Any, init_state: Any, inputs: Any = None) -> BudgetPlan:
        """Measure one step (four evaluations of fn) and return the plan a gradient w.r.t. all
        floating-point params would use: evaluations, peak bytes, time relative to store-all."""
        n = self.length(inputs)
        call = self._measuring_call(params, init_state, inputs, n)
        measured = (self.budget or SizeCache()).sizes(call, self.disk)
        if self.budget is not None:
            plan = self.budget.best_plan(n, self.schedule.memory, measured,
                                         planned(self.disk))
            self.last_plan = plan
            return plan
        sizes = measured.states_only
        schedule = self.schedule if self.seq_len is not None else \
            Plan(n, self.schedule.num_ckpts)
        peak = getattr(schedule, "peak_checkpoints", None)
        if peak is None:
            peak = simulate(schedule).peak_checkpoints
        return BudgetPlan(n, sizes.work_bytes + min(peak, n) * sizes.state_bytes, sizes)

    def _measuring_call(self, params: Any, init_state: Any, inputs: Any, n: int) -> Call:
        """A call set up as a gradient w.r.t. every floating-point parameter and every input
        that requires grad would be, to measure one step with."""
        call = self.new_call(Args(params, init_state, inputs, n))
        call.p_want = [differentiable(v) for v in call.args.p]
        call.steps.aliases = aliases(call.args.p, call.p_want)
        call.steps.x_want = [k for k, v in enumerate(call.args.x)
                             if differentiable(v) and v.requires_grad]
        call.state0 = call.args.state([v.detach().clone() for v in call.args.s])
        return call

    def memory_for(self, max_relative_time: float, params: Any, init_state: Any,
                   inputs: Any = None) -> int:
        """The least ``memory`` (bytes) predicted to keep a gradient within ``max_relative_time``
        times store-all, measured on these arguments (one step, as :meth:`preview` measures
        it; the length is the loop's, or that of ``inputs``)."""
        n = self.length(inputs)
        call = self._measuring_call(params, init_state, inputs, n)
        measured = (self.budget or SizeCache()).sizes(call, self.disk)
        return memory_for(n, max_relative_time, measured.states_only)


class SizeCache(BaseCache):
    """Measured :class:`Sizes` and plans, per argument signature (shapes, dtypes, devices, which
    arguments are differentiated)."""

    @staticmethod
    def signature(call: Call, disk: Any) -> tuple:
        def sig(leaves: list) -> tuple:
            return tuple((tuple(v.shape), v.dtype, v.device) if isinstance(v, torch.Tensor)
                         else type(v) for v in leaves)
        args = call.args
        # inputs by their per-step slice: a loop without seq_len measures once for all lengths
        x = tuple((tuple(v.shape[1:]), v.dtype, v.device) for v in args.x)
        return (sig(args.p), sig(args.s), x, tuple(call.p_want),
                tuple(call.steps.x_want), disk is not None)

    def sizes(self, call: Call, disk: Any = None) -> Measured:
        return self.measured(self.signature(call, disk), lambda: probe(call, disk))

    def best_plan(self, seq_len: int, memory: int, measured: Measured,
                  disk: Any = False) -> BudgetPlan:
        """The faster of the states-only plan (one-step segments, the smaller working set) and
        the mixed plan (kept taped segments, the larger one) that fit ``memory``; a budget that
        fits neither raises the states-only plan's ValueError, naming the minimum."""
        plans, error = [], None
        for sizes in (measured.states_only, measured.mixed):
            try:
                plans.append(self.plan(seq_len, memory, sizes, disk))
            except ValueError as err:
                error = error or err
        if not plans:
            raise error
        # fewest plain steps; with a disk tier, the least predicted recomputation and I/O time
        return min(plans, key=lambda plan: plan.plain_steps if plan.extra_seconds is None
                   else plan.extra_seconds)


def binomial_checkpoint(fn: Callable, seq_len: int | None = None, num_ckpts: int | None = None, *,
                        memory: int | str | None = None, output_fn: Callable | None = None,
                        verify: bool = False, disk: bool | str | None = None,
                        preserve_rng_state: bool = True, offload: Any = None) -> CheckpointedLoop:
    """Wrap ``fn(params, state, x) -> new_state`` into a torch loop differentiable with optimal
    binomial checkpoints.

    ``loop = binomial_checkpoint(fn, seq_len, num_ckpts)``; ``loop(params, init_state, inputs)``
    returns the state after ``seq_len`` steps, step ``t`` receiving ``inputs[t]`` (each leaf's
    ``t``-th slice; ``x=None`` when ``inputs`` is None). With ``seq_len=None`` each call takes its
    length from the leading axis of ``inputs``, as ``lax.scan`` does (one loop for batches of
    different lengths; plans are made per length, a measured step once for all). ``params`` is a tensor, a (nested)
    tuple/list/dict of tensors, or an ``nn.Module`` (``fn`` then receives the module, e.g.
    ``lambda cell, h, x: cell(x, h)``); ``init_state`` a tensor or a tree of tensors (integer
    leaves are carried, not differentiated). ``.backward()`` and ``torch.autograd.grad`` reach
    every parameter, the initial state and the inputs, exactly once each.

    ``num_ckpts`` counts the states held at once **including the initial state** (Revolve's
    convention): a gradient runs ``fn`` ``seq_len`` times taped and exactly ``t(seq_len,
    num_ckpts)`` times without a graph (:func:`bincheck.plan`), in one reverse sweep.
    ``memory="200MB"`` instead (an int is bytes) plans within bytes: the first gradient measures
    one step and stores the optimal mix of states and taped segments that fits (Gruslys et al.'s
    mixed policy); a budget below one state plus one step's working set raises a ValueError
    naming the minimum, before the forward runs. ``disk=True`` or ``disk="/dir"`` (with
    ``memory``) adds a disk tier for CPU tensors (raw bytes with a CRC32, in a private directory
    removed after the sweep or any error).

    ``output_fn(params, new_state, x) -> y`` gives a per-step output (a loss at every step): it
    runs once per step in the forward and once under the tape when its step is reversed, never
    in recomputations (the last step's forward evaluation is taped and reused); the loop then
    returns ``(final_state, ys)`` with ``ys`` stacked along a new leading axis. If it draws
    random numbers (dropout) with ``preserve_rng_state=True``, recomputations run it too
    (plain), so that ``fn``'s and ``output_fn``'s draws interleave as in the plain loop and every
    replay draws what the forward drew.

    ``preserve_rng_state=True`` stores the RNG state with each checkpoint, so that dropout in
    ``fn`` draws in every recomputation what it drew in the forward, and the caller's random
    stream advances as with the plain loop. ``verify=True`` (a debugging aid) compares every
    recomputed state (and ``output_fn`` result) with its first evaluation and raises
    :class:`~bincheck.NondeterministicStepError` if they differ.

    ``offload=True`` (with ``memory``, for states on a CUDA device) adds a tier of pinned host
    memory instead: ``memory`` is then the device's budget, and snapshots beyond it are copied to
    the host on a side stream and back ahead of their restore (docs: "Host offload").

    ``fn`` must not update its arguments in place (states are kept by reference): an in-place
    update raises a RuntimeError naming the step; the caller's ``init_state`` is never written.
    Under ``no_grad`` / ``inference_mode`` the loop just runs; under ``torch.func`` transforms and
    forward-mode AD it runs as the plain loop (exact, without checkpointing); a backward with
    ``create_graph=True`` recomputes the loop with its whole graph (warned; exact).
    """
    check_callable("fn", fn, "fn(params, state, x) -> new_state")
    exactly_one_budget(num_ckpts, memory)
    if seq_len is not None:
        seq_len = check_positive_int("seq_len", seq_len, " or None (each call's inputs' length)")
    tier = check_offload(offload, memory, disk)
    if memory is not None:
        memory = parse_bytes(memory)
        tier = tier or check_disk(disk, memory)
        return CheckpointedLoop(fn, MemoryBudget(seq_len, memory, tier), verify, output_fn,
                                preserve_rng_state, tier)
    check_disk(disk, memory)
    schedule = Plan(seq_len, num_ckpts) if seq_len is not None else \
        PerLength(check_positive_int("num_ckpts", num_ckpts, NUM_CKPTS_RULE))
    return CheckpointedLoop(fn, schedule, verify, output_fn, preserve_rng_state)


@dataclass(frozen=True)
class PerLength:
    """The schedule of a loop built without ``seq_len``: the binomial plan with ``num_ckpts``
    states for each call's length (``loop.plan`` is the last call's)."""

    num_ckpts: int
    seq_len: None = None

    def __str__(self) -> str:
        return f"binomial plan with {self.num_ckpts} checkpoints for each call's length"

