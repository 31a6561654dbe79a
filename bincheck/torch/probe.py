"""Measuring one step of a torch loop: the sizes and times a byte budget is planned with.

One probe runs step 0 plain and taped (with its backward), twice each, keeping the faster, inside
``fork_rng`` so that the caller's random stream is untouched; on a CUDA device, also four of each
back to back between synchronisations, as a loop queues them (12 calls of ``fn`` in all). Bytes
come from the real tensors, never from an allocator's counters (which differ between CPU and CUDA
builds):

* ``state_bytes``: the storages a snapshot holds (a view counts its whole storage), plus the RNG
  state kept beside it (5056 bytes on CPU) with ``preserve_rng_state`` if step 0 draws random
  numbers (snapshots of a loop that draws none share one RNG state);
* ``tape_bytes``: the storages one step's graph saves for its backward (counted with a
  ``saved_tensors_hooks`` pack hook; the parameters' and inputs' own storages excluded), plus its
  input state, which a kept tape holds too; for a kept segment of several steps, without the
  state a step saves as its input where the step before saved it as its output (one tensor: a
  tanh cell's step then costs one state, not two; :func:`one_step_tape`);
* ``work_bytes``: what a reverse step holds beside the stored states: its tape, as much again for
  the gradients its backward computes, ``WORK_STATES`` states (live, adjoint, new adjoint, the
  output cotangent, state 0's copy), three RNG states (the one snapshots share, the one just
  read to compare with it, ``fork_rng``'s) and parameter-gradient buffers, two working sets:

  - one-step segments (states only, Revolve): the parameters' gradients once (each step's new
    gradient, before it is added into the accumulated one in place; measured at 0.60-0.77 of
    the prediction on tanh, LSTM and GRU cells with the profiler's allocation events);
  - taped segments of several steps (the mixed policy): twice, and the largest once more
    (torch's engine sums each weight's per-step gradients out of place before they reach the
    accumulated one: at the peak, each weight's running sum and new sum, and the new per-step
    gradient of the weight being processed, are alive; counting the parameters once left
    budgets 1.5 MiB short on an LSTM cell, twice up to 7 % short);
* with a disk tier, the time to write a state and read it back; with ``offload=True``, to copy it
  to pinned host memory and back.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..runtime.stats import LoopStats
from ..schedule.budget import Sizes
from ..tree import flatten
from .boundary import differentiable
from .offload import PIPELINED, tier_seconds
from .store import storage_bytes
from .steps import Outputs, Steps

WORK_STATES = 5


@dataclass(frozen=True)
class Measured:
    """One step's sizes for the two kinds of plan (see the module docstring)."""

    states_only: Sizes          # no kept tapes; one-step segments
    mixed: Sizes                # kept taped segments of several steps


