"""bincheck.jax: values and gradients equal the plain loop's (float64 rtol 1e-10, float32 rtol
1e-5), with and without jit, under every transformation the issue names.

Oracles: the same loop as one ``lax.scan``, and for the tanh cell a hand-written numpy backprop
(:func:`numpy_bptt`, checked against ``lax.scan`` here), which costs no compilation. Compiling
dominates these tests' time, so each test builds few programs.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from jax_helpers import (F32, F64, assert_close, cubed_sum, jax, lstm_cell,  # noqa: E402
                         lstm_problem, numpy_bptt, plain_loop, problem, tanh_cell)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import bincheck.jax as bj  # noqa: E402

T = 17
ALL = (0, 1, 2)
HERE = os.path.dirname(os.path.abspath(__file__))


def plain(p, h, x):
    return plain_loop(tanh_cell, p, h, x)


def loss_of(run):
    return lambda p, h, x: cubed_sum(run(p, h, x))


def grads_of(run, argnums=ALL):
    return jax.value_and_grad(loss_of(run), argnums=argnums)


def oracle(params, h0, xs):
    """``(loss, grads)`` as :func:`grads_of` returns them, from numpy."""
    final, grads = numpy_bptt(params, h0, xs)
    return np.sum(final ** 3), grads


@pytest.mark.parametrize("length,S", [(1, [1, 2]), (2, [1, 3]), (T, [1, 3, T + 3])])
def test_grid_of_lengths_and_checkpoints(length, S):
    """s = 1, 1 < s < T and s > T, T = 1 among the lengths: one jitted program. (The counts
    tests check gradients against the numpy oracle over a wider grid of (T, s).)"""
    params, h0, xs = problem(length)
    loops = [bj.binomial_checkpoint(tanh_cell, length, s) for s in S]
    got, primal = jax.jit(lambda p, h, x: ([grads_of(loop)(p, h, x) for loop in loops],
                                           loops[-1](p, h, x)))(params, h0, xs)
    want = oracle(params, h0, xs)
    for s, g in zip(S, got):
        assert_close(g, want)
    assert_close(primal, numpy_bptt(params, h0, xs)[0])   # the primal alone, no derivative


def test_every_subset_of_arguments():
    """Only the cotangents asked for are computed (symbolic zeros): each subset is exact, a
    single params leaf too (the others then enter as constants)."""
    params, h0, xs = problem(T)
    W, U, b = params
    loop = bj.binomial_checkpoint(tanh_cell, T, 4)
    subsets = [(1,), (2,)]          # no params cotangent; no params nor h0 cotangent

    def f(p, h, x):
        out = [jax.grad(loss_of(loop), argnums=a)(p, h, x) for a in subsets]
        out.append(jax.grad(lambda U: loss_of(loop)((W, U, b), h, x))(U))
        return out, grads_of(plain)(p, h, x)
    got, scanned = jax.jit(f)(params, h0, xs)
    _, want = oracle(params, h0, xs)
    assert_close(scanned[1], want)                       # the two oracles agree
    assert_close(got, [tuple(want[i] for i in a) for a in subsets] + [want[0][1]])


def test_without_jit_vjp():
    params, h0, xs = problem(T)
    loop = bj.binomial_checkpoint(tanh_cell, T, 2)
    out, pullback = jax.vjp(loop, params, h0, xs)
    ct = jnp.cos(jnp.arange(out.size, dtype=F64)).reshape(out.shape)
    final, want = numpy_bptt(params, h0, xs, ct)
    assert_close(out, final)
    assert_close(pullback(ct), want)


def test_float32_stays_float32_with_and_without_jit():
    params, h0, xs = problem(T, dtype=F32)
    loop = bj.binomial_checkpoint(tanh_cell, T, 3)
    want = jax.jit(grads_of(plain))(params, h0, xs)
    for got in (jax.jit(grads_of(loop))(params, h0, xs), grads_of(loop)(params, h0, xs)):
        assert all(v.dtype == F32 for v in jax.tree.leaves(got)), jax.tree.map(jnp.dtype, got)
        assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_pytrees_dict_params_lstm_state_dict_inputs():
    params, state, xs = lstm_problem(T)
    inputs = {"x": xs, "scale": jnp.linspace(0.5, 1.5, T, dtype=F64)[:, None, None]}
    step = lambda p, s, x: lstm_cell(p, s, x["x"] * x["scale"])      # noqa: E731
    ref = lambda p, s, x: plain_loop(step, p, s, x)                    # noqa: E731
    loop = bj.binomial_checkpoint(step, T, 3)
    both = lambda p, s, x: [(run(p, s, x), grads_of(run)(p, s, x)) for run in (loop, ref)]  # noqa
    got, want = jax.jit(both)(params, state, inputs)
    assert isinstance(got[0], tuple) and len(got[0]) == 2
    assert set(got[1][1][0]) == {"W", "U", "b"} and set(got[1][1][2]) == {"x", "scale"}
    assert_close(got, want)


def test_integer_and_bool_leaves_pass_through():
    """Integer and bool leaves in the state and the inputs are carried exactly and get float0
    cotangents; the float leaves' gradients are exact."""
    params, h0, xs = problem(T)
    ks = [t * 7 % 3 for t in range(T)]

    def step(p, s, x):
        h = tanh_cell(p, s["h"], x["x"]) * (1.0 + 0.1 * x["k"])
        return {"h": h, "n": s["n"] + x["k"], "odd": s["odd"] ^ (x["k"] == 1)}
    state = {"h": h0, "n": jnp.zeros(3, jnp.int32), "odd": jnp.zeros(2, bool)}
    inputs = {"x": xs, "k": jnp.asarray(ks, jnp.int32)}
    loop = bj.binomial_checkpoint(step, T, 3)
    ref = lambda p, s, x: plain_loop(step, p, s, x)                    # noqa: E731
    loss = lambda run: lambda p, s, x: jnp.sum(run(p, s, x)["h"] ** 3)  # noqa: E731
    grads = lambda run: jax.grad(loss(run), argnums=ALL, allow_int=True)  # noqa: E731
    both = lambda p, s, x: [(run(p, s, x), grads(run)(p, s, x)) for run in (loop, ref)]  # noqa
    (out, got), want = jax.jit(both)(params, state, inputs)
    assert out["n"].dtype == jnp.int32 and out["odd"].dtype == jnp.bool_
    assert out["n"].tolist() == [sum(ks)] * 3
    assert out["odd"].tolist() == [ks.count(1) % 2 == 1] * 2
    for g in (got[1]["n"], got[1]["odd"], got[2]["k"]):
        assert g.dtype == jax.dtypes.float0
    assert_close((out, got), want)


