"""A typed PRNG key (``jax.random.key``, an extended dtype numpy cannot interpret) in the
carry: ``memory=`` sizes it as its key data (issue 29, item 7; jax-md's Langevin integrator
carries one). Oracles: ``lax.scan`` and ``jax.grad`` of the uncheckpointed loop."""

from jax_helpers import assert_close, jax, nbytes  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import bincheck.jax as bj  # noqa: E402

T, H = 12, 32
K0 = jax.random.key(0)
H0 = jnp.linspace(0.1, 0.6, H)
XS = jnp.linspace(0.5, 1.5, T)
#: a threefry key is two uint32
KEY_BYTES = jax.random.key_data(K0).nbytes


def noisy(carry, x):
    h, key = carry
    key, sub = jax.random.split(key)
    h = jnp.tanh(h * x + 0.1 * jax.random.normal(sub, h.shape, h.dtype))
    return (h, key), jnp.sum(h)


def loss_of(scan, **kwargs):
    def loss(h0, xs):
        (h, _), ys = scan(noisy, (h0, K0), xs, **kwargs)
        return jnp.sum(h ** 3) + jnp.sum(ys ** 2)
    return loss


def test_scan_with_a_key_in_the_carry_under_memory():
    memory = 30 * (nbytes(H0) + KEY_BYTES) + 12_000
    grad = jax.jit(jax.grad(loss_of(bj.scan, memory=memory), (0, 1))).lower(H0, XS).compile()
    assert_close(grad(H0, XS), jax.grad(loss_of(lax.scan), (0, 1))(H0, XS))
    assert grad.memory_analysis().temp_size_in_bytes <= memory


def test_the_key_is_sized_as_its_key_data():
    loop = bj.binomial_checkpoint(lambda p, c, x: noisy(c, x)[0], T, memory="1MB")
    plan = loop.preview(None, (H0, K0), XS)
    assert plan.sizes.state_bytes == nbytes(H0) + KEY_BYTES == H * 8 + 8


def test_while_loop_with_a_key_under_memory():
    def body(v):
        i, h, key = v
        key, sub = jax.random.split(key)
        return i + 1, jnp.tanh(h + 0.1 * jax.random.normal(sub, h.shape, h.dtype)), key

    def loss(h0, bincheck_loop):
        if bincheck_loop:
            out = bj.while_loop(lambda v: v[0] < 7, body, (0, h0, K0), max_steps=10,
                                memory=20 * (nbytes(H0) + KEY_BYTES) + 12_000)
        else:       # the same seven steps, unrolled
            out = (0, h0, K0)
            for _ in range(7):
                out = body(out)
        return jnp.sum(out[1] ** 3)
    assert_close(jax.grad(loss)(H0, True), jax.grad(loss)(H0, False))
