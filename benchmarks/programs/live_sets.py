"""``python -m benchmarks.programs.live_sets``: Dauvergne and Hascoet's point measured on three
recorded programs: what a snapshot at a cut holds (the values defined before it and used after
it, inputs excluded) against what a tape would hold there (every value computed before it).

For each program the trace is recorded once (``bincheck.autograd.trace.record``, as a gradient of
``checkpoint_program`` records it) and, over its cuts, the live-set bytes are compared with the
bytes of every op result before the cut: the largest live set, the mean, and their ratio to the
largest and mean cumulative bytes. Writes ``live-sets.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy

from bincheck.autograd.trace import record

from ..reproduce.common import md_table, write_outputs
from .examples import nested, rnn


def programs():
    """(name, f, args): an RNN as a Python loop, S&P's nested loop, implicit Euler with Newton."""
    import autograd.numpy as np
    rng = numpy.random.RandomState(0)

    def euler(p, y):
        for _ in range(50):
            z = y
            while True:
                f = np.concatenate([z[1:] - z[:-1], -p[0] * z[-1:] ** 3])
                r = z - y - 0.01 * f
                if np.max(np.abs(r)) < 1e-10:
                    break
                z = z - r / (1.0 + 0.01 * p[0])
            y = z
        return np.sum(y ** 2)
    H = 64
    return [("rnn (T=200, B=16, H=64)", rnn, [rng.randn(H, H) * 0.2, rng.randn(8, H) * 0.2,
                                             rng.randn(200, 16, 8), rng.randn(16, H)]),
            ("nested loop (y of 1000)", nested, [numpy.linspace(0.5, 1.5, 1000), 1.01]),
            ("implicit Euler, Newton to 1e-10 (100 floats)", euler,
             [numpy.array([2.0]), rng.randn(100) * 0.1])]


def measure():
    rows = []
    for name, f, args in programs():
        tr, _ = record(f, args, lambda ls: tuple(ls))
        live = tr.cut_bytes()
        total = numpy.concatenate([[0], numpy.cumsum(numpy.frombuffer(tr.out_bytes,
                                                                      dtype=numpy.int64))])
        inner = slice(1, tr.n)                       # cuts strictly inside the program
        rows.append(dict(program=name, ops=tr.n, live_max=int(live[inner].max()),
                         live_mean=float(live[inner].mean()), taped_max=int(total[inner].max()),
                         taped_mean=float(total[inner].mean())))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.programs.live_sets",
                                description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join("benchmarks", "programs", "results"))
    args = p.parse_args(argv)
    rows = measure()
    env = f"Run: `python -m benchmarks.programs.live_sets`, {time.strftime('%Y-%m-%d %H:%M')}"
    table = md_table(["program", "ops", "largest live set (B)", "mean live set (B)",
                      "largest taped (B)", "mean taped (B)", "largest: live / taped",
                      "mean: live / taped"],
                     [[r["program"], r["ops"], r["live_max"], f"{r['live_mean']:.0f}",
                       r["taped_max"], f"{r['taped_mean']:.0f}",
                       f"{r['live_max'] / r['taped_max']:.4f}",
                       f"{r['live_mean'] / r['taped_mean']:.4f}"] for r in rows], "lrrrrrrr")
    text = ("# Live sets against what a tape holds, per cut\n\n" + env + ". A snapshot at a cut "
            "holds the values defined before it and used after it (inputs excluded); a tape "
            "there holds every op result before it. Over the cuts strictly inside each "
            "program:\n\n" + table + "\n")
    print(text)
    for path in write_outputs(args.out, {"live-sets.md": text.encode()}):
        print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
