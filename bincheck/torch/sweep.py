"""The reverse sweep: replay the rest of the schedule, pulling the adjoint back segment by segment.

:class:`Sweep` is the executor's stepper in the backward. ``Advance`` runs plain steps (the
call's :class:`~.steps.Steps`); ``Reverse`` tapes its segment (unless the forward taped it
already) and pulls the adjoint back through it with one ``torch.autograd.backward(...,
inputs=...)``: the parameter aliases accumulate their gradient in place over the whole sweep (no
per-step buffer), the detached input state receives the new adjoint, and each taped input slice
its cotangent, written into the one buffer per wanted input leaf. Only what the caller asked for
is allocated or accumulated.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from ..runtime.executor import Executor
from ..schedule.actions import Advance, Free, Restore, Reverse, Snapshot
from ..tree import LEAF, flatten
from .boundary import differentiable
from .steps import Segment, Steps


# torch.autograd.backward checks and converts its arguments (cotangent shapes and dtypes, None
# cotangents, input containers) before it calls the engine: 14 us a call on tiny tensors, 24-33 us
# on the tanh RNN cell (timed by hand), more than the rest of a reversed step's bookkeeping. The
# sweep's arguments need none of it: every step's state was checked against state 0's shapes,
# dtypes and devices, each adjoint is the ``.grad`` of the same leaves, and none is None. So the
# sweep calls the engine as that function does, where this torch has the entry point (and not
# under functorch transforms, where the function raises).
_engine_backward = getattr(torch.autograd.graph, "_engine_run_backward", None)


def backward_into(outs: list, grads: list, ins: list) -> None:
    """``torch.autograd.backward(outs, grads, inputs=ins)``, without its argument checks."""
    if _engine_backward is None or torch._C._are_functorch_transforms_active():
        torch.autograd.backward(outs, grads, inputs=ins)
    else:
        _engine_backward(tuple(outs), tuple(grads), False, False, tuple(ins),
                         allow_unreachable=True, accumulate_grad=True)


class Sweep:
    """Reverse-phase stepper for one backward of one call; see the module docstring."""

    __slots__ = ("steps", "stats", "adjoint", "g_ys", "pretaped", "box0", "p_in", "x_bar",
                 "store", "tape_bytes", "peak_held")

    def __init__(self, steps: Steps, adjoint: list, g_ys: list | None, pretaped: Segment | None,
                 box0: bool, p_in: list, store: Any, tape_bytes: int) -> None:
        self.steps, self.stats = steps, steps.stats
        self.adjoint, self.g_ys, self.pretaped, self.box0 = adjoint, g_ys, pretaped, box0
        self.p_in = p_in
        self.x_bar = {k: torch.zeros_like(steps.args.x[k]) for k in steps.x_want}
        self.store, self.tape_bytes, self.peak_held = store, tape_bytes, 0

    def advance(self, state: Any, start: int, stop: int) -> Any:
        return self.steps.advance(state, start, stop)

    def lean(self, store: Any) -> bool:
        """Whether :meth:`run` may reverse single steps inline: snapshots in RAM only, no
        per-step outputs, no fingerprints, no input cotangents, version counters to guard."""
        steps = self.steps
        return store.disk is None and self.g_ys is None and steps.output_fn is None and \
            steps.verifier is None and not steps.x_want and steps.track

    def run(self, executor: Executor, actions: Any) -> None:
        """``executor.run(actions, self)``, with the reverse sweep's most frequent work inlined.

        A Revolve schedule reverses most steps alone (``Reverse(t, t + 1)``, between a
        ``Restore`` and a ``Free``). Through :meth:`Executor.apply`, :meth:`Steps.tape`, a
        :class:`Segment` and :meth:`pull_back`, the library's Python cost 43.5 us a reversed
        step over a hand-written replay of the plan on a 4-unit tanh cell (timed by hand; about
        25 us with this path and the leaner store; ``benchmarks/torch/replay.py`` compares the
        two at the benchmark's size). Here it is taped and pulled back in place, with the same
        checks (the tracker validates every action first; in-place writes, the returned state's
        structure, shapes, dtypes and devices) and the same statistics; every other action goes
        to the store and the stepper as :meth:`Executor.apply` sends it. Taped segments of
        several steps, and calls that need more (a disk or host tier, ``output_fn``,
        ``verify``, input cotangents), take the general path."""
        if not self.lean(executor.store):
            executor.run(actions, self)
            return
        store, apply = executor.store, executor.tracker.apply
        advance, reverse_one = self.steps.advance, self.reverse_one
        live, executor.live = executor.live, None      # held here only, as Executor.apply does
        for action in actions:
            apply(action)                   # raises before any work if the action is invalid
            kind = type(action)
            if kind is Reverse:
                if action.stop - action.start > 1 or self.pretaped is not None:
                    self.reverse(live, action.start, action.stop)
                else:
                    reverse_one(live, action.start)
                live = None                 # the tape consumed it; hold no extra reference
            elif kind is Advance:
                if action.stop > action.start:
                    live = advance(live, action.start, action.stop)
            elif kind is Restore:
                live = store.get(action.index)
            elif kind is Snapshot:
                store.put(action.index, live, action.storage)
            elif kind is Free:
                store.pop(action.index)
        executor.live = live

    def reverse_one(self, state: Any, t: int) -> None:
        """Tape step ``t`` from ``state`` and pull the adjoint back through it (:meth:`run`'s
        single step: :meth:`Steps.tape` and :meth:`pull_back` in one, without a
        :class:`Segment`). Everything it refers to is released when it returns."""
        t0 = time.perf_counter()
        steps = self.steps
        args = steps.args
        single, xl = args.s_def is LEAF, args.x
        leaves = [state] if single else flatten(state)[0]
        box = t > 0 or self.box0
        ins = [v.detach().requires_grad_(box and differentiable(v)) for v in leaves]
        versions = [v._version for v in leaves]
        with torch.enable_grad():
            x = None if not xl else xl[0][t] if args.x_def is LEAF else args.x_at(t)
            out = args.call_with(steps.aliases, steps.fn, ins[0] if single else args.state(ins),
                                 x)
        if [v._version for v in leaves] != versions or (xl and steps.x_moved()):
            raise steps.in_place_error(t)
        outs = steps.check(out, t)[1]
        if "fn" not in steps.checked:
            steps.check_closure(outs, ins, {}, "fn")
        t1 = time.perf_counter()       # one step holds no tape beside its own: no peak_held
        pulled, grads = [], []
        for o, g in zip(outs, self.adjoint):
            if g is not None and o.requires_grad:
                pulled.append(o)
                grads.append(g)
        wrt = self.p_in + [v for v in ins if v.requires_grad] if box else self.p_in
        if pulled and wrt:
            backward_into(pulled, grads, wrt)
        if box:
            self.adjoint = [v.grad if v.requires_grad else None for v in ins]
        stats = self.stats
        stats.taped_steps += 1
        stats.tape_seconds += t1 - t0
        stats.backward_seconds += time.perf_counter() - t1

    def reverse(self, state: Any, start: int, stop: int) -> None:
        seg = self.pretaped
        if seg is not None and (seg.start, seg.stop) == (start, stop):
            self.pretaped = None                 # the forward taped this segment already
        else:
            seg = self.steps.tape(state, start, stop, start > 0 or self.box0)
        held = self.store.nbytes + (stop - start - 1) * self.tape_bytes
        self.peak_held = max(self.peak_held, held)
        self.pull_back(seg)

    def pull_back(self, seg: Segment) -> None:
        t0 = time.perf_counter()
        outs, grads = [], []
        for o, g in zip(seg.outs, self.adjoint):
            if g is not None and o.requires_grad:
                outs.append(o)
                grads.append(g)
        if self.g_ys is not None:
            for t, leaves in zip(range(seg.start, seg.stop), self.steps.taped_outputs(seg)):
                for y, g in zip(leaves, self.g_ys):
                    if g is not None and y.requires_grad:
                        outs.append(y)
                        grads.append(g[t])
        ins = self.p_in + [v for v in seg.ins if v.requires_grad]
        slices = [(t, k, v) for t, d in seg.xs.items() for k, v in d.items()] if seg.xs else ()
        if slices:
            ins += [v for _, _, v in slices]
        t1 = time.perf_counter()
        if outs and ins:
            backward_into(outs, grads, ins)
        if seg.start > 0 or self.box0:
            self.adjoint = [v.grad if v.requires_grad else None for v in seg.ins]
        for t, k, v in slices:
            if v.grad is not None:
                self.x_bar[k][t] = v.grad
        self.stats.tape_seconds += t1 - t0
        self.stats.backward_seconds += time.perf_counter() - t1

    def cotangents(self, steps: Steps, p_want: list[bool], s_needs: list[bool],
                   x_needs: list[bool]) -> list:
        """Per Function input leaf: its cotangent, or None."""
        p = [take_grad(a) if w else None for a, w in zip(steps.aliases, p_want)]
        s = [g if need and differentiable(v) else None
             for g, v, need in zip(self.adjoint, steps.args.s, s_needs)]
        x = [self.x_bar.get(k) if need else None for k, need in enumerate(x_needs)]
        return p + s + x


def take_grad(alias: torch.Tensor) -> torch.Tensor | None:
    """The gradient accumulated in an alias, handed over: the alias keeps no reference, so a
    later backward (``retain_graph=True``) starts from nothing and never writes into a gradient
    torch already handed to the parameter."""
    grad, alias.grad = alias.grad, None
    return grad
