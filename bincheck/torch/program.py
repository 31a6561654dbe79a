"""``bt.checkpoint``, ``bt.checkpoint_module``, ``bt.checkpoint_sequential``: optimal
checkpointing of any PyTorch forward, with no annotation, within ``num_ckpts`` snapshots or
``memory`` bytes.

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

import threading
import time
from typing import Any, Callable, Iterable

import numpy as np
import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..runtime.executor import Executor
from ..runtime.front import Configured
from ..runtime.stats import ProgramStats
from ..runtime.store import MemoryStore
from ..schedule.budget import parse_bytes
from ..schedule.chain import Chain, ChainPlan, minimum_memory
from ..schedule.validate import (NUM_CKPTS_RULE, check_bool, check_callable,
                                 check_positive_int, exactly_one_budget)
from .replay import Replay, env_nbytes, fingerprint, replaying
from .trace import Trace, record

# what a taped op costs beside three times its plain time (autograd's node, the replay's Python)
TAPED_OVERHEAD_S = 2e-5
# what a snapshot and the sweep hold beside the tensors' bytes (dicts, the executor's tables)
SNAPSHOT_OVERHEAD_B = 512
SWEEP_OVERHEAD_B = 16 * 1024

_last = threading.local()


def last_stats() -> ProgramStats | None:
    """The :class:`~bincheck.ProgramStats` of the last backward through :func:`checkpoint` in
    this thread (None before any)."""
    return getattr(_last, "stats", None)


class ProgramPlan:
    """The stages (op bounds) and actions of one trace's plan, and its predictions."""

    def __init__(self, bounds: list[int], actions: Any, peak_bytes: int, seconds: float,
                 plain_stages: int, taped_stages: int) -> None:
        self.bounds, self.actions = bounds, actions
        self.stages = len(bounds) - 1
        self.peak_bytes, self.seconds = peak_bytes, seconds
        self.plain_stages, self.taped_stages = plain_stages, taped_stages

    def __repr__(self) -> str:
        return (f"ProgramPlan(stages={self.stages}, peak_bytes={self.peak_bytes}, "
                f"seconds={self.seconds:.4g})")


class ProgramCall:
    """One call: its trace, plan and stats, from the recording to every backward."""

    def __init__(self, program: "CheckpointedFunction") -> None:
        self.program = program
        self.stats = ProgramStats()
        self.trace: Trace | None = None
        self.plan: ProgramPlan | None = None

    def record(self, args: tuple, kwargs: dict) -> Any:
        program, stats = self.program, self.stats
        t0 = time.perf_counter()
        tr, out, ids = record(program.fn, args, kwargs, program.preserve_rng_state)
        t1 = time.perf_counter()
        self.trace, self.ids = tr, ids
        stats.ops = stats.plain_ops = tr.n
        stats.record_seconds = stats.plain_seconds = t1 - t0
        self.prints = None
        if program.verify:
            self.prints = {}
        stats.trace_bytes = tr.nbytes
        return out

    def make_plan(self) -> ProgramPlan:
        t0 = time.perf_counter()
        self.plan = self.program.plan_for(self.trace)
        self.stats.stages = self.plan.stages
        self.stats.plan_seconds = time.perf_counter() - t0
        return self.plan

    def backward(self, grads: tuple) -> tuple:
        t0 = time.perf_counter()
        tr, stats, plan = self.trace, self.stats, self.plan
        replay = Replay(tr, plan.bounds, set(self.wanted), stats, self.prints)
        for v, g in zip(self.out_vids, grads):
            if g is not None:
                replay.ct[v] = g if v not in replay.ct else replay.ct[v] + g
        store = MemoryStore(size=env_nbytes)
        executor = Executor(plan.stages, {}, store)
        with replaying(self.cuda_devices, any(op.rng is not None for op in tr.ops)):
            executor.run(iter(plan.actions), replay)
        executor.tracker.finish()
        stats.snapshots = executor.tracker.peak_checkpoints
        stats.snapshot_bytes = store.peak_nbytes
        stats.peak_bytes = stats.trace_bytes + max(store.peak_nbytes, plan.peak_bytes)
        stats.library_seconds += time.perf_counter() - t0
        self.program.stats = stats
        _last.stats = stats
        return tuple(replay.ext_ct.get(e) for e in self.wanted)


