"""A differentiable, checkpointed drop-in for ``jax.lax.while_loop``: :func:`while_loop`.

* Primal (no derivative wanted): ``lax.while_loop`` that also stops after ``max_steps`` steps.
* Forward: the same loop, O(n) work for the ``n`` steps taken. Before each step it stores the state
  before the previous step in the slot the online planner chose for it
  (:class:`bincheck.schedule.online.OnlinePlanner`, whose choice depends only on the step count:
  compiled into ``write_slot[n]`` for every ``n < max_steps`` by
  :func:`~bincheck.jax.tables.online_table`). At most ``num_ckpts`` states are held whatever ``n``
  turns out to be, and the state before the last step is kept as the working state.
* Backward: the planner's reversal, run in the program (:mod:`bincheck.jax.revolve`): the last
  step from the working state, then each segment between snapshots, last first, with the binomial
  schedule and the slots left. Plain evaluations are the offline optimum's for every
  ``n <= beta(s, 2)`` and within 5 % of it up to ``beta(s, 3)`` for ``s >= 3``.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_derivatives import SymbolicZero

from ..schedule.budget import parse_bytes
from ..schedule.validate import (NUM_CKPTS_RULE, check_callable, check_int,
                                 check_positive_int, exactly_one_budget, short_repr)
from . import revolve
from .boundary import _pick, _put, batching, inexact
from .first_order import first_order
from .sizes import _lead, nbytes
from .tables import OnlineTable, online_table

_TABLES: dict = {}
_LOCK = threading.Lock()


# Planning the table costs about 3 microseconds per step and checkpoint (measured: 2.8 s for
# max_steps=20,000 at num_ckpts=50); beyond this many seconds a warning says so before it starts.
PLAN_SECONDS_PER_STEP_SLOT, WARN_SECONDS = 3e-6, 10.0
_KEEP = 8                               # tables kept for reuse (the most recent ones)


def _tables(num_ckpts: int, max_steps: int) -> tuple[OnlineTable, Any]:
    key = (num_ckpts, max_steps)
    got = _TABLES.get(key)
    if got is None:
        guess = PLAN_SECONDS_PER_STEP_SLOT * max_steps * num_ckpts
        if guess > WARN_SECONDS:
            warnings.warn(f"planning bj.while_loop's table for max_steps={max_steps} at "
                          f"num_ckpts={num_ckpts} takes about {guess:.0f} s (once per process "
                          f"and arguments); a smaller max_steps plans faster", RuntimeWarning,
                          stacklevel=3)
        got = (online_table(num_ckpts, max_steps), revolve.beta_table(num_ckpts, max_steps))
        with _LOCK:
            got = _TABLES.setdefault(key, got)
            while len(_TABLES) > _KEEP:
                _TABLES.pop(next(iter(_TABLES)))
    return got


def while_loop(cond_fun: Callable, body_fun: Callable, init_val: Any, *,
               max_steps: int, num_ckpts: int | None = None,
               memory: int | str | None = None) -> Any:
    """``lax.while_loop(cond_fun, body_fun, init_val)``, stopping after at most ``max_steps``
    steps, whose reverse mode holds at most ``num_ckpts`` states (the initial one included), or
    as many as fit ``memory`` bytes (int, or a string such as ``"50MB"``) beside one step's
    working set, sized from shapes alone.

    ``init_val`` is a pytree; ``body_fun`` must keep its structure, shapes and dtypes. Arrays the
    functions close over are differentiated as usual. The forward does work for the steps taken,
    not for ``max_steps``; ``max_steps`` sizes the planner's table (4 bytes a step) and bounds the
    loop: when it is reached the loop stops there, as a bounded while loop does.
    """
    check_callable("cond_fun", cond_fun, "cond_fun(val) -> bool")
    check_callable("body_fun", body_fun, "body_fun(val) -> val")
    if max_steps is None:
        raise TypeError("max_steps must be an int: reverse mode sizes the online planner's table "
                        "by it, and the loop stops there (use jax.lax.while_loop for a loop that "
                        "is never differentiated)")
    max_steps = check_int("max_steps", max_steps, 0)
    exactly_one_budget(num_ckpts, memory)
    if num_ckpts is not None:
        num_ckpts = check_positive_int("num_ckpts", num_ckpts, NUM_CKPTS_RULE)
    leaves, tdef = jax.tree.flatten(init_val)
    leaves = [jnp.asarray(v) for v in leaves]
    shapes = jax.eval_shape(body_fun, init_val)
    if jax.tree.structure(shapes) != tdef:
        raise ValueError(f"body_fun must return a value with the structure of init_val ({tdef}); "
                         f"it returned {jax.tree.structure(shapes)}")
    for i, (a, b) in enumerate(zip(jax.tree.leaves(shapes), leaves)):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ValueError(f"body_fun must keep every leaf's shape and dtype; leaf {i} went "
                             f"from {b.dtype}{list(b.shape)} to {a.dtype}{list(a.shape)}")
    verdict = jax.eval_shape(cond_fun, init_val)
    if not (hasattr(verdict, "shape") and verdict.shape == () and verdict.dtype == bool):
        raise TypeError(f"cond_fun must return a scalar bool (as for lax.while_loop); it returned "
                        f"{short_repr(verdict)}")
    if max_steps == 0:
        return init_val
    body, b_consts = jax.closure_convert(body_fun, init_val)
    cond, c_consts = jax.closure_convert(cond_fun, init_val)
    if memory is not None:
        def lanes_differ() -> bool:     # under vmap: does the condition differ between lanes?
            ok = cond_fun(body_fun(init_val))
            return batching([jnp.asarray(ok)])[1][0]
        num_ckpts = _slots_within(parse_bytes(memory), body, list(b_consts), leaves, tdef,
                                  max_steps, lanes_differ)
    table, beta = _tables(num_ckpts, max_steps)
    run = _build(body, cond, tdef, len(c_consts), leaves, max_steps, table, num_ckpts)
    out = run(list(b_consts), list(c_consts), leaves, jnp.asarray(table.write_slot),
              jnp.asarray(beta))
    return jax.tree.unflatten(tdef, out)


#: Under ``vmap`` with a condition that differs between lanes, JAX's batched while loops replace
#: their whole carry by a select between the new and the old one at every step, snapshots
#: included: a stored state was measured costing 3.6 states of temporaries (tanh cell, B=16,
#: H=32, float32; 1.5 at B=1), counted as this many.
SELECT_COPIES = 4


def _slots_within(memory: int, body: Callable, P: list, h: list, tdef: Any,
                  max_steps: int, lanes_differ: Callable[[], bool] = lambda: False) -> int:
    """How many states fit ``memory`` beside the working set: one compiled step and its
    backward (``memory_analysis`` temporaries), the working state, the state before it, the
    scratch slot, the state cotangent, and the parameter cotangents with one step's share."""
    spec = lambda leaves: [jax.ShapeDtypeStruct(np.shape(v), v.dtype) for v in leaves]  # noqa
    mask = [inexact(v) for v in h]

    def one(P: list, h: list, g: list) -> Any:
        def f(P: list, hd: list) -> list:
            return _pick(jax.tree.leaves(body(jax.tree.unflatten(tdef, _put(h, mask, hd)), *P)),
                         mask)
        return jax.vjp(f, P, _pick(h, mask))[1](g)
    # under vmap (a budget is for the program compiled): the step vmapped, with the state, its
    # cotangent and the parameter cotangents batched (see .sizes.measure)
    B, batched = batching(P + h)
    specs = [spec(P), spec(h), spec(_pick(h, mask))]
    if B > 1:
        specs = [_lead(specs[0], batched[:len(P)], B), _lead(specs[1], True, B),
                 _lead(specs[2], True, B)]
        one = jax.vmap(one, in_axes=([0 if b else None for b in batched[:len(P)]], 0, 0),
                       axis_size=B)
    compiled = jax.jit(one).lower(*specs).compile()
    state = max(B * nbytes(h), 1)
    work = (int(compiled.memory_analysis().temp_size_in_bytes) + 4 * state +
            2 * B * nbytes([v for v in P if inexact(v)]))
    if any(batched) and lanes_differ():
        state *= SELECT_COPIES
    slots = (memory - work) // state
    if slots < 1:
        raise ValueError(f"memory={memory} bytes is below the least this loop needs: one stored "
                         f"state ({state} bytes) and the working set of one taped step and its "
                         f"backward ({work} bytes), {work + state} bytes in all")
    return int(min(slots, max(max_steps, 1)))


