"""bincheck.jax.forward: the checkpointed loop as one hijax primitive, so that forward mode
(``jax.jvp`` of the loop itself, ``jacfwd``, ``linearize``) works beside the checkpointed reverse
mode: results equal a plain ``lax.scan``'s (float64), ``check_grads`` in both modes, Hessians,
forward-over-reverse, vmap, symbolic zeros, and exact step-evaluation counts (a gradient:
``t(l, s) + l``; a jvp: ``l``, one tangent step each). The ``custom_vjp`` fallback is checked
too."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.test_util import check_grads

import bincheck.jax as bj
from bincheck.jax import forward, sweep
from bincheck.jax.boundary import Flat
from bincheck.schedule import optimal_plain_steps, plan

jax.config.update("jax_enable_x64", True)

T, S, H = 8, 3, 3
RTOL = 1e-10


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> None:
        self.n += 1


def step(W, h, x, counter=None):
    if counter is not None:
        jax.debug.callback(counter)
    return {"a": jnp.tanh(h["a"] @ W["m"] + x) * W["s"], "b": h["b"] * 0.9 + jnp.sum(x)}


def output(W, h, x):
    return jnp.sin(h["a"]) * h["b"]


def make(counter=None, hijax=None, output_fn=output, seq_len=T, num_ckpts=S):
    """What ``CheckpointedLoop.__call__`` does, with :func:`forward.checkpointed` as the
    primitive: ``f(W, h0, xs) -> (h_T, ys)``."""
    loop = bj.binomial_checkpoint(lambda W, h, x: step(W, h, x, counter), seq_len, num_ckpts,
                                  output_fn=output_fn)

    def f(W, h0, xs):
        flat = Flat(loop.whole, W, h0, xs, loop.seq_len)
        tables = loop.tables_for(loop.plan_for(flat))
        prim = forward.checkpointed(flat, tables, hijax)
        new, ys = prim(flat.p, flat.h, flat.x, tuple(jnp.asarray(a) for a in tables.arrays()))
        return jax.tree.unflatten(flat.h_def, new), jax.tree.unflatten(flat.y_def, ys)
    return f


def plain(W, h0, xs):
    def body(h, x):
        new = step(W, h, x)
        return new, output(W, new, x)
    return lax.scan(body, h0, xs)


KEYS = jax.random.split(jax.random.PRNGKey(0), 6)
W = {"m": jax.random.normal(KEYS[0], (H, H)) * 0.6, "s": jnp.float64(1.2)}
H0 = {"a": jax.random.normal(KEYS[1], (H,)), "b": jnp.float64(0.7)}
XS = jax.random.normal(KEYS[2], (T, H)) * 0.5
DW = {"m": jax.random.normal(KEYS[3], (H, H)), "s": jnp.float64(-0.4)}
DH = {"a": jax.random.normal(KEYS[4], (H,)), "b": jnp.float64(0.3)}
DX = jax.random.normal(KEYS[5], (T, H))


def loss_of(f):
    def loss(W, h0, xs):
        h, ys = f(W, h0, xs)
        return jnp.sum(h["a"] ** 2) + h["b"] + jnp.sum(jnp.cos(ys))
    return loss


def close(a, b, rtol=RTOL):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    assert len(la) == len(lb) > 0
    for u, v in zip(la, lb):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=rtol, atol=1e-12)


def test_hijax_behind_a_version_check():
    """The primitive is used exactly where ``jax.experimental.hijax`` has it (jax >= 0.8.1)."""
    has = hasattr(__import__("jax.experimental.hijax").experimental.hijax, "VJPHiPrimitive")
    assert forward.HIJAX is has
    if tuple(jax.__version_info__[:3]) >= (0, 8, 1):
        assert forward.HIJAX


def test_jvp_of_the_loop_equals_plain_scan():
    f = make()
    got = jax.jvp(f, (W, H0, XS), (DW, DH, DX))
    close(got, jax.jvp(plain, (W, H0, XS), (DW, DH, DX)))


@pytest.mark.parametrize("which", [0, 1, 2])
def test_jvp_with_symbolic_zero_tangents(which):
    """Only one of params / state / inputs perturbed: the others' tangents are symbolic zeros."""
    args, tans = (W, H0, XS), (DW, DH, DX)

    def only(f):
        def g(a):
            full = list(args)
            full[which] = a
            return f(*full)
        return g
    close(jax.jit(lambda a, t: jax.jvp(only(make()), (a,), (t,)))(args[which], tans[which]),
          jax.jvp(only(plain), (args[which],), (tans[which],)))


def test_linearize_and_jacfwd_equal_plain_scan():
    y, f_lin = jax.linearize(make(), W, H0, XS)
    y0, f_lin0 = jax.linearize(plain, W, H0, XS)
    close(y, y0)
    close(f_lin(DW, DH, DX), f_lin0(DW, DH, DX))
    close(jax.jit(jax.jacfwd(lambda a: make()(W, {"a": a, "b": H0["b"]}, XS)))(H0["a"]),
          jax.jacfwd(lambda a: plain(W, {"a": a, "b": H0["b"]}, XS))(H0["a"]))


def test_check_grads_forward_and_reverse():
    loss = jax.jit(loss_of(make(seq_len=5, num_ckpts=2)))   # jvp / vjp of jit: the rules
    xs = XS[:5]
    check_grads(loss, (W, H0, xs), order=1, modes=["fwd", "rev"])
    check_grads(lambda h0: loss(W, h0, xs), (H0,), order=2, modes=["fwd"])


