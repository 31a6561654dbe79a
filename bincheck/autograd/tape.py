"""Taping one segment of steps and pulling cotangents back through it, once.

A segment is traced with one root node per differentiated array leaf and ended by a multi-output
backward pass (:func:`backward`), so no container boxes are built and no cotangent is computed for
a leaf nobody asked for (input slices are boxed only when ``inputs`` is differentiated). Parameter
cotangents are delivered as soon as each is complete, so the caller can add it into its
accumulator and free it before the next one is computed.

A segment taped with a guard counts its nodes as they are built (:class:`_MeteredNode`: one more
node, and the bytes of the array it computed, on the segment's :class:`Meter`). The probe reads
step 0's counts (its guard only counts, :func:`count_only`); under a memory budget a
:class:`~.budgets.TapeGuard` sets the meter's cap from them, so a step that keeps a bigger tape
than the budget has room for is refused as the node that crosses the cap is built. Without a
guard (``num_ckpts``) segments use autograd's own nodes and count nothing.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from autograd.core import VJPNode, add_outgrads
from autograd.tracer import getval, isbox, new_box, notrace_primitives, trace_stack
from autograd.util import toposort

from ..tree import conform, describe, flatten, unflatten
from .boundary import InternalError, differentiable, expand_boxes, refuse_hidden_boxes
from .steps import PlainStepper, call_fn, freeze


class Meter:
    """What a taped segment's nodes have built: ``nodes``, and ``nbytes`` of the arrays they
    computed. Priced at ``node_bytes`` per node and ``ratio`` per array byte (zero unless a
    guard set them), a node that takes the price over ``cap`` calls ``over(meter)``, which
    raises."""

    __slots__ = ("nodes", "nbytes", "node_bytes", "ratio", "cap", "over")

    def __init__(self) -> None:
        self.nodes = self.nbytes = self.node_bytes = 0
        self.ratio, self.cap, self.over = 0.0, float("inf"), None

    @property
    def price(self) -> float:
        return self.node_bytes * self.nodes + self.ratio * self.nbytes


class _MeteredNode(VJPNode):
    """A tape node that counts itself on its segment's :class:`Meter` as it is built. autograd
    builds each node with the type of its first parent's node, so rooting a segment's trace on
    these counts every node of that trace, for one attribute and a few additions per node.
    Nodes are counted when built: one that a step builds and drops counts too."""

    __slots__ = ("meter",)

    def __init__(self, value: Any, fun: Any, args: Any, kwargs: Any, parent_argnums: Any,
                 parents: Any) -> None:
        VJPNode.__init__(self, value, fun, args, kwargs, parent_argnums, parents)
        m = self.meter = parents[0].meter
        m.nodes += 1
        if type(value) is _ndarray:
            m.nbytes += value.nbytes
        if m.node_bytes * m.nodes + m.ratio * m.nbytes > m.cap:
            m.over(m)

    def initialize_root(self, meter: Meter) -> None:      # VJPNode's, inlined: one per leaf
        self.parents, self.vjp, self.meter = [], _no_vjp, meter


_ndarray = np.ndarray


def _no_vjp(g: Any) -> tuple:
    return ()


# autograd looks its untraced primitives (shape queries, ...) up by node type: the same set.
notrace_primitives[_MeteredNode] = notrace_primitives[VJPNode]


def count_only(t: int, meter: Meter) -> None:
    """A guard for :func:`tape_segment` that refuses nothing: the segment's nodes only count."""


class _Sink:
    """A pseudo-node whose parents are all outputs of a taped segment (multi-output backward)."""

    __slots__ = ("parents", "vjp")

    def __init__(self, parents: list, cotangents: list) -> None:
        self.parents = parents
        self.vjp = lambda _: cotangents


def backward(ends: list, cotangents: list, roots: dict, deliver: Callable) -> None:
    """Pull ``cotangents`` back from the end nodes to the root nodes of one taped segment.

    ``deliver(roots[node], g)`` is called as soon as a root's cotangent is complete (toposort
    yields a node after all its consumers).
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


def accumulate(acc: Any, g: Any) -> Any:
    """acc + g, in place when both are plain arrays (``acc`` is always our own copy)."""
    if acc is None:
        # Keep g's memory layout: autograd's dot VJP returns transposed views, and adding
        # F-ordered contributions into a C-ordered accumulator is a cache-hostile strided add.
        return g.copy(order="K") if type(g) is np.ndarray else g
    if type(acc) is np.ndarray and type(g) is np.ndarray and acc.shape == g.shape:
        np.add(acc, g, out=acc)
        return acc
    return acc + g


class Segment:
    """A taped run of steps ``start..stop-1``: its roots (node -> where the root's cotangent
    goes), the plain input state leaves, the (boxed) output state leaves, and the nodes of the
    per-step outputs ``y`` by step. The adjoint is paired with it later (:func:`ends`), so a
    segment can be taped before its adjoint exists (the forward tapes the last one)."""

    __slots__ = ("start", "stop", "trace", "roots", "input_leaves", "output_leaves", "y_nodes",
                 "meter")

    def __init__(self, start: int, stop: int) -> None:
        self.start, self.stop = start, stop
        self.trace = None
        self.meter = Meter()      # what the segment's nodes built, all steps together
        self.roots: dict = {}
        self.input_leaves: list = []
        self.output_leaves: list = []
        self.y_nodes: list = []

    def output_values(self) -> list:
        return [getval(v) for v in self.output_leaves]

    def ends(self, adjoint: list, g_ys: Any) -> tuple[list, list]:
        """The end nodes of the tape and their cotangents: the state leaves' adjoint and each
        step's ``y`` cotangent. Refuses a structure mismatch instead of dropping a cotangent."""
        if len(self.output_leaves) != len(adjoint):
            raise InternalError(
                f"the taped state of steps {self.start}..{self.stop - 1} has "
                f"{len(self.output_leaves)} leaves but its adjoint {len(adjoint)}: refusing to "
                f"drop a cotangent")
        nodes, cots = [], []
        for t, k, node in self.y_nodes:
            nodes.append(node)
            cots.append(g_ys[k][t])
        for leaf, a in zip(self.output_leaves, adjoint):
            if a is not None and isbox(leaf) and leaf._trace == self.trace:
                nodes.append(leaf._node)
                cots.append(a)
        return nodes, cots


