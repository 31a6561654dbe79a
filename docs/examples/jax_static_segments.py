"""bincheck.jax: segments of one static length. L consecutive steps become one super-step (a
lax.scan), and bincheck checkpoints the loop of T / L super-steps: few stored states, one
segment's residuals, each segment reversed by JAX's transpose of its scan (the shape of nested
sqrt(T) remat, with bincheck's schedule over the segments). Checked against lax.scan."""

import jax
import jax.numpy as jnp
from jax import lax

import bincheck.jax as bj

T, L, B, I, H = 1000, 25, 8, 16, 32                  # L divides T
k = jax.random.split(jax.random.PRNGKey(0), 4)
W = jax.random.normal(k[0], (H, H)) * 0.3
U = jax.random.normal(k[1], (I, H)) * 0.3
h0 = jax.random.normal(k[2], (B, H))
xs = jax.random.normal(k[3], (T, B, I))


def loss(W, U, h0, xs, scan):
    def f(h, x):                                     # lax.scan's f(carry, x) -> (carry, y)
        h = jnp.tanh(h @ W + x @ U)
        return h, jnp.mean(h ** 2)
    h, ys = scan(f, h0, xs)
    return jnp.sum(h ** 2) + ys.sum()


def static_segments(f, init, xs, num_ckpts):
    def block(carry, xs_block):                      # L steps, taped and reversed whole
        return lax.scan(f, carry, xs_block)

    n = T // L
    blocks = jax.tree.map(lambda v: v.reshape((n, L) + v.shape[1:]), xs)
    carry, ys = bj.scan(block, init, blocks, num_ckpts=num_ckpts)   # or memory="..."
    return carry, jax.tree.map(lambda v: v.reshape((T,) + v.shape[2:]), ys)


grad = jax.jit(jax.grad(loss, (0, 1, 2, 3)), static_argnums=4)
ours = grad(W, U, h0, xs, lambda f, c, x: static_segments(f, c, x, num_ckpts=10))
plain = grad(W, U, h0, xs, lax.scan)
for a, b in zip(ours, plain):                        # float32: equal to rounding
    err = float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
    assert err < 1e-5, err
print(f"{T // L} super-steps of {L} steps, 10 checkpoints: gradients equal lax.scan's")
