"""``python -m benchmarks.rnn``: memory saved vs slowdown of checkpointing strategies.

Quick default (about a minute on 2 cores): tanh and LSTM cells with the loss on the final state,
and the tanh character-level language model (a loss at every step), T=200, H=64, B=16.
``--full``: the seq_len = 1000, hidden = 256, batch = 32 table of benchmarks/rnn/README.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from ..common.files import write_atomic
from .cells import CELLS
from .harness import LOSSES, Problem, Run, run_problem
from .report import csv_bytes, markdown, plot_png
from .strategies import STRATEGIES

# (cell, loss) pairs; --cells / --loss replace them by the grid of the given cells and losses
QUICK = dict(problems=[("tanh", "final"), ("lstm", "final"), ("tanh", "char-lm")],
             seq_len=[200], hidden=64, batch=16, num_ckpts=[5, 10, 20], repeats=3)
FULL = dict(problems=[("tanh", "final"), ("lstm", "final"), ("gru", "final"),
                      ("tanh", "char-lm"), ("lstm", "char-lm")],
            seq_len=[1000], hidden=256, batch=32, num_ckpts=[10, 20, 50, 100], repeats=3)
STACKED_CKPTS = 50      # stacked-ys runs at the sweep's largest num_ckpts up to this


def stacked_num_ckpts(sweep: list[int], seq_len: int) -> int:
    """num_ckpts of the stacked-ys row: the sweep's largest value up to 50 (else its smallest),
    at most seq_len — so that it sits next to the output_fn row with the same num_ckpts."""
    fitting = [s for s in sweep if s <= STACKED_CKPTS]
    return min(max(fitting) if fitting else min(sweep), seq_len)


def _list_of(kind, choices=None):
    def parse(text: str):
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("expected a comma-separated list")
        out = []
        for item in items:
            if kind is int:
                try:
                    value = int(item)
                except ValueError:
                    raise argparse.ArgumentTypeError(f"{item!r} is not an integer") from None
                if value < 1:
                    raise argparse.ArgumentTypeError(f"{item!r} is not a positive integer")
                out.append(value)
            else:
                if item not in choices:
                    raise argparse.ArgumentTypeError(
                        f"{item!r} is not one of {', '.join(choices)}")
                out.append(item)
        return out
    return parse


def _positive(text: str) -> int:
    values = _list_of(int)(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"expected one integer, got {text!r}")
    return values[0]


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.rnn",
        description="Gradient memory and time of RNN checkpointing strategies vs store-all. "
                    "Without options: a quick run (tanh + LSTM, T=200, H=64, B=16).")
    p.add_argument("--full", action="store_true",
                   help="the full table: tanh/LSTM/GRU with the final-state loss, tanh/LSTM "
                        "char-LM, T=1000, H=256, B=32, num_ckpts 10,20,50,100")
    p.add_argument("--cells", type=_list_of(str, list(CELLS)), help="cells, e.g. tanh,lstm,gru")
    p.add_argument("--loss", type=_list_of(str, list(LOSSES)),
                   help="final (loss on the final state, random inputs) and/or char-lm (a "
                        "character-level language model: cross-entropy at every step, in "
                        "output_fn)")
    p.add_argument("--seq-len", type=_list_of(int), help="sequence lengths, e.g. 200,1000")
    p.add_argument("--hidden", type=_positive, help="hidden size")
    p.add_argument("--batch", type=_positive, help="batch size")
    p.add_argument("--num-ckpts", type=_list_of(int), help="bincheck num_ckpts sweep, e.g. 10,50")
    p.add_argument("--strategies", type=_list_of(str, list(STRATEGIES)),
                   help=f"subset of {','.join(STRATEGIES)} (store-all always runs: it is the "
                        f"reference)")
    p.add_argument("--repeats", type=_positive, help="timed gradients per run (median; >= 3)")
    p.add_argument("--seed", type=int, default=0, help="RNG seed for parameters and inputs")
    p.add_argument("--out", default=os.path.join("benchmarks", "rnn", "out"),
                   help="output folder for results.csv, results.md, results.png")
    p.add_argument("--replot", metavar="CSV",
                   help="redraw results.md and results.png from an earlier results.csv; no runs")
    p.add_argument("--no-rss", action="store_true",
                   help="skip the memory_profiler RSS measurement (one child process per run)")
    args = p.parse_args(argv)
    base = FULL if args.full else QUICK
    for name in ("seq_len", "hidden", "batch", "num_ckpts", "repeats"):
        if getattr(args, name) is None:
            setattr(args, name, base[name])
    if args.cells is None and args.loss is None:
        args.problems = base["problems"]
    else:
        cells = args.cells or list(dict.fromkeys(c for c, _ in base["problems"]))
        losses = args.loss or list(dict.fromkeys(loss for _, loss in base["problems"]))
        args.problems = [(c, loss) for c in cells for loss in losses]
    if args.strategies is None:
        args.strategies = list(STRATEGIES)
    if args.repeats < 3:
        p.error(f"--repeats must be at least 3 (the time is a median); got {args.repeats}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.replot:
        from .report import rows_from_csv
        rows = rows_from_csv(args.replot)
        write_atomic(os.path.join(args.out, "results.md"), markdown(rows).encode())
        png = plot_png(rows)
        if png is not None:
            write_atomic(os.path.join(args.out, "results.png"), png)
        print(f"redrew {len(rows)} runs into {args.out}/")
        return 0
    from tqdm import tqdm

    problems = [Problem(c, loss, T, args.hidden, args.batch, args.seed)
                for c, loss in args.problems for T in args.seq_len]
    plans = []
    for prob in problems:
        runs = [Run(prob, "store-all")]
        for strategy in args.strategies:
            if strategy == "bincheck":
                runs += [Run(prob, "bincheck", s) for s in args.num_ckpts if s <= prob.seq_len]
            elif strategy == "stacked-ys":
                if prob.per_step:
                    runs.append(Run(prob, strategy,
                                    stacked_num_ckpts(args.num_ckpts, prob.seq_len)))
            elif strategy != "store-all":
                runs.append(Run(prob, strategy))
        plans.append((prob, runs))
    total = sum(len(runs) + args.repeats for _, runs in plans)
    rows = []
    t0 = time.perf_counter()
    with tqdm(total=total, desc="benchmark", unit="step", file=sys.stderr) as bar:
        for prob, runs in plans:
            bar.set_postfix_str(f"{prob.cell} {prob.loss} T={prob.seq_len}")
            rows += run_problem(prob, runs, args.repeats, not args.no_rss, bar)
            # write what we have after every problem: an interrupted run keeps whole files
            write_atomic(os.path.join(args.out, "results.csv"), csv_bytes(rows))
    table = markdown(rows)
    write_atomic(os.path.join(args.out, "results.md"), table.encode())
    png = plot_png(rows)
    if png is not None:
        write_atomic(os.path.join(args.out, "results.png"), png)
    print(table)
    for r in rows:
        if r.bookkeeping_pct is not None:
            print(f"bookkeeping {r.cell}/{r.loss} {r.strategy}"
                  f"{'' if r.num_ckpts is None else f'(s={r.num_ckpts})'}: "
                  f"{r.bookkeeping_pct:.1f} % of the gradient's time outside step evaluations "
                  f"and their VJPs; the library's own overhead "
                  f"{r.library_overhead_pct:.1f} %")
    failed = [r for r in rows if r.status != "ok"]
    print(f"\n{len(rows)} runs in {time.perf_counter() - t0:.0f} s; results in {args.out}/"
          f"{'' if not failed else f'; {len(failed)} FAILED (gradient mismatch)'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
