"""The checkpointed loop as one ``jax.custom_vjp`` primitive replaying compiled tables.

* Primal (no derivative wanted): a plain ``lax.scan``; nothing is stored.
* Forward (``fwd``): a ``lax.scan`` over the first ``seq_len - 1`` steps that writes the state
  before step ``t`` into slot ``store_slot[t]`` of a preallocated ``(slots + 1, *leaf)`` buffer per
  state leaf (the extra slot takes the writes of steps that store nothing, so the body has no
  branch), then the last step under ``jax.vjp``: the forward tapes it, as in every bincheck front
  end, so no plain step is wasted.
* Backward (``bwd``): the last step's pullback, then one ``lax.scan`` over the remaining steps in
  reverse order (``reverse=True``, so input cotangents are written in place). Reversing step ``j``
  restores slot ``restore_slot[j]``, advances with plain steps to ``j`` storing the snapshots its
  compressed row lists, and pulls the cotangent back through one taped step. Parameter
  cotangents accumulate in the carry.

The step is traced a fixed number of times whatever the length (the forward scan, the taped last
step, the advance and the taped step of the backward), and the tables are array operands, so the
program's size does not grow with ``seq_len``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero

from .boundary import Flat, _pick, _put
from .segments import from_windows, to_windows
from .tables import Tables


@jax.tree_util.register_static
class Wanted:
    """Which cotangents the reverse sweep computes, carried beside the residuals (static)."""

    __slots__ = ("p", "x")

    def __init__(self, p: tuple, x: tuple) -> None:
        self.p, self.x = p, x

    def __hash__(self) -> int:
        return hash((self.p, self.x))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Wanted) and (self.p, self.x) == (other.p, other.x)


def _zeros_like_diff(values: list, mask: list) -> list:
    return [jnp.zeros_like(v) for v, m in zip(values, mask) if m]


def _write(buf: list, slot: Any, h: list) -> list:
    return [lax.dynamic_update_index_in_dim(b, v, slot, 0) for b, v in zip(buf, h)]


def _read(buf: list, slot: Any) -> list:
    return [lax.dynamic_index_in_dim(b, slot, keepdims=False) for b in buf]


def _instantiate(cts: list, mask: list) -> list:
    """The cotangents of the differentiable outputs, symbolic zeros made real."""
    return [jnp.zeros(c.shape, c.dtype) if isinstance(c, SymbolicZero) else c
            for c, m in zip(cts, mask) if m]


def x_at(xs: list, t: Any) -> list:
    return [lax.dynamic_index_in_dim(v, t, keepdims=False) for v in xs]


def scan_plain(flat: Flat, T: int, P: list, h: list, xs: list) -> tuple[list, list]:
    """The loop without derivatives: a plain ``lax.scan``; nothing is stored."""
    def body(h: list, x: list) -> tuple[list, list]:
        return flat.full(P, h, x)
    return lax.scan(body, h, xs, length=T)


def _advance(flat: Flat, P: list, xs: list, h: list, start: Any, stop: Any) -> list:
    return lax.fori_loop(start, stop, lambda t, h: flat.state(P, h, x_at(xs, t)), h)


def _window(vs: list, lo: Any, L: int, T: int) -> list:
    """Rows ``lo .. lo+L-1`` of each leaf (clamped at ``T - 1``: rows past a segment's end are
    masked out by :func:`taped_segment`)."""
    rows = jnp.minimum(lo + jnp.arange(L), T - 1)
    return [jnp.take(v, rows, axis=0) for v in vs]


def _write_rows(bufs: list, lo: Any, m: Any, rows: list) -> list:
    """``bufs[lo + i] = rows[i]`` for ``i < m``, in place."""
    if not bufs:
        return bufs
    return lax.fori_loop(0, m, lambda i, b: _write(b, lo + i, [r[i] for r in rows]), bufs)


def taped_segment(flat: Flat, P: list, h: list, xwin: list, m: Any,
                  L: int) -> tuple[tuple[list, list], Any]:
    """Steps ``0 .. m-1`` of a window of ``L`` input rows under one ``jax.vjp`` (a scan of ``L``
    steps; a ``lax.cond`` skips those at or past ``m``, so their residuals are never computed):
    ``((h_end, ys window), pullback)`` as :meth:`Flat.taped` with ``whole``, the pullback on the
    differentiable leaves (``gy``: ``(L, ...)`` windows)."""
    pdiff, hdiff, xdiff, ydiff = flat.p_diff, flat.h_diff, flat.x_diff, flat.y_diff
    zeros_y = [jnp.zeros(s.shape, s.dtype) for s in flat.y_shapes]

    def f(pd: list, hd: list, xd: list) -> tuple:
        Pf, hf, xw = _put(P, pdiff, pd), _put(h, hdiff, hd), _put(xwin, xdiff, xd)

        def body(h: list, inp: tuple) -> tuple:
            i, x = inp
            return lax.cond(i < m, lambda h: flat.full(Pf, h, x), lambda h: (h, zeros_y), h)
        end, ys = lax.scan(body, hf, (jnp.arange(L), xw), length=L)
        return (_pick(end, hdiff), _pick(ys, ydiff)), (end, ys)

    pick = lambda v, mask: [a for a, k in zip(v, mask) if k]     # noqa: E731
    (end_d, ys_d), vjp, (end, ys) = jax.vjp(f, pick(P, pdiff), pick(h, hdiff),
                                            pick(xwin, xdiff), has_aux=True)
    return (_put(end, hdiff, end_d), _put(ys, ydiff, ys_d)), vjp


def _recompute(flat: Flat, P: list, xs: list, buf: list, tabs: tuple, e: Any,
               lo: Any) -> tuple[list, list]:
    """The state before step ``lo``, recomputed for the reverse of the segment ending at step
    ``e``: restore its slot, advance storing the snapshots its row of the tables lists, then
    advance to ``lo``. Returns ``(state, buf)``."""
    _, restore_slot, restore_index, snap_ptr, snap_pos, snap_slot = tabs[:6]

    def snap(q: Any, c: tuple) -> tuple:
        pos, h, buf = c
        target = snap_pos[q]
        h = _advance(flat, P, xs, h, pos, target)
        return target, h, _write(buf, snap_slot[q], h)
    pos, h, buf = lax.fori_loop(snap_ptr[e], snap_ptr[e + 1], snap,
                                (restore_index[e], _read(buf, restore_slot[e]), buf))
    return _advance(flat, P, xs, h, pos, lo), buf


def forward_sweep(flat: Flat, tables: Tables, P: list, h0: list, xs: list,
                  tabs: tuple) -> tuple:
    """The first sweep: ``((h_T, ys), residuals)``. Stores the states the tables name and tapes
    the last step (with kept segments: the last segment); the residuals are what
    :func:`reverse_sweep` takes."""
    if tables.max_seg > 1:
        return _forward_segments(flat, tables, P, h0, xs, tabs)
    T, S = tables.seq_len, tables.slots
    tabs = tuple(jnp.asarray(a) for a in tabs)
    store_slot = tabs[0]
    buf = [jnp.zeros((S + 1,) + v.shape, v.dtype) for v in h0]
    # ys and the input cotangents live in (T, ...) buffers written in place: slicing or
    # concatenating them would copy T steps' worth of bytes.
    ys = [jnp.zeros((T,) + y.shape, y.dtype) for y in flat.y_shapes]
    h = h0
    if T > 1:
        def body(t: Any, carry: tuple) -> tuple:
            h, buf, ys = carry
            slot = store_slot[t]
            buf = _write(buf, jnp.where(slot >= 0, slot, S), h)
            new, y = flat.full(P, h, x_at(xs, t))
            return new, buf, _write(ys, t, y)
        h, buf, ys = lax.fori_loop(0, T - 1, body, (h0, buf, ys))
    x_last = [v[T - 1] for v in xs]
    (new, y), pullback = flat.taped(P, h, x_last, whole=True)
    ys = _write(ys, T - 1, y)
    return (new, ys), (P, xs, buf, pullback, tabs)


def reverse_sweep(flat: Flat, tables: Tables, res: tuple, g_h: list, g_ys: list,
                  p_wanted: list, x_wanted: list) -> tuple[list, list, list]:
    """The reverse sweep from :func:`forward_sweep`'s residuals. ``g_h`` / ``g_ys``: the
    cotangents of the differentiable outputs (arrays); ``p_wanted`` / ``x_wanted``: per leaf of
    ``P`` / ``xs``, whether its cotangent is wanted (differentiable and perturbed). Returns the
    cotangents ``(gP, gh, gx)`` as full leaf lists, ``None`` where there is none."""
    if tables.max_seg > 1:
        return _reverse_segments(flat, tables, res, g_h, g_ys, p_wanted, x_wanted)
    T = tables.seq_len
    P, xs, buf, pullback, tabs = res
    # Nested in another loop's taped step, constant residuals come back as numpy literals,
    # which a traced index cannot subscript: make them arrays again.
    tabs = tuple(jnp.asarray(a) for a in tabs)
    gP, gh, gx_last = pullback((g_h, [c[T - 1] for c in g_ys]))
    p_want, x_want = _pick(p_wanted, flat.p_diff), _pick(x_wanted, flat.x_diff)
    gP = [v if w else None for v, w in zip(gP, p_want)]
    gx_last = [v if w else None for v, w in zip(gx_last, x_want)]
    gx = [jnp.zeros(v.shape, v.dtype) for v, w in zip(_pick(xs, flat.x_diff), x_want)
          if w]
    gx = _write(gx, T - 1, [v for v in gx_last if v is not None])
    if T > 1:
        def body(k: Any, carry: tuple) -> tuple:
            buf, gh, gP, gx = carry
            j = T - 2 - k
            h, buf = _recompute(flat, P, xs, buf, tabs, j, j)
            _, pb = flat.taped(P, h, x_at(xs, j))
            dP, gh, dx = pb((gh, x_at(g_ys, j)))
            gP = [a if a is None else a + b for a, b in zip(gP, dP)]
            gx = _write(gx, j, [v for v, w in zip(dx, x_want) if w])
            return buf, gh, gP, gx
        _, gh, gP, gx = lax.fori_loop(0, T - 1, body, (buf, gh, gP, gx))
    it = iter(gx)
    gx = [next(it) if w else None for w in x_want]
    none_p = [None] * len(P)
    return (_put(none_p, flat.p_diff, gP), _put([None] * len(flat.h), flat.h_diff, gh),
            _put([None] * len(flat.x), flat.x_diff, gx))


def _forward_segments(flat: Flat, tables: Tables, P: list, h0: list, xs: list,
                      tabs: tuple) -> tuple:
    """:func:`forward_sweep` for a plan with kept segments: plain steps up to ``first_lo``
    storing what the tables name, then the last segment taped."""
    T, S, L, lo = tables.seq_len, tables.slots, tables.max_seg, tables.first_lo
    tabs = tuple(jnp.asarray(a) for a in tabs)
    store_slot = tabs[0]
    buf = [jnp.zeros((S + 1,) + v.shape, v.dtype) for v in h0]
    ys = [jnp.zeros((T,) + y.shape, y.dtype) for y in flat.y_shapes]

    def body(t: Any, carry: tuple) -> tuple:
        h, buf, ys = carry
        slot = store_slot[t]
        buf = _write(buf, jnp.where(slot >= 0, slot, S), h)
        new, y = flat.full(P, h, x_at(xs, t))
        return new, buf, _write(ys, t, y)
    h = h0
    if lo > 0:                                  # else the whole loop is one taped segment
        h, buf, ys = lax.fori_loop(0, lo, body, (h0, buf, ys))
    m = T - lo
    (new, ywin), pullback = taped_segment(flat, P, h, _window(xs, lo, L, T), m, L)
    ys = _write_rows(ys, lo, m, ywin)
    return (new, ys), (P, xs, buf, pullback, tabs)


def _reverse_segments(flat: Flat, tables: Tables, res: tuple, g_h: list, g_ys: list,
                      p_wanted: list, x_wanted: list) -> tuple[list, list, list]:
    """:func:`reverse_sweep` for a plan with kept segments: one ``while`` loop over the
    segments, last first, each restored, advanced to its start and pulled back through."""
    T, L, lo0 = tables.seq_len, tables.max_seg, tables.first_lo
    P, xs, buf, pullback, tabs = res
    tabs = tuple(jnp.asarray(a) for a in tabs)
    seg_len = tabs[6]
    p_want, x_want = _pick(p_wanted, flat.p_diff), _pick(x_wanted, flat.x_diff)
    xd = _pick(xs, flat.x_diff)
    gyd = [c for c in g_ys]                             # differentiable y cotangents
    gP, gh, gxw = pullback((g_h, _window(gyd, lo0, L, T)))
    gP = [v if w else None for v, w in zip(gP, p_want)]
    gx = [jnp.zeros(v.shape, v.dtype) for v, w in zip(xd, x_want) if w]
    gx = _write_rows(gx, lo0, T - lo0, [v for v, w in zip(gxw, x_want) if w])

    def body(carry: tuple) -> tuple:
        e, buf, gh, gP, gx = carry
        m = seg_len[e]
        lo = e - m + 1
        h, buf = _recompute(flat, P, xs, buf, tabs, e, lo)
        _, pb = taped_segment(flat, P, h, _window(xs, lo, L, T), m, L)
        dP, gh, dxw = pb((gh, _window(gyd, lo, L, T)))
        gP = [a if a is None else a + b for a, b in zip(gP, dP)]
        gx = _write_rows(gx, lo, m, [v for v, w in zip(dxw, x_want) if w])
        return lo - 1, buf, gh, gP, gx
    if lo0 > 0:
        _, _, gh, gP, gx = lax.while_loop(lambda c: c[0] >= 0, body,
                                          (jnp.asarray(lo0 - 1, jnp.int32), buf, gh, gP, gx))
    it = iter(gx)
    gx = [next(it) if w else None for w in x_want]
    return (_put([None] * len(P), flat.p_diff, gP), _put([None] * len(flat.h), flat.h_diff, gh),
            _put([None] * len(flat.x), flat.x_diff, gx))


def routed_forward(flat: Flat, tables: Tables, route: Any, x_wanted: bool, P: list, h0: list,
                   xs: list, tabs: tuple) -> tuple:
    """:func:`forward_sweep`; with a ``route`` (static segments, chosen once the reverse mode
    says whether the inputs are differentiated), the loop of super-steps ``route(x_wanted)``
    names, on windows of the inputs, or ``flat``'s own states-only sweep where it names none."""
    bflat, btables = (None, None) if route is None else route(x_wanted)
    if bflat is None:
        return forward_sweep(flat, tables, P, h0, xs, tabs)
    tabs = tuple(jnp.asarray(a) for a in btables.arrays())
    (new, ys), res = forward_sweep(bflat, btables, P, h0, to_windows(xs, bflat.L), tabs)
    return (new, from_windows(ys)), res


