"""Helpers for the torch front end's tests: problems, the plain (uncheckpointed) reference loop,
an evaluation counter, the closed form t(l, s) and an allocation meter that sees torch's
allocator (tracemalloc does not)."""


import gc

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

from closed_form import closed_form  # noqa: F401  (re-exported for the tests)

DT = torch.float64


def tanh_cell(params, h, x):
    W, U, b = params
    return torch.tanh(h @ W + x @ U + b)


def problem(T, B=3, H=4, I=2, seed=0, dtype=DT):
    g = torch.Generator().manual_seed(seed)
    params = (torch.randn(H, H, generator=g, dtype=dtype) * 0.5,
              torch.randn(I, H, generator=g, dtype=dtype) * 0.5,
              torch.randn(H, generator=g, dtype=dtype) * 0.1)
    h0 = torch.randn(B, H, generator=g, dtype=dtype)
    xs = torch.randn(T, B, I, generator=g, dtype=dtype)
    return params, h0, xs


def requiring(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


def plain_loop(fn, params, state, inputs, T, output_fn=None):
    ys = []
    for t in range(T):
        x = None if inputs is None else slice_tree(inputs, t)
        state = fn(params, state, x)
        if output_fn is not None:
            ys.append(output_fn(params, state, x))
    return (state, torch.stack(ys)) if output_fn is not None else state


def slice_tree(tree, t):
    if isinstance(tree, dict):
        return {k: slice_tree(v, t) for k, v in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(slice_tree(v, t) for v in tree)
    return tree[t]


def assert_close(got, want, rtol=1e-10, atol=1e-12):
    got, want = list(got), list(want)
    assert len(got) == len(want)
    for k, (a, b) in enumerate(zip(got, want)):
        if b is None:
            assert a is None or not a.abs().max() > 0, k
            continue
        assert a is not None, f"gradient {k} is None"
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=f"gradient {k}")


class Counter:
    """Wraps a step function and counts its calls with and without grad mode."""

    def __init__(self, fn):
        self.fn, self.plain, self.taped = fn, 0, 0

    def __call__(self, *args):
        if torch.is_grad_enabled():
            self.taped += 1
        else:
            self.plain += 1
        return self.fn(*args)


def allocation_peak(fn, net=False):
    """(result of fn(), peak torch-allocated CPU bytes during fn above those live at its start),
    from the profiler's allocation events; with ``net``, also the bytes still allocated at the
    end. Garbage left by earlier code is collected first: freed inside ``fn``'s window it would
    count against ``fn`` (a cycle from an earlier test freed there read as -1.9 MB)."""
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        if e.tag == _EventType.Allocation and str(e.extra_fields.device).startswith("cpu"):
            events.append((e.start_time_ns, e.extra_fields.alloc_size))
        stack.extend(e.children)
    live = peak = 0
    for _, size in sorted(events):
        live += size
        peak = max(peak, live)
    return (result, peak, live) if net else (result, peak)


def float64_default():
    """A fixture's body (``yield from``): float64 as torch's default dtype and seed 0 for the
    test, the previous default dtype restored after it."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    yield
    torch.set_default_dtype(old)
