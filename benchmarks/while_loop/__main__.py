"""``python -m benchmarks.while_loop``: loops of unknown length, in the spirit of the notes on
bounded while loops in JAX (where memory is sized for ``max_steps``, not for the actual ``n``;
see README.md for what Equinox's bounded and checkpointed loops do).

Problem: explicit Euler for ``y' = tanh(W y) - y`` until ``t >= T_end`` with a state-dependent step
size; gradient of ``sum(y_final**2)`` w.r.t. ``W`` and ``y0``. ``max_steps = M``; runs with
``n << M`` and ``n ~ M``. Strategies:

* ``store-all``: the plain Python ``while`` under autograd (tape grows with n);
* ``sqrt(M) segments``: store every ceil(sqrt(M))-th state, tape one segment at a time
  (``EveryKPlanner``: one level of segments, like Equinox's bounded loop with ``base = sqrt(M)``
  but storing only the segment starts reached, not buffers sized for M);
* ``offline binomial (n known)``: ``binomial_checkpoint`` with the true n, as if it were known;
* ``checkpointed_while_loop``: online binomial placement with the same num_ckpts.

Reported: forward work (plain steps before the reverse), backward work (plain and taped steps in
the reverse), peak snapshots, tracemalloc peak and time of one gradient, and the plain-evaluation
ratio online / offline. Writes ``benchmarks/while_loop/out/results.{csv,md}`` atomically.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import time
import tracemalloc

import autograd.numpy as np
import numpy
from autograd import make_vjp
from autograd.tracer import isbox

from bincheck import binomial_checkpoint, checkpointed_while_loop
from bincheck import WhileLoop
from bincheck.schedule.online import EveryKPlanner

from ..common.files import write_atomic


class Counter:
    def __init__(self, fn):
        self.fn, self.plain, self.taped = fn, 0, 0

    def __call__(self, p, st):
        if isbox(p) or any(isbox(v) for v in st):
            self.taped += 1
        else:
            self.plain += 1
        return self.fn(p, st)


def body(W, st):
    t, y = st
    dt = 0.02 / (1.0 + 0.1 * np.sum(y * y) / y.shape[0])
    return (t + dt, y + dt * (np.tanh(np.dot(W, y)) - y))


def make_problem(dim: int, seed: int):
    rng = numpy.random.RandomState(seed)
    return rng.randn(dim, dim) / numpy.sqrt(dim), rng.randn(dim)


def count_steps(W, y0, T_end):
    st, n = (0.0, y0), 0
    while st[0] < T_end:
        st, n = body(W, st), n + 1
    return n


def strategies(M, s, n):
    k = math.ceil(math.sqrt(M))
    return {
        "store-all": None,
        f"sqrt(M) segments (k={k})": lambda cond, b: WhileLoop(cond, b, s, M,
                                                               planner=lambda slots: EveryKPlanner(k)),
        "offline binomial (n known)": "offline",
        "checkpointed_while_loop": lambda cond, b: checkpointed_while_loop(cond, b, s, M),
    }


def run_one(name, factory, W, y0, T_end, n, s):
    counter = Counter(body)
    cond = lambda W, st: st[0] < T_end
    loop = None
    if factory is None:
        def run(W, y0):
            st = (0.0, y0)
            while cond(W, st):
                st = counter(W, st)
            return st
    elif factory == "offline":
        loop = binomial_checkpoint(lambda W, st, x: counter(W, st), n, s)
        run = lambda W, y0: loop(W, (0.0, y0), None)
    else:
        loop = factory(cond, counter)
        run = lambda W, y0: loop(W, (0.0, y0))
    f = lambda W, y0: np.sum(run(W, y0)[1] ** 2)

    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    vjp, value = make_vjp(f, (0, 1))(W, y0)
    fwd_plain, fwd_taped = counter.plain, counter.taped
    grads = vjp(1.0)
    wall = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return dict(strategy=name, forward_plain=fwd_plain, forward_taped=fwd_taped,
                backward_plain=counter.plain - fwd_plain, backward_taped=counter.taped - fwd_taped,
                peak_snapshots=getattr(getattr(loop, "stats", None), "peak_snapshots", "") if loop
                else "", tracemalloc_mib=peak / 2**20, time_s=wall), grads


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.while_loop", description=__doc__.split(
        "\n\n")[0])
    p.add_argument("--max-steps", type=int, default=2000, help="M, the loop's bound")
    p.add_argument("--num-ckpts", type=int, default=10, help="snapshots for the binomial runs")
    p.add_argument("--dim", type=int, default=256, help="state size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.path.join("benchmarks", "while_loop", "out"))
    args = p.parse_args(argv)
    if args.max_steps < 10 or args.num_ckpts < 1 or args.dim < 1:
        p.error("need --max-steps >= 10, --num-ckpts >= 1, --dim >= 1")
    W, y0 = make_problem(args.dim, args.seed)
    M, s = args.max_steps, args.num_ckpts
    # pick T_end so that n is about M/10 and about 0.95 M
    per_step = 0.02 / (1.0 + 0.1 * numpy.sum(y0 * y0) / args.dim)
    rows = []
    for label, frac in (("n << M", 0.1), ("n ~ M", 0.95)):
        T_end = frac * M * per_step
        n = count_steps(W, y0, T_end)
        if n > M:
            p.error(f"the problem needs {n} steps > --max-steps {M}")
        ref = None
        for name, factory in strategies(M, s, n).items():
            row, grads = run_one(name, factory, W, y0, T_end, n, s)
            if ref is None:
                ref = grads
            else:
                for a, b in zip(grads, ref):
                    numpy.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
            row.update(case=label, n=n, M=M, num_ckpts=s)
            rows.append(row)
        offline = next(r for r in rows if r["case"] == label and r["strategy"].startswith("off"))
        for r in rows:
            if r["case"] == label:
                total = r["forward_plain"] + r["backward_plain"]
                r["plain_vs_offline"] = total / (offline["forward_plain"] + offline["backward_plain"])

    cols = ["case", "n", "M", "num_ckpts", "strategy", "forward_plain", "forward_taped",
            "backward_plain", "backward_taped", "plain_vs_offline", "peak_snapshots",
            "tracemalloc_mib", "time_s"]
    csv = ",".join(cols) + "\n" + "\n".join(
        ",".join(f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in cols)
        for r in rows) + "\n"
    md = ["| case | strategy | forward plain | forward taped | backward plain | backward taped "
          "| plain vs offline | peak snapshots | peak memory (MiB) | time (s) |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        md.append(f"| {r['case']} (n={r['n']}) | {r['strategy']} | {r['forward_plain']} "
                  f"| {r['forward_taped']} "
                  f"| {r['backward_plain']} | {r['backward_taped']} "
                  f"| {r['plain_vs_offline']:.3f} | {r['peak_snapshots']} "
                  f"| {r['tracemalloc_mib']:.2f} | {r['time_s']:.2f} |")
    table = "\n".join(md) + "\n"
    write_atomic(os.path.join(args.out, "results.csv"), csv.encode())
    write_atomic(os.path.join(args.out, "results.md"), table.encode())
    print(f"M={M}, num_ckpts={s}, state size {args.dim}, gradients agree (rtol 1e-10)\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