class _ProgramFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, call: ProgramCall, *tensors: torch.Tensor) -> tuple:
        ctx.call = call
        outs = call.results
        call.results = None
        return outs

    @staticmethod
    def backward(ctx, *grads: torch.Tensor) -> tuple:
        if torch.is_grad_enabled():
            raise RuntimeError(
                "bincheck.torch: a checkpointed forward's backward cannot build a graph "
                "(create_graph=True, double backward): its replays run on detached snapshots. "
                "Differentiate the plain model for higher derivatives")
        return (None,) + ctx.call.backward(grads)


class CheckpointedFunction(Configured):
    """``f(*args, **kwargs)`` returns ``fn(*args, **kwargs)``, differentiated within
    ``num_ckpts`` snapshots or ``memory`` bytes; see :func:`checkpoint`."""

    _published = ("stats",)

    def __init__(self, fn: Callable, num_ckpts: int | None, memory: int | None, verify: bool,
                 preserve_rng_state: bool) -> None:
        self.fn, self.num_ckpts, self.memory = fn, num_ckpts, memory
        self.verify, self.preserve_rng_state = verify, preserve_rng_state
        self._plans: dict = {}
        self._lock = threading.Lock()
        self._freeze()
        self.stats = ProgramStats()

    def __repr__(self) -> str:
        name = getattr(self.fn, "__name__", repr(self.fn))
        budget = f"num_ckpts={self.num_ckpts}" if self.memory is None else \
            f"memory={self.memory}"
        return f"CheckpointedFunction({name}, {budget})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
            return self.fn(*args, **kwargs)
        call = ProgramCall(self)
        out = call.record(args, kwargs)
        tr = call.trace
        leaves, spec = tree_flatten(out)
        if not any(isinstance(o, torch.Tensor) for o in leaves):
            raise ValueError(f"bincheck.torch: the checkpointed function must return a tensor "
                             f"or a structure holding tensors; it returned {type(out).__name__}")
        # the tensors gradients flow to: every external requiring grad the function read
        wanted = [e for e, g in enumerate(tr.ext_grad) if g]
        for e in wanted:
            if tr.ext_written[e]:
                raise NotImplementedError(
                    "bincheck.torch: the checkpointed function writes in place into a tensor "
                    "that requires grad and that it did not create; write out of place")
        outs = [(i, v) for i, (o, v) in enumerate(zip(leaves, call.ids))
                if v is not None and v >= 0 and tr.diff[v] and o.requires_grad]
        if not wanted or not outs:
            return out                      # nothing differentiable: the plain result
        call.make_plan()
        if self.verify:
            call.prints = verify_prints(self, call)
        call.wanted = wanted
        call.cuda_devices = sorted({t.device.index or 0 for t in tr.externals
                                    if t.device.type == "cuda"})
        unique: dict[int, torch.Tensor] = {}
        for i, v in outs:
            if v not in unique:
                unique[v] = leaves[i].detach()
        call.out_vids = list(unique)
        call.results = tuple(unique.values())
        del out
        results = _ProgramFunction.apply(call, *(tr.externals[e] for e in wanted))
        if not isinstance(results, tuple):
            results = (results,)
        by_vid = dict(zip(call.out_vids, results))
        for i, v in outs:
            leaves[i] = by_vid[v]
        for i, (o, v) in enumerate(zip(leaves, call.ids)):
            if isinstance(o, torch.Tensor) and o.grad_fn is not None and \
                    o.grad_fn.__class__.__name__ != "_ProgramFunctionBackward":
                leaves[i] = o.detach()      # a recorded tensor that needs no gradient
        return tree_unflatten(leaves, spec)

    def plan_for(self, tr: Trace) -> ProgramPlan:
        key = (tr.signature, tr.n)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan(tr)
            with self._lock:
                if len(self._plans) > 64:
                    self._plans.clear()
                self._plans[key] = plan
        return plan

    def _plan(self, tr: Trace) -> ProgramPlan:
        ok = tr.cuttable()
        bounds = [int(c) for c in np.flatnonzero(ok)]
        cuts = tr.cut_bytes()[bounds]
        seconds = np.add.reduceat(np.asarray(tr.seconds), bounds[:-1])
        counts = np.diff(bounds)
        saved = np.add.reduceat(np.asarray(tr.tape, dtype=np.int64), bounds[:-1])
        out_bytes = np.asarray(tr.out_bytes, dtype=np.int64)
        biggest = np.maximum.reduceat(out_bytes, bounds[:-1])
        grads = sum(t.untyped_storage().nbytes() for t, g in zip(tr.externals, tr.ext_grad)
                    if g)
        work = 2 * int(cuts.max()) + int(out_bytes.max()) + grads + SWEEP_OVERHEAD_B
        chain = Chain(seconds, 3.0 * seconds + TAPED_OVERHEAD_S * counts, saved + biggest,
                      cuts + SNAPSHOT_OVERHEAD_B, work)
        if self.memory is None:
            cp = ChainPlan(chain, num_ckpts=self.num_ckpts)
        else:
            need = minimum_memory(chain) + tr.nbytes
            if self.memory < need:
                raise ValueError(
                    f"memory={self.memory} bytes is below the least this function needs "
                    f"({need} bytes: its trace, {tr.nbytes} bytes, its largest live set and "
                    f"stage taped alone, and the gradients of what it differentiates); pass "
                    f"memory={need} or more")
            cp = ChainPlan(chain, memory=self.memory - tr.nbytes)
        cp.release()
        return ProgramPlan(bounds, cp, int(cp.peak_bytes), float(cp.seconds), cp.plain_stages,
                           cp.taped_stages)

    def preview(self, *args: Any, **kwargs: Any) -> ProgramPlan:
        """Record ``fn(*args, **kwargs)`` once and return the plan a gradient would use
        (``peak_bytes`` and ``seconds`` predicted). Buffers the function writes and the
        caller's RNG stream are left as they were."""
        call = ProgramCall(self)
        devices = sorted({a.device.index or 0 for a in tree_flatten((args, kwargs))[0]
                          if isinstance(a, torch.Tensor) and a.device.type == "cuda"})
        with torch.random.fork_rng(devices=devices), torch.enable_grad():
            call.record(args, kwargs)
        call.trace.restore_written()
        return call.make_plan()