def routed_reverse(flat: Flat, tables: Tables, route: Any, x_wanted: bool, res: tuple,
                   g_h: list, g_ys: list, p_wanted: list, x_wanted_leaves: list) -> tuple:
    """:func:`reverse_sweep` of the sweep :func:`routed_forward` ran (``route`` gives the same
    choice for the same ``x_wanted``)."""
    bflat, btables = (None, None) if route is None else route(x_wanted)
    if bflat is None:
        return reverse_sweep(flat, tables, res, g_h, g_ys, p_wanted, x_wanted_leaves)
    gP, gh, gx = reverse_sweep(bflat, btables, res, g_h, to_windows(g_ys, bflat.L), p_wanted,
                               x_wanted_leaves)
    return gP, gh, [v if v is None else from_windows([v])[0] for v in gx]


def build(flat: Flat, tables: Tables, route: Any = None) -> Any:
    """The custom_vjp function ``loop(P, h0, xs, tabs) -> (h_T, ys)`` on flat leaf lists."""
    T = tables.seq_len

    @jax.custom_vjp
    def loop(P: list, h0: list, xs: list, tabs: tuple) -> tuple[list, list]:
        return scan_plain(flat, T, P, h0, xs)

    # Every differentiable argument gets its cotangent here, perturbed or not: under jit, JAX
    # traced this fwd once per pattern of perturbed arguments but handed a backward the
    # residual structure of the latest trace (two interleaved jax.vjp of one jitted loss with
    # different arguments: a zero parameter gradient, or a crash with static segments of two
    # lengths). The hijax primitive, used wherever jax has it, skips unwanted cotangents.
    wanted = Wanted(tuple(flat.p_diff), tuple(flat.x_diff))

    def fwd(P: list, h0: list, xs: list, tabs: tuple) -> tuple:
        P, h0, xs = ([a.value for a in arg] for arg in (P, h0, xs))
        return routed_forward(flat, tables, route, any(wanted.x), P, h0, xs,
                              tuple(a.value for a in tabs))

    def bwd(res: tuple, g: tuple) -> tuple:
        g_h, g_ys = (_instantiate(c, m) for c, m in zip(g, (flat.h_diff, flat.y_diff)))
        return (*routed_reverse(flat, tables, route, any(wanted.x), res, g_h, g_ys,
                                list(wanted.p), list(wanted.x)), None)

    loop.defvjp(fwd, bwd, symbolic_zeros=True)
    return loop
