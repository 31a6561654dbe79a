"""``python -m benchmarks.programs``: checkpoint_program on Siskind & Pearlmutter's nested loop,
side by side with plain autograd and loop-level checkpointing (issue 30, benchmark (a)).

The program is ``benchmarks.reproduce.siskind``'s with a state of 1000 floats (8 kB): an atomic step
``x <- tanh(w * x + phase(i, j))``, outer iteration ``i`` running ``l(i)`` of them (1 on most,
n/3 on three), written as a plain Python loop. Per n, one gradient w.r.t. (w, x0) each way:

* ``store-all``: plain autograd on the loop as written;
* ``outer binomial``: ``binomial_checkpoint`` over the n outer iterations, s = ceil(log2 n)
  (the loop restructured by hand: each outer step runs its inner loop, taped whole);
* ``program s``: ``checkpoint_program`` on the loop as written, ``num_ckpts = s``;
* ``program @outer``: ``checkpoint_program`` with ``memory`` = outer binomial's measured peak.

Measured: tracemalloc peak of one gradient, atomic-step evaluations (the loops: counted by the
step; the programs: op evaluations over ops recorded per atomic step, the recording included),
the median wall time of ``--repeats`` interleaved rounds (1 BLAS thread), and the gradients
(max relative error against store-all). Writes ``programs.{csv,md,png}`` into ``--out``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy
from autograd import grad

from bincheck import checkpoint_program

from ..reproduce.common import (csv_bytes, interleaved_medians, loglog_slope, max_rel_err,
                                md_table, peak_mib, png_bytes, write_outputs)
from ..reproduce.siskind import Counter, Problem as _Problem

DIM = 1000          # the state: 8 kB, as the trace prototype's nested loop (research/programs.md)


class Problem(_Problem):
    """``benchmarks.reproduce.siskind``'s nested loop with a state of ``DIM`` floats."""

    def __init__(self, n: int, seed: int) -> None:
        super().__init__(n, seed)
        rs = numpy.random.RandomState(seed)
        self.w = 0.5 + 0.4 * rs.rand(DIM)
        self.x0 = rs.randn(DIM)

STRATEGIES = ("store-all", "outer binomial", "program s", "program @outer")
FULL_NS, QUICK_NS, SMOKE_NS = [100, 316, 1000, 3162, 10000], [100, 316, 1000, 3162], [100, 160]
BIG_NS = FULL_NS + [31623, 100000]          # --full: above BIG_N, one round, two strategies
BIG_N = 10000
BIG_STRATEGIES = ("store-all", "program s")  # the memory growth: plain autograd's, the program's
PLAIN_SHARE = 0.4       # store-all runs while its predicted peak is below this share of free RAM