def test_output_fn_per_step_loss():
    params, h0, xs = problem(T)
    readout = lambda p, h, x: jnp.mean(jnp.sum(h, 1) * x[:, 0])      # noqa: E731
    loop = bj.binomial_checkpoint(tanh_cell, T, 3, output_fn=readout)
    ref = lambda p, h, x: plain_loop(tanh_cell, p, h, x, output_fn=readout)  # noqa: E731
    losses = [lambda o: jnp.sum(o[1] ** 2) + cubed_sum(o[0]),      # both outputs
              lambda o: jnp.sum(jnp.sin(o[1])),                     # the per-step outputs only
              lambda o: cubed_sum(o[0])]                            # the final state only

    def run(f):
        return lambda p, h, x: (f(p, h, x), [jax.grad(lambda p, h, x: L(f(p, h, x)),
                                                      argnums=ALL)(p, h, x) for L in losses])
    got, want = jax.jit(lambda *a: (run(loop)(*a), run(ref)(*a)))(params, h0, xs)
    assert got[0][1].shape == (T,)
    assert_close(got, want)


def test_scan_drop_in_with_closed_over_arrays_both_directions():
    params, h0, xs = problem(T)
    W, U, b = params

    def run(scan, W, h, x, reverse):
        def f(c, x):               # closes over W (traced by grad), U and b (constants)
            new = jnp.tanh(c @ W + x @ U + b)
            return new, {"sq": jnp.sum(new ** 2, 1), "first": new[0]}
        return scan(f, h, x, reverse=reverse)
    ours = lambda f, h, x, reverse: bj.scan(f, h, x, num_ckpts=3, reverse=reverse)  # noqa

    def both(W, h, x):
        return [[(run(scan, W, h, x, r), jax.grad(
                    lambda W, h, x: cubed_sum(run(scan, W, h, x, r)), argnums=ALL)(W, h, x))
                 for r in (False, True)] for scan in (ours, lax.scan)]
    got, want = jax.jit(both)(W, h0, xs)
    assert got[0][0][1]["sq"].shape == (T, 3)
    assert_close(got, want)


def test_scan_with_length_and_no_xs():
    params, h0, _ = problem(T)
    W = params[0]

    def run(scan, W, h):
        return scan(lambda c, x: (jnp.tanh(c @ W + 0.1), c[0, 0] * c[1, 1]), h, None, length=T)
    ours = lambda f, h, x, length: bj.scan(f, h, x, length, num_ckpts=4)  # noqa: E731

    def both(W, h):
        return [(run(scan, W, h), jax.grad(lambda W, h: cubed_sum(run(scan, W, h)), (0, 1))(W, h))
                for scan in (ours, lax.scan)]
    got, want = jax.jit(both)(W, h0)
    assert got[0][1].shape == (T,)
    assert_close(got, want)


