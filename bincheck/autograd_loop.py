"""The autograd adapter: a checkpointed loop as one autograd primitive (the only autograd import).

Model: autograd's ``misc/fixed_points.py`` writes a whole loop as one primitive with its own VJP.
Here the primitive's positional arguments are the leaves of ``(params, init_state, inputs)``; its
forward runs the schedule's first sweep on plain arrays, keeping the snapshots the schedule asks
for; the VJP closure replays the rest of the schedule, taping one segment at a time, and returns
the cotangents of every requested argument from that single sweep (``defvjp_argnums``, not one
sweep per argument).

Two levels of leaves. The *arguments* of the primitive are the user's trees flattened through plain
containers only: a container that autograd boxed as a whole (``grad`` w.r.t. a dict of weights
gives a ``DictBox``) stays one argument, so its cotangent goes back as one dict and autograd never
has to scatter per-key cotangents into zero-filled copies of the whole dict. Inside the primitive
everything is flattened down to array leaves.

Measured pitfalls this module is shaped around:

* autograd calls the VJP *maker* while building the node in the forward pass: the maker only
  captures references, all work happens in the returned closure.
* a taped segment is traced with one root node per differentiated array leaf and a custom
  multi-output backward pass, so no container boxes are built and no cotangent is computed for a
  leaf nobody asked for (input slices are boxed only when ``inputs`` is differentiated).
* parameter cotangents are added into one accumulator as soon as each is complete, in place.

Loops: :class:`CheckpointedLoop` (a schedule known in advance, e.g. the binomial plan) and
:class:`WhileLoop` (an online planner) share everything but their forward (:class:`_LoopBase`).
Higher-order and forward-mode rules come from the "tangent loop", see the section below.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any, Callable

import autograd.numpy as anp
import numpy as np
from autograd.builtins import DictBox, SequenceBox
from autograd.builtins import tuple as ag_tuple
from autograd.core import (JVPNode, VJPNode, add_outgrads, defjvp_argnums, defvjp_argnums,
                           vspace)
from autograd.core import make_vjp as _make_vjp
from autograd.tracer import getval, isbox, new_box, primitive, trace_stack
from autograd.util import toposort

from .executor import Executor
from .schedule.actions import Advance, Free, Restore, Reverse
from .schedule.binomial import Plan, check_positive_int
from .schedule.online import OnlinePlanner
from .tree import LEAF, conform, describe, flatten, unflatten


# --------------------------------------------------------------------------- helpers
def _values(tree: Any) -> Any:
    """The tree with container boxes replaced by their values (for shape checks only)."""
    t = type(tree)
    if t is SequenceBox or t is DictBox:
        return _values(tree._value)
    if t is tuple or t is list:
        return t(_values(c) for c in tree)
    if t is dict:
        return {k: _values(v) for k, v in tree.items()}
    return tree


class _Sink:
    """A pseudo-node whose parents are all outputs of a taped segment (multi-output backward)."""

    __slots__ = ("parents", "vjp")

    def __init__(self, parents: list, cotangents: list) -> None:
        self.parents = parents
        self.vjp = lambda _: cotangents


def _backward(ends: list, cotangents: list, roots: dict, deliver: Callable) -> None:
    """Pull ``cotangents`` back from the end nodes to the root nodes of one taped segment (once).

    ``deliver(roots[node], g)`` is called as soon as a root's cotangent is complete (toposort
    yields a node after all its consumers), so a parameter's contribution can be added into its
    accumulator and freed before the next one is computed.
    """
    if not ends:
        return
    sink = _Sink(ends, cotangents)
    outgrads: dict = {sink: (None, False)}
    ingrad = None
    for node in toposort(sink):
        g = outgrads.pop(node)[0]
        where = roots.get(node)
        if where is not None:
            deliver(where, g)
            continue
        ingrad = None     # drop the previous node's last cotangent before computing new ones
        for parent, ingrad in zip(node.parents, node.vjp(g)):
            outgrads[parent] = add_outgrads(outgrads.get(parent), ingrad)
        # The tape is used once: release this node's saved values now, not after the sweep.
        node.vjp = None


def _accumulate(acc: Any, g: Any) -> Any:
    """acc + g, in place when both are plain arrays (``acc`` is always our own copy)."""
    if acc is None:
        # Keep g's memory layout: autograd's dot VJP returns transposed views, and adding
        # F-ordered contributions into a C-ordered accumulator is a cache-hostile strided add.
        return g.copy(order="K") if type(g) is np.ndarray else g
    if type(acc) is np.ndarray and type(g) is np.ndarray and acc.shape == g.shape:
        np.add(acc, g, out=acc)
        return acc
    return acc + g


def _differentiable(value: Any) -> bool:
    """Float or complex leaves are traced; integer leaves (step counters, indices) are not."""
    if isinstance(value, (float, complex)):
        return True
    dtype = getattr(value, "dtype", None)
    return dtype is not None and dtype.kind in "fc"


def _zeros(value: Any) -> Any:
    """The zero cotangent of a state leaf; None for an integer leaf (it has none)."""
    return vspace(value).zeros() if _differentiable(value) else None


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool; got {value!r}")


def _check_fn(fn: Any, with_outputs: Any) -> None:
    if not callable(fn):
        raise TypeError(f"fn must be callable as fn(params, state, x) -> new_state; "
                        f"got {fn!r} of type {type(fn).__name__}")
    _check_bool("with_outputs", with_outputs)


class NondeterministicStepError(RuntimeError):
    """``verify=True`` found a recomputed state that differs from the forward pass."""


class _Checker:
    """``verify=True``: compare recomputed states with the forward's where both exist.

    Snapshots freed during the reverse sweep are kept (``retired``) until the sweep recomputes
    their state, which it always does when it reverses the segment ending there; the forward's
    final state is compared with the first taped step's output. This holds up to about twice
    the snapshots at once; it is a debugging aid, off by default.
    """

    def __init__(self, executor: Executor, call: _Call) -> None:
        self.executor, self.retired = executor, {}
        self.origin = executor.tracker.live_index
        self.retired[call.n] = list(call.out_leaves)

    def before(self, action) -> None:
        if type(action) is Free:
            self.retired[action.index] = flatten(self.executor.store[action.index])[0]

    def after(self, action) -> None:
        kind = type(action)
        if kind is Restore:
            self.origin = action.index
        elif kind is Advance and action.stop > action.start:
            self.check(action.stop, flatten(self.executor.live)[0])

    def check(self, index: int, leaves: list) -> None:
        ref = self.retired.pop(index, None)
        if ref is None and index in self.executor.store:
            ref = flatten(self.executor.store[index])[0]
        if ref is None:
            return
        for a, b in zip(leaves, ref):
            a, b = getval(a), getval(b)
            if np.shape(a) != np.shape(b) or not np.allclose(a, b, rtol=1e-10, atol=0.0,
                                                              equal_nan=True):
                diff = np.max(np.abs(np.asarray(a, dtype=complex) - np.asarray(b, dtype=complex)))
                raise NondeterministicStepError(
                    f"verify=True: recomputing steps {self.origin}..{index - 1} from stored state "
                    f"{self.origin} gave a state {index} that differs from the forward pass (by "
                    f"up to {diff:.3g}); a step in that range, first suspect step {index - 1}, is "
                    f"not a pure function of (params, state, x): unseeded randomness, or fn "
                    f"mutating params or state in place? Checkpointing replays steps, so the "
                    f"gradient would be wrong.")


class _Outputs:
    """Per-step outputs written straight into one (seq_len, ...) array: no list, no stacking copy.

    Only the first sweep records (each step once, in order); later recomputations are ignored.
    The dtype is promoted if a later y needs it, as ``np.stack`` would.
    """

    __slots__ = ("seq_len", "buf", "count")

    def __init__(self, seq_len: int) -> None:
        self.seq_len, self.buf, self.count = seq_len, None, 0

    def add(self, t: int, y: Any) -> None:
        if t != self.count:
            return
        y = np.asarray(y)
        if self.buf is None:
            self.buf = np.empty((self.seq_len,) + y.shape, dtype=y.dtype)
        elif y.dtype != self.buf.dtype:
            dtype = np.result_type(self.buf.dtype, y.dtype)   # promote, as np.stack would
            if dtype != self.buf.dtype:
                self.buf = self.buf.astype(dtype)
        self.buf[t] = y
        self.count += 1


class _Group:
    """One of params / init_state / inputs: its argument leaves and its array leaves."""

    __slots__ = ("arg_def", "n_args", "tree_def", "spans")

    def __init__(self, arg_def, n_args) -> None:
        self.arg_def, self.n_args = arg_def, n_args
        self.tree_def = None   # structure of the fully flattened tree (set by expand)
        self.spans = None      # per argument: (first leaf, stop leaf, its own treedef)

    def expand(self, args) -> list:
        """Array leaves of this group, given its argument values (plain, inside the primitive)."""
        leaves, spans = [], []
        for a in args:
            sub, sub_def = flatten(a)
            spans.append((len(leaves), len(leaves) + len(sub), sub_def))
            leaves += sub
        self.spans = spans
        self.tree_def = flatten(unflatten(self.arg_def, list(args)))[1]
        return leaves

    def gather(self, k: int, leaf_cotangents: list) -> Any:
        """The cotangent of argument ``k`` from its array leaves' cotangents."""
        lo, hi, sub_def = self.spans[k]
        if sub_def is LEAF:
            return leaf_cotangents[lo]
        return unflatten(sub_def, leaf_cotangents[lo:hi])


