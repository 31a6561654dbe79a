"""``bj.scan_plan``: the plan a gradient of ``bj.scan`` uses, shown before anything runs (issue
29, item 11), and ``bj.scan`` of length 0, which ``lax.scan`` allows. Oracles: the closed form
t(l, s), evaluations counted at run time, ``memory_analysis`` and ``lax.scan``."""

import pytest

from jax_helpers import Counter, assert_close, closed_form, cubed_sum, jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import bincheck.jax as bj  # noqa: E402

T, H = 12, 8
G = np.random.default_rng(3)
W = jnp.asarray(G.normal(size=(H, H)) * 0.4)
H0 = jnp.asarray(G.normal(size=(H,)))
XS = jnp.asarray(G.normal(size=(T, H)))


def step(h, x):
    h = jnp.tanh(h @ W + x)
    return h, jnp.sum(h ** 2)


@pytest.mark.parametrize("budget", [dict(num_ckpts=3), dict(memory=4)])
def test_the_plan_shown_is_the_plan_a_gradient_runs(budget):
    counter = Counter()
    f = counter.wrap(step)
    S = lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype)  # noqa: E731
    if "memory" in budget:      # room for the working set and that many states
        sizes = bj.scan_plan(f, S(H0), S(XS), memory="1MB").sizes
        budget = dict(memory=sizes.work_bytes + budget["memory"] * sizes.state_bytes)
    plan = bj.scan_plan(f, S(H0), S(XS), **budget)          # shapes alone: nothing runs
    assert counter.settled()["fn"] == 0
    assert plan.taped_steps == T
    assert plan.plain_steps == closed_form(T, plan.checkpoints)
    if "num_ckpts" in budget:
        assert plan.checkpoints == 3
    else:
        assert plan.peak_bytes <= budget["memory"] and plan.checkpoints == 4

    def loss(h0, xs):
        carry, ys = bj.scan(f, h0, xs, **budget)
        return cubed_sum((carry, ys))
    grad = jax.jit(jax.grad(loss, (0, 1))).lower(H0, XS).compile()
    got = grad(H0, XS)
    assert counter.settled()["fn"] == plan.plain_steps + T
    assert grad.memory_analysis().temp_size_in_bytes <= plan.memory
    assert_close(got, jax.grad(lambda h, x: cubed_sum(lax.scan(step, h, x)), (0, 1))(H0, XS))


def test_a_scan_of_length_zero_is_lax_scan_s():
    empty = XS[:0]
    f = lambda h, x: step(h, 0.5 if x is None else x)  # noqa: E731
    for xs, length in ((empty, None), (None, 0), (empty, 0)):
        got = bj.scan(f, H0, xs, length, num_ckpts=2)
        want = lax.scan(f, H0, xs, length)
        assert_close(got, want, rtol=0, atol=0)
        assert bj.scan_plan(f, H0, xs, length, memory="1MB") is None
    grad = jax.grad(lambda h: jnp.sum(bj.scan(step, h, empty, num_ckpts=2)[0] ** 3))(H0)
    assert_close(grad, 3 * H0 ** 2)
    with pytest.raises(ValueError, match="num_ckpts must be a positive int .*got 0"):
        bj.scan(step, H0, empty, num_ckpts=0)
    with pytest.raises(ValueError, match="length must be a non-negative int; got -2"):
        bj.scan(step, H0, None, -2, num_ckpts=2)
