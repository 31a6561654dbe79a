"""Sizes for byte budgets, from shapes alone: nothing runs.

``state_bytes`` is the state leaves' bytes. ``work_bytes`` is what the checkpointed gradient holds
beside its stored states, under XLA's static allocation: the temporaries of one compiled taped
step and its backward (``memory_analysis``), plus the buffers the reverse scan carries (the live
state, its cotangent, the scratch slot the forward writes unstored steps into, and the parameter
cotangents being accumulated: XLA adds each step's share into them in place, measured on tanh,
LSTM and GRU cells with parameters much larger than the state), one step's input and output
slices and their cotangents, and the loops' own bookkeeping.

Two terms come from reading XLA's buffer assignment (CPU), where a gradient of a tiny state
(a few hundred bytes) measured up to ~1 KiB above the sum of its buffers: every buffer is
64-byte aligned (a 96-byte state takes 128 bytes, an 8-byte scalar 64), so buffer sizes are
rounded up to :data:`ALIGN`; and each of the sweep's nested ``while`` loops holds its counter,
the table entries it reads and a tuple of pointers to everything it carries (8 bytes a leaf),
each in its own aligned slot: :data:`LOOP_SLOTS` aligned scalars and :data:`LOOPS` tuples. For
states of a few KiB and more these terms are noise; for tiny ones they are most of the working
set, and without them a ``memory=`` budget was exceeded under ``memory_analysis``.

The sum of parts misses what XLA holds beside the slots that one compiled step does not show:
with a parameter broadcast to a large intermediate (``sin(h[:, None] * h[None, :] * c)``) and
``c`` differentiated, a buffer of the intermediate's size lived through the whole sweep (a budget
exceeded by that constant, 64 KiB at H=128); and with a loss of the final state, whose cotangent
XLA computes in the program, it held 180 KB more than with the cotangent as an argument on a
jax-cfd step (the constant ~90-160 KB its budgets were exceeded by). So a loop's sizes take the
larger of the sum of parts and :func:`measure_sweep` (a compiled gradient of the sweep itself,
less its slots, the final cotangent computed from the final state; about 0.4 s more at trace
time, once per argument signature).

Under ``vmap`` (``Flat.batch``, read at trace time by :func:`.boundary.batching`) every size is
the batched program's: the step is compiled vmapped over one axis of the batch's size, the state,
its cotangent, the outputs and the accumulated parameter cotangents are ``B`` of each (a plan per
element let a budget be exceeded 1.4-fold at B=16 on a tanh cell).

Not counted: what is ``seq_len`` long (the inputs, the stacked outputs of ``output_fn`` and their
cotangents, the inputs' cotangent), which are the loop's arguments and results, as for
``lax.scan``, and the temporaries of the caller's own loss.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..schedule.budget import Sizes
from .boundary import Flat, _pick, _put


#: XLA (CPU) aligns every buffer to this many bytes.
ALIGN = 64
#: Aligned scalars the sweep's loops hold at once (loop counters, table entries, predicates).
LOOP_SLOTS = 16
#: The sweep's nested ``while`` loops (forward; backward, its snapshots and two advances), each
#: with a tuple of pointers to what it carries.
LOOPS = 5


#: Parameter-sized buffers the reverse sweep holds: the accumulated cotangent (one step's share is
#: added into it in place; counting two refused budgets that held with room to spare).
GRAD_COPIES = 1


def itemsize(dtype: Any) -> int:
    """Bytes of one element of ``dtype``. A typed PRNG key (``jax.random.key``: an extended
    dtype such as ``key<fry>``, which numpy cannot interpret) is stored as its key data, e.g.
    two ``uint32`` for threefry: what ``jax.random.key_data`` of one key holds."""
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct((), dtype))
        return int(np.prod(data.shape, dtype=np.int64)) * np.dtype(data.dtype).itemsize
    return np.dtype(dtype).itemsize


def nbytes(leaves: list) -> int:
    return int(sum(np.prod(np.shape(v), dtype=np.int64) * itemsize(v.dtype) for v in leaves))


def aligned(leaves: list) -> int:
    """Bytes of ``leaves`` as XLA allocates them, each rounded up to :data:`ALIGN`."""
    return sum(-(-nbytes([v]) // ALIGN) * ALIGN for v in leaves)


def _lead(leaves: list, mask: Any, B: int) -> list:
    """Shapes of ``leaves`` with a leading batch axis of ``B`` where ``mask`` (a list, or one
    bool for all) says they are batched."""
    mask = [mask] * len(leaves) if isinstance(mask, bool) else mask
    return [jax.ShapeDtypeStruct(((B,) if m and B > 1 else ()) + tuple(np.shape(v)), v.dtype)
            for v, m in zip(leaves, mask)]


def _temp(flat: Flat, fn: Any, *groups: tuple[list, Any]) -> int:
    """XLA's temporaries of ``jit(fn)`` on the shapes of ``groups`` (``(leaves, batched)``
    pairs, one per argument), compiled as the loop runs: under ``vmap`` (``flat.batch``),
    ``fn`` vmapped over one axis of the batch's size, each argument batched where the call's
    is; the state, the cotangents and the outputs always (the carry is batched as soon as
    anything it depends on is)."""
    B = flat.batch[0]
    specs = [_lead(leaves, mask, B) for leaves, mask in groups]
    if B > 1:
        axes = tuple([0 if len(s.shape) > len(np.shape(v)) else None for s, v in zip(sp, leaves)]
                     for sp, (leaves, _) in zip(specs, groups))
        fn = jax.vmap(fn, in_axes=axes, axis_size=B)
    compiled = jax.jit(fn).lower(*specs).compile()
    return int(compiled.memory_analysis().temp_size_in_bytes)


def _segment_temp(flat: Flat, L: int) -> int:
    """XLA temporaries of one compiled taped segment of ``L`` steps and its pullback (the
    masked scan of :func:`.sweep.taped_segment`)."""
    from .sweep import taped_segment
    spec = lambda leaves, lead=(): [jax.ShapeDtypeStruct(lead + np.shape(v), v.dtype)  # noqa
                                    for v in leaves]
    xw = [jax.ShapeDtypeStruct((L,) + np.shape(v)[1:], v.dtype) for v in flat.x]
    gy = [jax.ShapeDtypeStruct((L,) + tuple(s.shape), s.dtype)
          for s, d in zip(flat.y_shapes, flat.y_diff) if d]

    def seg(P: list, h: list, x: list, gh: list, gy: list, m: list) -> tuple:
        _, pullback = taped_segment(flat, P, h, x, m[0], L)
        return pullback((gh, gy))
    gh = spec(_pick(flat.h, flat.h_diff))
    m = jax.ShapeDtypeStruct((), np.int32)
    _, pb, _, xb = flat.batch
    return _temp(flat, seg, (spec(flat.p), list(pb)), (spec(flat.h), True), (xw, list(xb)),
                 (gh, True), (gy, True), ([m], False))


def _bookkeeping(flat: Flat) -> int:
    """The loops' own scalars and tuples of pointers (see the module docstring)."""
    leaves = len(flat.p) + len(flat.h) + len(flat.x) + len(flat.y_shapes)
    pointers = -(-8 * (4 + 2 * leaves) // ALIGN) * ALIGN
    return LOOP_SLOTS * ALIGN + LOOPS * pointers


def measure(flat: Flat, segments: bool = False) -> Sizes:
    """Sizes by accounting: one compiled taped step's temporaries plus the buffers the sweep
    carries and its bookkeeping (see the module docstring). With ``segments`` (kept taped
    segments, the static mixed policy), ``extra(L) = temp(L) - temp(1) + windows(L)`` is what a
    segment of ``L`` steps adds (``temp`` the compiled segment's temporaries, ``windows`` its input,
    output and cotangent windows): measured at 2 and 4 steps and written as
    ``segment_bytes + (L - 1) * tape_bytes`` (XLA's temporaries grow linearly in ``L``:
    measured exactly so up to 16 steps on a tanh RNN)."""
    spec = lambda leaves: [jax.ShapeDtypeStruct(np.shape(v), v.dtype) for v in leaves]  # noqa
    x0 = [jax.ShapeDtypeStruct(np.shape(v)[1:], v.dtype) for v in flat.x]

    def one_step(P: list, h: list, x: list, gh: list, gy: list) -> tuple:
        _, pullback = flat.taped(P, h, x)
        return pullback((gh, gy))

    out = jax.eval_shape(lambda P, h, x: flat.taped(P, h, x)[0], spec(flat.p), spec(flat.h), x0)
    B, pb, _, xb = flat.batch
    temp = _temp(flat, one_step, (spec(flat.p), list(pb)), (spec(flat.h), True),
                 (x0, list(xb)), (out[0], True), (out[1], True))
    # under vmap: the state, its cotangent and the outputs are batched, and so are the
    # parameter cotangents being accumulated (one per batch element: vmap of grad's are the
    # per-element gradients, grad of vmap's are summed after the loop)
    h_b, y_b = _lead(flat.h, True, B), _lead(flat.y_shapes, True, B)
    state = nbytes(h_b)
    carried = 3 * aligned(h_b) + GRAD_COPIES * aligned(_lead(_pick(flat.p, flat.p_diff),
                                                            True, B))
    slices = 2 * aligned(_lead(x0, list(xb), B)) + 2 * aligned(y_b)
    work = temp + carried + slices + _bookkeeping(flat)
    if not segments:
        return Sizes(state_bytes=max(state, 1), tape_bytes=None, work_bytes=work)
    rows = aligned(_lead(x0, list(xb), B)) + aligned(y_b)
    extra = {L: _segment_temp(flat, L) - temp + 2 * L * rows for L in (2, 4)}
    tape = max(1, -(-(extra[4] - extra[2]) // 2))
    return Sizes(state_bytes=max(state, 1), tape_bytes=tape, work_bytes=work,
                 segment_bytes=max(0, extra[2] - tape))


def sweep_gradient(flat: Flat, n: int, slots: int, x_wanted: bool,
                   loss_of_final: bool = False) -> tuple[Callable, tuple, Any]:
    """The gradient of the checkpointed sweep over ``n`` (super-)steps of ``flat`` with
    ``slots`` stored states (a Revolve plan), to be compiled and measured (:func:`measure_sweep`:
    its temporaries; :func:`.prices.step_prices`: its time): ``(grad, specs, tables)``.
    ``grad(P, h, xs, gh, gy)`` pulls the cotangents ``gh`` of the final state and ``gy`` of the
    outputs back to the differentiated parameters, state and inputs (the inputs where
    ``x_wanted``); ``specs`` are its arguments' shapes (``jax.ShapeDtypeStruct`` lists);
    ``tables`` the plan's. With ``loss_of_final`` the final state's cotangent is computed from
    the final state instead, as a loss of it does (that of ``sum(h ** 2)``; ``gh`` is unused):
    taken as an argument, XLA held 180 KB less than beside a loss on a jax-cfd step (64 x 64,
    the ~90 KB its budgets were exceeded by)."""
    from .forward import checkpointed
    from .tables import revolve_tables
    tables = revolve_tables(n, slots)
    loop = checkpointed(flat, tables)
    x_mask = [m and x_wanted for m in flat.x_diff]
    spec = lambda leaves: [jax.ShapeDtypeStruct(np.shape(v), v.dtype) for v in leaves]  # noqa
    xs = [jax.ShapeDtypeStruct((n,) + tuple(np.shape(v))[1:], v.dtype) for v in flat.x]
    gh = spec(_pick(flat.h, flat.h_diff))
    gy = [jax.ShapeDtypeStruct((n,) + tuple(s.shape), s.dtype)
          for s, d in zip(flat.y_shapes, flat.y_diff) if d]

    def grad(P: list, h: list, xs: list, gh: list, gy: list) -> tuple:
        tabs = tuple(jnp.asarray(a) for a in tables.arrays())

        def f(pd: list, hd: list, xd: list) -> tuple:
            new, ys = loop(_put(P, flat.p_diff, pd), _put(h, flat.h_diff, hd),
                           _put(xs, x_mask, xd), tabs)
            return _pick(new, flat.h_diff), _pick(ys, flat.y_diff)
        out, pullback = jax.vjp(f, _pick(P, flat.p_diff), _pick(h, flat.h_diff),
                                _pick(xs, x_mask))
        if loss_of_final:
            gh = [2 * o for o in out[0]]        # h_T a temporary, as beside a loss
        return pullback((gh, gy))
    return grad, (spec(flat.p), spec(flat.h), xs, gh, gy), tables


def measure_sweep(flat: Flat, x_wanted: bool, n: int = 10, slots: int = 3) -> Sizes:
    """Sizes of a loop of super-steps (:class:`.segments.BlockFlat`) measured whole: the
    temporaries of a compiled gradient of the checkpointed sweep itself over ``n`` super-steps
    with ``slots`` stored states, less those states, plus the loops' bookkeeping margin of
    :func:`measure`. With segments, what XLA holds beside the slots depends on its own choices
    (copies of the input window, and of the window's cotangent when the inputs are
    differentiated: ``x_wanted``) more than a sum of parts can say (the sum overcounted by
    0.56 MiB without, and undercounted by 0.22 MiB with the inputs differentiated, on a tanh
    cell at H=256 in 25-step segments). Measured so, it did not depend on ``n`` or ``slots``
    there (3 and 40 super-steps, 2 and 86 slots: equal to the byte); on states of a few
    hundred bytes XLA's packing of scalars moved it by up to ~600 bytes between small and
    large ``n`` (with 3 super-steps some loops are folded away, hence 10 and 3 slots), which
    the margin covers."""
    grad, (P, h, xs, gh, gy), _ = sweep_gradient(flat, n, slots, x_wanted, loss_of_final=True)
    _, pb, _, xb = flat.batch
    temp = _temp(flat, grad, (P, list(pb)), (h, True), (xs, list(xb)), (gh, True), (gy, True))
    B = flat.batch[0]
    h_b = _lead(flat.h, True, B)
    state = nbytes(h_b)
    work = temp - slots * state + _bookkeeping(flat)
    if B > 1:
        # the per-element parameter cotangents are this function's results; under grad of
        # vmap they are temporaries, summed after the loop (as in measure)
        work += GRAD_COPIES * aligned(_lead(_pick(flat.p, flat.p_diff), True, B))
    return Sizes(state_bytes=max(state, 1), tape_bytes=None, work_bytes=max(work, 1))