def test_hessian_and_jvp_of_grad_equal_plain_scan():
    def on_a(f):
        return lambda a: loss_of(f)(W, {"a": a, "b": H0["b"]}, XS)
    close(jax.jit(jax.hessian(on_a(make())))(H0["a"]), jax.jit(jax.hessian(on_a(plain)))(H0["a"]))

    def hvp(f):
        return jax.jit(lambda *a: jax.jvp(jax.grad(loss_of(f), (0, 1)), a[:3], a[3:]))
    close(hvp(make())(W, H0, XS, DW, DH, DX), hvp(plain)(W, H0, XS, DW, DH, DX))


def test_vmap_vmap_grad_and_forward_mode_under_vmap():
    h0s = jax.tree.map(lambda v: jnp.stack([v, 2 * v, -v]), H0)
    dhs = jax.tree.map(lambda v: jnp.stack([v, -v, 3 * v]), DH)

    def each(f):
        return jax.jit(lambda h0s, dhs: (
            jax.vmap(f, (None, 0, None))(W, h0s, XS),
            jax.vmap(jax.grad(loss_of(f)), (None, 0, None))(W, h0s, XS),
            jax.vmap(lambda h, d: jax.jvp(f, (W, h, XS), (DW, d, DX)))(h0s, dhs),
            jax.jvp(jax.vmap(f, (None, 0, None)), (W, h0s, XS), (DW, dhs, DX))))
    close(each(make())(h0s, dhs), each(plain)(h0s, dhs))


@pytest.mark.parametrize("hijax", [True, False])
def test_jit_grad_equals_plain_scan_and_evaluates_the_step_t_plus_l_times(hijax):
    counter = Counter()
    loss = loss_of(make(counter, hijax))
    got = jax.block_until_ready(jax.jit(jax.grad(loss, (0, 1, 2)))(W, H0, XS))
    jax.effects_barrier()
    close(got, jax.grad(loss_of(plain), (0, 1, 2))(W, H0, XS))
    assert plan(T, S).plain_steps == optimal_plain_steps(T, S) > T - 1
    assert counter.n == optimal_plain_steps(T, S) + T


def test_jvp_evaluates_the_step_once_per_step():
    counter = Counter()
    f = make(counter)
    jax.block_until_ready(jax.jvp(f, (W, H0, XS), (DW, DH, DX)))
    jax.effects_barrier()
    assert counter.n == T
    counter.n = 0
    jax.block_until_ready(jax.jit(lambda h: jax.jvp(f, (W, h, XS), (DW, DH, DX)))(H0))
    jax.effects_barrier()
    assert counter.n == T


@pytest.mark.parametrize("argnums, want_x", [(0, False), (2, True), ((0, 1), False)])
def test_reverse_sweep_computes_no_cotangent_for_unperturbed_inputs(monkeypatch, argnums,
                                                                    want_x):
    seen = []
    reverse = sweep.reverse_sweep

    def spy(flat, tables, res, g_h, g_ys, p_wanted, x_wanted):
        seen.append((tuple(p_wanted), tuple(x_wanted)))
        return reverse(flat, tables, res, g_h, g_ys, p_wanted, x_wanted)
    monkeypatch.setattr(sweep, "reverse_sweep", spy)
    jax.make_jaxpr(jax.grad(loss_of(make()), argnums))(W, H0, XS)     # traced, not run
    want_p = argnums == 0 or argnums == (0, 1)
    assert seen == [((want_p, want_p), (want_x,))]


@pytest.mark.parametrize("hijax", [True, False])
def test_interleaved_vjps_of_one_jitted_loss_each_get_their_own_backward(hijax):
    # Two jax.vjp of one jitted loss differentiating different arguments, both pulled back
    # after both forwards: the custom_vjp fallback once gave the first a zero parameter
    # gradient (its backward got the second forward's choice of wanted cotangents).
    loss = jax.jit(loss_of(make(hijax=hijax)))
    ref = loss_of(lambda W, h0, xs: plain(W, h0, xs))
    _, pb_w = jax.vjp(lambda W: loss(W, H0, XS), W)
    _, pb_x = jax.vjp(lambda xs: loss(W, H0, xs), XS)
    close(pb_w(1.0)[0], jax.grad(ref, 0)(W, H0, XS))
    close(pb_x(1.0)[0], jax.grad(ref, 2)(W, H0, XS))


def test_integer_state_leaf_gets_a_float0_tangent():
    def fn(W, h, x):
        return {"a": jnp.tanh(h["a"] * W + x), "k": h["k"] + 1}
    loop = bj.binomial_checkpoint(fn, 5, 2)

    def f(W, h0, xs):
        flat = Flat(loop.whole, W, h0, xs, 5)
        tables = loop.tables_for(loop.plan_for(flat))
        new, _ = forward.checkpointed(flat, tables)(flat.p, flat.h, flat.x,
                                                    tuple(jnp.asarray(a) for a in tables.arrays()))
        return jax.tree.unflatten(flat.h_def, new)
    h0 = {"a": jnp.ones(2), "k": jnp.int64(3)}
    out, tan = jax.jvp(lambda w: f(w, h0, jnp.ones((5, 2))), (0.8,), (1.0,))
    assert int(out["k"]) == 8 and tan["k"].dtype == jax.dtypes.float0
    want = jax.jvp(lambda w: lax.scan(lambda h, x: (fn(w, h, x), None), h0,
                                      jnp.ones((5, 2)))[0]["a"], (0.8,), (1.0,))
    close((out["a"], tan["a"]), want)


def test_custom_vjp_fallback_has_reverse_mode_only():
    """``hijax=False`` (what jax < 0.8.1 gets; its gradients and counts are checked above):
    ``jax.jvp`` of the loop raises JAX's custom_vjp error."""
    with pytest.raises(TypeError, match="custom_vjp"):
        jax.jvp(make(hijax=False), (W, H0, XS), (DW, DH, DX))

