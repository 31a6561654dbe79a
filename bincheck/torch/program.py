"""How one gradient of any PyTorch forward runs under ``bt.checkpoint``,
``bt.checkpoint_module`` or ``bt.checkpoint_sequential`` (:mod:`.networks`): optimal
checkpointing with no annotation, within ``num_ckpts`` snapshots or ``memory`` bytes.

One gradient:

1. **Record** (the forward): the user's function runs once, as it would without bincheck, under a
   recorder of the aten ops it reaches (:mod:`.trace`); its graph is dropped as it is built, so
   the forward holds no activations. Modules update their buffers, dropout draws and Python
   control flow runs once, by this run.
2. **Plan**: the trace is a chain of stages (runs of ops between the cuts where no value live
   across is written in place later), each priced by its recorded time and the bytes autograd
   saved in it, each cut by its live set; the framework-free
   :class:`~bincheck.schedule.chain.ChainPlan` chooses snapshots, recomputations and taped
   segments. A call with the same op sequence and shapes reuses the plan.
3. **Replay** (the backward of one ``torch.autograd.Function`` whose inputs are every tensor
   requiring grad that the function reached, arguments, parameters and closed-over tensors
   alike): the plan's actions run through the :class:`~bincheck.runtime.Executor` with
   :class:`~.replay.Replay` as the stepper; snapshots are dicts of references to the live
   values; each external's cotangent is returned once.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.utils._pytree import tree_flatten

from ..runtime.executor import Executor
from ..runtime.front import Configured
from ..runtime.stats import ProgramStats
from ..runtime.store import MemoryStore
from ..schedule.actions import Advance, Free, Reverse, Snapshot
from ..schedule.binomial import Plan
from ..schedule.chain import ChainPlan, chain_cost, minimum_memory
from ..schedule.fitted import FittedRevolve
from .costs import chain_of, merged
from .replay import Replay, replaying
from .recorder import Plan0, record
from .trace import Trace

# the share of the budget beyond the trace and the gradients a plan may predict: the model
# (:mod:`.costs`) leaves out the ops' internal scratch beyond BatchNorm's and convolution's and
# autograd's own buffers; measured peaks against budgets and predictions are in
# benchmarks/program/results/budgets.md (at most 0.983 of the budget: ResNet-18 at its least).
# ResNet-18 at checkpoint per block's peak measured 0.999 of its budget at 0.9 once
# (results/quick-at-2b18092.md): the recorder then held a kept tape until the graph died (1 MiB
# at the stem, fixed in e47adb4); at 0.9 since, 0.980
MODEL_SHARE = 0.9
MAX_STAGES = 64             # the planner's stages at most (longer traces are grouped)
# where the groups' least is above the budget, the DP over every stage up to this many (0.2 s
# and 10.5 MB of numpy tables, while planning, at 85 stages)
FULL_DP_STAGES = 96

_last = threading.local()


def last_stats() -> ProgramStats | None:
    """The :class:`~bincheck.ProgramStats` of the last call through :func:`checkpoint` in this
    thread: its forward's, updated as its backward runs (None before any)."""
    return getattr(_last, "stats", None)


class ProgramPlan:
    """The stages (op bounds) and actions of one trace's plan, its predictions, and what a
    forward that expects it does (``plan0``: the snapshots it captures, where it keeps the
    saved tensors)."""

    def __init__(self, bounds: list[int], actions: tuple, peak_bytes: int, seconds: float,
                 plain_stages: int, taped_stages: int) -> None:
        self.bounds, self.actions = bounds, actions
        self.stages = len(bounds) - 1
        self.peak_bytes, self.seconds = peak_bytes, seconds
        self.plain_stages, self.taped_stages = plain_stages, taped_stages
        self.plan0, self.keep_from = None, None
        self.plan_seconds = 0.0                 # how long planning took (once per op sequence)

    def expect(self, trace: Trace) -> None:
        """Work out what the forward captures for this plan: the live set at every cut the
        plan's first advances reach (before its first taped segment), and from which op on it
        keeps autograd's saved tensors (that segment's)."""
        live = trace.live_sets()
        capture: dict[int, tuple] = {}
        for action in self.actions:
            if type(action) is Advance:
                c = self.bounds[action.stop]
                capture[c] = live(c)
            elif type(action) is Reverse:
                c = self.bounds[action.start]
                capture[c] = live(c)
                self.keep_from = c
                break
        capture.pop(0, None)
        sizes = {c: trace.storage_bytes(vs) for c, vs in capture.items()}
        kept = 0
        if self.keep_from is not None:          # what the recorder's pack keeps from there on
            starts, ks = trace.saver_start, trace.saver_ks
            kept = trace.storage_bytes(v for v in range(len(trace.group)) if any(
                k >= self.keep_from - 1 for k in ks[starts[v]:starts[v + 1]]))
        self.plan0 = Plan0(capture, self.keep_from, trace.n, sizes, kept)

    def __repr__(self) -> str:
        return (f"ProgramPlan(stages={self.stages}, peak_bytes={self.peak_bytes}, "
                f"seconds={self.seconds:.4g}, plan_seconds={self.plan_seconds:.3g})")