class _Call:
    """Everything one call of a loop needs, shared by the primitive's forward and its VJP maker."""

    __slots__ = ("loop", "groups", "forward", "out_leaves", "n")

    def __init__(self, loop, groups) -> None:
        self.loop, self.groups = loop, groups
        self.forward = None      # (executor, the remaining actions), until the VJP uses them
        self.out_leaves = None   # the final state's leaves; integer ones stay out of the tape
        self.n = None            # number of steps this call ran

    def pack(self, out) -> tuple:
        """The primitive's output: the final state's float leaves (and ys), as a flat tuple.

        A flat tuple of arrays is what autograd handles best; integer leaves (counters) cannot be
        boxed at all, so they travel beside the primitive and :meth:`unpack` puts them back.
        """
        final, ys = out if self.loop.with_outputs else (out, None)
        leaves = flatten(final)[0]
        self.out_leaves = leaves
        packed = tuple(v for v in leaves if _differentiable(v))
        return packed + (ys,) if self.loop.with_outputs else packed

    def unpack(self, packed) -> Any:
        items = list(packed)
        ys = items.pop() if self.loop.with_outputs else None
        it = iter(items)
        leaves = [next(it) if _differentiable(v) else v for v in self.out_leaves]
        final = unflatten(self.groups[1].tree_def, leaves)
        return (final, ys) if self.loop.with_outputs else final

    def state_cotangent(self, g) -> tuple[list, Any]:
        """Split the cotangent of :meth:`pack`'s tuple into per-leaf state cotangents and ys'."""
        items = list(g)
        g_ys = items.pop() if self.loop.with_outputs else None
        it = iter(items)
        return [next(it) if _differentiable(v) else None for v in self.out_leaves], g_ys

    def split(self, args):
        n_p, n_s = self.groups[0].n_args, self.groups[1].n_args
        return args[:n_p], args[n_p:n_p + n_s], args[n_p + n_s:]


