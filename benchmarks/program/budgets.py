"""How ``memory=`` holds under the profiler's allocation meter for ``bt.checkpoint_module``.

``python -m benchmarks.program.budgets [--out DIR]``: for a 32-op MLP and issue 31's ResNet-18,
GPT, U-Net and TreeLSTM (benchmarks/program/models.py, quick sizes), the least budget the
planner accepts, then budgets from it to 0.8x store-all's metered peak; at each, the metered peak
of a gradient (the second call, which reuses the plan) against the budget and against the
plan's prediction. Writes results/budgets.{csv,md}."""

from __future__ import annotations

import argparse
import copy
import os
import re
import sys

import torch
from torch import nn

import bincheck.torch as bt
from benchmarks.program.report import write_table
from benchmarks.program import models as M

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests"))
from torch_helpers import allocation_peak  # noqa: E402


def least_budget(model, run) -> int:
    try:
        run(bt.checkpoint_module(copy.deepcopy(model), memory=10_000))
    except ValueError as e:
        return int(re.search(r"pass memory=(\d+)", str(e)).group(1))
    return 10_000


def rows_for(name, model, run, fracs):
    ref = copy.deepcopy(model)
    ref.zero_grad(set_to_none=True)
    _, store_all = allocation_peak(lambda: run(ref).backward())
    least = least_budget(model, run)
    out = []
    for f in (None,) + fracs:
        budget = least if f is None else int(f * store_all)
        if budget < least:
            continue
        net = bt.checkpoint_module(copy.deepcopy(model), memory=budget)
        run(net).backward()                       # plans; the next call reuses the plan
        net.zero_grad(set_to_none=True)           # the gradients are allocated in the window
        _, peak = allocation_peak(lambda: run(net).backward())
        predicted = net.last_plan.peak_bytes + net.stats.trace_bytes
        out.append(dict(workload=name, budget=("least" if f is None else f"{f:g}x store-all"),
                        store_all=store_all, budget_bytes=budget, peak=peak,
                        peak_over_budget=round(peak / budget, 3),
                        peak_over_predicted=round(peak / predicted, 3),
                        ops=net.stats.ops, plain_ops=net.stats.plain_ops,
                        taped_ops=net.stats.taped_ops))
        print(out[-1], flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--smoke", action="store_true", help="the MLP only, small")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    width, batch = (16, 64) if args.smoke else (64, 2048)
    mlp = nn.Sequential(*[m for _ in range(16) for m in (nn.Linear(width, width), nn.Tanh())])
    x = torch.randn(batch, width)
    rows = rows_for("mlp", mlp, lambda m: m(x).sum(), (0.5, 0.6, 0.8))
    if not args.smoke:
        for name in ("resnet18", "gpt", "unet", "treelstm"):
            w = M.make(name, "quick")
            rows += rows_for(name, w.model, lambda m, w=w: w.loss_of(w.apply(m)), (0.6, 0.8))
    mib = lambda key: lambda r: f"{r[key] / 2**20:.2f}"  # noqa: E731
    write_table(args.out, "budgets-smoke" if args.smoke else "budgets",
                "memory= under the profiler's meter", [
                    ("workload", False, lambda r: r["workload"]),
                    ("budget", False, lambda r: r["budget"]),
                    ("store-all MiB", True, mib("store_all")),
                    ("budget MiB", True, mib("budget_bytes")), ("peak MiB", True, mib("peak")),
                    ("peak / budget", True, lambda r: f"{r['peak_over_budget']:.3f}"),
                    ("peak / predicted", True, lambda r: f"{r['peak_over_predicted']:.3f}"),
                    ("ops", True, lambda r: str(r["ops"])),
                    ("plain", True, lambda r: str(r["plain_ops"])),
                    ("taped", True, lambda r: str(r["taped_ops"]))], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