def available_bytes() -> int:
    """MemAvailable (Linux), else a generous 8 GiB."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 2 ** 30
COLUMNS = ["n", "work", "num_ckpts", "strategy", "peak_mib", "plain_evals", "taped_evals",
           "evals_per_step", "ops", "trace_bytes_per_op", "snapshots", "time_s",
           "time_vs_outer", "evals_vs_outer", "trace_mib", "snapshot_mib", "grad_max_rel_err"]


def measure(ns: list[int], repeats: int, log=print, plain_up_to: int | None = None,
            done=None) -> list[dict]:
    """The rows; ``done(rows)`` after each n (results written as they come)."""
    rows = []
    plain_per_n = 0.0                 # store-all's measured MiB per outer iteration, so far
    for n in ns:
        prob = Problem(n, seed=0)
        counter = Counter()
        plain_loss, _ = prob.build("store-all", counter)
        outer_loss, outer = prob.build("outer binomial", counter)
        # plain autograd only where its tape fits in RAM (linear in n: predicted from the last n)
        plain = plain_per_n * n * 2 ** 20 < PLAIN_SHARE * available_bytes() and \
            (plain_up_to is None or n <= plain_up_to)
        if not plain:
            log(f"  n={n} store-all skipped: about {plain_per_n * n / 1024:.1f} GiB predicted"
                + (f" (--plain-up-to {plain_up_to})" if plain_up_to and n > plain_up_to else ""))
        big = n > BIG_N               # hours otherwise on 2 cores: the memory growth only
        progs = {"program s": checkpoint_program(plain_loss, num_ckpts=prob.s)}
        if not big or not plain:      # outer binomial: the budget of program @outer, a reference
            outer_mem, ref = peak_mib(lambda: grad(outer_loss, (0, 1))(prob.w, prob.x0))
            progs["program @outer"] = checkpoint_program(plain_loss,
                                                         memory=int(outer_mem * 2 ** 20))
        if plain:
            ref = grad(plain_loss, (0, 1))(prob.w, prob.x0)
        losses = {"store-all": plain_loss, "outer binomial": outer_loss, **progs}
        if not plain:
            del losses["store-all"]
        if big:
            losses = {k: v for k, v in losses.items() if k in BIG_STRATEGIES}
        grads = {k: grad(f, (0, 1)) for k, f in losses.items()}
        times = interleaved_medians([lambda g=g: g(prob.w, prob.x0) for g in grads.values()],
                                    1 if big else repeats)
        medians = dict(zip(grads, (sorted(t)[len(t) // 2] for t in times)))
        for name, g in grads.items():
            counter.plain = counter.taped = 0
            mem, value = peak_mib(lambda: g(prob.w, prob.x0))
            if name == "store-all":
                plain_per_n = mem / n
            row = dict(n=n, work=prob.work, num_ckpts=prob.s, strategy=name, peak_mib=mem,
                       time_s=medians[name], grad_max_rel_err=max_rel_err(value, ref))
            if name in progs:
                st = progs[name].stats
                per_step = st.ops / prob.work
                row.update(plain_evals=round(st.plain_ops / per_step),
                           taped_evals=round(st.taped_ops / per_step), ops=st.ops,
                           trace_bytes_per_op=st.trace_bytes / st.ops, snapshots=st.snapshots,
                           trace_mib=st.trace_bytes / 2 ** 20,
                           snapshot_mib=st.snapshot_bytes / 2 ** 20)
            else:
                row.update(plain_evals=counter.plain, taped_evals=counter.taped,
                           snapshots=outer.stats.peak_snapshots if name != "store-all" else "")
            row["evals_per_step"] = (row["plain_evals"] + row["taped_evals"]) / prob.work
            rows.append(row)
        outer_row = next((r for r in rows if r["n"] == n and r["strategy"] ==
                          "outer binomial"), None)
        for r in rows:
            if r["n"] == n and outer_row is None:
                r["time_vs_outer"] = r["evals_vs_outer"] = float("nan")
            elif r["n"] == n:
                r["time_vs_outer"] = r["time_s"] / outer_row["time_s"]
                r["evals_vs_outer"] = ((r["plain_evals"] + r["taped_evals"]) /
                                       (outer_row["plain_evals"] + outer_row["taped_evals"]))
                log(f"  n={n} {r['strategy']}: {r['peak_mib']:.3f} MiB, {r['plain_evals']} + "
                    f"{r['taped_evals']} evals ({r['evals_vs_outer']:.2f}x outer), "
                    f"{r['time_s']:.3f} s ({r['time_vs_outer']:.2f}x), err "
                    f"{r['grad_max_rel_err']:.1e}")
        if done is not None:
            done(rows)
    return rows


def markdown(rows: list[dict], env: str) -> str:
    out = ["# checkpoint_program on Siskind & Pearlmutter's nested loop\n",
           f"{env}. Outer iterations n, W atomic steps (~2n), longest inner loop n/3, "
           "s = ceil(log2 n). Evaluations in atomic steps (programs: op evaluations over ops per "
           "step, the recording included); memory: tracemalloc peak of one gradient; time: "
           "median of interleaved rounds; ratios against outer binomial at the same n; "
           "gradients against store-all's (where store-all did not run, its tape not fitting in "
           "RAM: against outer binomial's). Above n = 10^4 (`--full`) only store-all and program "
           "s run, one round. Programs: the trace's bytes and the most bytes their snapshots "
           "held at once.\n"]
    out.append(md_table(
        ["n", "W", "s", "strategy", "peak MiB", "plain evals", "taped evals", "evals / W",
         "evals vs outer", "time (s)", "time vs outer", "snapshots", "trace B/op",
         "trace MiB", "snapshots MiB", "grad max rel err"],
        [[r["n"], r["work"], r["num_ckpts"], r["strategy"], f"{r['peak_mib']:.3f}",
          r["plain_evals"], r["taped_evals"], f"{r['evals_per_step']:.2f}",
          f"{r['evals_vs_outer']:.2f}", f"{r['time_s']:.3f}", f"{r['time_vs_outer']:.2f}",
          r["snapshots"], f"{r['trace_bytes_per_op']:.1f}" if r.get("ops") else "",
          f"{r['trace_mib']:.3f}" if r.get("ops") else "",
          f"{r['snapshot_mib']:.3f}" if r.get("ops") else "",
          f"{r['grad_max_rel_err']:.1e}"] for r in rows], "rrrlrrrrrrrrrrrr"))
    out.append("\nFitted growth orders (log-log slope against n):\n")
    body = []
    for s in STRATEGIES:
        rs = [r for r in rows if r["strategy"] == s]
        if len(rs) > 1:
            ns = [r["n"] for r in rs]
            body.append([s, f"{loglog_slope(ns, [r['peak_mib'] for r in rs]):.2f}",
                         f"{loglog_slope(ns, [r['time_s'] for r in rs]):.2f}"])
    out.append(md_table(["strategy", "peak memory", "time"], body))
    return "\n".join(out)


def plot(rows: list[dict]) -> bytes:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.8))
    marks = {"store-all": "s-", "outer binomial": "^-", "program s": "o-",
             "program @outer": "D-"}
    for s in STRATEGIES:
        rs = [r for r in rows if r["strategy"] == s]
        ns = [r["n"] for r in rs]
        a1.loglog(ns, [r["peak_mib"] for r in rs], marks[s], label=s)
        a2.loglog(ns, [r["time_s"] for r in rs], marks[s], label=s)
    a1.set_title("peak memory of one gradient (tracemalloc)", fontsize=10)
    a1.set_ylabel("MiB")
    a2.set_title("time of one gradient (median)", fontsize=10)
    a2.set_ylabel("seconds")
    for a in (a1, a2):
        a.set_xlabel("outer iterations n (W ~ 2n atomic steps, longest inner loop n/3)")
        a.grid(alpha=0.3, which="both")
        a.legend(fontsize=8)
    fig.suptitle("Siskind & Pearlmutter's nested loop: checkpoint_program (no annotation) "
                 "beside plain autograd and binomial checkpointing of the outer loop",
                 fontsize=10)
    fig.tight_layout()
    return png_bytes(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.programs", description=__doc__
                                .splitlines()[0])
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="n up to 3162 (about a minute)")
    size.add_argument("--smoke", action="store_true", help="seconds; the numbers mean nothing")
    size.add_argument("--full", action="store_true",
                      help="n up to 10^5 (above 10^4: store-all, where its tape fits in RAM, "
                           "and program s, one round); writes programs-full.*")
    p.add_argument("--repeats", type=int, default=3, help="interleaved timing rounds (>= 1)")
    p.add_argument("--ns", type=int, nargs="+",
                   help="outer iterations to run (default: the mode's)")
    p.add_argument("--plain-up-to", type=int, help="run store-all only up to this n (time)")
    p.add_argument("--out", default=os.path.join("benchmarks", "programs", "results"))
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats must be at least 1; got {args.repeats}")
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    ns = args.ns or (SMOKE_NS if args.smoke else QUICK_NS if args.quick else BIG_NS if args.full
                     else FULL_NS)
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    flag = " --quick" if args.quick else " --smoke" if args.smoke else " --full" if args.full \
        else ""
    env = (f"Run: `python -m benchmarks.programs{flag}`, {time.strftime('%Y-%m-%d %H:%M')}, "
           f"{os.cpu_count()} cores, load average at start {load}, Python "
           f"{sys.version.split()[0]}, BLAS threads 1")
    print(env)
    name = "programs-full" if args.full else "programs"
    extra = (f" --repeats {args.repeats}" if args.repeats != 3 else "") + \
        (f" --ns {' '.join(map(str, args.ns))}" if args.ns else "") + \
        (f" --plain-up-to {args.plain_up_to}" if args.plain_up_to else "")
    env = env.replace("`,", f"{extra}`,", 1)

    def write(rows: list[dict]) -> None:                 # after each n: a long run keeps its rows
        files = {f"{name}.csv": csv_bytes(rows, COLUMNS),
                 f"{name}.md": markdown(rows, env).encode(), f"{name}.png": plot(rows)}
        for path in write_outputs(args.out, files):
            print("wrote", path, flush=True)
    measure(ns, args.repeats, log=lambda s: print(s, flush=True), plain_up_to=args.plain_up_to,
            done=write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