@dataclass
class LoopStats:
    """What the last gradient (forward + reverse) of a loop did, counted and timed by the library.

    ``plain_steps`` / ``taped_steps`` count ``fn`` evaluations; the times are seconds spent in
    plain steps, in taped steps (building the tape) and in backward passes over those tapes
    (including adding each step's parameter cotangent into the total). Whatever else a gradient
    costs is bookkeeping (planning, executor, pytree handling). ``library_seconds`` is the wall
    time spent inside the loop's forward and reverse sweep, so ``library_seconds - plain_seconds
    - tape_seconds - backward_seconds`` is the library's own overhead (the user's loss and
    autograd's graph outside the loop excluded). ``peak_snapshots`` is the most states the
    schedule stored at once (the working state not counted, as in Revolve).
    """

    plain_steps: int = 0
    taped_steps: int = 0
    peak_snapshots: int = 0
    plain_seconds: float = 0.0
    tape_seconds: float = 0.0
    backward_seconds: float = 0.0
    library_seconds: float = 0.0

    @property
    def overhead_seconds(self) -> float:
        """Time inside the library not spent in steps, taping or backward passes."""
        return self.library_seconds - self.plain_seconds - self.tape_seconds - \
            self.backward_seconds


# --------------------------------------------------------------------------- the loops
class _LoopBase:
    """What every checkpointed loop shares: plain steps with checks, and the VJP.

    A subclass's ``forward(call, args)`` runs the forward on plain values and leaves in
    ``call.forward`` the executor (holding the snapshots) and the iterable of the remaining
    actions; ``make_vjp`` replays those actions with taped segments.
    """

    fn: Callable
    with_outputs: bool = False
    verify: bool = False

    def _enter(self, trees: tuple) -> Any:
        """Run plain if nothing is boxed, else through the primitive (returns None for plain)."""
        flat = [flatten(tree) for tree in trees]     # container boxes stay single arguments
        args = [a for leaves, _ in flat for a in leaves]
        if not any(isbox(a) for a in args):
            return None
        call = _Call(self, [_Group(d, len(leaves)) for leaves, d in flat])
        # Hand back the containers the plain loop returns (a tuple of boxes, not a box of a tuple)
        # so that user code that unpacks or type-checks the result works unchanged.
        packed = _loop_primitive(*args, call=call)
        return (call.unpack([packed[i] for i in range(len(packed._value))]),)

    # ------------------------------------------------------------ plain steps
    def _step(self, params, state, x, t: int, s_def, s_shapes, y_shape):
        """One plain step with the structure checks that keep snapshots interchangeable."""
        out = self.fn(params, state, x)
        y = None
        if self.with_outputs:
            if not (type(out) in (tuple, list) and len(out) == 2):
                length = f" of length {len(out)}" if isinstance(out, (tuple, list)) else ""
                raise TypeError(
                    f"with_outputs=True: fn must return a 2-tuple (new_state, y); step {t} "
                    f"returned {type(out).__name__}{length}")
            out, y = out
            if type(y) in (tuple, list, dict) or y is None:
                raise TypeError(f"with_outputs=True: y must be an array (or a scalar); step {t} "
                                f"returned {type(y).__name__}")
            if y_shape is not None and np.shape(y) != y_shape:
                raise ValueError(f"with_outputs=True: every y must have the same shape; step {t} "
                                 f"returned shape {np.shape(y)}, earlier steps {y_shape}")
        leaves, new_def = flatten(out)
        if new_def != s_def:
            out = conform(out, s_def)            # the same dict keys in another order is fine
            leaves, new_def = flatten(out)
        if new_def != s_def:
            raise ValueError(
                f"fn must return a state with the structure of its input state; step {t} got "
                f"{describe(s_def)} and returned {describe(new_def)}")
        shapes = [np.shape(leaf) for leaf in leaves]
        if shapes != s_shapes:
            raise ValueError(
                f"fn must return state arrays of the shapes it received; step {t} got shapes "
                f"{s_shapes} and returned {shapes}")
        if any(isbox(leaf) for leaf in leaves) or isbox(y):
            raise TypeError(
                "fn returned an autograd box on plain inputs: it closes over a value that is "
                "being differentiated. Pass that value through params (fn(params, state, x)) so "
                "the loop can checkpoint and differentiate it")
        return out, y

    def _make_advance(self, params, s_def, s_shapes, x_leaves, x_def, stats, ys):
        """``advance(state, start, stop)`` on plain values; records outputs in ``ys`` if given."""
        y_shape = [None]

        def advance(state, start, stop):
            t0 = time.perf_counter()
            for t in range(start, stop):
                x = unflatten(x_def, [leaf[t] for leaf in x_leaves])
                state, y = self._step(params, state, x, t, s_def, s_shapes, y_shape[0])
                if ys is not None:
                    y_shape[0] = np.shape(y)
                    ys.add(t, y)
            stats.plain_seconds += time.perf_counter() - t0
            stats.plain_steps += stop - start
            return state

        return advance

    # ------------------------------------------------------------ tangent loop (higher order)
    def derivative_loop(self, call: _Call) -> "CheckpointedLoop":
        """The loop over f~ (a step and its JVP), with this call's length and checkpoint budget."""
        return CheckpointedLoop(_TangentStep(self.fn, self.with_outputs),
                                self.derivative_schedule(call), self.with_outputs)

    def _tangent_inputs(self, call: _Call, z_args, tangents: dict):
        """(P, S, X) of the tangent loop: each of params/state/inputs paired with its tangent.

        Unperturbed params and inputs get ZERO leaves (no work, no buffers); the state tangent is
        dense (zeros) because the step makes it non-zero as soon as anything is perturbed.
        """
        trees, offset = [], 0
        for gi, grp in enumerate(call.groups):
            vals = list(z_args[offset:offset + grp.n_args])
            tans, any_tangent = [], False
            for k, v in enumerate(vals):
                t = tangents.get(offset + k)
                if t is None:
                    leaves, d = flatten(v)
                    t = unflatten(d, [_zero_tangent(v) if gi == 1 else ZERO for v in leaves])
                else:
                    any_tangent = True
                tans.append(t)
            tree, ttree = unflatten(grp.arg_def, vals), unflatten(grp.arg_def, tans)
            trees.append((tree, ttree if gi != 2 or any_tangent else None))
            offset += grp.n_args
        return trees

    def _tangent_outputs(self, call: _Call, P, S, X) -> tuple:
        """Run the tangent loop: ((final state, its tangent), stacked (y, y.) or None)."""
        if call.n == 0:                          # a while loop that took no step
            return S, None
        out = self.derivative_loop(call)(P, S, X)
        return out if self.with_outputs else (out, None)

    def tangent(self, call: _Call, argnums: tuple, gs: tuple, args: tuple) -> tuple:
        """Forward mode: the output tangent (in the primitive's packed form) along ``gs``."""
        P, S, X = self._tangent_inputs(call, args, dict(zip(argnums, gs)))
        (final, dfinal), ys2 = self._tangent_outputs(call, P, S, X)
        packed = tuple(t for t, v in zip(flatten(dfinal)[0], call.out_leaves)
                       if _differentiable(v))
        if not self.with_outputs:
            return packed
        dys = ys2[:, 1]
        return packed + (dys.copy() if type(dys) is np.ndarray else dys,)  # free the (T, 2) pair

    def tangent_vjp(self, call: _Call, z_args, tangents: dict, wrt, gdot: dict | None,
                    g_args) -> dict:
        """grad over z[wrt] of <(g., g), F~(z; z.)> (g. = 0 when gdot is None), as {argnum: ...}.

        ``g_args`` is the loop's packed output cotangent g, ``gdot`` its tangent by packed index.
        """
        def F(*zsel):
            zz = list(z_args)
            for a, v in zip(wrt, zsel):
                zz[a] = v
            (final, dfinal), ys2 = self._tangent_outputs(call, *self._tangent_inputs(
                call, zz, tangents))
            mask = [_differentiable(v) for v in call.out_leaves]
            leaves = [v for v, m in zip(flatten(final)[0], mask) if m] + \
                [v for v, m in zip(flatten(dfinal)[0], mask) if m]
            return ag_tuple(leaves + ([ys2] if self.with_outputs else []))

        vjp, out = _make_vjp(lambda zs: F(*zs), tuple(z_args[a] for a in wrt))
        n_float = sum(_differentiable(v) for v in call.out_leaves)
        g_items = list(g_args)
        gd_items = [None] * len(g_items)
        for i, v in (gdot or {}).items():
            gd_items[i] = v
        zero = lambda i: vspace(out[i]).zeros()
        cot = [gd_items[i] if gd_items[i] is not None else zero(i) for i in range(n_float)] + \
              [g_items[i] for i in range(n_float)]
        if self.with_outputs:
            g_ys = g_items[n_float]
            gd_ys = gd_items[n_float] if gd_items[n_float] is not None else vspace(g_ys).zeros()
            cot.append(_interleave(gd_ys, g_ys))
        return dict(zip(wrt, vjp(tuple(cot))))

    # ------------------------------------------------------------ VJP
    def make_vjp(self, call: _Call, argnums: tuple, args: tuple) -> Callable:
        """Called by autograd while it builds the node: capture references only.

        The sweep itself is another primitive, so that an outer trace (grad of grad, jvp of grad)
        differentiates it with its own checkpointed rules instead of taping every step of it.
        """
        vcall = _VJPCall(call, argnums, len(args))
        return lambda g: _vjp_primitive(*args, *g, call=vcall)

    def reverse_sweep(self, call: _Call, argnums: tuple, args: tuple, g: tuple) -> tuple:
        """The reverse sweep on plain values: cotangents of ``argnums`` for output cotangent g."""
        fn, with_outputs = self.fn, self.with_outputs
        groups = call.groups
        n_p, n_s = groups[0].n_args, groups[1].n_args
        p_args, s_args, x_args = call.split(args)
        p_leaves, s_leaves, x_leaves = (grp.expand(a) for grp, a in zip(groups, (
            p_args, s_args, x_args)))
        if call.forward is None:          # a second VJP call (e.g. jacobian): redo the forward
            self.forward(call, args)
        executor, actions = call.forward
        call.forward = None               # the sweep consumes the snapshots; let them go
        p_def, s_def, x_def = (grp.tree_def for grp in groups)

        # Which array leaves need a cotangent.
        def wanted(group_index, offset):
            grp, out = groups[group_index], []
            for k in range(grp.n_args):
                if offset + k in argnums:
                    lo, hi, _ = grp.spans[k]
                    out += range(lo, hi)
            return out

        p_want = wanted(0, 0)
        s_want = bool(wanted(1, n_p))
        x_want = wanted(2, n_p + n_s)

        adjoint, g_ys = call.state_cotangent(g)
        p_acc: list = [None] * len(p_leaves)
        x_bar = {k: vspace(x_leaves[k]).zeros() for k in x_want}
        stats = self.stats
        new_adjoint: list = []

        def deliver(where, cot):
            kind, key = where
            if kind == "p":
                p_acc[key] = _accumulate(p_acc[key], cot)
            elif kind == "s":
                new_adjoint[key] = cot
            else:
                t, k = key
                x_bar[k][t] = cot

        def reverse(state, start, stop):
            nonlocal adjoint, new_adjoint
            t0 = time.perf_counter()
            roots: dict = {}
            with trace_stack.new_trace() as trace:

                def box(value, where):
                    node = VJPNode.new_root()
                    roots[node] = where
                    return new_box(value, trace, node)

                p_vals = list(p_leaves)
                for i in p_want:
                    p_vals[i] = box(p_vals[i], ("p", i))
                params = unflatten(p_def, p_vals)
                s_vals = flatten(state)[0]
                box_state = start > 0 or s_want
                st = unflatten(s_def, [box(v, ("s", j)) if box_state and _differentiable(v)
                                       else v for j, v in enumerate(s_vals)])
                ends, cots = [], []
                for t in range(start, stop):
                    xs = [leaf[t] for leaf in x_leaves]
                    for k in x_want:
                        xs[k] = box(xs[k], ("x", (t, k)))
                    out = fn(params, st, unflatten(x_def, xs))
                    if with_outputs:
                        st, y = out
                        if isbox(y) and y._trace == trace:
                            ends.append(y._node)
                            cots.append(g_ys[t])
                    else:
                        st = out
                out_leaves, out_def = flatten(st)
                if out_def != s_def:
                    out_leaves = flatten(conform(st, s_def))[0]
                for leaf, a in zip(out_leaves, adjoint):
                    if isbox(leaf) and leaf._trace == trace and a is not None:
                        ends.append(leaf._node)
                        cots.append(a)
            if checker is not None:
                checker.check(stop, [getval(v) for v in out_leaves])
            t1 = time.perf_counter()
            new_adjoint = [None] * len(s_vals)
            _backward(ends, cots, roots, deliver)
            if box_state:
                adjoint = [_zeros(v) if a is None else a
                           for a, v in zip(new_adjoint, s_vals)]
            stats.backward_seconds += time.perf_counter() - t1
            stats.tape_seconds += t1 - t0
            stats.taped_steps += stop - start

        executor.reverse = reverse
        checker = _Checker(executor, call) if self.verify else None
        if checker is None:
            executor.run(actions)
        else:
            for action in actions:
                checker.before(action)
                executor.apply(action)
                checker.after(action)
        executor.tracker.finish()
        stats.peak_snapshots = executor.tracker.peak_slots

        p_wanted = set(p_want)
        p_cots = [_zeros(v) if a is None and i in p_wanted else a
                  for i, (a, v) in enumerate(zip(p_acc, p_leaves))]
        x_cots = [x_bar.get(k) for k in range(len(x_leaves))]
        out = []
        for a in argnums:
            if a < n_p:
                out.append(groups[0].gather(a, p_cots))
            elif a < n_p + n_s:
                out.append(groups[1].gather(a - n_p, adjoint))
            else:
                out.append(groups[2].gather(a - n_p - n_s, x_cots))
        return tuple(out)