def tape_segment(stepper: PlainStepper, p_def: Any, p_leaves: list, p_box: list, state: Any,
                 box_state: bool, x_box: list, start: int, stop: int,
                 plain_outputs: bool = False, guard: Callable | None = None) -> Segment:
    """Tape steps ``start..stop-1`` from ``state``.

    Roots: ``("p", i)`` for params leaf ``i`` in ``p_box``, ``("s", j)`` for state leaf ``j``
    (when ``box_state``), ``("x", (t, k))`` for input leaf ``k`` at step ``t`` in ``x_box``.
    Unboxed leaves are handed to ``fn`` as the stepper's read-only views. Each step's ``y`` goes
    to the stepper's outputs (recorded if new, compared under ``verify=True``). With
    ``plain_outputs`` (the forward's taped last segment), a new step's ``y`` is first computed by
    ``output_fn`` on plain values and recorded, as in every other step of the forward, and the
    taped ``output_fn`` is the one its reversal needs: ``output_fn`` runs once plain and once
    taped per step, the documented contract.

    Each step's result is checked against the state's structure and shapes, as a plain step's
    is: a segment may be the only evaluation of a step. With ``guard``, the segment's nodes count
    themselves on its :class:`Meter`, and ``guard(t, meter)`` is called before each step; it may
    set the meter's cap for step ``t`` (:meth:`~.budgets.TapeGuard.segment`), which a node that
    crosses raises.
    """
    seg = Segment(start, stop)
    roots = seg.roots
    fn, s_def = stepper.fn, stepper.s_def
    with trace_stack.new_trace() as trace:
        seg.trace = trace

        meter = seg.meter

        def box(value: Any, where: tuple) -> Any:
            node = VJPNode.new_root() if guard is None else _MeteredNode.new_root(meter)
            roots[node] = where
            return new_box(value, trace, node)

        # Params get fresh roots at every step: each step's parameter cotangent is then complete
        # as soon as that step is pulled back, goes straight into the caller's accumulator and is
        # freed. (One root per segment would make autograd sum a whole segment's contributions
        # into an extra parameter-sized buffer at the root.)
        p_vals = list(p_leaves)
        s_vals = flatten(state)[0]
        seg.input_leaves = s_vals
        st = unflatten(s_def, [box(v, ("s", j)) if box_state and differentiable(v) else v
                               for j, v in enumerate(s_vals)])
        x_leaves = stepper.x_leaves
        for t in range(start, stop):
            if guard is not None:
                guard(t, meter)
            for i in p_box:
                p_vals[i] = box(p_leaves[i], ("p", i))
            params = unflatten(p_def, p_vals)
            xs = [leaf[t] for leaf in x_leaves]
            for k in x_box:
                xs[k] = box(xs[k], ("x", (t, k)))
            x = unflatten(stepper.x_def, xs)
            out = call_fn(fn, (params, st, x), t, stepper.label)
            y = None
            if stepper.with_outputs:
                st, y = out
            else:
                st = out
            # Container boxes (autograd.builtins containers under the tape) become plain
            # containers of element boxes, so the next step and the adjoint see array leaves.
            st = conform(expand_boxes(st), s_def)
            leaves, st_def = flatten(st)
            refuse_hidden_boxes(leaves, f"{stepper.label} (taped step {t}) returned", {trace})
            if st_def != s_def:
                raise ValueError(
                    f"{stepper.label} must return a state with the structure of its input state; "
                    f"taped step {t} got {describe(s_def)} and returned {describe(st_def)} "
                    f"(refusing to drop a cotangent; if {stepper.label} builds its state "
                    f"differently under autograd's tape, build it the same way on plain arrays)")
            shapes = [np.shape(getval(v)) for v in leaves]
            if shapes != stepper.s_shapes:
                raise ValueError(
                    f"{stepper.label} must return state arrays of the shapes it received; step "
                    f"{t} got shapes {stepper.s_shapes} and returned {shapes}")
            if stepper.output_fn is not None:
                if plain_outputs:
                    plain_st = freeze(unflatten(s_def, [getval(v) for v in flatten(st)[0]]))
                    stepper.record_output(plain_st, t, stepper.x_at(t))
                y = call_fn(stepper.output_fn, (params, st, x), t, "output_fn")
            if y is not None:
                y = expand_boxes(y)
                refuse_hidden_boxes(flatten(y)[0], f"step {t}'s output y is", {trace})
                if stepper.ys is not None:      # records the forward's, or compares (verify)
                    stepper.ys.add(t, y)
                for k, leaf in enumerate(flatten(y)[0]):
                    if isbox(leaf) and leaf._trace == trace:
                        seg.y_nodes.append((t, k, leaf._node))
        seg.output_leaves = flatten(st)[0]
    return seg
