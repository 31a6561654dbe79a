"""``python -m benchmarks.online_quality``: plain evaluations of checkpointed_while_loop's online
schedule against the offline optimum t(n, s) + 1 for the same n, worst and mean over ranges of n.

Counts only (closed form per segment, cross-checked against the simulator in the tests): no
timing, deterministic. ``--max-n`` caps the longest range (default 100000).
"""

from __future__ import annotations

import argparse
import sys

from bincheck.schedule.binomial import beta, optimal_plain_steps
from bincheck.schedule.online import OnlinePlanner, reverse_steps


def ratios(s: int, n_max: int):
    planner = OnlinePlanner(s)
    list(planner.start())
    for n in range(1, n_max + 1):
        yield n, (n + reverse_steps(planner.snaps, n, s)) / (optimal_plain_steps(n, s) + 1)
        list(planner.advance(n))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.online_quality", description=__doc__)
    p.add_argument("--num-ckpts", default="5,10,20,50", help="comma-separated num_ckpts values")
    p.add_argument("--max-n", type=int, default=100_000)
    a = p.parse_args(argv)
    try:
        slots = [int(v) for v in a.num_ckpts.split(",")]
    except ValueError:
        p.error(f"--num-ckpts must be comma-separated integers; got {a.num_ckpts!r}")
    if any(v < 1 for v in slots) or a.max_n < 1:
        p.error("--num-ckpts values and --max-n must be positive")
    print("| num_ckpts s | n ≤ β(s,2) | β(s,2) < n ≤ β(s,3) | β(s,3) < n ≤ β(s,4) | "
          "β(s,4) < n ≤ min(β(s,5), max-n) |")
    print("|---:|---|---|---|---|")
    for s in slots:
        bounds = [0] + [beta(s, r) for r in (2, 3, 4, 5)]
        bounds = [min(b, a.max_n) for b in bounds]
        stats = [[1.0, 0.0, 0] for _ in range(4)]         # worst, sum, count per range
        for n, r in ratios(s, bounds[-1]):
            k = next(i for i in range(4) if n <= bounds[i + 1])
            st = stats[k]
            st[0], st[1], st[2] = max(st[0], r), st[1] + r, st[2] + 1
        cells = []
        for (worst, total, count), lo, hi in zip(stats, bounds, bounds[1:]):
            cells.append("–" if count == 0 else
                         f"worst {worst:.4f}, mean {total / count:.4f} (n ≤ {hi})")
        print(f"| {s} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
