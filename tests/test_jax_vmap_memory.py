"""A ``memory=`` budget is for the program the user compiles, ``vmap`` included (issue 29, item
6): the loop is planned with the batched sizes, so XLA's temporaries of ``vmap(grad)`` and of
``grad(sum(vmap))`` stay within the budget at every batch size, where a plan made per batch
element grew with the batch. Oracles: ``memory_analysis`` and ``lax.scan``'s gradients."""

import pytest

from jax_helpers import F32, assert_close, jax, temp_bytes  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import bincheck.jax as bj  # noqa: E402

T, H = 40, 32
G = np.random.default_rng(7)
W = jnp.asarray(G.normal(size=(H, H)) * 0.2, F32)
U = jnp.asarray(G.normal(size=(H, H)) * 0.2, F32)
MEMORY = 150_000        # B=16: 40 states of 2 KiB do not fit beside 16 parameter cotangents


def cell(W, h, x):
    return jnp.tanh(h @ W + x @ U)


def batch(B):
    return (jnp.asarray(G.normal(size=(B, H)), F32),
            jnp.asarray(G.normal(size=(B, T, H)) * 0.5, F32))


def loss_of(loop):
    return lambda W, h0, xs: jnp.sum(loop(W, h0, xs) ** 2)


def vmap_of_grad(loss):
    return jax.vmap(jax.grad(loss), (None, 0, 0))


def grad_of_vmap(loss):
    return jax.grad(lambda W, h0, xs: jnp.sum(jax.vmap(loss, (None, 0, 0))(W, h0, xs)))


@pytest.mark.parametrize("transform", [vmap_of_grad, grad_of_vmap])
def test_the_budget_holds_at_every_batch_size(transform):
    loop = bj.binomial_checkpoint(cell, T, memory=MEMORY)
    checkpoints, temps, states = {}, {}, {}
    for B in (1, 4, 16):
        h0, xs = batch(B)
        grad = jax.jit(transform(loss_of(loop))).lower(W, h0, xs).compile()
        temps[B] = grad.memory_analysis().temp_size_in_bytes
        checkpoints[B], states[B] = loop.plan.checkpoints, loop.plan.sizes.state_bytes
    assert all(temp <= MEMORY for temp in temps.values()), temps
    assert states == {B: B * H * 4 for B in (1, 4, 16)}, states
    assert checkpoints[1] >= checkpoints[4] > checkpoints[16] > 1, checkpoints
    # and the gradients are lax.scan's
    plain = loss_of(lambda W, h, xs: lax.scan(lambda h, x: (cell(W, h, x), None), h, xs)[0])
    assert_close(grad(W, h0, xs), transform(plain)(W, h0, xs), rtol=2e-5, atol=2e-6)


def test_kept_segments_are_sized_batched_too():
    """Segments' sizes come from a compiled sweep, vmapped here; under grad of vmap the
    per-element parameter cotangents are temporaries (205,752 bytes without them counted)."""
    loop = bj.binomial_checkpoint(cell, T, memory=MEMORY, keep_segments=True)
    h0, xs = batch(16)
    assert temp_bytes(grad_of_vmap(loss_of(loop)), W, h0, xs) <= MEMORY


#: at B=16: 40 states, each copied by the masked loops, and 16 parameter cotangents
WHILE_MEMORY = 300_000


def test_while_loop_budget_holds_under_vmap():
    def loss(W, h0, n):
        out = bj.while_loop(lambda v: v[1] < n, lambda v: (jnp.tanh(v[0] @ W), v[1] + 1),
                            (h0, 0), max_steps=T, memory=WHILE_MEMORY)
        return jnp.sum(out[0] ** 2)
    for B in (4, 16):
        h0, _ = batch(B)
        n = jnp.arange(B) % 5 + T - 5           # a condition that differs between lanes
        assert temp_bytes(jax.vmap(jax.grad(loss), (None, 0, 0)), W, h0, n) <= WHILE_MEMORY
