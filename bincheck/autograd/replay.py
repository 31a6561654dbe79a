"""Replaying a recorded trace (:mod:`.trace`): the executor's stepper for
:func:`~bincheck.autograd.program.checkpoint_program`.

An advance replays ops with their raw functions on plain values, freeing each value after its
last use; a reverse replays its segment on boxes of autograd's reverse mode and pulls the
cotangents of the values live after it back to those before it with autograd's own node VJPs
and accumulation (:func:`pull_back`), so the arithmetic is plain autograd's.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
from autograd.core import VJPNode, add_outgrads, sparse_add, sparse_object_types, vspace
from autograd.tracer import isbox, new_box, trace_stack

from ..runtime.errors import NondeterministicStepError
from ..runtime.stats import ProgramStats
from .constants import build
from .trace import Trace, fingerprint, value_nbytes


def env_nbytes(env: dict) -> int:
    return sum(value_nbytes(v) for v in env.values())


class Replay:
    """The executor's stepper for one call: plain and taped replays of the trace's ops; the
    cotangents of the values live at the adjoint's cut in ``ct``."""

    def __init__(self, trace: Trace, inputs: list, stats: ProgramStats,
                 wanted: set | None = None) -> None:
        self.trace, self.inputs, self.stats = trace, inputs, stats
        self.wanted = set(range(trace.n_in)) if wanted is None else wanted
        self.ct: dict = {}

    def _args(self, k: int, values: dict) -> tuple:
        """Op ``k``'s primitive, arguments (its parents from ``values``, by value id) and
        keyword arguments."""
        tr = self.trace
        fun, argnums, template, kwargs, col = tr.templates[tr.tmpl[k]]
        args = list(template)
        j, parents = tr.start[k], tr.parents
        for argnum in argnums:
            args[argnum] = values[parents[j]]
            j += 1
        if col is not None:                     # constants whose numbers are in the column
            numbers = iter(col[0].unpack_from(parents, 4 * j))
            for i, spec in col[1]:
                args[i] = build(spec, numbers)
        return fun, args, kwargs

    def _check(self, k: int, value: Any) -> None:
        prints = self.trace.prints
        if prints is not None and fingerprint(value) != prints[k]:
            fun = self.trace.templates[self.trace.tmpl[k]][0]
            raise NondeterministicStepError(
                f"verify=True: op {k} ({getattr(fun, '__name__', fun)}) gave another value when "
                f"replayed than when the program ran: the program reads state outside its "
                f"arguments that changed since (a captured array written in place?) or draws "
                f"random numbers outside autograd's primitives; the gradient would be wrong")

    def advance(self, live: dict, start: int, stop: int) -> dict:
        t0 = time.perf_counter()
        tr, inputs = self.trace, self.inputs
        n_in, last, parents, start_of, tmpl, arity = tr.n_in, tr.last, tr.parents, tr.start, \
            tr.tmpl, tr.arity
        env = dict(enumerate(inputs))               # the inputs by id, then the live values
        env.update(live)
        check = self._check if tr.prints is not None else None
        for k in range(start, stop):
            fun, args, kwargs = self._args(k, env)
            value = fun.fun(*args, **kwargs)
            if check is not None:
                check(k, value)
            if last[n_in + k] > k:
                env[n_in + k] = value
            s0 = start_of[k]
            for j in range(s0, s0 + arity[tmpl[k]]):
                p = parents[j]
                if p >= n_in and last[p] == k:
                    env.pop(p, None)
        for i in range(n_in):                       # a snapshot holds the live values only
            del env[i]
        self.stats.plain_ops += stop - start
        self.stats.plain_seconds += time.perf_counter() - t0
        return env

    def reverse(self, env: dict, start: int, stop: int) -> None:
        t0 = time.perf_counter()
        tr, inputs, ct = self.trace, self.inputs, self.ct
        n_in, last = tr.n_in, tr.last
        first = n_in + start
        dep = tr.dep
        outs = [n_in + k for k in range(start, stop) if last[n_in + k] >= stop and dep[n_in + k]]
        self.stats.taped_ops += stop - start
        if not any(o in ct for o in outs):          # nothing to pull back through the segment
            for o in outs:
                ct.pop(o, None)
            return
        needed = sorted({p for k in range(start, stop) for p in tr.parents_of(k) if p < first})
        value = lambda p: inputs[p] if p < n_in else env[p]  # noqa: E731
        # values of the inputs nobody asked a cotangent for alone are constants here, as they
        # are to autograd (no buffer for them, no VJP asked of their ops)
        wanted = self.wanted
        wrt = [p for p in needed if dep[p] and (p >= n_in or p in wanted)]
        if not wrt:                                 # nothing wanted flows back through it
            for o in outs:
                ct.pop(o, None)
            return
        fixed = {p: value(p) for p in needed if p not in set(wrt)}

        def segment(boxes: list) -> list:
            # each value freed after its last use, as an advance frees them: what stays is
            # what the nodes' VJPs keep (the plan's tape, .kept), not every result
            local = dict(fixed)
            local.update(zip(wrt, boxes))
            for k in range(start, stop):
                fun, args, kwargs = self._args(k, local)
                local[n_in + k] = v = taped(fun, args, kwargs, level)
                if isbox(v):
                    nodes.append(v._node)
                del args, v
                for p in tr.parents_of(k):
                    if p >= first and last[p] == k:
                        local.pop(p, None)
                if last[n_in + k] <= k:
                    del local[n_in + k]
            return [local[o] for o in outs]
        nodes: list = []                  # the segment's nodes, in the order they were made
        with trace_stack.new_trace() as level:
            roots = [VJPNode.new_root() for _ in wrt]
            results = segment([new_box(value(p), level, r) for p, r in zip(wrt, roots)])
        t1 = time.perf_counter()
        for k, v in zip((o - n_in for o in outs), results):
            self._check(k, v._value if isbox(v) else v)
        # each cotangent reaching an input of the segment is summed into ``ct`` as it arrives:
        # one such temporary at a time, in the order autograd's own sweep sums them
        pull_back(results, [ct.pop(o, None) for o in outs], roots, level,
                  lambda i, c: accumulate(ct, wrt[i], c, wrt[i] < n_in), nodes)
        stats = self.stats
        stats.tape_seconds += t1 - t0
        stats.backward_seconds += time.perf_counter() - t1


