"""The strategies compared: each builds ``f(params, state0, xs) -> final state`` from a step
``step(params, state, x) -> state`` (the plain cell, or the same cell with an evaluation counter).

* ``scan``: ``lax.scan`` (store-all: the reference gradient and the reference memory);
* ``scan-remat``: ``lax.scan`` of ``jax.checkpoint(body)``;
* ``nested``: √T nested remat: an outer ``lax.scan`` over T/d segments of an inner ``lax.scan``
  of d steps under ``jax.checkpoint``, d the divisor of T nearest √T;
* ``eqx``: ``equinox.internal.while_loop(cond, body, (i, state), max_steps=T,
  kind="checkpointed", checkpoints=C)`` with the step counter ``i`` in the carry;
* ``bincheck``: ``bincheck.jax.binomial_checkpoint(step, T, C)`` or ``memory=``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax

import bincheck.jax as bj

PEERS = ("scan-remat", "nested", "eqx")      # the peers of the "never behind a peer" target
EXTRA_HINT = 'pip install -e ".[jaxbench]"'


def equinox_internal() -> Any:
    """``equinox.internal``, imported when a strategy needs it, with a usable error if absent."""
    try:
        import equinox.internal as eqxi
    except ImportError as err:
        raise SystemExit(f"benchmarks.jax needs Equinox (its peer, Equinox's checkpointed while "
                         f"loop): {EXTRA_HINT}  ({err})") from None
    return eqxi


def nearest_divisor(n: int) -> int:
    """The divisor of ``n`` nearest √n (the smaller on a tie): 25 for 1000."""
    root = math.sqrt(n)
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - root), d))


@dataclass
class Strategy:
    name: str                       # row label in the table
    kind: str                       # scan, scan-remat, nested, eqx, bincheck
    label: str                      # short label on the plot, and the budget's name
    build: Callable[[Callable], Callable]
    num_ckpts: int | None = None
    memory: int | None = None       # memory= bytes
    budget_of: str | None = None    # what the budget was derived from
    loops: list = field(default_factory=list)   # bincheck loops built (the first is timed)


def scan(T: int) -> Strategy:
    def build(step: Callable) -> Callable:
        def f(p: Any, s0: Any, xs: Any) -> Any:
            return lax.scan(lambda s, x: (step(p, s, x), None), s0, xs)[0]
        return f
    return Strategy("lax.scan", "scan", "scan", build)


def scan_remat(T: int) -> Strategy:
    def build(step: Callable) -> Callable:
        def f(p: Any, s0: Any, xs: Any) -> Any:
            body = jax.checkpoint(lambda s, x: (step(p, s, x), None))
            return lax.scan(body, s0, xs)[0]
        return f
    return Strategy("lax.scan of jax.checkpoint(step)", "scan-remat", "scan-remat", build)


def nested(T: int) -> Strategy:
    d = nearest_divisor(T)

    def build(step: Callable) -> Callable:
        def f(p: Any, s0: Any, xs: Any) -> Any:
            @jax.checkpoint
            def segment(s: Any, xk: Any) -> tuple:
                return lax.scan(lambda s, x: (step(p, s, x), None), s, xk)[0], None
            xs2 = jax.tree.map(lambda v: v.reshape((T // d, d) + v.shape[1:]), xs)
            return lax.scan(segment, s0, xs2)[0]
        return f
    return Strategy(f"nested remat {T // d}×{d} (inner scan under jax.checkpoint)", "nested",
                    "nested", build)


def equinox(T: int, C: int) -> Strategy:
    eqxi = equinox_internal()

    def build(step: Callable) -> Callable:
        def f(p: Any, s0: Any, xs: Any) -> Any:
            def body(carry: tuple) -> tuple:
                i, s = carry
                x = jax.tree.map(lambda v: lax.dynamic_index_in_dim(v, i, keepdims=False), xs)
                return i + 1, step(p, s, x)
            init = (jnp.zeros((), jnp.int32), s0)
            return eqxi.while_loop(lambda c: c[0] < T, body, init, max_steps=T,
                                   kind="checkpointed", checkpoints=C)[1]
        return f
    return Strategy(f"Equinox checkpointed while_loop C={C}", "eqx", f"eqx C={C}", build,
                    num_ckpts=C)


def bincheck(T: int, num_ckpts: int | None = None, memory: int | None = None,
             budget_of: str | None = None, keep_segments: bool = False) -> Strategy:
    seg = " keep_segments" if keep_segments else ""
    st = Strategy(f"bincheck num_ckpts={num_ckpts}" if memory is None else
                  f"bincheck memory= {budget_of}{seg}", "bincheck",
                  f"s={num_ckpts}" if memory is None else f"mem={budget_of}{seg}", None,
                  num_ckpts, memory, budget_of)

    def build(step: Callable) -> Callable:
        loop = bj.binomial_checkpoint(step, T, num_ckpts, memory=memory,
                                      keep_segments=keep_segments)
        st.loops.append(loop)
        return loop
    st.build = build
    return st


def fixed(T: int, num_ckpts: list[int]) -> list[Strategy]:
    """Every strategy that needs no measured budget, lax.scan first (the reference)."""
    cs = [c for c in num_ckpts if c <= T]
    return ([scan(T), scan_remat(T), nested(T)] + [equinox(T, c) for c in cs]
            + [bincheck(T, c) for c in cs])
