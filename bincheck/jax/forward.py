"""The checkpointed loop with forward mode too: one hijax primitive carrying both derivatives.

A ``jax.custom_vjp`` function has no forward mode (``jax.jvp`` of it raises "can't apply
forward-mode autodiff (jvp) to a custom_vjp function"), and ``jax.custom_jvp`` would derive the
reverse mode by transposing the tangent loop, which keeps every step. A hijax primitive
(``jax.experimental.hijax.VJPHiPrimitive``, experimental) carries both rules side by side:

* ``expand`` (evaluation, lowering): the plain ``lax.scan`` of :func:`.sweep.scan_plain`;
* ``vjp_fwd`` / ``vjp_bwd_retval`` (``grad``, ``vjp``): :func:`.sweep.forward_sweep` and
  :func:`.sweep.reverse_sweep`, the same checkpointed sweeps as the ``custom_vjp`` of
  :func:`.sweep.build` (same tables, same evaluation counts: ``plain_steps + seq_len``);
* ``jvp`` (``jax.jvp``, ``jacfwd``): the tangent loop, one ``lax.scan`` over ``(h, dh)`` with the
  step under ``jax.jvp`` -- ``seq_len`` evaluations, nothing stored (constant memory);
* ``lin`` / ``linearized`` (``jax.linearize``): keep the primal inputs, evaluate the loop, and
  run the tangent loop again (recomputing the states) each time the linear map is applied;
* ``batch_dim_rule`` (``vmap``): every output batched along axis 0; JAX then vmaps the rules
  (``jax.linearize`` of a vmapped loop is not supported: JAX's batched primitive has no
  ``lin``; ``jax.jvp`` / ``jacfwd`` of it are).

Not supported, as with the ``custom_vjp``: ``grad`` of ``grad`` (the reverse sweep's loops have
trip counts known only at run time; the sweep is wrapped by :func:`.first_order.first_order`,
which raises :class:`.first_order.SecondOrderError` saying so). Under ``jax.checkpoint`` JAX
asks for the forward-mode rule and transposes it (store-all): ``jvp`` warns
(:class:`RematWarning`) when it sees that on the call stack. ``grad`` of ``jvp`` works but is
JAX's own reverse mode of the tangent scan, which stores every step.

Only inputs with a nonzero tangent are differentiated in the tangent loop (symbolic zeros are
kept symbolic where they enter, and instantiated only for the carried state), as the reverse
sweep computes no cotangent for an input nobody differentiates.

:func:`checkpointed` feature-detects the API (:data:`HIJAX`) and falls back to the
``custom_vjp`` of :func:`.sweep.build` where it is missing (jax < 0.8.1): there reverse mode
and ``jvp(grad)`` work but ``jax.jvp`` of the loop raises JAX's ``custom_vjp`` error.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import jax
from jax import lax

from .boundary import Flat, _pick, _put
from .first_order import first_order
from .sweep import Wanted, build, routed_forward, routed_reverse, scan_plain
from .tables import Tables

try:        # experimental: public in jax.experimental.hijax since jax 0.8.1
    from jax.experimental.hijax import (ShapedArray, VJPHiPrimitive, Zero,
                                        instantiate_zeros)
except ImportError:     # pragma: no cover - older jax: the custom_vjp fallback
    VJPHiPrimitive = None

#: Whether this jax has the hijax primitive API, so that :func:`checkpointed` gives forward mode.
HIJAX = VJPHiPrimitive is not None


def checkpointed(flat: Flat, tables: Tables, hijax: bool | None = None,
                 route: Any = None) -> Any:
    """``loop(P, h0, xs, tabs) -> (h_T, ys)`` on flat leaf lists, as :func:`.sweep.build`; with
    forward mode too where the hijax API exists (``hijax=None``: detect; ``False``: the
    ``custom_vjp`` of :func:`.sweep.build`)."""
    if hijax is None:
        hijax = HIJAX
    if not hijax:
        return build(flat, tables, route)
    if not HIJAX:
        raise RuntimeError(f"hijax=True needs jax.experimental.hijax.VJPHiPrimitive "
                           f"(jax >= 0.8.1); this is jax {jax.__version__}")
    spec = _Spec(flat, tables, route)

    def loop(P: list, h0: list, xs: list, tabs: tuple) -> tuple[list, list]:
        args = (list(P), list(h0), list(xs), tuple(tabs))
        return _Loop(spec, jax.tree.map(jax.typeof, args))(*args)
    return loop


class _Spec:
    """The primitive's static parameter: one call's step and tables, hashed by identity."""

    __slots__ = ("flat", "tables", "route")

    def __init__(self, flat: Flat, tables: Tables, route: Any = None) -> None:
        # route: static segments' choice, see sweep.routed_forward
        self.flat, self.tables, self.route = flat, tables, route

    def __repr__(self) -> str:
        return f"seq_len={self.tables.seq_len}, slots={self.tables.slots}"


class RematWarning(UserWarning):
    """A bincheck loop differentiated inside ``jax.checkpoint``: its gradient stores every step."""


REMAT_WARNING = (
    "a bincheck.jax loop (binomial_checkpoint / scan) is differentiated inside jax.checkpoint "
    "(remat): JAX then differentiates it through its forward-mode rule (the tangent loop) and "
    "transposes that, which stores every step's state; num_ckpts= / memory= are ignored and the "
    "checkpointed sweep never runs (the gradient is right, its memory is store-all's). Call the "
    "loop outside jax.checkpoint (it checkpoints itself) and put jax.checkpoint around the code "
    "beside it")


def _linearized_under_remat() -> bool:
    """Whether JAX's remat rule (``jax.checkpoint``) is asking for the loop's forward-mode rule
    on its way to a reverse mode (``grad``, ``vjp``, ``linearize``): both are on the call stack.
    Read from the stack, as JAX says nothing else to a primitive: with other JAX internals this
    answers False (no warning), never a false alarm for ``jax.jvp`` alone."""
    frame, remat, linearize = sys._getframe(1), False, False
    while frame is not None:
        code = frame.f_code
        if "jax" in code.co_filename:
            remat = remat or (code.co_name == "remat_jvp" and
                              code.co_filename.endswith("ad_checkpoint.py"))
            linearize = linearize or "linearize" in code.co_name
        frame = frame.f_back
    return remat and linearize


def _outside_jax() -> int:
    """The ``stacklevel`` of the caller's first frame outside jax and bincheck.jax, so that a
    warning names the user's line (the ``jax.grad`` call), not JAX's internals."""
    frame, level = sys._getframe(2), 2          # 1: warnings.warn's caller (jvp), 2: its caller
    while frame is not None and ("jax" in frame.f_code.co_filename.replace("\\", "/")
                                 .split("/site-packages/")[-1].split("/")[0] or
                                 "bincheck/jax" in frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return level


def _is_zero(t: Any) -> bool:
    return isinstance(t, Zero)


def _zero_like(v: Any) -> Any:
    return Zero(jax.typeof(v).to_tangent_aval())


def tangent_loop(flat: Flat, T: int, P: list, h0: list, xs: list, dP: list, dh0: list,
                 dxs: list) -> tuple[tuple[list, list], tuple[list, list]]:
    """Forward mode: one ``lax.scan`` over ``(h, dh)`` with the step under ``jax.jvp`` (one
    evaluation per step, nothing stored). Tangents may be symbolic zeros; returns
    ``((h_T, ys), (dh_T, dys))`` with symbolic zeros for the integer outputs."""
    p_on = [m and not _is_zero(t) for t, m in zip(dP, flat.p_diff)]
    x_on = [m and not _is_zero(t) for t, m in zip(dxs, flat.x_diff)]
    dp = _pick(dP, p_on)
    dh = [instantiate_zeros(t) for t, m in zip(dh0, flat.h_diff) if m]

    def body(carry: tuple, x_pair: tuple) -> tuple:
        h, dh = carry
        x, dx = x_pair

        def step(pd: list, hd: list, xd: list) -> tuple:
            new, y = flat.full(_put(P, p_on, pd), _put(h, flat.h_diff, hd), _put(x, x_on, xd))
            return (_pick(new, flat.h_diff), _pick(y, flat.y_diff)), (new, y)
        _, (dnew, dy), (new, y) = jax.jvp(
            step, (_pick(P, p_on), _pick(h, flat.h_diff), _pick(x, x_on)), (dp, dh, dx),
            has_aux=True)
        return (new, dnew), (y, dy)
    (h, dh), (ys, dys) = lax.scan(body, (h0, dh), (xs, _pick(dxs, x_on)), length=T)
    dh = _put([_zero_like(v) for v in h], flat.h_diff, dh)
    dys = _put([_zero_like(v) for v in ys], flat.y_diff, dys)
    return (h, ys), (dh, dys)


if HIJAX:
    class _Loop(VJPHiPrimitive):
        """``(P, h0, xs, tabs) -> (h_T, ys)``: see the module docstring."""

        spec: _Spec

        def __init__(self, spec: _Spec, in_avals: tuple) -> None:
            flat, T = spec.flat, spec.tables.seq_len
            h_avals = in_avals[1]
            y_avals = [ShapedArray((T,) + tuple(s.shape), s.dtype)
                       for s in flat.y_shapes]
            self.in_avals = in_avals
            self.out_aval = (list(h_avals), y_avals)
            self.params = dict(spec=spec)
            super().__init__()

        def expand(self, P: list, h0: list, xs: list, tabs: tuple) -> tuple[list, list]:
            return scan_plain(self.spec.flat, self.spec.tables.seq_len, P, h0, xs)

        # ---------------------------------------------------------------- reverse mode
        def vjp_fwd(self, nzs_in: tuple, P: list, h0: list, xs: list, tabs: tuple) -> tuple:
            flat = self.spec.flat
            p_nz, _, x_nz, _ = nzs_in
            wanted = Wanted(tuple(bool(n) and m for n, m in zip(p_nz, flat.p_diff)),
                             tuple(bool(n) and m for n, m in zip(x_nz, flat.x_diff)))
            out, res = routed_forward(flat, self.spec.tables, self.spec.route, any(wanted.x),
                                      P, h0, xs, tabs)
            return out, (res, wanted)

        def vjp_bwd_retval(self, res: tuple, g: tuple) -> tuple:
            flat = self.spec.flat
            res, wanted = res
            g_h, g_ys = ([instantiate_zeros(c) for c, m in zip(cts, mask) if m]
                         for cts, mask in zip(g, (flat.h_diff, flat.y_diff)))
            def reverse(res: tuple, g_h: list, g_ys: list) -> tuple:
                return routed_reverse(flat, self.spec.tables, self.spec.route, any(wanted.x),
                                      res, g_h, g_ys, list(wanted.p), list(wanted.x))
            gP, gh, gx = first_order(reverse, "bincheck.jax.binomial_checkpoint / scan")(
                res, g_h, g_ys)
            return gP, gh, gx, (None,) * len(self.in_avals[3])

        # ---------------------------------------------------------------- forward mode
        def jvp(self, primals: tuple, tangents: tuple) -> tuple:
            if _linearized_under_remat():
                warnings.warn(REMAT_WARNING, RematWarning, stacklevel=_outside_jax())
            P, h0, xs, _ = primals
            dP, dh0, dxs, _ = tangents
            return tangent_loop(self.spec.flat, self.spec.tables.seq_len, P, h0, xs,
                                dP, dh0, dxs)

        def lin(self, nzs_in: tuple, P: list, h0: list, xs: list, tabs: tuple) -> tuple:
            return self(P, h0, xs, tabs), (P, h0, xs)

        def linearized(self, res: tuple, dP: list, dh0: list, dxs: list, dtabs: tuple) -> tuple:
            P, h0, xs = res
            return tangent_loop(self.spec.flat, self.spec.tables.seq_len, P, h0, xs,
                                dP, dh0, dxs)[1]

        # ---------------------------------------------------------------- vmap
        def batch_dim_rule(self, axis_data: Any, in_dims: tuple) -> tuple:
            return ([0] * len(self.out_aval[0]), [0] * len(self.out_aval[1]))
