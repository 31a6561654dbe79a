"""``python -m benchmarks.budget``: gradients within a byte budget, measured against store-all.

For each budget (a percentage of store-all's tracemalloc peak, measured in the same run) and each
policy — bincheck's mixed policy (``memory=...``: states and whole taped segments) and states only
at the same bytes (Revolve with as many states as fit) — one run builds the loop, checks its
gradient against store-all (rtol 1e-8) before timing, and measures: the tracemalloc peak minus the
returned cotangents and the output (what the budget covers), wall time (median of ``--repeats``,
all runs interleaved round by round), plain/taped evaluations next to the plan's prediction, and
the predicted time. Results: results.csv, results.md, results.png in ``--out``.

Default: tanh RNN, T=1000, H=256, B=32, float64, budgets 1, 2, 5, 10, 25 % (a few minutes on two
cores). ``--quick``: T=300, H=64, B=32 (well under a minute). ``--disk``: the disk tier instead
(:mod:`benchmarks.budget.disk`).
"""

from __future__ import annotations

import argparse
import csv
import gc
import io
import os
import statistics
import sys
import time
import tracemalloc
from dataclasses import asdict, dataclass, field, replace

import autograd.numpy as np
from autograd import grad

from bincheck import CheckpointedLoop, binomial_checkpoint
from bincheck.schedule import BudgetPlan

from ..rnn.cells import CELLS
from ..rnn.harness import Counter, gradients_agree
from ..common.files import write_atomic

FULL = dict(seq_len=1000, hidden=256, batch=32, fractions=[1, 2, 5, 10, 25], repeats=3)
QUICK = dict(seq_len=300, hidden=64, batch=32, fractions=[2, 5, 10, 25], repeats=3)


@dataclass
class Row:
    cell: str
    seq_len: int
    hidden: int
    batch: int
    budget_pct: float | None
    memory_mib: float | None
    policy: str                      # store-all, mixed, states-only
    status: str = "ok"
    peak_mib: float | None = None    # tracemalloc peak - returned cotangents - output
    within_budget: bool | None = None
    time_s: float | None = None
    slowdown: float | None = None
    predicted_slowdown: float | None = None
    plain_evals: int | None = None
    predicted_plain: int | None = None
    taped_evals: int | None = None
    states: int | None = None
    times_s: list = field(default_factory=list)


def traced_peak(fn, *args):
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        out = fn(*args)
        return tracemalloc.get_traced_memory()[1] - base, out
    finally:
        tracemalloc.stop()


def plain_loop(step, T):
    def run(params, state, xs):
        for t in range(T):
            state = step(params, state, xs[t])
        return state
    return run


def measure(cell_name: str, T: int, H: int, B: int, fractions: list[float], repeats: int,
            progress=print) -> list[Row]:
    cell = CELLS[cell_name]
    params, state0, xs = cell.init(H, B, T, 0)
    loss = lambda run: (lambda p: np.sum(cell.hidden(run(p, state0, xs))))
    out_bytes = sum(v.nbytes for v in (state0 if isinstance(state0, tuple) else (state0,)))

    def returned(g):
        return sum(v.nbytes for v in g.values()) + out_bytes

    store_all = grad(loss(plain_loop(cell.fn, T)))
    full_peak, g0 = traced_peak(store_all, params)
    rows = [Row(cell_name, T, H, B, 100.0, full_peak / 2**20, "store-all",
                peak_mib=(full_peak - returned(g0)) / 2**20, plain_evals=0, predicted_plain=0,
                taped_evals=T)]
    gradients = [store_all]
    for pct in fractions:
        memory = int(pct / 100 * full_peak)
        probe_loop = binomial_checkpoint(cell.fn, T, memory=memory)
        try:
            mixed_plan = probe_loop.preview(params, state0, xs)
        except ValueError as err:
            rows.append(Row(cell_name, T, H, B, pct, memory / 2**20, "mixed",
                            status=f"refused: {err}"))
            continue
        states_plan = BudgetPlan(T, memory, replace(mixed_plan.sizes, tape_bytes=None))
        for policy, plan in (("mixed", mixed_plan), ("states-only", states_plan)):
            row = Row(cell_name, T, H, B, pct, memory / 2**20, policy,
                      predicted_slowdown=plan.relative_time, predicted_plain=plan.plain_steps,
                      states=plan.checkpoints)
            counter = Counter(cell.fn)
            counted = CheckpointedLoop(counter, plan)
            g = grad(loss(counted))(params)
            bad = gradients_agree(g, g0)
            if bad:
                row.status = "FAILED: " + bad
                rows.append(row)
                continue
            row.plain_evals, row.taped_evals = counter.plain, counter.taped
            peak, g = traced_peak(grad(loss(CheckpointedLoop(cell.fn, plan))), params)
            row.peak_mib = (peak - returned(g)) / 2**20
            row.within_budget = peak - returned(g) <= memory
            rows.append(row)
            gradients.append(grad(loss(CheckpointedLoop(cell.fn, plan))))
            progress(f"  {pct:g} % {policy}: plan {plan.plain_steps} plain, peak "
                     f"{row.peak_mib:.2f} MiB of {memory / 2**20:.2f}")
    live = [r for r in rows if r.status == "ok"]
    for _ in range(repeats):                              # interleaved rounds
        for r, gradient in zip(live, gradients):
            gc.collect()
            t0 = time.perf_counter()
            gradient(params)
            r.times_s.append(time.perf_counter() - t0)
    for r in live:
        r.time_s = statistics.median(r.times_s)
        r.slowdown = r.time_s / live[0].time_s
    return rows


