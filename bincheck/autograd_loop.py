"""The autograd adapter: a checkpointed loop as one autograd primitive (the only autograd import).

Model: autograd's ``misc/fixed_points.py`` writes a whole loop as one primitive with its own VJP.
Here the primitive's arguments are the leaves of ``(params, init_state, inputs)``; its forward runs
the plan's first sweep on plain arrays, keeping the snapshots the plan asks for; the VJP closure
replays the rest of the plan, taping one segment at a time, and returns the cotangents of every
requested leaf from that single sweep (``defvjp_argnums``, not one sweep per argument).

Measured pitfalls this module is shaped around (see DESIGN.md):

* autograd calls the VJP *maker* while building the node in the forward pass: the maker only
  captures references, all work happens in the returned closure.
* a taped step is traced with one root node per differentiated leaf and a custom multi-output
  backward pass, so no container boxes are built and no cotangent is computed for a leaf nobody
  asked for (the inputs' slices are only boxed when ``inputs`` is differentiated).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from autograd.core import VJPNode, add_outgrads, defvjp_argnums, vspace
from autograd.builtins import DictBox, SequenceBox
from autograd.tracer import isbox, new_box, primitive, trace_stack
from autograd.util import toposort

from .executor import Executor
from .schedule.actions import Reverse
from .schedule.binomial import Plan
from .tree import describe, flatten, unflatten


def _open_boxes(tree: Any) -> Any:
    """Turn autograd container boxes (a differentiated tuple/list/dict) into containers of boxes.

    autograd boxes a whole tuple when the user differentiates with respect to it; indexing the box
    (recorded on the user's trace, once per call) exposes each leaf to the primitive.
    """
    t = type(tree)
    if t is SequenceBox:
        kind = type(tree._value)
        items = [_open_boxes(tree[i]) for i in range(len(tree._value))]
        return kind(*items) if hasattr(kind, "_fields") else kind(items)
    if t is DictBox:
        return {k: _open_boxes(tree[k]) for k in tree._value}
    if t is tuple or t is list:
        return t(_open_boxes(c) for c in tree)
    if t is dict:
        return {k: _open_boxes(v) for k, v in tree.items()}
    return tree


class _Sink:
    """A pseudo-node whose parents are all outputs of a taped segment (multi-output backward)."""

    __slots__ = ("parents", "vjp")

    def __init__(self, parents: list, cotangents: list) -> None:
        self.parents = parents
        self.vjp = lambda _: cotangents


def _backward(ends: list, cotangents: list, roots: set) -> dict:
    """Pull ``cotangents`` back from the end nodes; return {root node: its total cotangent}."""
    if not ends:
        return {}
    sink = _Sink(ends, cotangents)
    outgrads: dict = {sink: (None, False)}
    found = {}
    for node in toposort(sink):
        outgrad = outgrads.pop(node)
        if node in roots:
            found[node] = outgrad[0]
            continue
        for parent, ingrad in zip(node.parents, node.vjp(outgrad[0])):
            outgrads[parent] = add_outgrads(outgrads.get(parent), ingrad)
    return found


class _Call:
    """Everything one call of a loop needs, shared by the primitive's forward and its VJP maker."""

    __slots__ = ("loop", "p_def", "s_def", "x_def", "n_p", "n_s", "forward")

    def __init__(self, loop, p_def, s_def, x_def, n_p, n_s) -> None:
        self.loop, self.p_def, self.s_def, self.x_def = loop, p_def, s_def, x_def
        self.n_p, self.n_s = n_p, n_s
        self.forward = None      # (executor, pending Reverse, rest of the actions), until used

    def split(self, leaves):
        n_p, n_s = self.n_p, self.n_s
        return leaves[:n_p], leaves[n_p:n_p + n_s], leaves[n_p + n_s:]


def _check_fn(fn: Any, with_outputs: Any) -> None:
    if not callable(fn):
        raise TypeError(f"fn must be callable as fn(params, state, x) -> new_state; "
                        f"got {fn!r} of type {type(fn).__name__}")
    if not isinstance(with_outputs, bool):
        raise TypeError(f"with_outputs must be a bool; got {with_outputs!r}")


@dataclass
class LoopStats:
    """What the last gradient (forward + reverse) of a loop did, counted and timed by the library.

    ``plain_steps`` / ``taped_steps`` count ``fn`` evaluations; the times are seconds spent in
    plain steps, in taped steps (building the tape) and in backward passes over those tapes.
    Whatever else a gradient costs is bookkeeping (planning, executor, pytree handling).
    """

    plain_steps: int = 0
    taped_steps: int = 0
    plain_seconds: float = 0.0
    tape_seconds: float = 0.0
    backward_seconds: float = 0.0


class CheckpointedLoop:
    """``loop(params, init_state, inputs)`` driven by a schedule; see :func:`binomial_checkpoint`.

    ``schedule`` is any object with ``seq_len``, ``first_reverse_start`` and ``__iter__`` yielding
    actions (e.g. :func:`bincheck.plan` or :class:`bincheck.schedule.EqualSegments`).
    """

    def __init__(self, fn: Callable, schedule: Any, with_outputs: bool = False) -> None:
        _check_fn(fn, with_outputs)
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

    # ---------------------------------------------------------------- entry point
    def __call__(self, params: Any, init_state: Any, inputs: Any = None) -> Any:
        params, init_state, inputs = (_open_boxes(params), _open_boxes(init_state),
                                      _open_boxes(inputs))
        p_leaves, p_def = flatten(params)
        s_leaves, s_def = flatten(init_state)
        x_leaves, x_def = flatten(inputs)
        self._check_inputs(x_leaves, inputs)
        leaves = p_leaves + s_leaves + x_leaves
        if not any(isbox(leaf) for leaf in leaves):
            # Not being differentiated: just run the loop, keep nothing.
            return self._run_plain(params, init_state, x_leaves, x_def, s_def)
        call = _Call(self, p_def, s_def, x_def, len(p_leaves), len(s_leaves))
        # Hand back the same containers the plain loop returns (tuples of boxes, not a box of a
        # tuple), so user code that unpacks or type-checks the result works unchanged.
        return _open_boxes(_loop_primitive(*leaves, call=call))

    def _check_inputs(self, x_leaves: list, inputs: Any) -> None:
        for leaf in x_leaves:
            shape = np.shape(leaf)
            if len(shape) == 0 or shape[0] != self.seq_len:
                got = "a scalar" if len(shape) == 0 else f"leading length {shape[0]}"
                raise ValueError(
                    f"inputs must have leading axis of length seq_len={self.seq_len} "
                    f"(step t receives inputs[t]); got {got} (shape {shape})")

    # ---------------------------------------------------------------- plain steps
    def _step(self, params, state, x, t: int, s_def, s_shapes, y_shape):
        """One plain step with the structure checks that keep snapshots interchangeable."""
        out = self.fn(params, state, x)
        y = None
        if self.with_outputs:
            if not (type(out) in (tuple, list) and len(out) == 2):
                raise TypeError(
                    f"with_outputs=True: fn must return a 2-tuple (new_state, y); step {t} "
                    f"returned {type(out).__name__}"
                    f"{' of length %d' % len(out) if isinstance(out, (tuple, list)) else ''}")
            out, y = out
            if y_shape is not None and np.shape(y) != y_shape:
                raise ValueError(f"with_outputs=True: every y must have the same shape; step {t} "
                                 f"returned shape {np.shape(y)}, step 0 returned {y_shape}")
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
        return out, y

    def _run_plain(self, params, init_state, x_leaves, x_def, s_def):
        s_shapes = [np.shape(leaf) for leaf in flatten(init_state)[0]]
        state, ys, y_shape = init_state, [], None
        for t in range(self.seq_len):
            x = unflatten(x_def, [leaf[t] for leaf in x_leaves])
            state, y = self._step(params, state, x, t, s_def, s_shapes, y_shape)
            if self.with_outputs:
                y_shape = np.shape(y)
                ys.append(y)
        return (state, np.stack(ys)) if self.with_outputs else state

    # ---------------------------------------------------------------- primitive forward
    def forward(self, call: _Call, leaves: tuple) -> Any:
        """Run the plan up to its first ``Reverse`` (the first sweep) and the last step."""
        p_leaves, s_leaves, x_leaves = call.split(leaves)
        params = unflatten(call.p_def, p_leaves)
        s_shapes = [np.shape(leaf) for leaf in s_leaves]
        ys: list = []         # filled by the first sweep only (each step once, in order)
        y_shape: list = [None]
        stats = self.stats = LoopStats()

        def advance(state, start, stop):
            t0 = time.perf_counter()
            for t in range(start, stop):
                x = unflatten(call.x_def, [leaf[t] for leaf in x_leaves])
                state, y = self._step(params, state, x, t, call.s_def, s_shapes, y_shape[0])
                if collect and t == len(ys):
                    y_shape[0] = np.shape(y)
                    ys.append(y)
            stats.plain_seconds += time.perf_counter() - t0
            stats.plain_steps += stop - start
            return state

        collect = self.with_outputs

        executor = Executor(self.seq_len, advance, None, unflatten(call.s_def, s_leaves))
        actions = iter(self.plan)
        for action in actions:
            if type(action) is Reverse:
                break
            executor.apply(action)
        # The first sweep stops where the first Reverse starts; the output needs the rest too.
        final = advance(executor.live, action.start, self.seq_len)
        call.forward = (executor, action, actions)
        if not self.with_outputs:
            return final
        collect = False       # recomputations in the reverse sweep drop their outputs
        stacked = np.stack(ys)
        ys.clear()
        return final, stacked

    # ---------------------------------------------------------------- VJP
    def make_vjp(self, call: _Call, argnums: tuple, leaves: tuple) -> Callable:
        fn, with_outputs = self.fn, self.with_outputs
        p_leaves, s_leaves, x_leaves = call.split(leaves)
        n_p, n_s = call.n_p, call.n_s
        want = set(argnums)
        p_want = [i for i in range(n_p) if i in want]
        s_want = any(n_p + j in want for j in range(n_s))
        x_want = [k for k in range(len(x_leaves)) if n_p + n_s + k in want]

        def vjp(g):
            if call.forward is None:          # a second VJP call (e.g. jacobian): redo sweep 1
                self.forward(call, leaves)
            executor, pending, actions = call.forward
            call.forward = None               # the sweep consumes the snapshots; let them go
            if with_outputs:
                g_state, g_ys = g
            else:
                g_state, g_ys = g, None
            adjoint = flatten(g_state)[0]
            p_acc: dict[int, Any] = {}
            x_bar = {k: vspace(x_leaves[k]).zeros() for k in x_want}

            stats = self.stats

            def reverse(state, start, stop):
                nonlocal adjoint
                t0 = time.perf_counter()
                with trace_stack.new_trace() as trace:
                    roots = set()

                    def box(value):
                        node = VJPNode.new_root()
                        roots.add(node)
                        return new_box(value, trace, node)

                    p_boxes = {i: box(p_leaves[i]) for i in p_want}
                    params = unflatten(call.p_def, [p_boxes.get(i, v) for i, v in
                                                    enumerate(p_leaves)])
                    s_vals = flatten(state)[0]
                    s_boxes = ([box(v) for v in s_vals] if start > 0 or s_want else None)
                    st = unflatten(call.s_def, s_boxes if s_boxes is not None else s_vals)
                    ends, cots, x_boxes = [], [], []
                    for t in range(start, stop):
                        xs = [leaf[t] for leaf in x_leaves]
                        for k in x_want:
                            xs[k] = box(xs[k])
                            x_boxes.append((t, k, xs[k]))
                        out = fn(params, st, unflatten(call.x_def, xs))
                        if with_outputs:
                            st, y = out
                            if isbox(y) and y._trace == trace:
                                ends.append(y._node)
                                cots.append(g_ys[t])
                        else:
                            st = out
                    for leaf, a in zip(flatten(st)[0], adjoint):
                        if isbox(leaf) and leaf._trace == trace:
                            ends.append(leaf._node)
                            cots.append(a)
                t1 = time.perf_counter()
                found = _backward(ends, cots, roots)
                stats.backward_seconds += time.perf_counter() - t1
                stats.tape_seconds += t1 - t0
                stats.taped_steps += stop - start
                for i, b in p_boxes.items():
                    gi = found.get(b._node)
                    if gi is not None:
                        p_acc[i] = gi if i not in p_acc else p_acc[i] + gi
                for t, k, b in x_boxes:
                    gx = found.get(b._node)
                    if gx is not None:
                        x_bar[k][t] = gx
                if s_boxes is not None:
                    adjoint = [found[b._node] if b._node in found else vspace(v).zeros()
                               for b, v in zip(s_boxes, s_vals)]

            executor.reverse = reverse
            executor.apply(pending)
            executor.run(actions)
            executor.tracker.finish()
            out = []
            for a in argnums:
                if a < n_p:
                    out.append(p_acc[a] if a in p_acc else vspace(p_leaves[a]).zeros())
                elif a < n_p + n_s:
                    out.append(adjoint[a - n_p])
                else:
                    out.append(x_bar[a - n_p - n_s])
            return tuple(out)

        return vjp


def _loop_forward(*leaves, call: _Call):
    return call.loop.forward(call, leaves)


_loop_primitive = primitive(_loop_forward)
defvjp_argnums(_loop_primitive,
               lambda argnums, ans, args, kwargs: kwargs["call"].loop.make_vjp(
                   kwargs["call"], argnums, args))


def binomial_checkpoint(fn: Callable, seq_len: int, num_ckpts: int,
                        with_outputs: bool = False) -> CheckpointedLoop:
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
    """
    _check_fn(fn, with_outputs)
    return CheckpointedLoop(fn, Plan(seq_len, num_ckpts), with_outputs)
