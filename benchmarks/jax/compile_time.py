"""Compile time and program size against the loop's length (issue 18, item 3).

``python -m benchmarks.jax.compile_time`` traces, lowers and compiles ``jax.jit(jax.grad(loss))``
of a tanh RNN (H=256, B=32, I=256, float32; the inputs as shapes only, nothing runs) at
T = 100, 1,000, 10,000 and 100,000 for three loops: ``bj.binomial_checkpoint(..., 50)``,
``bj.scan(..., num_ckpts=50)`` and ``bj.binomial_checkpoint(..., memory=...)`` (a budget of 20
states and the working set, planned from shapes). Each measurement uses a fresh loop object (the
tables are cached per loop), the lengths interleaved round by round; medians of ``--rounds``
(default 5). The jaxpr's equation count (loop bodies included) is reported beside the times.
Pinned to one CPU like ``python -m benchmarks.jax``. Writes
``benchmarks/jax/results/compile-time.{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from ..common.files import write_results
from .__main__ import pin_xla

LENGTHS = (100, 1000, 10_000, 100_000)


def count_eqns(jaxpr) -> int:
    """Equations of a closed jaxpr, those of nested jaxprs (loop bodies, branches) included."""
    from jax.extend import core

    def walk(j) -> int:
        n = 0
        for eqn in j.eqns:
            n += 1
            for v in eqn.params.values():
                for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                    if isinstance(sub, core.ClosedJaxpr):
                        n += walk(sub.jaxpr)
                    elif isinstance(sub, core.Jaxpr):
                        n += walk(sub)
        return n
    return walk(jaxpr.jaxpr)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args(argv)
    flags, cpus = pin_xla()
    import jax
    import jax.numpy as jnp
    import numpy as np
    import bincheck.jax as bj

    h, b, i = 256, 32, 256
    g = np.random.default_rng(0)
    params = (jnp.asarray(g.normal(size=(h, h)) * 0.05, jnp.float32),
              jnp.asarray(g.normal(size=(i, h)) * 0.05, jnp.float32),
              jnp.zeros((h,), jnp.float32))
    h0 = jnp.zeros((b, h), jnp.float32)

    def cell(p, state, x):
        return jnp.tanh(state @ p[0] + x @ p[1] + p[2])

    state_bytes = b * h * 4
    budget = None                      # 20 states beside the working set, from a preview

    def loss_of(kind: str, T: int):
        if kind == "num_ckpts=50":
            loop = bj.binomial_checkpoint(cell, T, 50)
            return lambda p, s, xs: jnp.sum(loop(p, s, xs))
        if kind == "bj.scan num_ckpts=50":
            def f(c, x, p):
                c = cell(p, c, x)
                return c, None
            return lambda p, s, xs: jnp.sum(bj.scan(lambda c, x: f(c, x, p), s, xs,
                                                    num_ckpts=50)[0])
        loop = bj.binomial_checkpoint(cell, T, memory=budget)
        return lambda p, s, xs: jnp.sum(loop(p, s, xs))

    probe = bj.binomial_checkpoint(cell, 100, memory="1GB")
    work = probe.preview(params, h0, jax.ShapeDtypeStruct((100, b, i), jnp.float32))
    budget = work.sizes.minimum_memory + 19 * state_bytes
    kinds = ("num_ckpts=50", "bj.scan num_ckpts=50", "memory=")
    times: dict = {(k, T): {"trace": [], "lower": [], "compile": [], "total": []}
                   for k in kinds for T in LENGTHS}
    eqns: dict = {}
    for r in range(args.rounds):
        for kind in kinds:
            for T in (LENGTHS if r % 2 == 0 else LENGTHS[::-1]):
                xs = jax.ShapeDtypeStruct((T, b, i), jnp.float32)
                f = jax.jit(jax.grad(loss_of(kind, T)))
                t0 = time.perf_counter()
                traced = f.trace(params, h0, xs)
                t1 = time.perf_counter()
                lowered = traced.lower()
                t2 = time.perf_counter()
                lowered.compile()
                t3 = time.perf_counter()
                rec = times[(kind, T)]
                for name, v in (("trace", t1 - t0), ("lower", t2 - t1), ("compile", t3 - t2),
                                ("total", t3 - t0)):
                    rec[name].append(v)
                eqns[(kind, T)] = count_eqns(traced.jaxpr)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    rows = []
    for kind in kinds:
        base = statistics.median(times[(kind, LENGTHS[0])]["total"])
        for T in LENGTHS:
            rec = {name: statistics.median(v) for name, v in times[(kind, T)].items()}
            rows.append({"loop": kind, "seq_len": T, "eqns": eqns[(kind, T)],
                         **{f"{k}_s": v for k, v in rec.items()},
                         "total_over_T100": rec["total"] / base,
                         "totals_s": times[(kind, T)]["total"]})
    meta = {"jax": jax.__version__, "xla_flags": flags, "cpu_affinity": cpus,
            "rounds": args.rounds, "cell": f"tanh RNN H={h} B={b} I={i} float32",
            "memory_budget": budget,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load_average": open("/proc/loadavg").read().split()[:3]
            if os.path.exists("/proc/loadavg") else None}
    lines = [f"# Compile time against the length ({meta['date']})", "",
             f"{meta['cell']}; `jax.jit(jax.grad(loss))` traced, lowered and compiled with the "
             f"inputs as shapes; medians of {args.rounds} rounds, a fresh loop object each; jax "
             f"{meta['jax']}, pinned to CPU {cpus}, load average {meta['load_average']}. "
             f"`memory=` is {budget} bytes (20 states and the working set).", "",
             "| loop | T | jaxpr equations | trace s | lower s | compile s | total s "
             "| total / total at T=100 |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['loop']} | {row['seq_len']:,} | {row['eqns']} "
                     f"| {row['trace_s']:.3f} | {row['lower_s']:.3f} | {row['compile_s']:.3f} "
                     f"| {row['total_s']:.3f} | {row['total_over_T100']:.2f}× |")
    write_results(args.out, "compile-time", meta, rows, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
