"""bincheck.jax.while_loop: exact gradients against a plain bounded loop, run-time step counts
equal to the online planner's (the framework-free Python one), the traced split equal to the
Python split, O(n) forward work, the max_steps bound, vmap, and errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import bincheck.jax as bj
from bincheck.jax import revolve
from bincheck.schedule import optimal_plain_steps, split
from bincheck.schedule.online import OnlinePlanner

jax.config.update("jax_enable_x64", True)

H = 4


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> None:
        self.n += 1


def problem(counter=None):
    """An Euler-like iteration that stops when t reaches a limit read from the state."""
    def make(W, limit):
        def body(v):
            if counter is not None:
                jax.debug.callback(counter)
            h, t = v
            return jnp.tanh(h @ W) + 0.1 * h, t + 1

        def cond(v):
            return v[1] < limit
        return cond, body
    return make


W = jax.random.normal(jax.random.PRNGKey(1), (H, H), dtype=jnp.float64) * 0.5
H0 = jax.random.normal(jax.random.PRNGKey(2), (3, H), dtype=jnp.float64)


def plain_loss(W, h0, n):
    cond, body = problem()(W, n)
    v = (h0, 0)
    for _ in range(n):
        v = body(v)
    return jnp.sum(v[0] ** 2)


def planner_count(n, s):
    """fn evaluations of one gradient by the Python online planner: n forward, its predicted
    recomputations, n taped."""
    planner = OnlinePlanner(s)
    list(planner.start())
    for k in range(1, n):
        list(planner.advance(k))
    return n + planner.predicted_reverse_steps(n) + n


@pytest.mark.parametrize("s", [1, 2, 3, 6])
def test_gradients_and_counts_equal_the_planners(s):
    counter = Counter()
    make = problem(counter)
    limit = jnp.int64(0)

    def loss(W, h0, limit):
        cond, body = make(W, limit)
        return jnp.sum(bj.while_loop(cond, body, (h0, 0), max_steps=60, num_ckpts=s)[0] ** 2)
    grad = jax.jit(jax.grad(loss, (0, 1)))
    for n in (0, 1, 2, 3, 5, 9, 21, 37, 60):
        limit = jnp.int64(n)
        counter.n = 0
        g = jax.block_until_ready(grad(W, H0, limit))
        want = jax.grad(plain_loss, (0, 1))(W, H0, n)
        for a, b in zip(g, want):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-14)
        assert counter.n == planner_count(n, s), (n, s)


def test_within_five_percent_of_the_offline_optimum():
    """Plain evaluations for n <= beta(s, 3), s >= 3 (counted at run time: all but the n
    taped): equal to the offline optimum's t(n, s) + 1 (closed form; + 1: the forward cannot
    tape a last step it does not know is last) up to beta(s, 2), within 5 % of it up to
    beta(s, 3) - the convention of tests/test_online.py."""
    counter = Counter()
    make = problem(counter)
    s = 4                                   # beta(4, 2) = 15, beta(4, 3) = 35

    def loss(W, limit):
        cond, body = make(W, limit)
        return jnp.sum(bj.while_loop(cond, body, (H0, 0), max_steps=35, num_ckpts=s)[0] ** 2)
    grad = jax.jit(jax.grad(loss))
    worst = 1.0
    for n in range(1, 36):
        counter.n = 0
        jax.block_until_ready(grad(W, jnp.int64(n)))
        ratio = (counter.n - n) / (optimal_plain_steps(n, s) + 1)
        if n <= 15:
            assert ratio == 1, n
        worst = max(worst, ratio)
    assert 1 < worst <= 1.05, worst        # the online planner does lose a little past beta(s, 2)


def test_traced_split_equals_python_split():
    slots, max_len = 12, 700
    table = jnp.asarray(revolve.beta_table(slots, max_len))
    ls = np.arange(2, max_len + 1)
    for s in range(2, slots + 1):
        got = jax.jit(jax.vmap(lambda l: revolve.split(table, l, s)))(jnp.asarray(ls))
        want = np.array([split(int(l), s) for l in ls])
        np.testing.assert_array_equal(np.asarray(got), want)


def test_forward_work_is_the_steps_taken_not_max_steps():
    counter = Counter()
    cond, body = problem(counter)(W, 7)
    out = jax.jit(lambda h0: bj.while_loop(cond, body, (h0, 0), max_steps=100_000,
                                           num_ckpts=3))(H0)
    jax.block_until_ready(out)
    assert counter.n == 7 and int(out[1]) == 7


def test_max_steps_bounds_the_loop():
    def loss(W):
        cond, body = problem()(W, 10**6)
        return jnp.sum(bj.while_loop(cond, body, (H0, 0), max_steps=25, num_ckpts=4)[0] ** 2)
    cond, body = problem()(W, 10**6)
    assert int(bj.while_loop(cond, body, (H0, 0), max_steps=25, num_ckpts=4)[1]) == 25
    np.testing.assert_allclose(jax.grad(loss)(W), jax.grad(plain_loss)(W, H0, 25), rtol=1e-10)


def test_equals_lax_while_loop_and_closures_are_differentiated():
    def loss(W, use_bj):
        def body(v):
            h, t = v
            return jnp.sin(h @ W), t + 1.0

        def cond(v):
            return v[1] < 13.0
        run = (lambda c, b, v: bj.while_loop(c, b, v, max_steps=20, num_ckpts=3)) if use_bj \
            else lax.while_loop
        return jnp.sum(run(cond, body, (H0, 0.0))[0])
    assert float(loss(W, True)) == pytest.approx(float(loss(W, False)), rel=1e-12)

    def unrolled(W):
        h = H0
        for _ in range(13):
            h = jnp.sin(h @ W)
        return jnp.sum(h)
    np.testing.assert_allclose(jax.grad(loss)(W, True), jax.grad(unrolled)(W), rtol=1e-10)


def test_vmap_with_a_batched_condition():
    cond_body = problem()

    def loss(W, limit):
        cond, body = cond_body(W, limit)
        return jnp.sum(bj.while_loop(cond, body, (H0, 0), max_steps=30, num_ckpts=3)[0] ** 2)
    limits = jnp.array([0, 4, 17, 30])
    got = jax.vmap(jax.grad(loss), (None, 0))(W, limits)
    for i, n in enumerate([0, 4, 17, 30]):
        np.testing.assert_allclose(got[i], jax.grad(plain_loss)(W, H0, n), rtol=1e-10,
                                   atol=1e-14)


def test_errors():
    cond, body = problem()(W, 3)
    with pytest.raises(TypeError, match="max_steps"):
        bj.while_loop(cond, body, (H0, 0), max_steps=None, num_ckpts=3)
    with pytest.raises(ValueError, match="num_ckpts"):
        bj.while_loop(cond, body, (H0, 0), max_steps=10, num_ckpts=0)
    with pytest.raises(ValueError, match="shape"):
        bj.while_loop(cond, lambda v: (v[0][:1], v[1]), (H0, 0), max_steps=10, num_ckpts=2)
    with pytest.raises(TypeError, match=r"cond_fun must return a scalar bool .*shape=\(3, 4\)"):
        bj.while_loop(lambda v: v[0] > 0.0, body, (H0, 0), max_steps=10, num_ckpts=2)


def _temp(f, *args):
    return jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_memory_budget_holds_under_memory_analysis():
    """memory= plans the slots from shapes; the compiled gradient's XLA temporaries stay within
    it, and fewer bytes give fewer states (more recomputation, smaller temporaries)."""
    Hb, B = 64, 32
    Wb = jnp.ones((Hb, Hb)) * 0.01
    h0 = jnp.ones((B, Hb))
    state = B * Hb * 8

    def make(memory):
        def loss(W, h0, limit):
            def body(v):
                return jnp.tanh(v[0] @ W), v[1] + 1
            out = bj.while_loop(lambda v: v[1] < limit, body, (h0, 0), max_steps=500,
                                memory=memory)
            return jnp.sum(out[0] ** 2)
        return jax.grad(loss)
    temps = []
    for memory in (20 * state, 60 * state, 200 * state):
        temp = _temp(make(memory), Wb, h0, jnp.int64(400))
        assert temp <= memory, (memory, temp)
        temps.append(temp)
    assert temps[0] < temps[1] < temps[2]
    with pytest.raises(ValueError, match=r"below the least this loop needs.*bytes in all"):
        make(2 * state)(Wb, h0, jnp.int64(3))
    with pytest.raises(TypeError, match="exactly one"):
        bj.while_loop(lambda v: True, lambda v: v, H0, max_steps=3, num_ckpts=2, memory="1MB")


def test_a_long_planning_is_announced(monkeypatch):
    import importlib
    wl = importlib.import_module("bincheck.jax.while_loop")   # the module, not the function
    monkeypatch.setattr(wl, "WARN_SECONDS", 1e-4)
    cond, body = problem()(W, 3)
    with pytest.warns(RuntimeWarning, match=r"max_steps=977 at num_ckpts=3 takes about"):
        bj.while_loop(cond, body, (H0, 0), max_steps=977, num_ckpts=3)


def test_hessian_vector_product_through_the_while_loop():
    """jax.jvp of grad (forward over the checkpointed reverse sweep) equals the plain loop's."""
    def loss(W, use_bj):
        cond, body = problem()(W, 9)
        if use_bj:
            out = bj.while_loop(cond, body, (H0, 0), max_steps=20, num_ckpts=3)
            return jnp.sum(out[0] ** 2)
        return plain_loss(W, H0, 9)
    V = jnp.ones_like(W) * 0.1
    got = jax.jvp(jax.grad(lambda W: loss(W, True)), (W,), (V,))[1]
    want = jax.jvp(jax.grad(lambda W: loss(W, False)), (W,), (V,))[1]
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-14)
    assert float(jnp.max(jnp.abs(want))) > 0
