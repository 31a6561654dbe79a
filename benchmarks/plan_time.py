"""``python -m benchmarks.plan_time``: time to plan the mixed (snapshots + kept tapes) schedule, and
its plain step evaluations next to Revolve's with the same number of state slots.

For each cell (state_bytes S, tape_bytes T), n and budget ``memory = fraction * n * T``, it builds
``MixedPlan`` and iterates every action; the time covers both. ``revolve`` is ``t(n, slots)`` with
``slots = memory // S``; ``rows`` is how many exact DP rows the table had to build (0 when closed
forms answered everything). ``--check`` also replays every
plan through the simulator (validity, peak bytes, plain count) for n <= 10^4. Counts are
deterministic; times depend on the machine and its load (the benchmark asserts nothing about them).
``--csv FILE`` writes the rows as CSV too.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time

from bincheck.schedule import simulate
from bincheck.schedule.binomial import optimal_plain_steps
from bincheck.schedule.mixed import MixedPlan

KiB = 1024
CELLS = {"rnn": (64 * KiB, 140 * KiB),       # tanh RNN, H=256, B=32
         "lstm": (128 * KiB, 930 * KiB)}
FIELDS = ["cell", "n", "budget_pct", "slots", "longest_leaf", "plain", "revolve", "plain/revolve",
          "rows", "plan_s"]


def run(cell: str, n: int, fraction: float, check: bool) -> dict:
    S, T = CELLS[cell]
    memory = int(fraction * n * T)
    start = time.perf_counter()
    plan = MixedPlan(n, memory, S, T)
    plain = plan.plain_steps
    for _ in plan:
        pass
    elapsed = time.perf_counter() - start
    if check and n <= 10 ** 4:
        cost = simulate(plan)
        assert cost.plain_steps == plain and cost.peak_bytes <= memory
    revolve = optimal_plain_steps(n, plan.checkpoints)
    return {"cell": cell, "n": n, "budget_pct": round(100 * fraction, 3), "slots": plan.checkpoints,
            "longest_leaf": plan.table.leaves[-1], "plain": plain, "revolve": revolve,
            "plain/revolve": round(plain / revolve, 3) if revolve else 1.0,
            "rows": plan.table.dp_rows, "plan_s": round(elapsed, 4)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.plan_time", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", default="1000,10000,100000", help="comma-separated sequence lengths")
    p.add_argument("--budgets", default="1,2,5,10,25", help="comma-separated %% of n * tape_bytes")
    p.add_argument("--cells", default="rnn,lstm", help=f"comma-separated, from {sorted(CELLS)}")
    p.add_argument("--check", action="store_true", help="simulate every plan with n <= 10^4")
    p.add_argument("--csv", help="also write the results to this CSV file")
    a = p.parse_args(argv)
    try:
        ns = [int(v) for v in a.n.split(",")]
        budgets = [float(v) / 100 for v in a.budgets.split(",")]
    except ValueError:
        p.error("--n and --budgets take comma-separated numbers")
    cells = a.cells.split(",")
    if any(c not in CELLS for c in cells) or any(v < 1 for v in ns) or any(b <= 0 for b in budgets):
        p.error(f"--cells must name {sorted(CELLS)}; --n and --budgets must be positive")
    print("| " + " | ".join(FIELDS) + " |")
    print("|" + "---:|" * len(FIELDS))
    rows = []
    for cell in cells:
        for n in ns:
            for fraction in budgets:
                row = run(cell, n, fraction, a.check)
                rows.append(row)
                print("| " + " | ".join(str(row[f]) for f in FIELDS) + " |", flush=True)
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