def verify_prints(program: CheckpointedFunction, call: ProgramCall) -> dict:
    """Fingerprints of every recorded value, from one plain replay of the trace (the recorded
    forward's tensors are gone): ``verify=True`` compares each later replay with it."""
    tr = call.trace
    prints: dict = {}
    env: dict = {}
    ext = tr.externals
    get = lambda v: env[v] if v >= 0 else ext[-1 - v]  # noqa: E731
    replay = Replay(tr, [0, tr.n], set(), ProgramStats())
    with torch.no_grad(), replaying([], any(op.rng is not None for op in tr.ops)):
        for k, op in enumerate(tr.ops):
            results = replay.run(op, get, k)
            for v, r in zip(replay.made[k], results):
                prints[v] = fingerprint(r)
                env[v] = r
            for v in replay.dies[k]:
                env.pop(v, None)
    return prints


def _configure(fn: Callable, num_ckpts: Any, memory: Any, verify: Any,
               preserve_rng_state: Any) -> CheckpointedFunction:
    exactly_one_budget(num_ckpts, memory)
    if memory is not None:
        memory = parse_bytes(memory)
    else:
        num_ckpts = check_positive_int("num_ckpts", num_ckpts, NUM_CKPTS_RULE)
    return CheckpointedFunction(fn, num_ckpts, memory, check_bool("verify", verify),
                                check_bool("preserve_rng_state", preserve_rng_state))


def checkpoint_function(fn: Callable, num_ckpts: int | None = None, *,
                        memory: int | str | None = None, verify: bool = False,
                        preserve_rng_state: bool = True) -> CheckpointedFunction:
    """``f = checkpoint_function(fn, memory="200MB")``: ``f(*args, **kwargs)`` is
    ``fn(*args, **kwargs)``, its gradient planned over the whole forward; ``f.stats`` describes
    the last backward and ``f.preview(*args)`` the plan. Plans are reused across calls with the
    same op sequence and shapes."""
    check_callable("fn", fn, "fn(*args, **kwargs) -> tensors")
    return _configure(fn, num_ckpts, memory, verify, preserve_rng_state)


