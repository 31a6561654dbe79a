"""The reverse sweep: replay the rest of the schedule, taping one segment at a time.

:class:`Sweep` is the stepper of the reverse phase: plain ``Advance`` goes to the forward's stepper,
``Reverse`` tapes a segment (:mod:`.tape`) and pulls the adjoint back through it. It holds the
sweep's own state — the adjoint, the parameter accumulators, the input cotangent buffers — and
returns the cotangents of every requested argument from this one sweep (``defvjp_argnums``: never
one sweep per argument). Buffers are allocated only for what was asked for.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from autograd.core import vspace

from ..tree import flatten
from .boundary import Call, InternalError, Pending, differentiable, zeros
from .tape import accumulate, backward, tape_segment
from .verify import Verifier


class Sweep:
    """Reverse-phase stepper for one VJP of one call; see the module docstring."""

    __slots__ = ("plain", "executor", "p_def", "p_leaves", "p_want", "p_wanted", "s_want",
                 "x_want", "adjoint", "g_ys", "p_acc", "x_bar", "new_adjoint", "verifier", "stats",
                 "taped", "tape_bytes", "peak_held", "guard")

    def __init__(self, call: Call, pending: Pending, argnums: tuple, g: tuple,
                 verifier: Verifier | None) -> None:
        groups = call.groups
        n_p, n_s = groups[0].n_args, groups[1].n_args
        self.plain = stepper = pending.stepper
        self.executor = pending.executor
        self.stats = pending.stats
        self.verifier = verifier
        self.p_leaves, self.p_def = flatten(stepper.params)

        def wanted(group: int, offset: int) -> list:
            out: list = []
            for k in range(groups[group].n_args):
                if offset + k in argnums:
                    out += groups[group].leaves_of(k)
            return out

        self.p_want = wanted(0, 0)
        self.p_wanted = set(self.p_want)
        self.taped, pending.taped = pending.taped, None    # held here only until used
        sizes = getattr(call.schedule, "sizes", None)      # a memory budget's measured sizes
        self.tape_bytes = sizes.tape_bytes or 0 if sizes is not None else 0
        self.peak_held = 0
        self.guard = call.guard
        self.s_want = bool(wanted(1, n_p))
        self.x_want = wanted(2, n_p + n_s)
        self.adjoint, self.g_ys = call.state_cotangent(g)
        self.p_acc: list = [None] * len(self.p_leaves)
        self.x_bar = {k: vspace(stepper.x_leaves[k]).zeros() for k in self.x_want}
        self.new_adjoint: list = []

    def advance(self, state: Any, start: int, stop: int) -> Any:
        return self.plain.advance(state, start, stop)

    def reverse(self, state: Any, start: int, stop: int) -> None:
        t0 = time.perf_counter()
        box_state = start > 0 or self.s_want     # state 0's cotangent: only if asked for
        seg = self.taped
        if seg is not None and (seg.start, seg.stop) == (start, stop):
            self.taped = None                    # the forward taped this segment already
        else:
            guard = self.guard and self.guard.segment(start, self.executor.store)
            seg = tape_segment(self.plain, self.p_def, self.p_leaves, self.p_want, state,
                               box_state, self.x_want, start, stop, guard=guard)
            self.stats.taped_steps += stop - start
        held = self.executor.store.nbytes + (stop - start - 1) * self.tape_bytes
        self.peak_held = max(self.peak_held, held)
        if self.verifier is not None:
            self.verifier.taped(start, stop, seg.input_leaves, seg.output_values(),
                                self.executor)
        t1 = time.perf_counter()
        self.new_adjoint = [None] * len(seg.input_leaves)
        ends, cotangents = seg.ends(self.adjoint, self.g_ys)
        backward(ends, cotangents, seg.roots, self._deliver)
        if box_state:
            self.adjoint = [zeros(v) if a is None else a
                            for a, v in zip(self.new_adjoint, seg.input_leaves)]
        stats = self.stats
        stats.backward_seconds += time.perf_counter() - t1
        stats.tape_seconds += t1 - t0

    def _deliver(self, where: tuple, cot: Any) -> None:
        # A segment taped in the forward may have roots for leaves this VJP does not want (the
        # forward only knew which arguments were boxed): their cotangents are dropped.
        kind, key = where
        if kind == "p":
            if key in self.p_wanted:
                self.p_acc[key] = accumulate(self.p_acc[key], cot)
        elif kind == "s":
            self.new_adjoint[key] = cot
        else:
            t, k = key
            buf = self.x_bar.get(k)
            if buf is not None:
                buf[t] = cot

    def cotangents(self, call: Call, argnums: tuple, state_args: tuple) -> tuple:
        groups = call.groups
        n_p, n_s = groups[0].n_args, groups[1].n_args
        p_wanted = self.p_wanted
        p_cots = [zeros(v) if a is None and i in p_wanted else a
                  for i, (a, v) in enumerate(zip(self.p_acc, self.p_leaves))]
        x_cots = [self.x_bar.get(k) for k in range(len(self.plain.x_leaves))]
        out = []
        for a in argnums:
            if a < n_p:
                out.append(groups[0].gather(a, p_cots))
            elif a < n_p + n_s:
                lo, hi, _ = groups[1].spans[a - n_p]
                leaves = flatten(state_args[a - n_p])[0]
                adjoint = self.adjoint[:lo] + [
                    integer_zeros(v, call.out_leaves[i]) if c is None else c
                    for i, c, v in zip(range(lo, hi), self.adjoint[lo:hi], leaves)]
                out.append(groups[1].gather(a - n_p, adjoint))
            else:
                out.append(groups[2].gather(a - n_p - n_s, x_cots))
        return tuple(out)


def integer_zeros(value: Any, final: Any) -> Any:
    """The cotangent plain autograd gives an integer (or bool) array leaf of ``init_state`` that
    the loop carries: zeros of its shape and dtype. None for a Python or numpy integer scalar,
    which autograd cannot differentiate with respect to at all. A leaf the steps turn into floats
    (``final``, its value after the loop) has a real gradient that integer leaves do not get here:
    refused rather than answered with zeros."""
    if differentiable(final):
        raise TypeError(
            f"an integer leaf of init_state (dtype {getattr(value, 'dtype', type(value).__name__)}"
            f") comes out of the loop as {getattr(final, 'dtype', type(final).__name__)}: integer "
            f"leaves are carried, not differentiated, so its gradient would be lost; pass it as "
            f"floats (e.g. init_state.astype(float)) to differentiate through it")
    return vspace(value).zeros() if isinstance(value, np.ndarray) else None


def reverse_sweep(call: Call, argnums: tuple, args: tuple, g: tuple) -> tuple:
    """The reverse sweep on plain values: cotangents of ``argnums`` for output cotangent ``g``."""
    t0 = time.perf_counter()
    pending = call.take_pending(args)
    executor = pending.executor
    disk = executor.store.disk
    try:
        verifier = Verifier(call.n, call.out_leaves) if call.loop.verify else None
        sweep = Sweep(call, pending, argnums, g, verifier)
        if executor.run(pending.actions, sweep, (verifier,) if verifier else ()) is not None:
            raise InternalError("the reverse sweep stopped early")        # pragma: no cover
        executor.tracker.finish()
    finally:
        if disk is not None:             # success or not, the call's files go now
            disk.close()                 # waits for the worker: its I/O is all counted
            pending.stats.add_disk(disk)
    stats = pending.stats
    stats.peak_snapshots = executor.tracker.peak_checkpoints
    sizes = getattr(call.schedule, "sizes", None)
    stats.peak_bytes = max(executor.store.peak_nbytes, sweep.peak_held) + \
        (sizes.work_bytes if sizes is not None else 0)
    result = sweep.cotangents(call, argnums, call.split(args)[1])
    pending.stats.library_seconds += time.perf_counter() - t0
    call.loop.publish(call, pending.stats)   # one whole call's results, at once
    return result