class _Captured:
    """The stepper of the advances the forward did: each gives the snapshot it captured. (A
    module-level class: one defined in a method is a reference cycle, and would hold the
    captured snapshots until the garbage collector ran.)"""

    __slots__ = ("captured", "bounds")

    def __init__(self, captured: dict, bounds: list[int]) -> None:
        self.captured, self.bounds = captured, bounds

    def advance(self, env: dict, a: int, b: int) -> dict:
        return self.captured[self.bounds[b]]

    def reverse(self, env: dict, a: int, b: int) -> None:
        raise AssertionError("unreachable")


class ProgramCall:
    """One call: its trace and plan from the recording, and the backward's executor, driven by
    autograd asking for saved tensors (:meth:`fetch`)."""

    def __init__(self, program: "CheckpointedFunction") -> None:
        self.program = program
        self.stats = ProgramStats()
        self.trace: Trace | None = None
        self.plan: ProgramPlan | None = None
        self.lock = threading.Lock()
        self.replay: Replay | None = None
        self.executor: Executor | None = None
        self.actions: Iterator | None = None
        self.checked = False

    def record(self, args: tuple, kwargs: dict, plan0: Plan0 | None) -> Any:
        program, stats = self.program, self.stats
        t0 = time.perf_counter()
        tr, out, _, rec = record(program.fn, args, kwargs, program.preserve_rng_state,
                                   self.unpack, plan0, program.verify)
        t1 = time.perf_counter()
        self.trace, self.rec = tr, rec
        stats.ops = stats.plain_ops = tr.n
        stats.record_seconds = stats.plain_seconds = t1 - t0
        stats.trace_bytes = tr.nbytes
        self.rng = tr.has_rng
        self.cuda_devices = sorted({t.device.index or 0 for t in tr.externals
                                    if t.device.type == "cuda"})
        return out

    def start(self, plan: ProgramPlan, expected: bool) -> None:
        """Set up the backward: from the plan's first action, or, where the forward ran the
        plan it expected, from its first taped segment with the snapshots it captured."""
        self.plan = plan
        self.stats.stages = plan.stages
        self.uses = self.trace.saver_counts()
        self.replay = Replay(self.trace, plan.bounds, self.stats)
        self.replay.uses = self.uses
        self.store = MemoryStore(size=self.replay.env_bytes)
        self.executor = Executor(plan.stages, {}, self.store)
        self.actions = iter(plan.actions)
        rec = self.rec
        # a forward that diverged from the plan it expected (it dropped what it captured, and
        # plan0) runs the plan from its start, even where its trace has that plan's key
        if expected and plan.keep_from is not None and rec.plan0 is not None:
            rec.captured[0] = {}
            first = self.executor.run(self.actions, _Captured(rec.captured, plan.bounds),
                                      until=Reverse)
            rec.captured.clear()                # the store holds the snapshots it keeps
            self.replay.materialized = rec.kept     # the forward kept its saved tensors
            self.executor.tracker.apply(first)
            self.executor.live = None
        # the graph's saved-tensor hooks (``rec.pack``) keep the recorder alive as long as the
        # graph: it must hold no tensor now (a call that planned anew held the forward's
        # captures and tape through its own plan's backward: 1.7x its budget)
        rec.captured, rec.kept = {}, {}
        self.rec = None
        self._finish()

    def unpack(self, saved: Any) -> torch.Tensor:
        if not self.checked:                # once per backward: nothing read was changed since
            self.trace.check_versions()
            self.checked = True
        if saved.t is not None:
            return saved.t
        return self.fetch(saved.v)

    def fetch(self, v: int) -> torch.Tensor:
        """The value ``v`` for autograd: from the segment taped last, else from the plan's next
        taped segments (running its actions up to each), else by starting the plan over."""
        if torch.is_grad_enabled():
            raise RuntimeError(
                "bincheck.torch: a checkpointed forward's backward cannot build a graph "
                "(create_graph=True, double backward): its saved tensors are recomputed without "
                "one. Differentiate the plain model for higher derivatives")
        t = self._take(v)
        if t is not None:
            return t
        with self.lock, replaying(self.cuda_devices, self.rng):
            t0 = time.perf_counter()
            try:
                for attempt in range(2):
                    t = self._run_to(v)
                    if t is not None:
                        return t
                    self._restart()
                return self.replay.regenerate(v)
            finally:
                self.stats.library_seconds += time.perf_counter() - t0

    def _run_to(self, v: int) -> torch.Tensor | None:
        self.checked = False                # a later backward checks again
        executor, replay = self.executor, self.replay
        for action in self.actions:
            executor.apply(action, replay)
            if type(action) is Reverse:
                self._finish()
                t = self._take(v)
                if t is not None:
                    return t
        self._finish()
        return None

    def _take(self, v: int) -> torch.Tensor | None:
        """``v`` from the taped segment, dropped there once every node saving it has it."""
        materialized = self.replay.materialized
        t = materialized.get(v)
        if t is not None:
            left = self.uses[v] - 1
            self.uses[v] = left
            if left <= 0:
                del materialized[v]
        return t

    def _restart(self) -> None:
        self.uses = self.replay.uses = self.trace.saver_counts()
        self.store = MemoryStore(size=self.replay.env_bytes)
        self.executor = Executor(self.plan.stages, {}, self.store)
        self.actions = iter(self.plan.actions)
        self.replay.materialized = {}

    def _finish(self) -> None:
        stats = self.stats
        if self.executor.tracker.peak_checkpoints:
            stats.snapshots = max(stats.snapshots, self.executor.tracker.peak_checkpoints)
        stats.snapshot_bytes = max(stats.snapshot_bytes, self.store.peak_nbytes)
        stats.peak_bytes = stats.trace_bytes + max(self.store.peak_nbytes, self.plan.peak_bytes)
        self.program.stats = stats
        _last.stats = stats


