"""Planning time of ``bt.checkpoint_module`` (issue 31: ResNet-18's forward <= 1 s, a 12-layer
transformer's <= 5 s), and the recorded forward against the plain one.

``python -m benchmarks.program.plan_time [--out DIR]``: ResNet-18 (batch 8, 64x64; the
benchmark's model) and 12 ``nn.TransformerEncoderLayer`` (d=256, 4 heads, seq 128, batch 4,
dropout 0.1), each at ``memory=`` budgets and ``num_ckpts=4``; the first call's planning seconds
(later calls with the same ops reuse the plan), the ops recorded, the trace's bytes per op, and
the median of 5 forwards plain and recorded. Writes results/plan-time.{csv,md}."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from torch import nn

import bincheck.torch as bt
from benchmarks.program.report import write_table
from benchmarks.program import models as M

HERE = os.path.dirname(os.path.abspath(__file__))


def median_forward(f, x, n=5) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        y = f(x)
        times.append(time.perf_counter() - t0)
        del y
    return statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    resnet = M.make("resnet18", "quick")
    tfm = nn.Sequential(*[nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.1,
                                                     batch_first=True) for _ in range(12)])
    cases = [("ResNet-18, batch 8, 64x64", resnet.model, resnet.inputs[0],
              ["80MB", "120MB"]),
             ("12-layer transformer, d=256, seq 128, batch 4", tfm, torch.randn(4, 128, 256),
              ["100MB", "200MB"])]
    rows = []
    for label, model, x, budgets in cases:
        plain = median_forward(model, x)
        for budget in budgets + [4]:
            kw = dict(num_ckpts=budget) if isinstance(budget, int) else dict(memory=budget)
            net = bt.checkpoint_module(model, **kw)
            net(x).sum().backward()
            plan = net.last_plan
            recorded = median_forward(net, x)
            s = net.stats
            rows.append(dict(model=label, budget=str(kw), ops=s.ops, stages=plan.stages,
                             plan_s=round(plan.plan_seconds, 4),
                             trace_bytes_per_op=round(s.trace_bytes / s.ops),
                             plain_forward_s=round(plain, 4),
                             recorded_forward_s=round(recorded, 4),
                             overhead_us_per_op=round(1e6 * (recorded - plain) / s.ops, 1)))
            print(rows[-1], flush=True)
    write_table(args.out, "plan-time", "Planning and recording", [
        ('model', False, lambda row: str(row['model'])),
        ('budget', False, lambda row: str(row['budget'])),
        ('ops', True, lambda row: str(row['ops'])),
        ('stages', True, lambda row: str(row['stages'])),
        ('planning s', True, lambda row: str(row['plan_s'])),
        ('trace B/op', True, lambda row: str(row['trace_bytes_per_op'])),
        ('forward s', True, lambda row: str(row['plain_forward_s'])),
        ('recorded forward s', True, lambda row: str(row['recorded_forward_s'])),
        ('overhead µs/op', True, lambda row: str(row['overhead_us_per_op']))], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