def _build(body: Callable, cond: Callable, tdef: Any, n_c: int, h_leaves: list, M: int,
           table: OnlineTable, s: int) -> Callable:
    # Reversing a segment pushes at most one frame per step of it: min(s, M) states suffice.
    S = max(min(s, M), table.slots)
    h_diff = [inexact(v) for v in h_leaves]

    def step(P: list, h: list) -> list:
        return jax.tree.leaves(body(jax.tree.unflatten(tdef, h), *P))

    def going(Pc: list, h: list) -> Any:
        ok = cond(jax.tree.unflatten(tdef, h), *Pc)
        return jnp.asarray(ok).reshape(()).astype(bool)

    def advance(P: list, h: list, start: Any, stop: Any) -> list:
        return lax.fori_loop(start, stop, lambda _, h: step(P, h), h)

    @jax.custom_vjp
    def run(P: list, Pc: list, h0: list, write_slot: Any, beta: Any) -> list:
        def more(c: tuple) -> Any:
            return (c[0] < M) & going(Pc, c[1])
        return lax.while_loop(more, lambda c: (c[0] + 1, step(P, c[1])), (0, h0))[1]

    wanted: dict = {}

    def fwd(P: list, Pc: list, h0: list, write_slot: Any, beta: Any) -> tuple:
        wanted["p"] = [a.perturbed and inexact(a.value) for a in P]
        P, Pc, h0 = ([a.value for a in arg] for arg in (P, Pc, h0))
        write_slot, beta = write_slot.value, beta.value
        buf = [jnp.zeros((S + 1,) + v.shape, v.dtype).at[0].set(v) for v in h0]
        slot_pos = jnp.full((S + 1,), -1, jnp.int32).at[0].set(0)

        def more(c: tuple) -> Any:
            return (c[0] < M) & going(Pc, c[2])

        def body_(c: tuple) -> tuple:
            n, prev, cur, buf, slot_pos = c
            slot = jnp.where(n >= 1, write_slot[jnp.maximum(n - 1, 0)], -1)
            slot = jnp.where(slot >= 0, slot, S)
            buf = [lax.dynamic_update_index_in_dim(b, v, slot, 0) for b, v in zip(buf, prev)]
            slot_pos = slot_pos.at[slot].set(n - 1)
            return n + 1, cur, step(P, cur), buf, slot_pos
        n, prev, cur, buf, slot_pos = lax.while_loop(
            more, body_, (jnp.int32(0), h0, h0, buf, slot_pos))
        return cur, (P, n, prev, buf, slot_pos, beta)

    def bwd(res: tuple, g: list) -> tuple:
        P, n, prev, buf, slot_pos, beta = res
        p_want = wanted["p"]
        gh = [jnp.zeros(c.shape, c.dtype) if isinstance(c, SymbolicZero) else c
              for c, m in zip(g, h_diff) if m]
        gP = [jnp.zeros_like(v) for v, w in zip(P, p_want) if w]

        def reverse(P: list, n: Any, prev: list, buf: list, slot_pos: Any, beta: Any,
                    carry: tuple) -> tuple:
            def step_back(carry: tuple, h: list, j: Any) -> tuple:
                gP, gh = carry
                pd = _pick(P, p_want)

                def f(pd: list, hd: list) -> list:
                    return _pick(step(_put(P, p_want, pd), _put(h, h_diff, hd)), h_diff)
                _, pullback = jax.vjp(f, pd, _pick(h, h_diff))
                dP, gh = pullback(gh)
                return [a + b for a, b in zip(gP, dP)], gh

            def reverse_all(carry: tuple) -> tuple:
                carry = step_back(carry, prev, n - 1)
                # The held snapshots in position order become the frames 0..k (frame d in slot
                # order[d]; the free slots follow, for the frames the reversal pushes): no copy.
                key = jnp.where(slot_pos[:S] >= 0, slot_pos[:S], jnp.iinfo(jnp.int32).max)
                order = jnp.argsort(key).astype(jnp.int32)
                depth = jnp.sum(slot_pos[:S] >= 0).astype(jnp.int32) - 1
                fslots = (s - jnp.arange(S, dtype=jnp.int32))
                return revolve.reverse(step_back, lambda h, a, b: advance(P, h, a, b), beta,
                                       buf, order, key[order], fslots, depth, n - 1, carry)
            return lax.cond(n > 0, reverse_all, lambda c: c, carry)
        # forward mode over the reversal works (Hessian-vector products); reverse mode over it
        # raises bincheck's error (grad of grad: .first_order)
        gP, gh = first_order(reverse, "bincheck.jax.while_loop")(P, n, prev, buf, slot_pos,
                                                                 beta, (gP, gh))
        return (_put([None] * len(P), p_want, gP), [None] * n_c,
                _put([None] * len(h_diff), h_diff, gh), None, None)

    run.defvjp(fwd, bwd, symbolic_zeros=True)
    return run
