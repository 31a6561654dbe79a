"""User arguments (pytrees) <-> the flat leaf lists the checkpointed primitive works on.

A call is traced once per argument signature. Here, at trace time, the step is checked on shapes
alone (``jax.eval_shape``: the new state must have the state's structure, shapes and dtypes; every
input leaf must have the leading length ``seq_len``), closed-over arrays are hoisted out of
``fn`` and ``output_fn`` (``jax.closure_convert``) so that they are differentiated as parameters
instead of leaking tracers into the backward, and each leaf is marked differentiable or not
(integer and boolean leaves carry no cotangent: ``float0`` / ``None``).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import custom_batching, lax

from ..schedule.validate import short_repr


def batching(leaves: list) -> tuple[int, list[bool]]:
    """``(B, batched)`` for arrays met while tracing: ``B`` is the product of the sizes of the
    ``vmap``s that batch any of them (1 outside ``vmap``), ``batched[i]`` whether leaf ``i`` is
    batched by one. A ``memory=`` budget is for the program the user compiles, so a vmapped
    loop is planned with the batched sizes (the leaves a step sees inside ``vmap`` are one
    element's). Read at trace time with an identity under ``jax.custom_batching.custom_vmap``
    whose rule records the axis it meets and applies itself again (nested ``vmap``s), on
    ``stop_gradient`` of the leaves (the identity has no derivative rule; its result is
    unused)."""
    sizes: list[int] = []
    batched = [False] * len(leaves)

    def probe() -> Callable:
        @custom_batching.custom_vmap
        def identity(values: list) -> list:
            return values

        @identity.def_vmap
        def rule(axis_size: int, in_batched: list, values: list) -> tuple:
            sizes.append(int(axis_size))
            for i, b in enumerate(in_batched[0]):
                batched[i] = batched[i] or bool(b)
            probe()(values)
            return values, in_batched[0]
        return identity
    probe()([lax.stop_gradient(v) for v in leaves])
    return int(np.prod(sizes, dtype=np.int64)), batched


def inexact(v: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(v), jnp.inexact)


def _shape_text(tree: Any) -> str:
    return short_repr(jax.tree.map(lambda v: jax.ShapeDtypeStruct(np.shape(v),
                                                                  jnp.result_type(v)), tree), 300)


class Flat:
    """One call's step ``whole(params, state, x) -> (new_state, y or None)``, on flat leaf lists: ``state(P, h, x) -> h'`` and ``full(P, h, x) ->
    (h', y)`` (``y`` the leaves of ``output_fn``'s result, empty without one), with the masks of
    the differentiable leaves and :meth:`pullback`, one step's VJP over those leaves only."""

    def __init__(self, whole: Callable, params: Any, state: Any, xs: Any, seq_len: int,
                 words: tuple[str, str, str, str] = ("fn", "inputs", "seq_len",
                                                     "init_state")) -> None:
        # the caller's names: (the step, its inputs, the length, the initial state)
        label, inputs, length, init = words
        self.seq_len = seq_len
        h_leaves, self.h_def = jax.tree.flatten(state)
        x_leaves, self.x_def = jax.tree.flatten(xs)
        for v in x_leaves:
            shape = np.shape(v)
            if len(shape) == 0 or shape[0] != seq_len:
                raise ValueError(
                    f"{inputs}: every leaf needs the leading length {length}={seq_len} (one "
                    f"slice per step); got a leaf of shape {tuple(shape)} in {inputs} of shapes "
                    f"{_shape_text(xs)}")
        x_leaves = [jnp.asarray(v) for v in x_leaves]
        h_leaves = [jnp.asarray(v) for v in h_leaves]
        x0 = jax.tree.unflatten(self.x_def, [v[0] for v in x_leaves])
        state0 = jax.tree.unflatten(self.h_def, h_leaves)

        try:
            out_shape = jax.eval_shape(whole, params, state0, x0)
        except TypeError as err:
            if x0 is None and "NoneType" in str(err):
                raise TypeError(f"{label} failed with x=None: {err} ({inputs} is None, so each "
                                f"step gets x=None; pass {inputs}=... with a leading axis of "
                                f"length {length})") from err
            raise
        new_def = jax.tree.structure(out_shape[0])
        if new_def != self.h_def:
            raise ValueError(f"{label} must return a state with the structure of {init} "
                             f"({self.h_def}); it returned {new_def}")
        for i, (a, b) in enumerate(zip(jax.tree.leaves(out_shape[0]), h_leaves)):
            if a.shape != b.shape or a.dtype != b.dtype:
                raise ValueError(
                    f"{label} must return a state whose leaves keep their shapes and dtypes "
                    f"(a loop carries one fixed-size state); leaf {i} went from "
                    f"{b.dtype}{list(b.shape)} to {a.dtype}{list(a.shape)}")
        converted, consts = jax.closure_convert(whole, params, state0, x0)
        p_leaves, self.p_def = jax.tree.flatten(params)
        self.n_p = len(p_leaves)
        self.p = [jnp.asarray(v) for v in p_leaves] + list(consts)
        self.h, self.x = h_leaves, x_leaves
        self.y_def = jax.tree.structure(out_shape[1])
        self.y_shapes = jax.tree.leaves(out_shape[1])
        self._converted = converted
        # under vmap: (B, which leaves of p, h, x are batched), for memory='s sizes
        B, batched = batching(self.p + self.h + self.x)
        n_p, n_h = len(self.p), len(self.h)
        self.batch = (B, tuple(batched[:n_p]), tuple(batched[n_p:n_p + n_h]),
                      tuple(batched[n_p + n_h:]))
        self.p_diff = [inexact(v) for v in self.p]
        self.h_diff = [inexact(v) for v in self.h]
        self.x_diff = [inexact(v) for v in self.x]
        self.y_diff = [jnp.issubdtype(s.dtype, jnp.inexact) for s in self.y_shapes]

    def signature(self) -> tuple:
        """Shapes and dtypes of every leaf: what a byte budget's sizes depend on."""
        return (signature(self.p), signature(self.h), signature(self.x), self.p_def,
                self.h_def, self.x_def, self.batch)

    # ------------------------------------------------------------------ steps on flat leaves
    def _call(self, P: list, h: list, x: list) -> tuple[list, list]:
        params = jax.tree.unflatten(self.p_def, P[:self.n_p])
        new, y = self._converted(params, jax.tree.unflatten(self.h_def, h),
                                 jax.tree.unflatten(self.x_def, x), *P[self.n_p:])
        return jax.tree.leaves(new), jax.tree.leaves(y)

    def full(self, P: list, h: list, x: list) -> tuple[list, list]:
        return self._call(P, h, x)

    def state(self, P: list, h: list, x: list) -> list:
        """The new state only: ``output_fn``'s result is dead code there, which XLA removes."""
        return self._call(P, h, x)[0]

    def taped(self, P: list, h: list, x: list,
              whole: bool = False) -> tuple[tuple[list, list], Callable]:
        """One step under ``jax.vjp`` over the differentiable leaves: its outputs and a pullback
        ``(gh, gy) -> (gP, gh, gx)`` on differentiable leaves only. The outputs are the
        differentiable leaves, or with ``whole`` all of them (integer leaves too, from the same
        evaluation: completing them with a second call would evaluate the step once more)."""
        pd, hd, xd = (_pick(v, m) for v, m in ((P, self.p_diff), (h, self.h_diff),
                                                (x, self.x_diff)))

        def f(pd: list, hd: list, xd: list) -> tuple[tuple[list, list], tuple[list, list]]:
            new, y = self.full(_put(P, self.p_diff, pd), _put(h, self.h_diff, hd),
                               _put(x, self.x_diff, xd))
            return (_pick(new, self.h_diff), _pick(y, self.y_diff)), (new, y)

        (new_d, y_d), vjp, (new, y) = jax.vjp(f, pd, hd, xd, has_aux=True)
        if whole:
            # the differentiable leaves from the primal outputs, the others from the aux ones
            return (_put(new, self.h_diff, new_d), _put(y, self.y_diff, y_d)), vjp
        return (new_d, y_d), vjp


def _pick(values: list, mask: list) -> list:
    return [v for v, m in zip(values, mask) if m]


def _put(values: list, mask: list, chosen: list) -> list:
    it = iter(chosen)
    return [next(it) if m else v for v, m in zip(values, mask)]


def signature(leaves: list) -> tuple:
    return tuple((tuple(np.shape(v)), str(jnp.result_type(v))) for v in leaves)
