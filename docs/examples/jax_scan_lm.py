"""bincheck.jax: a GRU language model whose loss is taken at every step, through bj.scan (a
drop-in for lax.scan), jitted and trained a few steps; then a differentiable while loop. Both are
checked against the plain lax loops."""

import jax
import jax.numpy as jnp
from jax import lax

import bincheck.jax as bj

T, B, V, H = 200, 8, 20, 32                          # steps, batch, vocabulary, hidden units
keys = jax.random.split(jax.random.PRNGKey(0), 4)
params = {"embed": jax.random.normal(keys[0], (V, H)) * 0.3,
          "wx": jax.random.normal(keys[1], (H, 3 * H)) * 0.2,
          "wh": jax.random.normal(keys[2], (H, 3 * H)) * 0.2,
          "head": jax.random.normal(keys[3], (H, V)) * 0.2}
text = jax.random.randint(jax.random.PRNGKey(1), (T + 1, B), 0, V)


def gru(p, h, chars):
    gx, gh = p["embed"][chars] @ p["wx"], h @ p["wh"]
    r = jax.nn.sigmoid(gx[:, :H] + gh[:, :H])
    z = jax.nn.sigmoid(gx[:, H:2 * H] + gh[:, H:2 * H])
    n = jnp.tanh(gx[:, 2 * H:] + r * gh[:, 2 * H:])
    return (1 - z) * n + z * h


def loss(p, text, scan):
    def f(h, x):                                     # lax.scan's f(carry, x) -> (carry, y)
        h = gru(p, h, x[0])
        logits = h @ p["head"]
        return h, -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(B), x[1]])
    _, losses = scan(f, jnp.zeros((B, H)), (text[:-1], text[1:]))
    return losses.mean()


checkpointed = jax.jit(jax.value_and_grad(
    lambda p, text: loss(p, text, lambda f, c, xs: bj.scan(f, c, xs, num_ckpts=10))))
for _ in range(3):
    value, grads = checkpointed(params, text)
    params = jax.tree.map(lambda p, g: p - 0.5 * g, params, grads)
print(f"loss {float(value):.3f}")

# The same gradient as lax.scan's (float32):
plain = jax.grad(lambda p: loss(p, text, lax.scan))(params)
ours = checkpointed(params, text)[1]
for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(plain)):
    assert jnp.allclose(a, b, rtol=1e-4, atol=1e-6), float(jnp.max(jnp.abs(a - b)))

# A loop that stops when a condition says so: lax.while_loop's arguments plus max_steps and a
# budget. Differentiable, O(n) forward work, at most num_ckpts states held in the backward.
def decay(rate, use_bj):
    def body(v):
        x, t = v
        return x * (1 - rate) + 0.001 * jnp.sin(x), t + 1

    def cond(v):
        return jnp.max(jnp.abs(v[0])) > 0.05
    start = (jnp.linspace(1.0, 2.0, 16), 0)
    if use_bj:
        return bj.while_loop(cond, body, start, max_steps=10_000, num_ckpts=8)
    return lax.while_loop(cond, body, start)


x, steps = decay(0.01, True)
print(f"the while loop stopped after {int(steps)} steps")
g = jax.grad(lambda r: jnp.sum(decay(r, True)[0]))(0.01)
# the oracle: the same number of steps unrolled by lax.scan, differentiated store-all
n = int(steps)
want = jax.grad(lambda r: jnp.sum(lax.scan(
    lambda v, _: (((v[0] * (1 - r) + 0.001 * jnp.sin(v[0])), v[1] + 1), None),
    (jnp.linspace(1.0, 2.0, 16), 0), length=n)[0][0]))(0.01)
assert jnp.allclose(g, want, rtol=1e-4), (g, want)
