"""Forward mode and higher-order derivatives of a checkpointed loop, via the *tangent loop*.

Let F(z) be the loop's (packed) output for z = (params, init_state, inputs), J(z) = dF/dz, and let
the tangent loop be the loop over the JVP of one step,

    f~(p, s, x; p., s., x.) = (f(p, s, x), df(p, s, x)[p., s., x.]),

whose output is F~(z; z.) = (F(z), J(z) z.). It is an ordinary loop of the same length (states are
pairs), so it runs with the same checkpoint schedule and the same machinery.

* Forward mode:   dF(z)[z.] = second half of F~(z; z.): one tangent sweep, no snapshots of its
  own (autograd has already run the primal forward).
* The VJP map V(z, g) = J(z)^T g is itself a primitive (see :mod:`.primitives`). Its derivatives
  follow from <g, J(z) z.> = <(0, g), F~(z; z.)>, which is linear in z. and in g:
    - reverse (VJP of V, cotangent z^ of its output): w.r.t. g it is J(z) z^ (forward mode);
      w.r.t. z it is grad_z <g, J(z) z^> = the VJP of F~(. ; z^) with output cotangent (0, g).
    - forward (JVP of V along (z., g.)): d/de J(z+e z.)^T (g + e g.) = J^T g. + grad_z <g, J z.>
      = the VJP of F~(. ; z.) with output cotangent (g., g).
  Both are gradients of the tangent loop, so they run with checkpoints and bounded memory; a third
  order applies the same rules to the tangent loop's own primitives. Recomputation inside these
  derivatives carries the outer trace's dependencies because it starts from the (boxed) arguments,
  never from plain snapshots.

As in autograd's ``misc/fixed_points.py``, the rule calls the operator it belongs to: the tangent
loop comes from ``call.loop.derivative_loop(call)``, so this module never imports the front ends.
"""

from __future__ import annotations

from typing import Any, Callable

import autograd.numpy as anp
import numpy as np
from autograd.builtins import tuple as ag_tuple
from autograd.core import JVPNode, vspace
from autograd.core import make_vjp as _make_vjp
from autograd.tracer import isbox, new_box, trace_stack

from ..tree import LEAF, flatten, is_dict_kind, num_leaves, unflatten
from .boundary import Call, InternalError, differentiable, expand_boxes, zeros


class _Zero:
    """A zero tangent that is never materialised (an unperturbed parameter or input)."""

    shape = ()

    def __getitem__(self, index: Any) -> "_Zero":   # a zero input tangent sliced at step t
        return self

    def __repr__(self) -> str:
        return "ZERO"


ZERO = _Zero()


def aligned_tangents(treedef: Any, tangent: Any) -> list:
    """The tangent's leaves, one per leaf of the value with structure ``treedef``.

    A ZERO (or None) stands for a whole subtree: an argument that autograd boxed as one
    container (``grad`` w.r.t. a dict of weights) gets a single ZERO, whose value has many leaves.
    """
    if tangent is None or tangent is ZERO:
        return [ZERO] * num_leaves(treedef)
    if treedef is LEAF:
        return [tangent]
    kind, keys, children = treedef
    if is_dict_kind(kind):
        parts = [tangent[k] for k in keys]
    else:
        parts = list(tangent)
        if len(parts) != len(children):
            raise InternalError(f"a tangent has {len(parts)} children where its value has "
                                f"{len(children)}")
    return [leaf for c, part in zip(children, parts, strict=True)
            for leaf in aligned_tangents(c, part)]


def jvp_call(fn: Callable, args: tuple, tangents: tuple) -> tuple:
    """``fn(*args)`` and its directional derivative along ``tangents`` (trees, ZERO leaves)."""
    with trace_stack.new_trace() as trace:
        boxed = []
        for a, t in zip(args, tangents, strict=True):
            leaves, d = flatten(a)
            t_leaves = aligned_tangents(d, t)
            boxed.append(unflatten(d, [
                new_box(v, trace, JVPNode.new_root(g)) if g is not ZERO and differentiable(v)
                else v for v, g in zip(leaves, t_leaves, strict=True)]))
        leaves, d = flatten(expand_boxes(fn(*boxed)))
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
    return zeros(value) if differentiable(value) else np.zeros(np.shape(value))


def _dense(value: Any, tangent: Any) -> Any:
    """A state tangent leaf as an array (state tangents must keep the state's shapes)."""
    return _zero_tangent(value) if tangent is ZERO else tangent


def _pairs(y: Any, ty: Any) -> Any:
    """Per-step outputs of the tangent loop: each leaf of ``y`` stacked with its tangent."""
    y_leaves, y_def = flatten(y)
    return unflatten(y_def, [anp.stack([v, _zero_tangent(v) if t is ZERO else t])
                             for v, t in zip(y_leaves, aligned_tangents(y_def, ty), strict=True)])


class TangentStep:
    """f~: one step and its JVP; params (p, p.), state (s, s.), inputs (x, x.)."""

    def __init__(self, fn: Callable, with_outputs: bool) -> None:
        self.fn, self.with_outputs = fn, with_outputs

    def __call__(self, P: tuple, S: tuple, X: tuple) -> Any:
        (p, tp), (s, ts), (x, tx) = P, S, X
        out, tout = jvp_call(self.fn, (p, s, x), (tp, ts, tx))
        if self.with_outputs:
            (s1, y), (ts1, ty) = out, tout
        else:
            s1, ts1 = out, tout
        s1_leaves, s1_def = flatten(s1)
        new_ts = unflatten(s1_def, [_dense(v, t) for v, t in
                                    zip(s1_leaves, aligned_tangents(s1_def, ts1), strict=True)])
        if not self.with_outputs:
            return (s1, new_ts)
        return (s1, new_ts), _pairs(y, ty)


