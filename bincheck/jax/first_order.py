"""A backward sweep that JAX may differentiate in forward mode only, with bincheck's own error
for reverse mode over it (``grad`` of ``grad``).

The reverse sweeps of :mod:`.sweep` and :mod:`.while_loop` are loops whose trip counts are
known only at run time. JAX can run them, vectorise them and push tangents through them (``jax.jvp``
of ``grad``: Hessian-vector products), but it cannot transpose them, and ``grad`` of ``grad``
failed late, at the transpose, with JAX's generic "Reverse-mode differentiation does not work
for lax.while_loop" naming neither bincheck nor what works instead. :func:`first_order` wraps
such a sweep in a hijax primitive whose forward-mode rules are JAX's own (``jax.jvp`` of the
sweep) and whose reverse-mode rule raises :class:`SecondOrderError` at trace time, when the
outer ``grad`` meets it. Where jax has no hijax API the sweep runs unwrapped (JAX's error).
"""

from __future__ import annotations

from typing import Any, Callable

import jax

try:        # as in .forward: public in jax.experimental.hijax since jax 0.8.1
    from jax.experimental.hijax import ShapedArray, VJPHiPrimitive, Zero, instantiate_zeros
    HIJAX = True
except ImportError:     # pragma: no cover - older jax
    HIJAX = False


class SecondOrderError(NotImplementedError):
    """Reverse mode over a bincheck loop's backward (``grad`` of ``grad``)."""


def message(what: str) -> str:
    return (f"{what}: reverse mode over its backward (grad of grad, jacrev of grad) is "
            f"not supported: the checkpointed backward replays its "
            f"plan with loops whose trip counts are known only at run time, which JAX cannot "
            f"transpose. Supported: forward over reverse, e.g. jax.jvp(jax.grad(f), ...) for "
            f"Hessian-vector products, jax.jacfwd(jax.grad(f)) or jax.hessian(f) for a "
            f"Hessian; or use lax.scan where grad of grad is needed")


def first_order(fn: Callable, what: str) -> Callable:
    """``fn`` (a function of pytrees of arrays, returning one), evaluated as usual, whose
    forward mode is ``jax.jvp`` of it and whose reverse mode raises :class:`SecondOrderError`
    naming ``what``."""
    if not HIJAX:                               # pragma: no cover - older jax
        return fn

    def call(*args: Any) -> Any:
        leaves, in_tree = jax.tree.flatten(args)
        out = jax.eval_shape(fn, *args)
        out_leaves, out_tree = jax.tree.flatten(out)
        spec = _Spec(fn, what, in_tree, out_tree)
        avals = [ShapedArray(s.shape, s.dtype, weak_type=getattr(s, "weak_type", False))
                 for s in out_leaves]
        return jax.tree.unflatten(out_tree, _FirstOrder(spec, tuple(map(jax.typeof, leaves)),
                                                        avals)(*leaves))
    return call


class _Spec:
    """The primitive's static parameter, hashed by identity."""

    __slots__ = ("fn", "what", "in_tree", "out_tree")

    def __init__(self, fn: Callable, what: str, in_tree: Any, out_tree: Any) -> None:
        self.fn, self.what, self.in_tree, self.out_tree = fn, what, in_tree, out_tree

    def __call__(self, *leaves: Any) -> list:
        out = self.fn(*jax.tree.unflatten(self.in_tree, leaves))
        return self.out_tree.flatten_up_to(out)

    def __repr__(self) -> str:
        return self.what


if HIJAX:
    class _FirstOrder(VJPHiPrimitive):
        spec: _Spec

        def __init__(self, spec: _Spec, in_avals: tuple, out_avals: list) -> None:
            self.in_avals = in_avals
            self.out_aval = list(out_avals)
            self.params = dict(spec=spec)
            super().__init__()

        def expand(self, *leaves: Any) -> list:
            return self.spec(*leaves)

        def jvp(self, primals: tuple, tangents: tuple) -> tuple:
            tangents = tuple(instantiate_zeros(t) for t in tangents)
            out, dout = jax.jvp(self.spec, tuple(primals), tangents)
            # integer outputs: symbolic zeros, as JAX's own rules give
            dout = [t if jax.numpy.issubdtype(o.dtype, jax.numpy.inexact)
                    else Zero(jax.typeof(o).to_tangent_aval()) for o, t in zip(out, dout)]
            return out, dout

        def lin(self, nzs_in: tuple, *primals: Any) -> tuple:
            return self(*primals), primals

        def linearized(self, primals: tuple, *tangents: Any) -> list:
            return self.jvp(primals, tangents)[1]

        def vjp_fwd(self, nzs_in: tuple, *args: Any) -> Any:
            raise SecondOrderError(message(self.spec.what))

        def batch(self, axis_data: Any, args: tuple, dims: tuple) -> tuple:
            # the vmapped sweep, wrapped again (not hijax's generic VmapOf, whose jvp gives the
            # primals the tangents' batch axes: jacfwd of grad failed with it)
            batched = jax.vmap(self.spec, in_axes=tuple(dims), out_axes=0,
                               axis_size=axis_data.size, axis_name=axis_data.name,
                               spmd_axis_name=axis_data.spmd_name)
            out = first_order(batched, self.spec.what)(*args)
            return out, [0] * len(out)