class CheckpointedLoop(_LoopBase):
    """``loop(params, init_state, inputs)`` driven by a schedule; see :func:`binomial_checkpoint`.

    ``schedule`` is any object with ``seq_len``, ``first_reverse_start``, ``plain_steps`` and
    ``__iter__`` yielding actions (:func:`bincheck.plan`, :class:`bincheck.EqualSegments`).
    """

    def __init__(self, fn: Callable, schedule: Any, with_outputs: bool = False,
                 verify: bool = False) -> None:
        _check_fn(fn, with_outputs)
        _check_bool("verify", verify)
        missing = [a for a in ("seq_len", "first_reverse_start", "plain_steps", "__iter__")
                   if not hasattr(schedule, a)]
        if missing:
            raise TypeError(f"schedule must be a plan such as bincheck.plan(seq_len, num_ckpts) "
                            f"(with seq_len, first_reverse_start, plain_steps and __iter__); got "
                            f"{schedule!r} of type {type(schedule).__name__}, lacking "
                            f"{', '.join(missing)}")
        self.verify = verify
        self.plan = schedule
        self.fn = fn
        self.seq_len = schedule.seq_len
        self.with_outputs = with_outputs
        self.stats = LoopStats()

    def __repr__(self) -> str:
        name = getattr(self.fn, "__name__", repr(self.fn))
        return f"CheckpointedLoop({name}, {self.plan!r}, with_outputs={self.with_outputs})"

    @property
    def predicted_plain_steps(self) -> int:
        """Plain evaluations of one gradient: the schedule's, plus the forward's tail to the end."""
        return self.plan.plain_steps + self.seq_len - self.plan.first_reverse_start

    def __call__(self, params: Any, init_state: Any, inputs: Any = None) -> Any:
        self._check_inputs(inputs)
        out = self._enter((params, init_state, inputs))
        if out is None:             # not being differentiated: just run the loop, keep nothing
            return self._run_plain(params, init_state, inputs)
        return out[0]

    def _check_inputs(self, inputs: Any) -> None:
        leaves = flatten(_values(inputs))[0]
        for k, leaf in enumerate(leaves):
            if leaf is ZERO:
                continue
            shape = np.shape(leaf)
            if len(shape) == 0 or shape[0] != self.seq_len:
                got = "a scalar" if len(shape) == 0 else f"leading length {shape[0]}"
                which = "" if len(leaves) == 1 else f" (leaf {k} of {len(leaves)})"
                raise ValueError(
                    f"inputs must have leading axis of length seq_len={self.seq_len} "
                    f"(step t receives inputs[t]); got {got}{which} (shape {shape})")

    def _run_plain(self, params, init_state, inputs):
        s_leaves, s_def = flatten(init_state)
        x_leaves, x_def = flatten(inputs)
        ys = _Outputs(self.seq_len) if self.with_outputs else None
        advance = self._make_advance(params, s_def, [np.shape(v) for v in s_leaves], x_leaves,
                                     x_def, LoopStats(), ys)
        state = advance(init_state, 0, self.seq_len)
        return (state, ys.buf) if self.with_outputs else state

    # ------------------------------------------------------------ primitive forward
    def derivative_schedule(self, call: _Call) -> Any:
        return self.plan

    def forward(self, call: _Call, args: tuple) -> Any:
        """Run the schedule up to its first ``Reverse`` (the first sweep), then to the end."""
        call.n = self.seq_len
        groups = call.groups
        p_args, s_args, x_args = call.split(args)
        p_leaves, s_leaves, x_leaves = (g.expand(a) for g, a in zip(groups, (p_args, s_args,
                                                                              x_args)))
        params = unflatten(groups[0].tree_def, p_leaves)
        ys = _Outputs(self.seq_len) if self.with_outputs else None   # from the first sweep
        stats = self.stats = LoopStats()
        advance = self._make_advance(params, groups[1].tree_def, [np.shape(v) for v in s_leaves],
                                     x_leaves, groups[2].tree_def, stats, ys)
        executor = Executor(self.seq_len, advance, None, unflatten(groups[1].tree_def, s_leaves))
        actions = iter(self.plan)
        for action in actions:
            if type(action) is Reverse:
                break
            executor.apply(action)
        final = advance(executor.live, action.start, self.seq_len)
        if not self.with_outputs:
            call.forward = (executor, itertools.chain((action,), actions))
            return final
        stacked = ys.buf
        # Recomputations in the reverse sweep must not collect outputs again.
        executor.advance = self._make_advance(params, groups[1].tree_def,
                                              [np.shape(v) for v in s_leaves], x_leaves,
                                              groups[2].tree_def, stats, None)
        call.forward = (executor, itertools.chain((action,), actions))
        return final, stacked