_cache: "dict[tuple, CheckpointedFunction]" = {}
_cache_lock = threading.Lock()


def checkpoint(function: Callable, *args: Any, num_ckpts: int | None = None,
               memory: int | str | None = None, verify: bool = False,
               preserve_rng_state: bool = True, use_reentrant: bool | None = None,
               **kwargs: Any) -> Any:
    """A drop-in for ``torch.utils.checkpoint.checkpoint(function, *args,
    use_reentrant=False, **kwargs)``, planned over the whole forward of ``function`` within
    ``num_ckpts`` snapshots or ``memory`` bytes (exactly one), with as many recomputations as
    pay. Other keyword arguments go to ``function``. The stats of the last backward in this
    thread: :func:`last_stats`."""
    check_callable("function", function, "function(*args, **kwargs) -> tensors")
    if use_reentrant:
        raise ValueError("bincheck.torch.checkpoint has no reentrant variant: pass "
                         "use_reentrant=False or leave it out")
    f = _configure(function, num_ckpts, memory, verify, preserve_rng_state)
    key = (function, f.num_ckpts, f.memory, f.verify, f.preserve_rng_state)
    try:
        with _cache_lock:
            f = _cache.setdefault(key, f)
            if len(_cache) > 256:
                _cache.clear()
    except TypeError:                        # an unhashable callable: no plan reuse
        pass
    return f(*args, **kwargs)


class CheckpointedModule(nn.Module):
    """``net(x) == model(x)``, its backward planned by bincheck; see
    :func:`checkpoint_module`. Shares the model's parameters, buffers and submodules (the same
    objects, the same ``state_dict`` keys)."""

    def __init__(self, model: nn.Module, program: CheckpointedFunction) -> None:
        super().__init__()
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "program", program)
        # the model's own dicts, shared: parameters(), state_dict(), to(), load_state_dict()
        # act on the model's tensors under the model's names
        self._parameters = model._parameters
        self._buffers = model._buffers
        self._modules = model._modules
        self._non_persistent_buffers_set = model._non_persistent_buffers_set
        self.training = model.training

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.program(*args, **kwargs)

    def train(self, mode: bool = True) -> "CheckpointedModule":
        self.model.train(mode)
        self.training = mode
        return self

    @property
    def stats(self) -> ProgramStats:
        return self.program.stats

    def preview(self, *args: Any, **kwargs: Any) -> ProgramPlan:
        return self.program.preview(*args, **kwargs)

    def __repr__(self) -> str:
        return f"CheckpointedModule({self.model!r})"


def checkpoint_module(model: nn.Module, num_ckpts: int | None = None, *,
                      memory: int | str | None = None, verify: bool = False,
                      preserve_rng_state: bool = True) -> CheckpointedModule:
    """``net = checkpoint_module(model, memory="200MB")``: a module whose forward is
    ``model``'s and whose backward holds at most ``num_ckpts`` snapshots or ``memory`` bytes.
    ``net.parameters()`` are ``model``'s, ``net.state_dict()`` has ``model``'s keys,
    ``net.train()``/``net.eval()`` reach ``model``; ``net.stats`` describes the last backward,
    ``net.preview(x)`` the plan for ``x``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    program = _configure(model, num_ckpts, memory, verify, preserve_rng_state)
    return CheckpointedModule(model, program)


def checkpoint_sequential(functions: Iterable[Callable] | nn.Sequential, input: Any,
                          num_ckpts: int | None = None, *, memory: int | str | None = None,
                          verify: bool = False, preserve_rng_state: bool = True) -> Any:
    """``torch.utils.checkpoint.checkpoint_sequential(functions, segments, input)`` with
    ``segments`` replaced by a budget: ``functions`` run in order on ``input``, planned over
    their ops' measured costs and sizes."""
    fs = list(functions.children()) if isinstance(functions, nn.Sequential) else \
        list(functions)
    for i, f in enumerate(fs):
        check_callable(f"functions[{i}]", f, "f(x) -> x")

    def run(x: Any) -> Any:
        for f in fs:
            x = f(x)
        return x
    run.__name__ = "sequential"
    return _configure(run, num_ckpts, memory, verify, preserve_rng_state)(input)
