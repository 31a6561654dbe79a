"""The problem: one RNN cell (tanh, LSTM or GRU, torch's equations) run for T steps,
loss = sum(h_T ** 2), gradient w.r.t. the cell's parameters; and the per-step costs.

Every array (parameters, initial state, inputs) is a jit argument: an array a jitted function
closes over becomes a constant of the program, which would change what XLA allocates.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax

CELLS = ("tanh", "lstm", "gru")
GATES = {"tanh": 1, "lstm": 4, "gru": 3}


def tanh_cell(p: dict, h: Any, x: Any) -> Any:
    return jnp.tanh(x @ p["W_ih"] + h @ p["W_hh"] + p["b"])


def lstm_cell(p: dict, state: Any, x: Any) -> Any:
    h, c = state
    i, f, g, o = jnp.split(x @ p["W_ih"] + h @ p["W_hh"] + p["b"], 4, axis=-1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    return jax.nn.sigmoid(o) * jnp.tanh(c), c


def gru_cell(p: dict, h: Any, x: Any) -> Any:
    xr, xz, xn = jnp.split(x @ p["W_ih"] + p["b_ih"], 3, axis=-1)
    hr, hz, hn = jnp.split(h @ p["W_hh"] + p["b_hh"], 3, axis=-1)
    r, z = jax.nn.sigmoid(xr + hr), jax.nn.sigmoid(xz + hz)
    n = jnp.tanh(xn + r * hn)
    return (1 - z) * n + z * h


STEPS = {"tanh": tanh_cell, "lstm": lstm_cell, "gru": gru_cell}


class Counter:
    """Step evaluations, counted at run time by a ``jax.debug.callback`` in the step. The callback
    takes one element of the state as its operand: without a data dependence on the carry, JAX
    hoists it out of a scan body as loop-invariant and it runs once."""

    def __init__(self) -> None:
        self.count = 0

    def tick(self, _: Any) -> None:
        self.count += 1

    def wrap(self, step: Callable) -> Callable:
        def counted(p: Any, state: Any, x: Any) -> Any:
            jax.debug.callback(self.tick, jax.tree.leaves(state)[0][0, 0])
            return step(p, state, x)
        return counted


@dataclass
class Problem:
    cell: str
    seq_len: int
    hidden: int
    batch: int
    input_size: int
    seed: int = 0

    def __post_init__(self) -> None:
        H, I, B, T, g = self.hidden, self.input_size, self.batch, self.seq_len, GATES[self.cell]
        keys = jax.random.split(jax.random.PRNGKey(self.seed), 6)
        bound = 1.0 / H ** 0.5                  # torch's RNN initialisation

        def u(k: Any, shape: tuple) -> Any:
            return jax.random.uniform(k, shape, jnp.float32, -bound, bound)
        if self.cell == "gru":
            self.params = dict(W_ih=u(keys[0], (I, g * H)), W_hh=u(keys[1], (H, g * H)),
                               b_ih=u(keys[2], (g * H,)), b_hh=u(keys[3], (g * H,)))
        else:
            self.params = dict(W_ih=u(keys[0], (I, g * H)), W_hh=u(keys[1], (H, g * H)),
                               b=u(keys[2], (g * H,)))
        h0 = jax.random.normal(keys[4], (B, H), jnp.float32)
        self.state0 = (h0, jnp.zeros((B, H), jnp.float32)) if self.cell == "lstm" else h0
        self.xs = jax.random.normal(keys[5], (T, B, I), jnp.float32)
        self.step = STEPS[self.cell]

    @property
    def args(self) -> tuple:
        return self.params, self.state0, self.xs

    @property
    def state_bytes(self) -> int:
        return sum(v.nbytes for v in jax.tree.leaves(self.state0))

    def loss(self, state: Any) -> Any:
        h = state[0] if self.cell == "lstm" else state
        return jnp.sum(h ** 2)

    def describe(self) -> str:
        return (f"T={self.seq_len}, H={self.hidden}, B={self.batch}, I={self.input_size}, "
                f"float32, CPU")


class StepCosts:
    """Compiled one-step references for the bound, each a ``lax.scan`` of ``K`` steps divided by
    ``K`` (one dispatch per K steps): a plain step, and a taped step with its backward (the
    forward under ``jax.vjp`` and the pullback to the parameters and the state, chained as a
    reverse sweep chains them; a fresh cotangent is added each step so that nothing decays)."""

    def __init__(self, prob: Problem, K: int = 100) -> None:
        self.K = K = min(K, prob.seq_len)
        step = prob.step
        xs = prob.xs[:K]
        gs = jax.tree.map(lambda v: jnp.ones((K,) + v.shape, v.dtype) * 1e-2, prob.state0)

        def plain(p: Any, h: Any, xs: Any) -> Any:
            return lax.scan(lambda h, x: (step(p, h, x), None), h, xs)[0]

        def taped(p: Any, h: Any, xs: Any, gs: Any) -> Any:
            def body(carry: tuple, xg: tuple) -> tuple:
                h, gh, gp = carry
                x, g = xg
                new, pullback = jax.vjp(lambda p, h: step(p, h, x), p, h)
                dp, dh = pullback(gh)
                gp = jax.tree.map(jnp.add, gp, dp)
                return (new, jax.tree.map(jnp.add, dh, g), gp), None
            zero = jax.tree.map(jnp.zeros_like, p)
            gh0 = jax.tree.map(jnp.zeros_like, h)
            return lax.scan(body, (h, gh0, zero), (xs, gs))[0]
        self.plain = jax.jit(plain).lower(prob.params, prob.state0, xs).compile()
        self.taped = jax.jit(taped).lower(prob.params, prob.state0, xs, gs).compile()
        self.plain_args = (prob.params, prob.state0, xs)
        self.taped_args = (prob.params, prob.state0, xs, gs)
        jax.block_until_ready(self.plain(*self.plain_args))
        jax.block_until_ready(self.taped(*self.taped_args))

    def measure(self, reps: int = 3) -> tuple[float, float]:
        """Seconds per plain step and per taped step + backward: the median of ``reps`` calls."""
        out = []
        for fn, args in ((self.plain, self.plain_args), (self.taped, self.taped_args)):
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                jax.block_until_ready(fn(*args))
                times.append(time.perf_counter() - t0)
            out.append(statistics.median(times) / self.K)
        return out[0], out[1]
