"""Replaying a recorded forward (:mod:`.trace`): the executor's stepper for :mod:`.program`.

A plan's stage is a run of recorded aten ops. ``advance`` replays ops under ``no_grad``, freeing
each value after its last read; ``reverse`` replays its ops under autograd from detached leaves
of the values live before it (and detached aliases of the externals that require grad) and pulls
the cotangents of the values live after it back with one ``torch.autograd.grad``. Ops are called
as recorded (already decomposed and cast), so replays run with autocast off; random ops get the
generator state they had in the forward, and the caller's stream is restored afterwards.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterator

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..runtime.errors import NondeterministicStepError
from ..runtime.stats import ProgramStats
from .trace import Op, Trace, set_rng_state


def env_nbytes(env: dict) -> int:
    seen, total = set(), 0
    for t in env.values():
        s = t.untyped_storage()
        if s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            total += s.nbytes()
    return total


def fingerprint(t: torch.Tensor) -> tuple:
    with torch.no_grad():
        if t.numel() == 0:
            return (tuple(t.shape),)
        flat = t.detach().reshape(-1)
        if t.dtype.is_floating_point or t.dtype.is_complex:
            flat = flat.to(torch.complex128 if t.dtype.is_complex else torch.float64)
        else:
            flat = flat.to(torch.int64)
        return (tuple(t.shape), complex(flat.sum().item()), complex(flat[-1].item()))


class Replay:
    """The stepper of one backward: ops ``bounds[a]..bounds[b]-1`` for stages ``a..b-1``; the
    cotangents of values live at the adjoint's cut in ``ct``, of externals in ``ext_ct``."""

    def __init__(self, trace: Trace, bounds: list[int], wanted: set[int], stats: ProgramStats,
                 prints: list | None = None) -> None:
        self.tr, self.bounds, self.wanted, self.stats = trace, bounds, wanted, stats
        self.prints = prints
        self.ct: dict[int, torch.Tensor] = {}
        self.ext_ct: dict[int, torch.Tensor] = {}
        n = trace.n
        # the values to drop after each op: those it reads or makes for the last time
        self.dies: list[list[int]] = [[] for _ in range(n)]
        for v, u in enumerate(trace.last):
            if u < n:
                self.dies[u].append(v)
        # the values each op makes: its tensor results, then the arguments it writes into
        self.made = [op.outs + tuple(w for _, w in op.writes) for op in trace.ops]

    def run(self, op: Op, get: Callable[[int], torch.Tensor], k: int) -> list:
        flat = list(op.consts)
        for pos, v in op.slots:
            flat[pos] = get(v)
        for pos in op.copies:
            flat[pos] = flat[pos].detach().clone()
        args, kwargs = tree_unflatten(flat, op.spec)
        if op.rng is not None:
            set_rng_state(op.rng)
        out = op.func(*args, **kwargs)
        results = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        results += [flat[pos] for pos, _ in op.writes]
        if self.prints is not None:
            for v, r in zip(op.outs, results):
                if fingerprint(r) != self.prints[v]:
                    raise NondeterministicStepError(
                        f"verify=True: op {k} ({op.func}) gave another value when replayed "
                        f"than when the forward ran: the function reads state that changed "
                        f"since (a tensor written in place outside it?) or draws random "
                        f"numbers outside torch's generators; the gradient would be wrong")
        return results

    def _ext(self, v: int) -> torch.Tensor:
        return self.tr.externals[-1 - v]

    def advance(self, env: dict, start: int, stop: int) -> dict:
        t0 = time.perf_counter()
        tr, dies = self.tr, self.dies
        env = dict(env)
        ext = tr.externals
        get = lambda v: env[v] if v >= 0 else ext[-1 - v]  # noqa: E731
        a, b = self.bounds[start], self.bounds[stop]
        with torch.no_grad():
            for k in range(a, b):
                op = tr.ops[k]
                results = self.run(op, get, k)
                for v, r in zip(self.made[k], results):
                    env[v] = r
                for v in dies[k]:
                    env.pop(v, None)
        self.stats.plain_ops += b - a
        self.stats.plain_seconds += time.perf_counter() - t0
        return env

    def reverse(self, env: dict, start: int, stop: int) -> None:
        t0 = time.perf_counter()
        tr, ct = self.tr, self.ct
        a, b = self.bounds[start], self.bounds[stop]
        self.stats.taped_ops += b - a
        outs = list(dict.fromkeys(v for k in range(a, b) for v in self.made[k]
                                  if tr.last[v] >= b and v in ct))
        if not outs:
            return
        leaves: dict[int, torch.Tensor] = {}
        aliases: dict[int, torch.Tensor] = {}
        for v, t in env.items():
            if tr.diff[v] and tr.defined[v] < a:
                leaves[v] = t.detach().requires_grad_(True)
        for e in self.wanted:
            aliases[-1 - e] = tr.externals[e].detach().requires_grad_(True)
        local: dict[int, torch.Tensor] = {}

        def get(v: int) -> torch.Tensor:
            if v >= 0:
                t = local.get(v)
                if t is None:
                    t = leaves.get(v)
                    if t is None:
                        t = env[v]
                return t
            t = aliases.get(v)
            return self._ext(v) if t is None else t
        with torch.enable_grad():
            for k in range(a, b):
                op = tr.ops[k]
                results = self.run(op, get, k)
                for v, r in zip(self.made[k], results):
                    local[v] = r
        t1 = time.perf_counter()
        ys, gs = [], []
        for v in outs:
            y = local[v]
            g = ct.pop(v)
            if y.requires_grad:
                ys.append(y)
                gs.append(g)
        xs_ids = list(leaves) + list(aliases)
        xs = [leaves[v] if v >= 0 else aliases[v] for v in xs_ids]
        if ys and xs:
            grads = torch.autograd.grad(ys, xs, gs, allow_unused=True)
            for v, g in zip(xs_ids, grads):
                if g is None:
                    continue
                if v >= 0:
                    ct[v] = g if v not in ct else ct[v] + g
                else:
                    e = -1 - v
                    self.ext_ct[e] = g if e not in self.ext_ct else self.ext_ct[e] + g
        del local, leaves, aliases, ys, gs
        stats = self.stats
        stats.tape_seconds += t1 - t0
        stats.backward_seconds += time.perf_counter() - t1


@contextlib.contextmanager
def replaying(cuda_devices: list[int], rng: bool) -> Iterator[None]:
    """Autocast off (the recorded ops are already cast) and, if random ops were recorded, the
    caller's generator states restored on exit."""
    with contextlib.ExitStack() as stack:
        if rng:
            stack.enter_context(torch.random.fork_rng(devices=cuda_devices))
        stack.enter_context(torch.autocast("cpu", enabled=False))
        if torch.cuda.is_available():
            stack.enter_context(torch.autocast("cuda", enabled=False))
        yield