def probe(call: Any, disk: Any = None) -> Measured:
    """Sizes and times of step 0 of ``call`` (its arguments, aliases and wanted inputs)."""
    src = call.steps
    stats = LoopStats()
    steps = Steps(src.fn, src.output_fn, src.args, stats, None, False, src.label)
    steps.aliases, steps.x_want = src.aliases, src.x_want
    state0 = call.state0
    owned: set = set()
    storage_bytes(src.args.p + src.args.x, owned)
    saved: list = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        # What the graph keeps: a detached alias (same storage and version counter). The tensor
        # itself would make a step's output that its backward saves (tanh) hold its own graph,
        # a cycle through torch's C++ that Python's collector cannot free: a leak of the
        # probed step's tape at every probe.
        return t.detach()

    plain, taped = [], []

    def sync() -> None:            # CUDA runs asynchronously: time the work, not its launch
        for device in call.ambient.devices:
            torch.cuda.synchronize(device)

    def plain_step() -> Any:
        with torch.no_grad():
            return steps.step(state0, 0)

    def taped_step(hooks: Any = contextlib.nullcontext) -> Any:
        """Step 0 taped (the forward inside ``hooks()``: only what the forward saves is tape),
        with its backward into the wanted inputs (their ``.grad`` cleared)."""
        with hooks():
            seg = steps.tape(state0, 0, 1, True)
            outs = [o for o in seg.outs if o.requires_grad]
            if src.output_fn is not None:
                steps.ys = Outputs()
                outs += [y for y in steps.taped_outputs(seg)[0] if y.requires_grad]
        ins = [a for a in steps.aliases if isinstance(a, torch.Tensor) and a.requires_grad]
        ins += [v for v in seg.ins if v.requires_grad]
        if outs and ins:
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs], inputs=ins,
                                    retain_graph=True)
        for a in ins:
            a.grad = None
        return seg

    def timed(run: Any, times: int) -> float:
        """Seconds per call of ``run()``, called ``times`` times between synchronisations."""
        sync()
        t0 = time.perf_counter()
        for _ in range(times):
            run()
        sync()
        return (time.perf_counter() - t0) / times

    with torch.random.fork_rng(devices=call.ambient.devices):
        # The first call of each kind runs cold (first dispatch, allocator, lazily built code),
        # the backward of the first taped one too: the faster of the two calls is the warm one,
        # never above it (a minimum, not a median: two calls of each are all the probe makes of
        # fn; tests/test_probe_warm.py)
        for _ in range(2):
            before = torch.get_rng_state()
            sync()
            t0 = time.perf_counter()
            state1 = plain_step()
            sync()
            t1 = time.perf_counter()
            draws = not torch.equal(before, torch.get_rng_state())
            saved.clear()
            seg = taped_step(lambda: torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t))
            sync()
            t2 = time.perf_counter()
            plain.append(t1 - t0)
            taped.append(t2 - t1)
        if call.ambient.devices:
            # In a loop, CUDA steps queue behind each other while Python launches the next:
            # a step alone, synchronised, costs its launch and its run one after the other
            # (on a small tanh cell on an H100: 0.246 ms, where a loop's plain step cost
            # 0.07-0.11 ms; benchmarks/torch/README.md, "On a GPU").
            plain.append(timed(plain_step, PIPELINED))
            taped.append(timed(taped_step, PIPELINED))
    leaves = flatten(state1)[0]
    # A snapshot holds its own RNG state only where the steps draw random numbers (see Rng.get)
    rng = call.rng.nbytes() if call.rng is not None else 0
    state_bytes = storage_bytes(leaves) + (rng if draws else 0)
    # What a kept segment holds a step beyond its tape: with output_fn, the cotangent it pulls
    # back into the step's state; for wanted inputs, the step's input slice's cotangent
    extra = sum(o.numel() * o.element_size() for o in seg.outs if differentiable(o)) \
        if src.output_fn is not None else 0
    extra += sum(src.args.x[k][0].numel() * src.args.x[k].element_size() for k in src.x_want)
    tape, chain = one_step_tape(saved, owned, flatten(state0)[0], seg.outs,
                                src.output_fn is not None, extra)
    saved.clear()        # torch may keep the pack hook (and the list it appends to) alive
    grads = [a.numel() * a.element_size() for a, w in zip(src.aliases, call.p_want)
             if w and differentiable(a)]
    # + the RNG state the snapshots share and the one being compared with it, and fork_rng's
    work = 2 * tape + extra + WORK_STATES * state_bytes + 3 * rng
    write_s, read_s = tier_seconds(disk, state1)
    # a kept segment of several steps: ``chain`` bytes a step, its input state once (work)
    mixed = Sizes(state_bytes, chain, work + state_bytes + 2 * sum(grads) + max(grads, default=0),
                  max(min(plain), 1e-9), max(min(taped), 1e-9), write_s, read_s)
    return Measured(replace(mixed, tape_bytes=None, work_bytes=work + sum(grads)), mixed)


def one_step_tape(saved: list, owned: set, ins: list, outs: list, keeps_states: bool = False,
                  extra: int = 0) -> tuple[int, int]:
    """Bytes one taped step holds alone (what it saves, and its input state), and what each step
    of a kept segment of several steps adds to it.

    In a segment each step's input state is the previous step's output. Where a step saves its
    output (a tanh cell saves its result for its backward; the next step saves the same tensor
    as its input), that state is held once, not twice: counted with the step that produced it.
    A state leaf costs each step only if the step saves its input and not its output, or, with
    ``keeps_states`` (``output_fn``: the segment keeps every step's state), if it saves neither.
    A state is counted at its output's storage (from step 1 on, an input is the previous step's
    output, which may be a view of a larger storage). ``extra`` is added per step (cotangents a
    segment holds per step: see :func:`probe`); the segment's first input (one state) is counted
    in the working set."""
    def saved_(t: Any) -> bool:
        return isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in saved_ptrs
    saved_ptrs = {t.untyped_storage().data_ptr() for t in saved}
    ins_ptrs = {t.untyped_storage().data_ptr() for t in ins if isinstance(t, torch.Tensor)}
    others = storage_bytes(saved, set(owned) | ins_ptrs)      # saved, without the input state
    alone = others + storage_bytes(outs)                       # + the input state (held)
    kept = [o for i, o in zip(ins, outs) if (saved_(i) and not saved_(o)) or
            (keeps_states and not saved_(i) and not saved_(o))]
    chain = others + storage_bytes(kept) + extra
    return alone, max(chain, 1)