def csv_bytes(rows: list[Row]) -> bytes:
    buf = io.StringIO()
    names = list(asdict(rows[0]))
    writer = csv.DictWriter(buf, fieldnames=names, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        d = asdict(r)
        d["times_s"] = " ".join(f"{t:.4f}" for t in r.times_s)
        writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in d.items()})
    return buf.getvalue().encode()


def markdown(rows: list[Row]) -> str:
    r0 = rows[0]
    out = [f"**{r0.cell}, T={r0.seq_len}, H={r0.hidden}, B={r0.batch}, float64, gradient w.r.t. "
           f"params; budgets as % of store-all's tracemalloc peak ({r0.memory_mib:.1f} MiB)**", "",
           "| budget | memory | policy | peak held (MiB) | within | slowdown | predicted | plain "
           "evals (predicted) | states |", "|---:|---:|---|---:|:-:|---:|---:|---:|---:|"]
    for r in rows:
        if r.status != "ok":
            out.append(f"| {r.budget_pct:g} % | {r.memory_mib:.2f} MiB | {r.policy} | "
                       f"{r.status} | | | | | |")
            continue
        pred = "–" if r.predicted_slowdown is None else f"{r.predicted_slowdown:.2f}×"
        within = "–" if r.within_budget is None else ("yes" if r.within_budget else "**no**")
        out.append(f"| {r.budget_pct:g} % | {r.memory_mib:.2f} MiB | {r.policy} | "
                   f"{r.peak_mib:.2f} | {within} | {r.slowdown:.2f}× | {pred} | "
                   f"{r.plain_evals} ({r.predicted_plain}) | {r.states or '–'} |")
    return "\n".join(out) + "\n"


def plot_png(rows: list[Row]) -> bytes | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for policy, color in (("mixed", "tab:blue"), ("states-only", "tab:orange")):
        pts = sorted((r.budget_pct, r.slowdown, r.predicted_slowdown) for r in rows
                     if r.policy == policy and r.status == "ok")
        if not pts:
            continue
        x, y, p = zip(*pts)
        ax.plot(x, y, "o-", color=color, label=f"{policy}: measured")
        ax.plot(x, p, "--", color=color, alpha=0.6, label=f"{policy}: predicted")
    ax.axhline(1.0, color="gray", lw=1, label="store-all (100 % of the memory)")
    ax.set_xscale("log")
    ticks = sorted({r.budget_pct for r in rows if r.policy != "store-all"})
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{t:g} %" for t in ticks])
    ax.set_xlabel("memory budget (% of store-all's tracemalloc peak)")
    ax.set_ylabel("gradient time / store-all's")
    r0 = rows[0]
    ax.set_title(f"{r0.cell} RNN, T={r0.seq_len}, H={r0.hidden}, B={r0.batch}: time within a "
                 f"byte budget", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def _percentages(text: str) -> list[float]:
    try:
        values = [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated percentages, got {text!r}")
    if not values or any(not 0 < v <= 100 for v in values):
        raise argparse.ArgumentTypeError(f"percentages must be in (0, 100], got {text!r}")
    return values


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.budget", description=__doc__.split(
        "\n\n")[0].strip("`"))
    p.add_argument("--quick", action="store_true", help="T=300, H=64, B=32")
    p.add_argument("--cell", choices=sorted(CELLS), default="tanh")
    p.add_argument("--fractions", type=_percentages, help="budgets in %% of store-all, e.g. 1,5,25")
    p.add_argument("--repeats", type=_count, help="timed gradients per run (median); with "
                                                  "--disk, rounds of the three runs (default 3, "
                                                  "--quick 1)")
    p.add_argument("--out", default=os.path.join("benchmarks", "budget", "out"))
    p.add_argument("--disk", action="store_true",
                   help="the disk-tier benchmark instead: a heat equation whose snapshots do "
                        "not fit the RAM budget (1024x1024, 2000 steps, 160 MB; --quick: 256x256)")
    args = p.parse_args(argv)
    if args.disk:
        from . import disk
        print(f"disk benchmark ({'quick' if args.quick else 'full'})", flush=True)
        rows = disk.measure(args.quick, repeats=args.repeats or (1 if args.quick else 3))
        table = disk.markdown(rows)
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(disk.as_dicts(rows)[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(disk.as_dicts(rows))
        write_atomic(os.path.join(args.out, "disk.csv"), buf.getvalue().encode())
        write_atomic(os.path.join(args.out, "disk.md"), table.encode())
        print(table)
        return 0 if all(r.status == "ok" for r in rows) else 1
    cfg = dict(QUICK if args.quick else FULL)
    cfg["fractions"] = args.fractions or cfg["fractions"]
    cfg["repeats"] = args.repeats or cfg["repeats"]
    print(f"budget benchmark: {args.cell}, T={cfg['seq_len']}, H={cfg['hidden']}, "
          f"B={cfg['batch']}, budgets {cfg['fractions']} %", flush=True)
    rows = measure(args.cell, cfg["seq_len"], cfg["hidden"], cfg["batch"], cfg["fractions"],
                   cfg["repeats"])
    table = markdown(rows)
    write_atomic(os.path.join(args.out, "results.csv"), csv_bytes(rows))
    write_atomic(os.path.join(args.out, "results.md"), table.encode())
    png = plot_png(rows)
    if png is not None:
        write_atomic(os.path.join(args.out, "results.png"), png)
    print(table)
    print(f"written to {args.out}/results.{{csv,md,png}}")
    failed = [r for r in rows if r.status.startswith("FAILED") or r.within_budget is False]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