class Recorded:
    """The executor's stepper for a call whose recording taped its first reversed segment,
    ``start`` to the end (:mod:`.expect`): that reverse pulls back through the recorded VJPs,
    with no replay; everything else is ``replay``'s."""

    def __init__(self, replay: Replay, start: int, tape: list) -> None:
        self.replay, self.start, self.tape = replay, start, tape
        self.advance = replay.advance

    def reverse(self, env: dict, start: int, stop: int) -> None:
        replay, tape = self.replay, self.tape
        if tape is None or start != self.start or stop != replay.trace.n:
            return replay.reverse(env, start, stop)
        self.tape = None
        t0 = time.perf_counter()
        tr, ct, wanted, stats = replay.trace, replay.ct, replay.wanted, replay.stats
        n_in, last = tr.n_in, tr.last
        first = n_in + start
        stats.plain_ops -= stop - start              # the recording ran them taped
        stats.taped_ops += stop - start
        outgrads = {}
        for k in range(start, stop):
            c = ct.pop(n_in + k, None) if last[n_in + k] >= stop else None
            if c is not None:
                outgrads[n_in + k] = (c, False)
        while tape:                                 # last op first, as :func:`pull_back`
            k, parents, vjp = tape.pop()
            g = outgrads.pop(n_in + k, None)
            if g is None:
                continue
            for p, ingrad in zip(parents, vjp(g[0])):
                if p >= first:
                    outgrads[p] = add_outgrads(outgrads.get(p), ingrad)
                elif p >= n_in or p in wanted:
                    accumulate(ct, p, ingrad, p < n_in)
            g = ingrad = vjp = None
        stats.backward_seconds += time.perf_counter() - t0