class WhileLoop(_LoopBase):
    """``run(params, init_state)``: see :func:`checkpointed_while_loop`."""

    def __init__(self, cond_fn: Callable, body_fn: Callable, num_ckpts: int,
                 max_steps: int | None = None, planner: Callable | None = None,
                 verify: bool = False) -> None:
        if not callable(cond_fn):
            raise TypeError(f"cond_fn must be callable as cond_fn(params, state) -> bool; "
                            f"got {cond_fn!r} of type {type(cond_fn).__name__}")
        if not callable(body_fn):
            raise TypeError(f"body_fn must be callable as body_fn(params, state) -> new_state; "
                            f"got {body_fn!r} of type {type(body_fn).__name__}")
        check_positive_int("num_ckpts", num_ckpts,
                           " (it counts stored states, the initial one included)")
        if max_steps is not None:
            if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 0:
                raise (TypeError if not isinstance(max_steps, int) or isinstance(max_steps, bool)
                       else ValueError)(
                    f"max_steps must be None (unbounded) or a non-negative int; got {max_steps!r}")
        _check_bool("verify", verify)
        if planner is not None and not callable(planner):
            raise TypeError(f"planner must be None or a callable returning an online planner; "
                            f"got {planner!r}")
        self.verify = verify
        self.cond_fn, self.body_fn = cond_fn, body_fn
        self.fn = lambda params, state, x: body_fn(params, state)
        self.num_ckpts, self.max_steps = num_ckpts, max_steps
        self.stats = LoopStats()
        self.num_steps: int | None = None       # steps taken by the last call
        # A factory of online planners (see bincheck.schedule.online); the default places
        # num_ckpts snapshots with binomial quality.
        self.make_planner = planner or (lambda: OnlinePlanner(num_ckpts))
        self.planner = None

    def derivative_schedule(self, call: _Call) -> Any:
        return Plan(call.n, self.num_ckpts)

    def __repr__(self) -> str:
        names = [getattr(f, "__name__", repr(f)) for f in (self.cond_fn, self.body_fn)]
        return (f"checkpointed_while_loop({names[0]}, {names[1]}, num_ckpts={self.num_ckpts}, "
                f"max_steps={self.max_steps})")

    def __call__(self, params: Any, init_state: Any) -> Any:
        out = self._enter((params, init_state, None))
        if out is None:             # not being differentiated: just run the loop, keep nothing
            return self._drive(params, init_state, None)[0]
        return out[0]

    def _drive(self, params, state, executor):
        """The while loop on plain values. With an executor, the online planner keeps snapshots.

        The executor's live state is the state before the latest step (the reversal starts from
        it); ``cur`` is the newest state. When the loop goes on, the planner may store the live
        state before it moves to ``cur``, which is handed over instead of recomputed.
        """
        s_leaves, s_def = flatten(state)
        s_shapes = [np.shape(v) for v in s_leaves]
        stats = self.stats = LoopStats()
        planner = self.planner = self.make_planner() if executor is not None else None
        if executor is not None:
            handoff = {}
            executor.advance = lambda live, start, stop: handoff.pop(start)
            executor.run(planner.start())
        n, cur = 0, state
        while self._keep_going(params, cur, n):
            if n == self.max_steps:
                raise RuntimeError(
                    f"checkpointed_while_loop: cond_fn is still true after max_steps="
                    f"{self.max_steps} steps; raise max_steps or pass max_steps=None (unbounded)")
            if n >= 1 and executor is not None:
                handoff[n - 1] = cur
                executor.run(planner.advance(n))
            t0 = time.perf_counter()
            cur = self._step(params, cur, None, n, s_def, s_shapes, None)[0]
            stats.plain_seconds += time.perf_counter() - t0
            stats.plain_steps += 1
            n += 1
        self.num_steps = n
        return cur, n

    def _keep_going(self, params, state, n: int) -> bool:
        verdict = self.cond_fn(params, state)
        try:
            return bool(verdict)
        except (TypeError, ValueError) as err:
            raise TypeError(f"cond_fn must return a bool; after {n} steps it returned "
                            f"{type(verdict).__name__} {np.shape(verdict)}: {err}") from None

    def forward(self, call: _Call, args: tuple) -> Any:
        groups = call.groups
        p_args, s_args, _ = call.split(args)
        p_leaves, s_leaves = groups[0].expand(p_args), groups[1].expand(s_args)
        groups[2].expand([])
        params = unflatten(groups[0].tree_def, p_leaves)
        state0 = unflatten(groups[1].tree_def, s_leaves)
        executor = Executor(None, None, None, state0)
        final, n = self._drive(params, state0, executor)
        # Re-advances in the reverse sweep are ordinary plain steps.
        executor.advance = self._make_advance(params, groups[1].tree_def,
                                              [np.shape(v) for v in s_leaves], [],
                                              groups[2].tree_def, self.stats, None)
        executor.tracker.end_forward(n)
        call.n = n
        call.forward = (executor, self.planner.reverse(n))
        return final


