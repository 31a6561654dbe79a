"""``python -m benchmarks.jax --while``: bounded while loops (``max_steps`` = m known, the number
of steps n only at run time), after the notes on bounded while loops in JAX: forward time,
gradient time, compile time and XLA temporaries, for n ≪ m and n ≈ m.

The loop: ``cond_fun((i, h)) = i < n``, ``body_fun((i, h)) = (i + 1, cell(params, h, xs[i]))``
with the tanh cell, ``xs`` of length m, ``n`` a jit argument (one compiled program serves both
n), loss = sum(h_final ** 2), gradient w.r.t. the parameters; checked against ``lax.scan`` over
the first n inputs. Strategies:

* ``lax.while_loop``: the forward only (it has no reverse mode): the reference forward time;
* ``scan-cond``: ``lax.scan`` over m steps of ``lax.cond(cond, body, identity)``;
* ``nested scan-cond``: d nested ``lax.scan``s of length b (b**d ≥ m), each iteration
  ``lax.cond(cond, recurse, identity)``, no checkpointing (the notes' "implementation 2");
* Equinox ``while_loop(..., kind="bounded")`` (nested scan-cond with ``jax.checkpoint`` on every
  level but the innermost, base 16) and ``kind="checkpointed"`` with ``checkpoints=C``;
* ``bincheck.jax.while_loop(cond_fun, body_fun, init_val, max_steps=m, num_ckpts=C)``.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax

from .harness import RTOL, max_rel_err
from .problem import Counter, Problem
from .rows import WhileRow
from .strategies import equinox_internal


def _x_at(xs: Any, i: Any) -> Any:
    return lax.dynamic_index_in_dim(xs, i, keepdims=False)


def scan_cond(cond_fun: Callable, body_fun: Callable, init: Any, m: int) -> Any:
    def it(v: Any, _: Any) -> tuple:
        return lax.cond(cond_fun(v), body_fun, lambda v: v, v), None
    return lax.scan(it, init, None, length=m)[0]


def nested_shape(m: int, depth: int = 3) -> tuple[int, int]:
    """(b, d): d levels of scans of length b with b**d ≥ m (1000 -> 10, 3)."""
    b = max(2, round(m ** (1 / depth)))
    while b ** depth < m:
        b += 1
    return b, depth


def nested_scan_cond(cond_fun: Callable, body_fun: Callable, init: Any, m: int) -> Any:
    b, d = nested_shape(m)

    def go(v: Any) -> Any:           # the step counter bounds the steps when b**d > m
        return jnp.logical_and(cond_fun(v), v[0] < m)

    def run(level: int, val: Any) -> Any:
        if level == 0:
            return body_fun(val)

        def it(v: Any, _: Any) -> tuple:
            return lax.cond(go(v), lambda v: run(level - 1, v), lambda v: v, v), None
        return lax.scan(it, val, None, length=b)[0]
    return run(d, init)


def bincheck_while() -> tuple[Callable | None, str | None]:
    """``bincheck.jax.while_loop``, or None and why not."""
    try:
        import bincheck.jax as bj
        return bj.while_loop, None
    except (ImportError, AttributeError) as err:
        return None, (f"skipped: bincheck.jax.while_loop is not importable in this checkout "
                      f"({type(err).__name__}: {err})")


@dataclass
class WhileStrategy:
    name: str
    kind: str
    loop: Callable | None               # loop(cond_fun, body_fun, init) -> final
    num_ckpts: int | None = None
    forward_only: bool = False
    skip: str | None = None


def strategies(m: int, num_ckpts: list[int]) -> list[WhileStrategy]:
    eqxi = equinox_internal()
    b, d = nested_shape(m)
    out = [WhileStrategy("lax.while_loop (forward only)", "lax",
                         lambda c, f, v: lax.while_loop(c, f, v), forward_only=True),
           WhileStrategy(f"scan-cond ({m} conds)", "scan-cond",
                         lambda c, f, v: scan_cond(c, f, v, m)),
           WhileStrategy(f"nested scan-cond ({d} levels × {b})", "nested-scan-cond",
                         lambda c, f, v: nested_scan_cond(c, f, v, m)),
           WhileStrategy("Equinox kind=\"bounded\" (base 16)", "eqx-bounded",
                         lambda c, f, v: eqxi.while_loop(c, f, v, max_steps=m, kind="bounded"))]
    for C in num_ckpts:
        out.append(WhileStrategy(
            f"Equinox kind=\"checkpointed\" C={C}", "eqx-ckpt",
            lambda c, f, v, C=C: eqxi.while_loop(c, f, v, max_steps=m, kind="checkpointed",
                                                 checkpoints=C), C))
    while_loop, why = bincheck_while()
    for C in num_ckpts:
        loop = None if while_loop is None else (
            lambda c, f, v, C=C: while_loop(c, f, v, max_steps=m, num_ckpts=C))
        out.append(WhileStrategy(f"bincheck.jax.while_loop num_ckpts={C}", "bincheck", loop, C,
                                 skip=why))
    return out


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_while(m: int, hidden: int, batch: int, input_size: int, num_ckpts: list[int],
              rounds: int, seed: int = 0, count: bool = True) -> list[WhileRow]:
    prob = Problem("tanh", m, hidden, batch, input_size, seed)
    step = prob.step
    ns = {"small": max(1, m // 50), "large": m - m // 20}

    def loss_of(st: WhileStrategy, step: Callable = step) -> Callable:
        def loss(p: Any, h0: Any, xs: Any, n: Any) -> Any:
            cond_fun = lambda c: c[0] < n                                  # noqa: E731
            body_fun = lambda c: (c[0] + 1, step(p, c[1], _x_at(xs, c[0])))  # noqa: E731
            return prob.loss(st.loop(cond_fun, body_fun, (jnp.zeros((), jnp.int32), h0))[1])
        return loss

    refs = {}
    for key, n in ns.items():
        g = jax.jit(jax.grad(lambda p, h0, xs: prob.loss(
            lax.scan(lambda h, x: (step(p, h, x), None), h0, xs)[0])))
        refs[key] = jax.block_until_ready(g(prob.params, prob.state0, prob.xs[:n]))
    args = (prob.params, prob.state0, prob.xs)
    nargs = {k: jnp.asarray(n, jnp.int32) for k, n in ns.items()}
    rows, live = [], []
    for st in strategies(m, num_ckpts):
        row = WhileRow(st.name, st.kind, m, hidden, batch, input_size, st.num_ckpts)
        row.runs = {k: dict(n=n, max_rel_err=None, evals=None, fwd_s=None, grad_s=None,
                            fwd_times=[], grad_times=[]) for k, n in ns.items()}
        rows.append(row)
        if st.skip:
            row.status = st.skip
            _log(f"  {st.name}: {row.status}")
            continue
        loss = loss_of(st)
        try:
            fwd = jax.jit(loss).lower(*args, nargs["small"]).compile()
            grad = None
            if not st.forward_only:
                t0 = time.perf_counter()
                lowered = jax.jit(jax.grad(loss)).lower(*args, nargs["small"])
                t1 = time.perf_counter()
                grad = lowered.compile()
                row.lower_s, row.compile_s = t1 - t0, time.perf_counter() - t1
                row.temp_bytes = int(grad.memory_analysis().temp_size_in_bytes)
            row.fwd_temp_bytes = int(fwd.memory_analysis().temp_size_in_bytes)
            bad = []
            for key in ns:
                if grad is not None:
                    err = max_rel_err(jax.block_until_ready(grad(*args, nargs[key])), refs[key])
                    row.runs[key]["max_rel_err"] = err
                    if err > RTOL:
                        bad.append(f"n={ns[key]}: {err:.2e}")
                jax.block_until_ready(fwd(*args, nargs[key]))
        except Exception as err:          # noqa: BLE001 - a library row that fails is reported
            if st.kind != "bincheck":
                raise
            row.status = f"error: {type(err).__name__}: {str(err)[:300]}"
            _log(f"  {st.name}: {row.status}")
            continue
        if bad:
            row.status = "FAILED: gradient max rel err " + ", ".join(bad)
            _log(f"  {st.name}: {row.status}")
            continue
        if count and not st.forward_only:
            counter = Counter()
            counted = jax.jit(jax.grad(loss_of(st, counter.wrap(step)))).lower(
                *args, nargs["small"]).compile()
            for key in ns:
                counter.count = 0
                jax.block_until_ready(counted(*args, nargs[key]))
                jax.effects_barrier()
                row.runs[key]["evals"] = counter.count
            del counted
        live.append((fwd, grad, row))
        _log(f"  {st.name}: compile {(row.lower_s or 0) + (row.compile_s or 0):.2f} s, temp "
             f"{(row.temp_bytes or 0) / 2**20:.3f} MiB, evals "
             f"{[v['evals'] for v in row.runs.values()]}")
    for k in range(rounds):
        order = live if k % 2 == 0 else live[::-1]
        gc.collect()
        gc.disable()                     # no collector pauses inside a timed call
        try:
            for fwd, grad, row in order:
                for key in ns:
                    for fn, name in ((fwd, "fwd"), (grad, "grad")):
                        if fn is None:
                            continue
                        t0 = time.perf_counter()
                        jax.block_until_ready(fn(*args, nargs[key]))
                        row.runs[key][f"{name}_times"].append(time.perf_counter() - t0)
        finally:
            gc.enable()
        _log(f"  round {k + 1}/{rounds} done")
    for _, _, row in live:
        for run in row.runs.values():
            for name in ("fwd", "grad"):
                if run[f"{name}_times"]:
                    run[f"{name}_s"] = statistics.median(run[f"{name}_times"])
    return rows