def test_check_grads_reverse_mode():
    # (7, 2): the backward recomputes a 2-step segment, not only single steps
    params, h0, xs = problem(7, B=2, H=3, I=2)
    W, U, b = params
    loop = bj.binomial_checkpoint(tanh_cell, 7, 2)
    f = jax.jit(lambda W, h, x: loop((W, U, b), h, x))
    check_grads(f, (W, h0, xs), order=1, modes=["rev"])


def test_vmap_over_the_loop_and_over_its_gradient():
    params, h0, xs = problem(T)
    h_batch = jnp.stack([h0, 2 * h0, -h0])
    p_batch = jax.tree.map(lambda v: jnp.stack([v, 0.7 * v]), params)
    loop = bj.binomial_checkpoint(tanh_cell, T, 3)

    def everything(p, hb, pb, h, x):
        batched = jax.vmap(loop, (None, 0, None))(p, hb, x)
        per_params = jax.vmap(jax.grad(loss_of(loop), ALL), (0, None, None))(pb, h, x)
        through = jax.grad(lambda p, hb: cubed_sum(jax.vmap(loop, (None, 0, None))(p, hb, x)),
                           (0, 1))(p, hb)
        return batched, per_params, through
    got = jax.jit(everything)(params, h_batch, p_batch, h0, xs)
    stack = lambda trees: jax.tree.map(lambda *v: np.stack(v), *trees)   # noqa: E731
    by_h = [numpy_bptt(params, h, xs) for h in h_batch]
    want = (np.stack([final for final, _ in by_h]),                 # vmap(loop) over h0
            stack([oracle(p, h0, xs)[1] for p in zip(*p_batch)]),   # vmap(grad) over params
            (jax.tree.map(lambda *v: sum(v), *[g[0] for _, g in by_h]),   # grad(vmap(loop))
             np.stack([g[1] for _, g in by_h])))
    assert got[0].shape == (3,) + h0.shape
    assert_close(got, want)


def test_hessian_vector_product_forward_over_reverse():
    params, h0, xs = problem(T)
    loop = bj.binomial_checkpoint(tanh_cell, T, 3)
    v = jax.tree.map(lambda a: jnp.cos(jnp.arange(a.size, dtype=F64)).reshape(a.shape), params)

    def hvp(run):
        g = jax.grad(lambda p: loss_of(run)(p, h0, xs))
        return lambda p, v: jax.jvp(g, (p,), (v,))
    got, want = jax.jit(lambda p, v: (hvp(loop)(p, v), hvp(plain)(p, v)))(params, v)
    assert_close(got[0], oracle(params, h0, xs)[1][0])
    assert_close(got, want, rtol=1e-9)


def test_loop_inside_another_loops_step():
    """An inner checkpointed loop in the outer loop's step (each outer step runs 7 inner
    ones); its backward runs inside the outer backward's recomputations."""
    params, h0, _ = problem(1)
    xs = problem(49, seed=3)[2].reshape(7, 7, 3, 2)
    inner = bj.binomial_checkpoint(tanh_cell, 7, 2)
    outer = bj.binomial_checkpoint(lambda p, h, x: 0.9 * inner(p, h, x) + 0.1 * h, 7, 2)
    ref_step = lambda p, h, x: 0.9 * plain(p, h, x) + 0.1 * h         # noqa: E731
    ref = lambda p, h, x: plain_loop(ref_step, p, h, x)                 # noqa: E731
    both = lambda p, h, x: [(run(p, h, x), grads_of(run)(p, h, x)) for run in (outer, ref)]  # noqa
    got, want = jax.jit(both)(params, h0, xs)
    assert_close(got, want)


SHARDED = """
import jax, numpy as np
from jax_helpers import assert_close, cubed_sum, numpy_bptt, problem, tanh_cell
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import bincheck.jax as bj
assert len(jax.devices()) == 2, jax.devices()
T = 12
params, h0, xs = problem(T, B=4)
mesh = Mesh(np.array(jax.devices()), ("batch",))
h0_s = jax.device_put(h0, NamedSharding(mesh, P("batch", None)))
xs_s = jax.device_put(xs, NamedSharding(mesh, P(None, "batch", None)))
assert len(h0_s.sharding.device_set) == 2 and len(xs_s.sharding.device_set) == 2
loop = bj.binomial_checkpoint(tanh_cell, T, 3)
f = jax.jit(jax.value_and_grad(lambda p, h, x: cubed_sum(loop(p, h, x)), argnums=(0, 1, 2)))
sharded = f(params, h0_s, xs_s)
unsharded = f(params, h0, xs)
assert_close(sharded, unsharded)
final, grads = numpy_bptt(params, h0, xs)
assert_close(sharded, (np.sum(final ** 3), grads))
print("ok", sharded[1][1].sharding)
"""


def test_sharded_batch_over_two_devices_equals_unsharded():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
               JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(
                   [HERE, os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(SHARDED)], cwd=HERE, env=env,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("ok"), out.stdout
