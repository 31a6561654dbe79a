"""One loop call as one ``torch.autograd.Function``: the first sweep in ``forward``, the rest of
the schedule in ``backward``.

``forward`` (grad mode off, as torch runs it) runs the schedule up to its first ``Reverse`` with
plain steps, keeping the snapshots the schedule asks for, and tapes the last segment, which the
backward reverses first. ``backward`` replays the remaining actions through a
:class:`~.sweep.Sweep` and returns the cotangent of every input leaf from that one sweep.

Two torch situations need more than the schedule:

* ``retain_graph=True`` (a second backward over the same graph; ``gradcheck``, ``jacobian``): a
  schedule is consumed as it runs. When torch says the graph is kept, the sweep replays the whole
  schedule from the initial state with a fresh store, leaving the forward's snapshots and tape for
  the next backward (``torch._C._autograd._get_current_graph_task_keep_graph``; where a torch
  build lacks it, every backward takes that path: always correct, costlier).
* ``create_graph=True`` (double backward, Hessian-vector products): the cotangents must be
  differentiable, which snapshots taken without a graph cannot give. The backward then recomputes
  the loop with its whole graph (store-all) from the saved inputs and differentiates it with
  ``create_graph=True``, with a warning: correct, without the memory saving.
"""

from __future__ import annotations

import contextlib
import itertools
import time
import warnings
from typing import Any, Iterator

import torch

from ..runtime.executor import Executor
from ..runtime.stats import LoopStats
from ..schedule.actions import Reverse
from ..schedule.simulate import ScheduleError
from .boundary import Args, aliases, differentiable
from .context import Ambient
from .offload import HostTier, open_tier
from .store import Buffers, Rng, TorchStore
from .steps import Outputs, Steps
from .sweep import Sweep

_keep_graph = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)


def graph_kept() -> bool:
    """Whether the running backward keeps its graph (``retain_graph=True``)."""
    return True if _keep_graph is None else bool(_keep_graph())


