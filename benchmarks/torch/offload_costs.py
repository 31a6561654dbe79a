"""``python -m benchmarks.torch.offload_costs [MEMORY]``: where ``offload=True`` spends its time
on a CUDA device (tanh cell, T=1000, H=256, B=32, I=256, float32; MEMORY in bytes, default
1663027, the full run's 5 % of store-all).

Runs the same ``memory=`` loop without and with the host tier, five timed gradients each after a
warm-up, and prints each plan, its statistics, and the host side's time in every method of the
tier and its copier (``HostTier.put/get/pop/prefetch``, ``CudaCopies.down/up/use/done/settle``:
calls and milliseconds per gradient), whether any wait on a copy blocked, and the profiler's
table of one gradient with the tier. Needs a GPU. ``results/offload-costs-cuda.md`` is its output
on an H100 (library at 43664bc, before the probe timed CUDA steps back to back).
"""

from __future__ import annotations

import collections
import statistics
import sys
import time

import torch

import bincheck.torch as bt
from bincheck.torch import offload as off

from .strategies import Problem

SECONDS: dict = collections.defaultdict(float)
CALLS: collections.Counter = collections.Counter()
BLOCKED: collections.Counter = collections.Counter()


def timed_method(cls: type, name: str) -> None:
    inner = getattr(cls, name)

    def method(self, *args, **kwargs):
        if name == "settle" and not args[0].query():
            BLOCKED[name] += 1
        t0 = time.perf_counter()
        out = inner(self, *args, **kwargs)
        SECONDS[f"{cls.__name__}.{name}"] += time.perf_counter() - t0
        CALLS[f"{cls.__name__}.{name}"] += 1
        return out
    setattr(cls, name, method)


def main(argv: list[str]) -> int:
    if not torch.cuda.is_available():
        print("offload_costs needs a CUDA device", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    prob = Problem("tanh", 1000, 256, 32, 256, 0, "cuda")
    memory = int(argv[0]) if argv else 1663027
    for name in ("down", "up", "use", "done", "settle"):
        timed_method(off.CudaCopies, name)
    for name in ("put", "get", "pop", "prefetch"):
        timed_method(off.HostTier, name)

    def gradient(loop) -> float:
        prob.zero_grad()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        prob.loss(loop(prob.cell, prob.state0, prob.xs)).backward()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    reps = 5
    for offload in (False, True):
        loop = bt.binomial_checkpoint(prob.step, 1000, memory=memory, offload=offload or None)
        gradient(loop)
        SECONDS.clear(), CALLS.clear(), BLOCKED.clear()
        times = [gradient(loop) for _ in range(reps)]
        print(f"offload {offload} median {statistics.median(times):.4f}",
              [round(t, 3) for t in times])
        print(" ", str(loop.last_plan).replace("\n", "\n  "))
        st = loop.stats
        print("  stats", {k: getattr(st, k) for k in dir(st)
                          if k.startswith(("offload", "plain", "taped", "disk"))})
        for k in sorted(SECONDS):
            print(f"  {k:22s} n/{reps}={CALLS[k] / reps:7.1f} "
                  f"ms/call={1e3 * SECONDS[k] / max(CALLS[k], 1):8.4f} "
                  f"total/{reps}={1e3 * SECONDS[k] / reps:8.2f} ms")
        print(f"  settle calls that waited /{reps}:", BLOCKED["settle"] / reps)
        if offload:
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
                gradient(loop)
            print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=18,
                                         max_name_column_width=40))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