class TangentOutput:
    """The tangent loop's ``output_fn``: an output and its JVP, (y, y.) per leaf."""

    def __init__(self, output_fn: Callable) -> None:
        self.output_fn = output_fn

    def __call__(self, P: tuple, S1: tuple, X: tuple) -> Any:
        (p, tp), (s1, ts1), (x, tx) = P, S1, X
        return _pairs(*jvp_call(self.output_fn, (p, s1, x), (tp, ts1, tx)))


def tangent_inputs(call: Call, z_args: tuple, tangents: dict) -> list:
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
                t = unflatten(d, [_zero_tangent(leaf) if gi == 1 else ZERO for leaf in leaves])
            else:
                any_tangent = True
            tans.append(t)
        tree, ttree = unflatten(grp.arg_def, vals), unflatten(grp.arg_def, tans)
        trees.append((tree, ttree if gi != 2 or any_tangent else None))
        offset += grp.n_args
    return trees


def _tangent_outputs(call: Call, P: tuple, S: tuple, X: tuple) -> tuple:
    """Run the tangent loop: ((final state, its tangent), stacked (y, y.) or None)."""
    if call.n == 0:                          # a while loop that took no step
        return S, None
    out = call.loop.derivative_loop(call)(P, S, X)
    return out if call.loop.has_outputs else (out, None)


def tangent(call: Call, argnums: tuple, gs: tuple, args: tuple) -> tuple:
    """Forward mode: the output tangent (in the primitive's packed form) along ``gs``."""
    P, S, X = tangent_inputs(call, args, dict(zip(argnums, gs)))
    (final, dfinal), ys2 = _tangent_outputs(call, P, S, X)
    packed = tuple(t for t, v in zip(flatten(dfinal)[0], call.out_leaves) if differentiable(v))
    if not call.loop.has_outputs:
        return packed
    dys = [pair[:, 1] for pair in flatten(ys2)[0]]                       # (T, 2, ...) pairs
    return packed + tuple(d.copy() if type(d) is np.ndarray else d for d in dys)  # free them


def tangent_vjp(call: Call, z_args: tuple, tangents: dict, wrt: list, gdot: dict | None,
                g_args: tuple) -> dict:
    """grad over z[wrt] of <(g., g), F~(z; z.)> (g. = 0 when gdot is None), as {argnum: ...}.

    ``g_args`` is the loop's packed output cotangent g, ``gdot`` its tangent by packed index.
    """
    has_outputs = call.loop.has_outputs
    mask = [differentiable(v) for v in call.out_leaves]

    def F(zsel: tuple) -> Any:
        zz = list(z_args)
        for a, v in zip(wrt, zsel):
            zz[a] = v
        (final, dfinal), ys2 = _tangent_outputs(call, *tangent_inputs(call, zz, tangents))
        leaves = [v for v, m in zip(flatten(final)[0], mask) if m] + \
            [v for v, m in zip(flatten(dfinal)[0], mask) if m]
        return ag_tuple(leaves + (flatten(ys2)[0] if has_outputs else []))

    vjp, out = _make_vjp(F, tuple(z_args[a] for a in wrt))
    n_float = sum(mask)
    g_items = list(g_args)
    gd_items = [None] * len(g_items)
    for i, v in (gdot or {}).items():
        gd_items[i] = v
    cot = [gd_items[i] if gd_items[i] is not None else vspace(out[i]).zeros()
           for i in range(n_float)] + [g_items[i] for i in range(n_float)]
    for i in range(n_float, len(g_items)):       # per-step output leaves, if any
        g_ys = g_items[i]
        gd_ys = gd_items[i] if gd_items[i] is not None else vspace(g_ys).zeros()
        cot.append(anp.stack([gd_ys, g_ys], axis=1))   # (T, 2, ...), matching f~'s outputs
    return dict(zip(wrt, vjp(tuple(cot))))


class VJPCall:
    """Context of one VJP map V(z, g) = J(z)^T g: the loop call, its argnums and arity."""

    __slots__ = ("call", "argnums", "n_args")

    def __init__(self, call: Call, argnums: tuple, n_args: int) -> None:
        self.call, self.argnums, self.n_args = call, argnums, n_args

    def vjp_of_vjp(self, argnums2: tuple, args2: tuple) -> Callable:
        n, call = self.n_args, self.call

        def vjp(zhat: tuple) -> tuple:
            tangents = dict(zip(self.argnums, zhat))
            z_nums = [a for a in argnums2 if a < n]
            out = {}
            if z_nums:
                out.update(tangent_vjp(call, args2[:n], tangents, z_nums, None, args2[n:]))
            if any(a >= n for a in argnums2):
                tan = tangent(call, tuple(tangents), tuple(tangents.values()), args2[:n])
                out.update({n + i: t for i, t in enumerate(tan)})
            return tuple(out[a] for a in argnums2)

        return vjp

    def jvp_of_vjp(self, argnums2: tuple, gs2: tuple, args2: tuple) -> tuple:
        n, call = self.n_args, self.call
        tangents = {a: g for a, g in zip(argnums2, gs2) if a < n}
        gdot = {a - n: g for a, g in zip(argnums2, gs2) if a >= n}
        res = tangent_vjp(call, args2[:n], tangents, list(self.argnums), gdot, args2[n:])
        return tuple(res[a] for a in self.argnums)