def _loop_forward(*args, call: _Call):
    t0 = time.perf_counter()
    out = call.pack(call.loop.forward(call, args))
    call.loop.stats.library_seconds += time.perf_counter() - t0   # forward resets stats
    return out


# --------------------------------------------------------------------------- higher order
#
# Let F(z) be the loop's (packed) output for z = (params, init_state, inputs), J(z) = dF/dz, and
# let the tangent loop be the loop over the JVP of one step,
#
#     f~(p, s, x; p., s., x.) = (f(p, s, x), df(p, s, x)[p., s., x.]),
#
# whose output is F~(z; z.) = (F(z), J(z) z.). It is an ordinary loop of the same length (states are
# pairs), so it is run with the same checkpoint schedule and the same machinery.
#
# * Forward mode:   dF(z)[z.] = second half of F~(z; z.): one tangent sweep, no snapshots of its
#   own (autograd has already run the primal forward, which keeps num_ckpts snapshots).
# * The VJP map V(z, g) = J(z)^T g is itself a primitive (_vjp_primitive). Its derivatives are
#   derived from <g, J(z) z.> = <(0, g), F~(z; z.)>, which is linear in z. and in g:
#     - reverse (VJP of V, cotangent z^ of its output): w.r.t. g it is J(z) z^ (forward mode);
#       w.r.t. z it is grad_z <g, J(z) z^> = the VJP of F~(. ; z^) with output cotangent (0, g).
#     - forward (JVP of V along (z., g.)): d/de J(z+e z.)^T (g + e g.) = J^T g. + grad_z <g, J z.>
#       = the VJP of F~(. ; z.) with output cotangent (g., g).
#   Both are gradients of the tangent loop, so they run with checkpoints and bounded memory; a
#   third order applies the same rules to the tangent loop's own primitives.

