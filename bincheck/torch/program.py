"""How one gradient of any PyTorch forward runs under ``bt.checkpoint``,
``bt.checkpoint_module`` or ``bt.checkpoint_sequential`` (:mod:`.networks`): optimal
checkpointing with no annotation, within ``num_ckpts`` snapshots or ``memory`` bytes.

1. **Record** (the forward): the user's function runs once, as it would without bincheck, under a
   recorder of the aten ops it reaches (:mod:`.recorder`). Autograd builds its own graph, but
   each tensor it saves is replaced by a handle. Buffers update, dropout draws and Python control
   flow runs once, by this run.
2. **Plan**: the trace is a chain of stages (runs of ops between cuts), each priced by its
   recorded time and bytes (:mod:`.costs`); the framework-free
   :class:`~bincheck.schedule.chain.ChainPlan` chooses snapshots, recomputations and taped
   segments. A call with the same op sequence and shapes reuses the plan, and its forward takes
   the plan's first snapshots and tape as it runs (:mod:`.plans`).
3. **Replay** (the backward is autograd's own): each handle autograd unpacks runs the plan's
   actions up to the taped segment that holds it, through the :class:`~bincheck.runtime.Executor`
   with :class:`~.replay.Replay` as the stepper.
"""

from __future__ import annotations

import math
import threading
import weakref
import time
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.utils._pytree import tree_flatten

from ..runtime.executor import Executor
from ..runtime.front import Configured
from ..runtime.stats import ProgramStats
from ..runtime.store import MemoryStore
from ..schedule.actions import Free, Reverse, Snapshot
from ..schedule.binomial import Plan
from ..schedule.chain import ChainPlan, chain_cost, minimum_memory
from ..schedule.fitted import FittedRevolve
from .costs import chain_of, merged
from .replay import Replay, replaying
from .plans import ProgramPlan, _Captured
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
        self.checked = self.from_forward = False
        self.results: list = []
        self.held: list = []

    def record(self, args: tuple, kwargs: dict, plan0: Plan0 | None) -> Any:
        program, stats = self.program, self.stats
        t0 = time.perf_counter()
        tr, out, ids, rec = record(program.fn, args, kwargs, program.preserve_rng_state,
                                   self.unpack, plan0, program.verify)
        t1 = time.perf_counter()
        # the results the caller gets, as the forward left them (it may write into them)
        self.results = [(weakref.ref(o), o._version, v) for o, v in
                        zip(tree_flatten(out)[0], ids) if v is not None and v >= 0]
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
        # detached aliases of what the forward took (sharing version counters with the caller's):
        # a tensor's ``grad_fn`` holds the graph, whose hooks hold this call: a cycle gc cannot
        # see (a graph dropped unused leaked them all)
        rec.captured = {c: {v: t.detach() for v, t in snap.items()}
                        for c, snap in rec.captured.items()}
        rec.kept = {v: t.detach() for v, t in rec.kept.items()}
        # a forward that diverged from the plan it expected (it dropped what it captured, and
        # plan0) runs the plan from its start, even where its trace has that plan's key
        if expected and plan.keep_from is not None and rec.plan0 is not None:
            rec.captured[0] = {}
            first = self.executor.run(self.actions, _Captured(rec.captured, plan.bounds),
                                      until=Reverse)
            self.held = [(weakref.ref(t), t._version, saved) for saved, ts in (
                (False, [t for snap in rec.captured.values() for t in snap.values()]),
                (True, list(rec.kept.values()))) for t in ts]
            rec.captured.clear()                # the store holds the snapshots it keeps
            self.replay.materialized = rec.kept     # the forward kept its saved tensors
            self.executor.tracker.apply(first)
            self.executor.live = None
            self.from_forward = True
        # the graph's saved-tensor hooks (``rec.pack``) keep the recorder alive as long as the
        # graph: it must hold no tensor now (a call that planned anew held the forward's
        # captures and tape through its own plan's backward: 1.7x its budget)
        rec.captured, rec.kept = {}, {}
        self.rec = None
        self._finish()

    def unpack(self, saved: Any) -> torch.Tensor:
        if self.trace is None:              # a backward inside the forward being recorded
            if saved.t is not None:
                return saved.t
            raise NotImplementedError(
                "bincheck.torch: the checkpointed function differentiates part of itself "
                "(torch.autograd.grad or .backward() inside it, such as a gradient penalty): "
                "the recording replaces what autograd saves, so that inner backward cannot "
                "run; compute it outside the checkpointed function")
        if not self.checked:                # once per backward: nothing read was changed since
            self.trace.check_versions()
            self._check_results()
            self.checked = True
        if saved.t is not None:
            return saved.t
        return self.fetch(saved.v)

    def _check_results(self) -> None:
        """A result the caller wrote into since the forward is refused where autograd saved it
        (as autograd refuses); a write through any alias of the snapshots and tape the forward
        took (a result's too) starts the plan over, from the inputs."""
        for i, (ref, version, v) in enumerate(self.results):
            t = ref()
            if t is not None and t._version != version and \
                    self.trace.saved[self.trace.group[v]]:
                raise RuntimeError(
                    f"one of the variables needed for gradient computation has been modified "
                    f"by an inplace operation: result {i} of the checkpointed function (or a "
                    f"view of its storage), {list(t.shape)}, is at version {t._version}; "
                    f"expected version {version} instead (bincheck.torch)")
        for ref, version, saved in self.held if self.from_forward else ():
            t = ref()               # the forward's snapshots and tape, written through an alias
            if t is not None and t._version != version:
                if saved:
                    raise RuntimeError(
                        "one of the variables needed for gradient computation has been "
                        f"modified by an inplace operation: a tensor of {list(t.shape)} the "
                        "checkpointed function made and autograd saved (bincheck.torch)")
                self._restart()
                return

    def fetch(self, v: int) -> torch.Tensor:
        """The value ``v`` for autograd: from the segment taped last, else from the plan's next
        taped segments (running its actions up to each), else by starting the plan over."""
        if torch.is_grad_enabled():
            raise RuntimeError(
                "bincheck.torch: a checkpointed forward's saved tensors are recomputed without a "
                "graph, so its backward cannot build one (create_graph=True, double backward): "
                "differentiate the plain model for higher derivatives. (Reading a saved tensor "
                "outside a backward, ``grad_fn._saved_...``, works under torch.no_grad())")
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
        self.from_forward = False
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

    def __reduce__(self) -> tuple:
        """A copy (``copy.deepcopy``, ``torch.save`` of a module) starts with no plans: it
        plans at its first call, as the original did."""
        return PlanBook, ()


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
        try:
            plan = self.plan_for(tr)
        except Exception:                   # a refused budget: as if the call had not run
            tr.restore_written()
            tr.rewind_rng()
            call.rec.captured, call.rec.kept = {}, {}       # (no cycle: see ``start``)
            raise
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
