"""Independent measurements: the profiler's allocation events (peak bytes) and per-step costs.

The peak is the running sum of every allocation and free torch's allocator reports to the
profiler during one call, sorted by time, above its value at the start (research/torch.md §3;
tracemalloc does not see torch's allocator). Per-step costs are the references for bincheck's
bound: a plain step under ``no_grad``, and a taped step with its backward pass (the cotangents of
the parameters and of the state, as a reverse sweep needs them).
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from .strategies import Problem


def _allocations(events) -> list[tuple[int, int]]:
    alloc = torch._C._profiler._EventType.Allocation
    out, stack = [], list(events)
    while stack:
        e = stack.pop()
        if e.tag == alloc:
            out.append((e.start_time_ns, e.extra_fields.alloc_size))
        stack.extend(e.children)
    return out


@contextlib.contextmanager
def _quiet_stderr():
    """Kineto writes a line to file descriptor 2 at every profiler start and stop."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_bytes(call: Callable[[], object]) -> int:
    """Peak torch-allocated bytes during ``call()``, above the start (profiler events)."""
    gc.collect()
    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU],
                                  profile_memory=True) as prof:
        call()
    events = _allocations(prof.profiler.kineto_results.experimental_event_tree())
    events.sort(key=lambda e: e[0])
    total = peak = 0
    for _, size in events:
        total += size
        peak = max(peak, total)
    return peak


def step_costs(prob: Problem, reps: int = 40) -> tuple[float, float]:
    """Seconds of one plain step (``no_grad``) and of one taped step with its backward pass
    (``autograd.grad`` w.r.t. the parameters and the state, as a reverse sweep needs them):
    the mean over ``reps`` steps on distinct inputs, after two warm-up steps."""
    cell, params, state0 = prob.cell, prob.params, prob.state0
    xs = prob.xs[:reps]

    def taped(x):
        s = tuple(v.detach().requires_grad_() for v in state0) if prob.lstm else \
            state0.detach().requires_grad_()
        out = prob.step(cell, s, x)
        outs = out if prob.lstm else (out,)
        torch.autograd.grad(outs, params + list(s if prob.lstm else (s,)),
                            [torch.ones_like(o) for o in outs])

    def plain(x):
        with torch.no_grad():
            prob.step(cell, state0, x)

    result = []
    for one in (plain, taped):
        for x in xs[:2]:
            one(x)
        t0 = time.perf_counter()
        for x in xs:
            one(x)
        result.append((time.perf_counter() - t0) / len(xs))
    return result[0], result[1]


def load_average() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"