class _Zero:
    """A zero tangent that is never materialised (an unperturbed parameter or input)."""

    shape = ()

    def __getitem__(self, index):           # a zero input tangent sliced at step t
        return self

    def __repr__(self) -> str:
        return "ZERO"


ZERO = _Zero()


def _jvp_call(fn: Callable, args: tuple, tangents: tuple) -> tuple:
    """``fn(*args)`` and its directional derivative along ``tangents`` (trees, ZERO leaves)."""
    with trace_stack.new_trace() as trace:
        boxed = []
        for a, t in zip(args, tangents):
            leaves, d = flatten(a)
            t_leaves = flatten(t)[0] if t is not None else [ZERO] * len(leaves)
            boxed.append(unflatten(d, [
                new_box(v, trace, JVPNode.new_root(g)) if g is not ZERO and _differentiable(v)
                else v for v, g in zip(leaves, t_leaves)]))
        out = fn(*boxed)
        leaves, d = flatten(out)
        values, tans = [], []
        for leaf in leaves:
            if isbox(leaf) and leaf._trace == trace:
                values.append(leaf._value)
                tans.append(leaf._node.g)
            else:
                values.append(leaf)
                tans.append(ZERO)
    return unflatten(d, values), unflatten(d, tans)


def _zero_tangent(value: Any) -> Any:
    """A dense zero tangent with the shapes of ``value`` (float zeros for integer values)."""
    return _zeros(value) if _differentiable(value) else np.zeros(np.shape(value))


def _dense(value: Any, tangent: Any) -> Any:
    """A state tangent leaf as an array (state tangents must keep the state's shapes)."""
    return _zero_tangent(value) if tangent is ZERO else tangent


class _TangentStep:
    """f~: one step and its JVP; params (p, p.), state (s, s.), inputs (x, x.)."""

    def __init__(self, fn: Callable, with_outputs: bool) -> None:
        self.fn, self.with_outputs = fn, with_outputs

    def __call__(self, P, S, X):
        (p, tp), (s, ts), (x, tx) = P, S, X
        out, tout = _jvp_call(self.fn, (p, s, x), (tp, ts, tx))
        if self.with_outputs:
            (s1, y), (ts1, ty) = out, tout
        else:
            s1, ts1 = out, tout
        new_ts = unflatten(flatten(s1)[1], [_dense(v, t) for v, t in zip(flatten(s1)[0],
                                                                         flatten(ts1)[0])])
        if not self.with_outputs:
            return (s1, new_ts)
        ty = _zero_tangent(y) if ty is ZERO else ty
        return (s1, new_ts), anp.stack([y, ty])