class Call:
    """Everything one call of a loop needs, from its forward to its backward."""

    def __init__(self, loop: Any, args: Args) -> None:
        self.loop, self.args = loop, args
        self.stats = LoopStats()
        self.ys = Outputs() if loop.output_fn is not None else None
        self.steps = Steps(loop.fn, loop.output_fn, args, self.stats, self.ys, loop.verify,
                           loop.label)
        self.ambient = Ambient(args.leaves, loop.preserve_rng_state)
        self.rng = Rng(self.ambient.devices) if loop.preserve_rng_state else None
        self.steps.rng = self.rng
        self.buffers = Buffers.of(args.module) if args.module is not None else None
        self.pending: tuple | None = None
        self.live_ambient: tuple | None = None
        self.schedule: Any = None
        self.n = args.seq_len

    # ---------------------------------------------------------------------------- forward
    def forward(self, needs: tuple, leaves: tuple) -> list:
        t0 = time.perf_counter()
        args, steps = self.args, self.steps
        n_p, n_s = len(args.p), len(args.s)
        self.needs = needs
        self.p_want = [bool(w) and differentiable(v) for w, v in zip(needs[:n_p], args.p)]
        self.s_needs = list(needs[n_p:n_p + n_s])
        self.x_needs = list(needs[n_p + n_s:])
        steps.x_want = [k for k, w in enumerate(self.x_needs) if w and differentiable(args.x[k])]
        steps.aliases = aliases(args.p, self.p_want)
        self.rng0 = None if self.rng is None else self.rng.get()
        # the module's buffers as the loop found them (a retained graph's replays start there)
        self.buf0 = None if self.buffers is None else self.buffers.get()
        # The caller's tensors are never written: state 0 is a copy (one state's bytes).
        self.state0 = args.state([v.detach().clone() for v in args.s])
        self.schedule = self.loop.schedule_for(self)
        self.disk = self.loop.disk_for(self.schedule)
        executor, actions, seg, outs = self.first_sweep(self.new_store())
        if self.rng is not None:
            self.rng.settle(self.rng0)
        self.pending = (executor, actions, seg)
        self.stats.library_seconds += time.perf_counter() - t0
        return outs

    def new_store(self) -> TorchStore:
        return TorchStore(open_tier(self.disk, self.state0), self.rng, self.buffers)

    def first_sweep(self, store: TorchStore) -> tuple:
        """Run the schedule to its first Reverse and tape that segment: (executor, the rest of
        the actions, the taped segment, the forward's output leaves)."""
        executor = Executor(self.n, self.state0, store)
        try:
            actions = self.loop.action_cache.actions(self.schedule)
            first = executor.run(actions, self.steps, until=Reverse)
            if first is None:
                raise ScheduleError(f"the schedule {self.schedule!r} yielded no Reverse action")
            if first.start != executor.tracker.live_index or first.stop != self.n:
                executor.tracker.apply(first)           # raises the tracker's ScheduleError
            seg = self.steps.tape(executor.live, first.start, self.n,
                                  first.start > 0 or any(self.s_needs))
        except BaseException:
            close(store)
            raise
        outs = [v.detach() for v in seg.outs] + (self.ys.stacked() if self.ys else [])
        return executor, itertools.chain((first,), actions), seg, outs

    # ---------------------------------------------------------------------------- backward
    def backward(self, grads: tuple) -> list:
        t0 = time.perf_counter()
        n_s = len(self.args.s)
        adjoint = list(grads[:n_s])
        g_ys = list(grads[n_s:]) or None
        if g_ys is not None and all(g is None for g in g_ys):
            g_ys = None
        keep = graph_kept()
        with self.ambient.reentered(), self.buffers_kept():
            if keep:
                # A later backward needs the forward's snapshots and tape: replay all from state 0.
                if self.rng0 is not None:
                    Rng.set(self.rng0, self.rng.devices)
                if self.buf0 is not None:
                    self.buffers.set(self.buf0)
                executor = Executor(self.n, self.state0, self.new_store())
                actions, pretaped = self.replay_schedule(), None
            else:
                if self.pending is None:
                    raise RuntimeError("bincheck: this loop call's backward already ran; pass "
                                       "retain_graph=True to the first backward to run another")
                (executor, actions, pretaped), self.pending = self.pending, None
                if executor.live is not None and self.live_ambient is not None:
                    # a live state held from the forward: steps from it draw and update as
                    # the forward's did (see WhileCall.first_sweep)
                    executor.store.set_ambient(self.live_ambient)
            store = executor.store
            sizes = getattr(self.schedule, "sizes", None)
            sweep = Sweep(self.steps, adjoint, g_ys, pretaped, any(self.s_needs),
                          [a for a, w in zip(self.steps.aliases, self.p_want) if w], store,
                          (sizes.tape_bytes or 0) if sizes is not None else 0)
            pretaped = None          # the sweep holds the forward's segment until it reverses it
            try:
                sweep.run(executor, actions)
                executor.tracker.finish()
            finally:
                close(store)
        stats = self.stats
        stats.peak_snapshots = max(stats.peak_snapshots, executor.tracker.peak_checkpoints)
        held = max(store.peak_nbytes, sweep.peak_held)
        if sizes is not None:               # the working set counts one RNG state already
            held -= min(store.working_rng_bytes, held)
        stats.peak_bytes = max(stats.peak_bytes,
                               held + (sizes.work_bytes if sizes is not None else 0))
        if isinstance(store.disk, HostTier):
            stats.add_offload(store.disk)
        elif store.disk is not None:
            stats.add_disk(store.disk)
        stats.library_seconds += time.perf_counter() - t0
        stats.num_steps = self.n
        self.loop.stats = stats
        return sweep.cotangents(self.steps, self.p_want, self.s_needs, self.x_needs)

    def replay_schedule(self) -> Any:
        return self.schedule

    @contextlib.contextmanager
    def buffers_kept(self) -> Iterator[None]:
        """Recomputations run on copies of the module's buffers (restored with the snapshots);
        the module's own buffer tensors, as the forward left them, are put back on exit."""
        if self.buffers is None:
            yield
            return
        objects = self.buffers.objects()
        try:
            yield
        finally:
            self.buffers.install(objects)

    def backward_differentiable(self, grads: tuple, saved: tuple) -> list:
        """``create_graph=True``: differentiate the loop recomputed with its whole graph."""
        warnings.warn("bincheck.torch: backward with create_graph=True recomputes the loop with "
                      "its whole graph (store-all memory) to make the gradient differentiable",
                      RuntimeWarning, stacklevel=3)
        args = self.args
        p, s, x = args.split(saved)
        # non-tensor leaves (a float in params) are not saved tensors: take them as given
        p = [v if isinstance(given, torch.Tensor) else given for v, given in zip(p, args.p)]
        wanted = [v for v, need in zip(saved, self.needs) if need]
        with self.ambient.reentered(), self.buffers_kept(), torch.enable_grad():
            if self.rng0 is not None:
                Rng.set(self.rng0, self.rng.devices)
            if self.buf0 is not None:
                self.buffers.set(self.buf0)
            outs = self.loop.plain_graph(args, p, s, x)[0]
            pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
            if not pairs or not wanted:
                return [None] * len(saved)
            cots = iter(torch.autograd.grad([o for o, _ in pairs], wanted,
                                            [g for _, g in pairs], create_graph=True,
                                            allow_unused=True))
        return [next(cots) if need else None for need in self.needs]


def close(store: TorchStore) -> None:
    if store.disk is not None:
        store.disk.close()


class LoopFunction(torch.autograd.Function):
    """``LoopFunction.apply(call, *leaves)``: see the module docstring."""

    @staticmethod
    def forward(ctx: Any, call: Call, *leaves: Any) -> tuple:
        ctx.set_materialize_grads(False)
        outs = call.forward(ctx.needs_input_grad[1:], leaves)
        ctx.call = call
        ctx.save_for_backward(*[v if isinstance(v, torch.Tensor) else None for v in leaves])
        fixed = [o for o in outs if not differentiable(o)]
        if fixed:
            ctx.mark_non_differentiable(*fixed)
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> tuple:
        call = ctx.call
        if torch.is_grad_enabled():
            return (None, *call.backward_differentiable(grads, ctx.saved_tensors))
        return (None, *call.backward(grads))