class PlanBook:
    """The plans made for one function, by op sequence, and the one its forward expects (the
    last call's); shared by the :func:`bincheck.torch.checkpoint` calls of one function. It holds
    no tensors and no reference to the function."""

    __slots__ = ("plans", "expected", "lock")

    def __init__(self) -> None:
        self.plans: dict = {}
        self.expected: ProgramPlan | None = None
        self.lock = threading.Lock()


class CheckpointedFunction(Configured):
    """``f(*args, **kwargs)`` returns ``fn(*args, **kwargs)``, differentiated within
    ``num_ckpts`` snapshots or ``memory`` bytes; see :func:`checkpoint`."""

    _published = ("stats", "last_plan")

    def __init__(self, fn: Callable, num_ckpts: int | None, memory: int | None, verify: bool,
                 preserve_rng_state: bool, book: "PlanBook | None" = None) -> None:
        self.fn, self.num_ckpts, self.memory = fn, num_ckpts, memory
        self.verify, self.preserve_rng_state = verify, preserve_rng_state
        self.book = PlanBook() if book is None else book
        self._freeze()
        self.stats = ProgramStats()
        self.last_plan: ProgramPlan | None = None

    def __repr__(self) -> str:
        name = getattr(self.fn, "__name__", repr(self.fn))
        budget = f"num_ckpts={self.num_ckpts}" if self.memory is None else \
            f"memory={self.memory}"
        return f"CheckpointedFunction({name}, {budget})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
            return self.fn(*args, **kwargs)
        call = ProgramCall(self)
        book = self.book
        expected = book.expected
        out = call.record(args, kwargs, expected.plan0 if expected is not None else None)
        tr = call.trace
        if not any(isinstance(o, torch.Tensor) for o in tree_flatten(out)[0]):
            raise ValueError(f"bincheck.torch: the checkpointed function must return a tensor "
                             f"or a structure holding tensors; it returned {type(out).__name__}")
        if tr.n == 0:                   # no op: nothing to checkpoint (its output is an input)
            call.rec = None
            return out
        t0 = time.perf_counter()
        plan = self.plan_for(tr)
        call.stats.plan_seconds = time.perf_counter() - t0
        call.start(plan, plan is expected)
        book.expected = self.last_plan = plan
        return out

    def plan_for(self, tr: Trace) -> ProgramPlan:
        key = (tr.signature, tr.n)
        book = self.book
        plan = book.plans.get(key)
        if plan is None:
            t0 = time.perf_counter()
            plan = self._plan(tr)
            plan.expect(tr)
            plan.plan_seconds = time.perf_counter() - t0
            with book.lock:
                if len(book.plans) > 64:
                    book.plans.clear()
                book.plans[key] = plan
        return plan

    def _plan(self, tr: Trace) -> ProgramPlan:
        bounds = [int(c) for c in np.flatnonzero(tr.cuttable())]
        if self.memory is not None:
            bounds = merged(tr, bounds)
        chain = chain_of(tr, bounds, 0)
        # the gradients of what the function differentiates: in ``adj`` (exact bytes)
        grads = sum(t.numel() * t.element_size() for t, g in zip(tr.externals, tr.ext_grad)
                    if g)
        stages = len(bounds) - 1
        if self.memory is None:
            if self.num_ckpts > stages:         # a snapshot per cut: store-all does better
                actions = (Snapshot(0), Reverse(0, stages), Free(0))
                cost = chain_cost(chain, iter(actions))
                return ProgramPlan(bounds, actions, cost.peak_bytes, cost.seconds, 0, stages)
            cp = ChainPlan(chain, num_ckpts=self.num_ckpts)
        else:
            # the share applies to what the model estimates; the gradients' bytes are exact
            free = grads + int((self.memory - tr.nbytes - grads) * MODEL_SHARE)
            least = minimum_memory(chain)
            need = grads + math.ceil((least - grads) / MODEL_SHARE) + tr.nbytes + 1
            if self.memory < need:
                raise ValueError(
                    f"memory={self.memory} bytes is below the least this function needs "
                    f"({need} bytes: its trace, {tr.nbytes} bytes, its largest live set and "
                    f"stage taped alone, and the gradients of what it differentiates, "
                    f"{grads} bytes); pass memory={need} or more")
            # two candidates priced by the same model (chain_cost), the least predicted time
            # (the DP's on a tie) wins: the DP over a few dozen groups (refused where a group's
            # tape does not fit: an RNN of 1000 steps in 64 groups tapes 16 steps at once) and
            # Revolve over many groups with the snapshots the budget fits (on that RNN the DP
            # fitted or not as the recorded times placed its groups: 1.2x or 1.5x
            # binomial_checkpoint's time, where Revolve over the stages was the fallback)
            found = []
            try:
                # the groups' least can be above a budget the stages' is not: a GPT's head
                # grouped with what comes before it, 30.3 MiB against 24.5, left Revolve over
                # the stages (3.3 s predicted, 11.6x checkpoint per block's time at its peak)
                found.append(ChainPlan(chain, memory=free, max_stages=MAX_STAGES,
                                       finer_stages=FULL_DP_STAGES))
            except ValueError:
                pass
            if stages > MAX_STAGES:             # else the DP's plan is optimal for the model
                found += [p for p in [FittedRevolve.best(chain, free)] if p is not None]
            if not found:
                # Revolve over the stages, each snapshot beyond the first costing at most the
                # largest live set above what one snapshot needs (which is ``least``)
                big = max(int(chain.cuts.max()), 1)
                slots = min(stages, 1 + max(0, free - least) // big)
                plan = Plan(stages, slots)
                seconds = plan.plain_steps * float(chain.plain.mean()) + float(chain.taped.sum())
                return ProgramPlan(bounds, tuple(plan), least + (slots - 1) * big, seconds,
                                   plan.plain_steps, stages)
            cp = min(found, key=lambda p: p.seconds)
        cp.release()
        return ProgramPlan(bounds, tuple(cp), int(cp.peak_bytes), float(cp.seconds),
                           cp.plain_stages, cp.taped_stages)

    def preview(self, *args: Any, **kwargs: Any) -> ProgramPlan:
        """Record ``fn(*args, **kwargs)`` once and return the plan a gradient would use
        (``peak_bytes`` and ``seconds`` predicted). Buffers the function writes and the
        caller's RNG stream are left as they were."""
        call = ProgramCall(self)
        devices = sorted({a.device.index or 0 for a in tree_flatten((args, kwargs))[0]
                          if isinstance(a, torch.Tensor) and a.device.type == "cuda"})
        with torch.random.fork_rng(devices=devices), torch.enable_grad():
            call.record(args, kwargs, None)
        call.trace.restore_written()
        return self.plan_for(call.trace)