class _VJPCall:
    """Context of one VJP map V(z, g) = J(z)^T g: the loop call, its argnums and arity."""

    __slots__ = ("call", "argnums", "n_args")

    def __init__(self, call: _Call, argnums: tuple, n_args: int) -> None:
        self.call, self.argnums, self.n_args = call, argnums, n_args

    def forward(self, args2: tuple) -> tuple:
        n = self.n_args
        return self.call.loop.reverse_sweep(self.call, self.argnums, args2[:n], args2[n:])

    def vjp_of_vjp(self, argnums2: tuple, args2: tuple) -> Callable:
        n, call = self.n_args, self.call

        def vjp(zhat):
            tangents = dict(zip(self.argnums, zhat))
            z_nums = [a for a in argnums2 if a < n]
            out = {}
            if z_nums:
                out.update(call.loop.tangent_vjp(call, args2[:n], tangents, z_nums, None,
                                                 args2[n:]))
            if any(a >= n for a in argnums2):
                tan = call.loop.tangent(call, tuple(tangents), tuple(tangents.values()),
                                        args2[:n])
                out.update({n + i: t for i, t in enumerate(tan)})
            return tuple(out[a] for a in argnums2)

        return vjp

    def jvp_of_vjp(self, argnums2: tuple, gs2: tuple, args2: tuple) -> Any:
        n, call = self.n_args, self.call
        tangents = {a: g for a, g in zip(argnums2, gs2) if a < n}
        gdot = {a - n: g for a, g in zip(argnums2, gs2) if a >= n}
        res = call.loop.tangent_vjp(call, args2[:n], tangents, list(self.argnums), gdot,
                                    args2[n:])
        return tuple(res[a] for a in self.argnums)


def _interleave(a, b):
    """Stack per-step arrays a, b of shape (T, ...) into (T, 2, ...), matching f~'s outputs."""
    return anp.stack([a, b], axis=1)


def _vjp_forward(*args2, call: _VJPCall):
    t0 = time.perf_counter()
    out = call.forward(args2)
    call.call.loop.stats.library_seconds += time.perf_counter() - t0
    return out


_loop_primitive = primitive(_loop_forward)
_vjp_primitive = primitive(_vjp_forward)
defvjp_argnums(_loop_primitive,
               lambda argnums, ans, args, kwargs: kwargs["call"].loop.make_vjp(
                   kwargs["call"], argnums, args))
defjvp_argnums(_loop_primitive,
               lambda argnums, gs, ans, args, kwargs: kwargs["call"].loop.tangent(
                   kwargs["call"], argnums, gs, args))
defvjp_argnums(_vjp_primitive,
               lambda argnums, ans, args, kwargs: kwargs["call"].vjp_of_vjp(argnums, args))
defjvp_argnums(_vjp_primitive,
               lambda argnums, gs, ans, args, kwargs: kwargs["call"].jvp_of_vjp(argnums, gs, args))


def binomial_checkpoint(fn: Callable, seq_len: int, num_ckpts: int,
                        with_outputs: bool = False, verify: bool = False) -> CheckpointedLoop:
    """Wrap ``fn(params, state, x) -> new_state`` into a loop differentiable with binomial checkpoints.

    ``loop = binomial_checkpoint(fn, seq_len, num_ckpts)``; ``loop(params, init_state, inputs)``
    returns the state after ``seq_len`` steps, step ``t`` receiving ``inputs[t]`` (each leaf's
    ``t``-th slice; ``x=None`` when ``inputs`` is None). With ``with_outputs=True`` ``fn`` returns
    ``(new_state, y)`` and the loop returns ``(final_state, ys)``, ``ys`` stacking the ``y``.

    ``num_ckpts`` counts the states held at once **including the initial state** (Revolve's
    convention): with ``seq_len=10, num_ckpts=1`` only the initial state is kept and every step is
    recomputed from it (45 plain steps); ``num_ckpts=3`` keeps the initial state plus two more (15
    plain steps); ``num_ckpts >= 10`` keeps every state (9 plain steps, no recomputation).

    A gradient runs ``fn`` exactly ``seq_len`` times under autograd's tape and
    ``t(seq_len, num_ckpts) + 1`` times on plain arrays (see :func:`bincheck.plan`), in a single
    reverse sweep whatever is differentiated. Outside any autograd trace it simply runs the loop.

    ``verify=True`` (a debugging aid, off by default) compares every recomputed state with the
    forward pass's where both exist and raises :class:`NondeterministicStepError` naming the
    steps if they differ (unseeded randomness, in-place mutation): a wrong gradient otherwise.
    """
    _check_fn(fn, with_outputs)
    return CheckpointedLoop(fn, Plan(seq_len, num_ckpts), with_outputs, verify)


def checkpointed_while_loop(cond_fn: Callable, body_fn: Callable, num_ckpts: int,
                            max_steps: int | None = None, verify: bool = False) -> WhileLoop:
    """A ``while cond_fn(params, state): state = body_fn(params, state)`` loop, differentiable with
    at most ``num_ckpts`` stored states (the initial one included) whatever its length.

    ``run = checkpointed_while_loop(cond_fn, body_fn, num_ckpts)``; ``run(params, init_state)``
    returns the final state. ``cond_fn`` is evaluated on plain values and not differentiated.
    Snapshots are placed online (see :mod:`bincheck.schedule.online`); each step runs once in the
    forward. ``max_steps=None`` means unbounded; otherwise a loop whose ``cond_fn`` is still true
    after ``max_steps`` steps raises RuntimeError. ``run.num_steps`` is the last call's length.
    ``verify=True``: as for :func:`binomial_checkpoint`.
    """
    return WhileLoop(cond_fn, body_fn, num_ckpts, max_steps, verify=verify)