def taped(fun: Callable, args: list, kwargs: dict, level: int) -> Any:
    """``fun(*args, **kwargs)`` under the tape at ``level``: what autograd's primitive wrapper
    does (the raw function on the values, a :class:`VJPNode` of the boxed arguments, a box of
    the result), without its search of the arguments for the top trace (every box here is of
    ``level``) and its second call of itself; ``args`` is the replay's own list. On 1000-float
    ops (the nested loop of benchmarks.programs, n=3162, load 3.4) the taped replay took 13 us
    an op this way, 17 us through the wrapper."""
    argnums, parents = [], []
    for i, a in enumerate(args):
        if isbox(a):
            argnums.append(i)
            parents.append(a._node)
            args[i] = a._value
    ans = fun.fun(*args, **kwargs)
    if not argnums:                             # no traced argument: a constant, as autograd's
        return ans
    return new_box(ans, level, VJPNode(ans, fun, tuple(args), kwargs, tuple(argnums),
                                       tuple(parents)))


def accumulate(ct: dict, p: int, c: Any, owned: bool) -> None:
    """``ct[p] += c``. An input's cotangent (``owned``: summed over the whole sweep) is a copy
    of its own, summed into in place, so that a sum never holds two of it; others are summed
    as autograd sums them."""
    old = ct.get(p)
    if type(c) in sparse_object_types:          # an index's VJP: added into a dense sum
        vs = vspace(c)
        if old is not None and not (owned and isinstance(old, np.ndarray)):
            old = vs.mut_add(None, old)         # a copy of its own, as autograd makes
        ct[p] = sparse_add(vs, old, c)
    elif old is None:
        # order="K": the layout of the cotangents to come (a VJP of ``dot`` returns them
        # transposed; summing an F-ordered array into a C-ordered one took 190 us against
        # 19 us for 256x256 float64 in one thread)
        ct[p] = c.copy(order="K") if owned and isinstance(c, np.ndarray) else c
    elif owned and isinstance(old, np.ndarray) and isinstance(c, np.ndarray) and \
            old.shape == c.shape and np.can_cast(c.dtype, old.dtype, "same_kind"):
        np.add(old, c, out=old)
    else:
        ct[p] = vspace(c).add(old, c)


def pull_back(outs: list, cts: list, roots: list, level: int,
              sink: Callable[[int, Any], None], nodes: list) -> None:
    """Pull the cotangents ``cts`` of a taped segment's outputs ``outs`` (None: none reached
    it) back to its boxed inputs ``roots`` by autograd's own node VJPs and accumulation:
    ``sink(i, g)`` receives each cotangent ``g`` that reaches ``roots[i]``, as it arrives (the
    caller sums them where it keeps them, so no root's sum is held here). One pass for several
    boxed inputs and outputs, without the tuple boxes ``make_vjp`` would need.

    ``nodes`` are the segment's nodes in the order its ops ran, pulled back last first: a
    cotangent then waits only while its value was live in the forward, as the plan prices it.
    Autograd's own ``backward_pass`` order (a depth-first toposort) leaves a side branch's
    cotangents pending down a whole chain: on a loop of ``solve(A0 + w*I, x)``, 200 of the
    A-sized ones (1.6 MB) that no plan priced."""
    outgrads: dict = {}
    index = {r: i for i, r in enumerate(roots)}
    for o, g in zip(outs, cts):
        if g is not None and isbox(o) and o._trace == level:
            node = o._node
            if node in index:                   # an output that is an input, passed through
                sink(index[node], g)
                continue
            outgrads[node] = add_outgrads(outgrads.get(node), g)
    for node in reversed(nodes):
        if node not in outgrads:
            continue
        g = outgrads.pop(node)[0]
        for parent, ingrad in zip(node.parents, node.vjp(g)):
            i = index.get(parent)
            if i is not None:
                sink(i, ingrad)
            else:
                outgrads[parent] = add_outgrads(outgrads.get(parent), ingrad)
        # the loop's names would hold the last cotangent (an RNN step's 512 kB for W) while
        # the next op's VJP runs (tracemalloc: two of them at the peak)
        g = ingrad = None
