"""Replaying a recorded forward (:mod:`.trace`): the executor's stepper for :mod:`.program`.

A plan's stage is a run of recorded aten ops. The backward is autograd's own, over the graph the
forward built; what the forward dropped are the tensors autograd saved, and a replay gives them
back. ``advance`` replays ops under ``no_grad`` (those whose results depend on grad mode,
``ops.GRAD_MODE_OPS``, in the mode they ran in, on detached inputs), freeing each value after
its last read;
``reverse`` replays a segment keeping the values its nodes saved, for the saved-tensor hook to
hand to autograd. Ops are called as recorded (already decomposed and cast), so replays run with
autocast off; random ops get the generator state they had in the forward, and the caller's
stream is restored afterwards.
"""

from __future__ import annotations

import contextlib
import time
from array import array
from typing import Callable, Iterator

import torch

from ..runtime.errors import NondeterministicStepError
from ..runtime.stats import ProgramStats
from .ops import fingerprint, set_rng_state, tensors_of, unflatten_args
from .trace import Trace


class Replay:
    """The stepper of one call's backward: ``advance`` replays stages ``start..stop-1`` (ops
    ``bounds[start]..bounds[stop]-1``) plainly; ``reverse`` replays them keeping, in
    ``materialized``, every value autograd saved for a node of theirs, which the saved-tensor
    hook then hands to the backward (:meth:`~.program.ProgramCall.fetch`)."""

    def __init__(self, trace: Trace, bounds: list[int], stats: ProgramStats) -> None:
        self.tr, self.bounds, self.stats = trace, bounds, stats
        self.materialized: dict[int, torch.Tensor] = {}
        self.simple: dict[int, bool] = {}      # per template: called with its flat arguments
        # per value: how many nodes saving it have not yet taken it (set by the program; a
        # replay keeps no value every saver already has)
        self.uses: array | None = None
        n = trace.n
        # the values to drop after each op (those it reads or makes for the last time), by op
        last = trace.last
        count = array("i", [0]) * (n + 1)
        for u in last:
            if u < n:
                count[u + 1] += 1
        for k in range(n):
            count[k + 1] += count[k]
        self.dies_start, fill = count, array("i", count)
        self.dies = array("i", [0]) * count[n]
        for v, u in enumerate(last):
            if u < n:
                self.dies[fill[u]] = v
                fill[u] += 1

    def env_bytes(self, env: dict) -> int:
        """A snapshot's bytes as the model counts them (:meth:`~.trace.Trace.storage_bytes`)."""
        return self.tr.storage_bytes(env)

    def run(self, k: int, env: dict) -> list:
        """Op ``k`` on the values of ``env`` (and the externals): its results, then the
        arguments it wrote into and did not return."""
        tr = self.tr
        t = tr.tmpl[k]
        func, spec, consts, positions, open_ = tr.templates[t]
        flat = list(consts)
        ids, ext = tr.slot_ids, tr.externals
        j = tr.start[k]
        for pos in positions:
            v = ids[j]
            flat[pos] = env[v] if v >= 0 else ext[-1 - v]
            j += 1
        for pos in open_:
            flat[pos] = ids[j]
            j += 1
        extra = tr.extra.get(k)
        if extra is not None:
            writes, copies, rng = extra
            for pos in copies:
                flat[pos] = flat[pos].detach().clone()
            if rng is not None and rng[0] == "generator":   # the caller's stays as it is
                copy = torch.Generator(device=flat[rng[1]].device)
                copy.set_state(rng[2])
                flat[rng[1]] = copy
            elif rng is not None:
                set_rng_state(rng)
        simple = self.simple.get(t)
        if simple is None:          # positional leaves only: the flat list is the arguments
            simple = self.simple[t] = not spec[1] and all(x is None for x in spec[2])
        if tr.grad_mode and tr.grad_mode.get(k):
            # as in the forward, building no graph (no input needs one)
            flat = [a.detach() if isinstance(a, torch.Tensor) else a for a in flat]
            with torch.enable_grad():
                args, kwargs = unflatten_args(flat, spec)
                out = func._op(*args, **kwargs)
        elif simple:
            out = func._op(*flat)
        else:
            args, kwargs = unflatten_args(flat, spec)
            out = func._op(*args, **kwargs)
        results = [out] if type(out) is torch.Tensor else tensors_of(out)
        if extra is not None:
            results += [flat[pos] for pos, _ in extra[0]]
        if len(results) != tr.nout[k] + (len(extra[0]) if extra is not None else 0):
            raise NondeterministicStepError(
                f"op {k} ({func}) gave {len(results)} tensors when replayed, another number "
                f"than when the forward ran: it cannot be replayed (please report it)")
        prints = tr.prints
        if prints is not None:
            for v, r in zip(tr.made(k), results):
                if fingerprint(r) != prints[v]:
                    raise NondeterministicStepError(
                        f"verify=True: op {k} ({func}) gave another value when replayed "
                        f"than when the forward ran: the function reads state that changed "
                        f"since (a tensor written in place outside it?) or draws random "
                        f"numbers outside torch's generators; the gradient would be wrong")
        return results

    def _replay(self, env: dict, a: int, b: int, keep: Callable[[int], bool] | None) -> dict:
        tr, dies, dies_start = self.tr, self.dies, self.dies_start
        first, nout, extra = tr.first, tr.nout, tr.extra
        kept: dict[int, torch.Tensor] = {}
        if keep is not None:
            kept = {v: t for v, t in env.items() if keep(v)}
        run = self.run
        with torch.no_grad():
            for k in range(a, b):
                results = run(k, env)
                if k in extra:
                    made = tr.made(k)
                else:
                    f = first[k]
                    made = range(f, f + nout[k])
                for v, r in zip(made, results):
                    env[v] = r
                    if keep is not None and keep(v):
                        kept[v] = r
                for j in range(dies_start[k], dies_start[k + 1]):
                    env.pop(dies[j], None)
        return kept

    def advance(self, env: dict, start: int, stop: int) -> dict:
        t0 = time.perf_counter()
        a, b = self.bounds[start], self.bounds[stop]
        env = dict(env)
        self._replay(env, a, b, None)
        self.stats.plain_ops += b - a
        self.stats.plain_seconds += time.perf_counter() - t0
        return env

    def reverse(self, env: dict, start: int, stop: int) -> None:
        t0 = time.perf_counter()
        a, b = self.bounds[start], self.bounds[stop]
        self.materialized = {}                  # the previous segment's values: consumed
        savers, uses = self.tr.savers, self.uses

        def keep(v: int) -> bool:
            # a value every saver already took stays unkept: the ReLU output a pooling node
            # and the in-place ReLU both took from the replay of the segment after it was held
            # again, 2 MiB, through ResNet's stem BatchNorm's backward
            return (uses is None or uses[v] > 0) and any(a - 1 <= k < b for k in savers(v))
        self.materialized = self._replay(dict(env), a, b, keep)
        self.stats.taped_ops += b - a
        self.stats.tape_seconds += time.perf_counter() - t0

    def regenerate(self, v: int) -> torch.Tensor:
        """Value ``v`` replayed from the start (a saved tensor asked for out of the plan's
        order: a second backward, or a graph walked in an order the plan did not expect)."""
        d = self.tr.defined[v]
        env: dict = {}
        kept = self._replay(env, 0, d + 1, lambda u: u == v)
        self.stats.plain_ops += d + 1
        return kept[v]


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
