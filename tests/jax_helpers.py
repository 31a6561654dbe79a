"""Helpers for the JAX front end's tests: problems, the plain ``lax.scan`` reference loop, the
closed form t(l, s), a run-time step counter (a host callback), a recursive jaxpr equation count
and XLA's compiled temporaries.

Importing this module turns on float64 (``jax_enable_x64``) for the whole test session: the
exactness checks need it. It is global, so every float32 test passes explicit float32 arrays
and checks the dtypes it gets back.

It also turns on JAX's compilation cache, in a directory of its own for this session (removed at
exit): the tests build many loops whose sizes, segment lengths and gradients compile the same
XLA programs again (a fresh closure each time, so ``jit``'s own cache misses), and compiling is
most of their time. The cache is keyed by the program's whole HLO and the compile options, and
an executable read back is the one XLA wrote, ``memory_analysis`` included (checked: the same
temporaries, arguments and outputs to the byte), so no test sees anything but time change.
"""

import atexit
import collections
import shutil
import tempfile

import jax

jax.config.update("jax_enable_x64", True)

_COMPILED = tempfile.mkdtemp(prefix="bincheck-tests-jax-cache-")
atexit.register(shutil.rmtree, _COMPILED, ignore_errors=True)
jax.config.update("jax_compilation_cache_dir", _COMPILED)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)      # every program
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)

import jax.extend.core as jcore  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

from closed_form import closed_form  # noqa: E402,F401  (re-exported for the tests)

F64, F32 = jnp.float64, jnp.float32


def tanh_cell(params, h, x):
    W, U, b = params
    return jnp.tanh(h @ W + x @ U + b)


def lstm_cell(params, state, x):
    h, c = state
    z = h @ params["W"] + x @ params["U"] + params["b"]
    i, f, g, o = jnp.split(z, 4, axis=-1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    return jnp.tanh(c) * jax.nn.sigmoid(o), c


def problem(T, B=3, H=4, I=2, seed=0, dtype=F64):
    """``(W, U, b), h0, xs`` for :func:`tanh_cell`, from numpy's generator, in ``dtype``."""
    g = np.random.default_rng(seed)
    arr = lambda *shape, scale=1.0: jnp.asarray(g.normal(size=shape) * scale, dtype)  # noqa
    params = (arr(H, H, scale=0.5), arr(I, H, scale=0.5), arr(H, scale=0.1))
    return params, arr(B, H), arr(T, B, I)


def lstm_problem(T, B=2, H=3, I=2, seed=1, dtype=F64):
    g = np.random.default_rng(seed)
    arr = lambda *shape, scale=1.0: jnp.asarray(g.normal(size=shape) * scale, dtype)  # noqa
    params = {"W": arr(H, 4 * H, scale=0.4), "U": arr(I, 4 * H, scale=0.4),
              "b": arr(4 * H, scale=0.1)}
    return params, (arr(B, H), arr(B, H)), arr(T, B, I)


def plain_loop(fn, params, state, inputs, output_fn=None, length=None):
    """The reference: the same loop as one ``lax.scan`` (no checkpointing)."""
    def body(h, x):
        new = fn(params, h, x)
        return new, (output_fn(params, new, x) if output_fn is not None else None)
    final, ys = lax.scan(body, state, inputs, length=length)
    return (final, ys) if output_fn is not None else final


def numpy_bptt(params, h0, xs, ct=None):
    """``(h_T, ((gW, gU, gb), gh0, gxs))``: :func:`tanh_cell`'s loop and its pullback of the
    cotangent ``ct`` of ``h_T`` (default ``3 * h_T ** 2``, the gradient of ``sum(h_T ** 3)``),
    by hand in numpy float64: an oracle that shares no code with JAX and compiles nothing
    (checked against ``lax.scan`` in the tests)."""
    W, U, b = (np.asarray(v, np.float64) for v in params)
    xs = np.asarray(xs, np.float64)
    hs = [np.asarray(h0, np.float64)]
    for x in xs:
        hs.append(np.tanh(hs[-1] @ W + x @ U + b))
    g = 3 * hs[-1] ** 2 if ct is None else np.asarray(ct, np.float64)
    gW, gU, gb, gx = np.zeros_like(W), np.zeros_like(U), np.zeros_like(b), np.zeros_like(xs)
    for t in reversed(range(len(xs))):
        da = g * (1 - hs[t + 1] ** 2)
        gW += hs[t].T @ da
        gU += xs[t].T @ da
        gb += da.sum(0)
        gx[t] = da @ U.T
        g = da @ W.T
    return hs[-1], ((gW, gU, gb), g, gx)


def assert_close(got, want, rtol=1e-10, atol=1e-12):
    """Same tree structure, shapes and dtypes; values within ``rtol`` / ``atol``."""
    g_leaves, g_def = jax.tree.flatten(got)
    w_leaves, w_def = jax.tree.flatten(want)
    assert g_def == w_def, (g_def, w_def)
    for k, (a, b) in enumerate(zip(g_leaves, w_leaves)):
        assert jnp.shape(a) == jnp.shape(b), (k, jnp.shape(a), jnp.shape(b))
        assert jnp.result_type(a) == jnp.result_type(b), (k, jnp.result_type(a),
                                                           jnp.result_type(b))
        if jnp.result_type(b) == jax.dtypes.float0:
            continue
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol,
                                   err_msg=f"leaf {k}")


def cubed_sum(tree):
    """A scalar loss whose cotangents are not all ones (so a wrong pullback shows)."""
    return sum(jnp.sum(v ** 3) for v in jax.tree.leaves(tree))


class Counter:
    """Counts step evaluations at run time: ``counter.wrap(fn, tag)`` calls a host callback each
    time the compiled program evaluates ``fn`` (whatever the trace), and counts the traces."""

    def __init__(self):
        self.runs = collections.Counter()
        self.traces = collections.Counter()

    def wrap(self, fn, tag="fn"):
        def counted(*args):
            self.traces[tag] += 1
            jax.debug.callback(lambda: self.runs.update([tag]))
            return fn(*args)
        return counted

    def settled(self):
        jax.effects_barrier()
        return self.runs


def _sub_jaxprs(value):
    if isinstance(value, jcore.ClosedJaxpr):
        yield value.jaxpr
    elif isinstance(value, jcore.Jaxpr):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _sub_jaxprs(v)


def _expanded(prim):
    """The jaxpr of a hijax primitive's ``expand`` (what it lowers to), traced on its avals."""
    avals = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), prim.in_avals)
    return jax.make_jaxpr(lambda *args: prim.expand(*args))(*avals)


def count_eqns(jaxpr):
    """Equations of a jaxpr, those of every sub-jaxpr (loop bodies, branches, calls) and of
    every hijax primitive's expansion (bincheck's backward sweeps are such primitives)
    included."""
    if isinstance(jaxpr, jcore.ClosedJaxpr):
        jaxpr = jaxpr.jaxpr
    total = 0
    for eqn in jaxpr.eqns:
        total += 1
        for name, value in eqn.params.items():
            if name == "_prim" and hasattr(value, "expand"):
                total += count_eqns(_expanded(value))
            for sub in _sub_jaxprs(value):
                total += count_eqns(sub)
    return total


def temp_bytes(f, *args):
    """XLA's temporaries for ``jit(f)(*args)``; the arrays are arguments, not constants."""
    return int(jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes)


def nbytes(tree):
    return int(sum(np.asarray(v).nbytes for v in jax.tree.leaves(tree)))
