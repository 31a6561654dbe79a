"""Independent measurements: the profiler's allocation events (peak bytes) and per-step costs.

On the CPU, the peak is the running sum of every allocation and free torch's allocator reports
to the profiler during one call, sorted by time, above its value at the start (research/torch.md
§3; tracemalloc does not see torch's allocator). On a CUDA device it is the caching allocator's
own peak of allocated bytes (``torch.cuda.max_memory_allocated``, reset before the call) above
the bytes allocated at the start: the allocator's count, not bincheck's. It stops counting a
tensor when it is freed, even while a copy on another stream still reads it (``record_stream``),
so with ``offload=True`` a peak may miss the one snapshot whose copy down is in flight.

Per-step costs are the references for bincheck's bound: a plain step under ``no_grad``, and a
taped step with its backward pass (the cotangents of the state, and of the parameters added into
their running sums, as a reverse sweep needs them), through autograd's engine without
``torch.autograd.backward``'s argument checks. On CUDA each is timed as the throughput of a run
of steps, synchronised before and after.
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


def peak_bytes(call: Callable[[], object], cuda: bool = False) -> int:
    """Peak torch-allocated bytes during ``call()``, above the start (profiler events; on a
    CUDA device, the caching allocator's peak of the current device)."""
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        call()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - start
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


def engine_backward(outs: list, grads: list, inputs: list) -> None:
    """``torch.autograd.backward(outs, grads, inputs=inputs)`` through the entry point that
    function calls after checking and converting its arguments (24–33 µs a call on the tanh
    cell, timed by hand): the least a loop can pay to pull a step back, so the bound charges
    no wrapper that bincheck's sweep does not pay either. The public function where torch
    lacks the entry."""
    run = getattr(torch.autograd.graph, "_engine_run_backward", None)
    if run is None:
        torch.autograd.backward(outs, grads, inputs=inputs)
    else:
        run(tuple(outs), tuple(grads), False, False, tuple(inputs), allow_unreachable=True,
            accumulate_grad=True)


def step_costs(prob: Problem, reps: int = 40) -> tuple[float, float, float]:
    """Seconds of one plain step (``no_grad``), of one taped step with its backward pass as a
    reverse sweep runs it, and of the older bound's taped step: the mean over ``reps`` steps on
    distinct inputs, after two warm-up steps.

    The backward of a step in a loop adds its parameters' cotangents into the gradient summed
    over the steps (``.grad``; store-all's ``.backward()`` pays the same additions in autograd's
    input buffers): the bound's taped cost is the engine's backward into the parameters' ``.grad``
    and the state (:func:`engine_backward`). The third number, ``torch.autograd.grad`` into fresh
    tensors, was the bound's taped cost in the results committed before 2026-11-24 and stays in
    the results beside it: it leaves out the additions and pays ``autograd.grad``'s argument
    checks."""
    cell, params, state0 = prob.cell, prob.params, prob.state0
    xs = prob.xs[:reps]

    def taped(x, into_grad):
        s = tuple(v.detach().requires_grad_() for v in state0) if prob.lstm else \
            state0.detach().requires_grad_()
        out = prob.step(cell, s, x)
        outs = out if prob.lstm else (out,)
        wrt = params + list(s if prob.lstm else (s,))
        ones = [torch.ones_like(o) for o in outs]
        if into_grad:
            engine_backward(list(outs), ones, wrt)
        else:
            torch.autograd.grad(outs, wrt, ones)

    def plain(x):
        with torch.no_grad():
            prob.step(cell, state0, x)

    saved = [p.grad for p in params]
    result = []
    try:
        for one in (plain, lambda x: taped(x, True), lambda x: taped(x, False)):
            prob.zero_grad()
            for x in xs[:2]:
                one(x)
            prob.sync()
            t0 = time.perf_counter()
            for x in xs:
                one(x)
            prob.sync()
            result.append((time.perf_counter() - t0) / len(xs))
    finally:
        for p, g in zip(params, saved):
            p.grad = g
    return result[0], result[1], result[2]

