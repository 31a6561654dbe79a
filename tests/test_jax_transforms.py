"""What bincheck.jax's loops say about transformations they do not checkpoint (issue 29, item
11): ``grad`` of ``grad`` raises bincheck's error naming what works instead (forward over
reverse, which still works), and ``jax.checkpoint`` around a loop, which turns its gradient into
store-all, warns. Oracles: ``jax.grad`` / ``jax.hessian`` of the uncheckpointed loop and
``memory_analysis``."""

import warnings

import pytest

from jax_helpers import assert_close, jax, temp_bytes  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import bincheck.jax as bj  # noqa: E402

H, T = 3, 6
W0 = jnp.asarray(np.random.default_rng(5).normal(size=(H, H)) * 0.5)
H0 = jnp.linspace(-0.5, 0.5, H)


def body(W):
    return lambda v: (jnp.tanh(v[0] @ W), v[1] + 1)


def while_loss(W, bincheck_loop=True):
    if bincheck_loop:
        out = bj.while_loop(lambda v: v[1] < T, body(W), (H0[:len(W)], 0), max_steps=T + 3,
                            num_ckpts=2)
    else:                                                    # the same T steps, unrolled
        out = (H0[:len(W)], 0)
        for _ in range(T):
            out = body(W)(out)
    return jnp.sum(out[0] ** 3)


def scan_loss(W, scan=bj.scan, **kwargs):
    kwargs = kwargs or (dict(num_ckpts=2) if scan is bj.scan else {})
    return jnp.sum(scan(lambda h, x: (jnp.tanh(h @ W), None), H0, None, T, **kwargs)[0] ** 3)


@pytest.mark.parametrize("loss,name", [(while_loss, "bincheck.jax.while_loop"),
                                       (scan_loss, "bincheck.jax.binomial_checkpoint / scan")])
def test_grad_of_grad_says_what_is_supported(loss, name):
    with pytest.raises(bj.SecondOrderError,
                       match=rf"{name}: reverse mode over its backward \(grad of grad.*"
                             r"not supported.*jax.jvp\(jax.grad\(f\).*jax.hessian"):
        jax.grad(lambda W: jnp.sum(jax.grad(loss)(W) ** 2))(W0)


def test_forward_over_reverse_still_works_through_the_while_loop():
    """jax.hessian is jacfwd of jacrev: forward mode over the checkpointed reverse sweep."""
    W = W0[:2, :2]
    assert_close(jax.jit(jax.hessian(while_loss))(W),
                 jax.hessian(lambda W: while_loss(W, False))(W))


def _remat_warnings(run):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = run()
    return out, [w for w in caught if issubclass(w.category, bj.RematWarning)]


def test_jax_checkpoint_around_the_loop_warns_that_it_stores_every_step():
    T_long, Hl = 64, 16
    Wl = jnp.eye(Hl) * 0.5
    xs = jnp.ones((T_long, Hl)) * 0.1

    def loss(W, scan=bj.scan):
        kwargs = dict(num_ckpts=2) if scan is bj.scan else {}
        return jnp.sum(scan(lambda h, x: (jnp.tanh(h @ W + x), None), jnp.ones(Hl), xs,
                            **kwargs)[0])
    want = jax.grad(lambda W: loss(W, lax.scan))(Wl)
    got, caught = _remat_warnings(lambda: jax.grad(loss)(Wl))
    assert not caught
    got, caught = _remat_warnings(lambda: jax.grad(jax.checkpoint(loss))(Wl))
    assert len(caught) == 1 and "stores every step's state" in str(caught[0].message)
    assert_close(got, want)             # right, but store-all: what the warning says
    rematted = temp_bytes(jax.grad(jax.checkpoint(loss)), Wl)
    assert rematted > 2 * temp_bytes(jax.grad(loss), Wl)
    assert rematted > T_long * Hl * 8
    # forward mode inside jax.checkpoint stores nothing: no warning
    _, caught = _remat_warnings(lambda: jax.jvp(jax.checkpoint(lambda W: loss(W)), (Wl,),
                                                (Wl,)))
    assert not caught
