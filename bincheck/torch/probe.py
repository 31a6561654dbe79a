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
  - taped segments of several steps (the mixed policy): what torch's engine holds while it
    sums each weight's per-step gradients out of place (:func:`kept_gradient_bytes`: every
    running sum, and at an addition the new sum, the new per-step gradient and those waiting
    to be added; at most twice the parameters and the largest once more, which the probe
    counted before issue 29); and less of the states: not the segment's first input twice (it
    is the live state), nor step 0's output where it saves it (counted in its tape), nor, in
    RAM alone, state 0's copy (snapshot 0), nor, where no random numbers are drawn, the RNG
    state read to compare (two RNG states, not three). Metered with the profiler's allocation
    events on the benchmark's cells (T=1000, H=256, B=32) at 5-30 % of store-all's bytes: 2.9
    (tanh), 9 (LSTM) and 18 (GRU) states of the budget unused at the peak of a kept segment's
    backward, where 14, 56 and 46 were unused before at the peers' budgets;
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
from .store import Buffers, storage_bytes
from .steps import Outputs, Steps

WORK_STATES = 5


@dataclass(frozen=True)
class Measured:
    """One step's sizes for the two kinds of plan (see the module docstring)."""

    states_only: Sizes          # no kept tapes; one-step segments
    mixed: Sizes                # kept taped segments of several steps


def probe(call: Any, disk: Any = None) -> Measured:
    """Sizes and times of step 0 of ``call`` (its arguments, aliases and wanted inputs). The
    probed steps update copies of the module's buffers, never its own (BatchNorm's statistics
    are updated once per step of the loop, not by the probe); a snapshot also holds the buffers'
    values where a step changes them."""
    buffers = getattr(call, "buffers", None)
    if buffers is None:
        return _probe(call, disk)
    before = buffers.objects()
    try:
        buf0 = buffers.get()
        buffers.set(buf0)
        measured = _probe(call, disk)
        changed = buffers.get() is not buf0
    finally:
        buffers.install(before)
    if not changed:
        return measured
    extra = Buffers.nbytes(buf0)
    return Measured(*(replace(m, state_bytes=m.state_bytes + extra,
                              work_bytes=m.work_bytes + 2 * extra)
                      for m in (measured.states_only, measured.mixed)))


def _probe(call: Any, disk: Any = None) -> Measured:
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
    last: list = []                 # the last taped step's roots and inputs

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
        last[:] = outs, ins
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
    saved_ptrs = {t.untyped_storage().data_ptr() for t in saved}
    saved_outs = storage_bytes([o for o in seg.outs if isinstance(o, torch.Tensor) and
                                o.untyped_storage().data_ptr() in saved_ptrs])
    saved.clear()        # torch may keep the pack hook (and the list it appends to) alive
    params = [a for a, w in zip(src.aliases, call.p_want) if w and differentiable(a)]
    grads = [a.numel() * a.element_size() for a in params]
    # + the RNG state the snapshots share and the one being compared with it, and fork_rng's
    work = 2 * tape + extra + WORK_STATES * state_bytes + 3 * rng
    write_s, read_s = tier_seconds(disk, state1)
    # A kept segment of several steps: ``chain`` bytes a step (the schedule's) and the one-step
    # working set: ``tape`` (what a step saves, and a state: a lone step's input, here the
    # segment's last output), the live state (here the segment's first input: no longer
    # counted once more), ... Less what such a segment's backward does not hold (issue 29: at
    # the bytes reentrant checkpoint_sequential was metered at, the plan recomputed 981 steps
    # where it recomputed 961; benchmarks/torch/README.md):
    # - where step 0 saves its output, that output twice: saved, and as the last output;
    # - without a disk or host tier, state 0's copy: every RAM plan holds it as snapshot 0 (in
    #   the store's count) until it is the live state of the last Reverse (WORK_STATES' live);
    # - where the steps draw no random numbers, the RNG state read to compare with the shared
    #   one: a backward after such a forward reads none (Rng.still): two RNG states, not three;
    # - the parameters' gradient buffers as torch's engine holds them (kept_gradient_bytes),
    #   not their bound 2 * sum + max.
    mixed_work = work - saved_outs - (state_bytes if disk is None else 0) - \
        (0 if draws else rng) + kept_gradient_bytes(*(last or ([], [])), params)
    last.clear()
    mixed = Sizes(state_bytes, chain, mixed_work, max(min(plain), 1e-9), max(min(taped), 1e-9),
                  write_s, read_s)
    return Measured(replace(mixed, tape_bytes=None, work_bytes=work + sum(grads)), mixed)


def kept_gradient_bytes(outs: list, ins: list, params: list) -> int:
    """The most bytes the parameters' gradient buffers hold at once in the backward of a kept
    segment of several steps, from the order in which torch's engine runs one step's backward
    (one more backward through the probe's retained graph, its nodes' pre-hooks recording it).

    Over a segment, the engine sums each parameter's per-step gradients in the input buffer of
    the parameter's ``AccumulateGrad`` node: every parameter's running sum is alive throughout,
    and each addition makes a new sum beside the old one and the new per-step gradient (out of
    place: twice the parameter's bytes). A per-step gradient waits, alive, between the node
    that computes it and its addition where a pass-through node stands between them (``W.t()``
    in ``x @ W.t()``, as ``nn.Linear`` computes) and other nodes run before it: a step that
    transposes all its weights first, then multiplies, has every weight's gradient waiting at
    once. So: every running sum, plus the most, over the additions, of twice the parameter's
    bytes and the other gradients waiting then. From ``sum + 2 * max`` (each gradient added as
    it is computed: ``nn.RNNCell``, ``nn.LSTMCell``, ``nn.GRUCell``, ``h @ W``; metered: three
    times the parameters' bytes at the peak, the accumulated gradient included) to
    ``2 * sum + max`` (every one waiting), what the probe counted before it looked."""
    sizes = {id(a): a.numel() * a.element_size() for a in params}
    bound = 2 * sum(sizes.values()) + max(sizes.values(), default=0)
    roots = [o.grad_fn for o in outs if o.grad_fn is not None]
    if not sizes or not roots or not ins:
        return bound
    producers: dict = {}            # node -> the nodes that send it a gradient
    nodes, stack = {}, list(roots)
    while stack:
        node = stack.pop()
        if node in nodes:
            continue
        nodes[node] = None
        for nxt, _ in node.next_functions:
            if nxt is not None:
                producers.setdefault(nxt, []).append(node)
                stack.append(nxt)
    order: dict = {}                # node -> its place in the run, the bytes it was handed

    def recorder(node: Any) -> Any:
        def hook(grad_outputs: tuple) -> None:
            order[node] = (len(order), sum(g.numel() * g.element_size() for g in grad_outputs
                                           if isinstance(g, torch.Tensor)))
        return hook
    handles = [node.register_prehook(recorder(node)) for node in nodes]
    try:
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs], inputs=ins,
                                retain_graph=True)
    except RuntimeError:            # a backward that runs once only (a Function freeing its
        return bound                # saved state): keep the bound
    finally:
        for handle in handles:
            handle.remove()
        for v in ins:
            v.grad = None
    # Each addition: (its place, the parameter's bytes, from when its gradient waits)
    additions = []
    for node in nodes:
        nbytes = sizes.get(id(getattr(node, "variable", None)))
        if nbytes is None:
            continue
        for feeder in producers.get(node, ()):
            if feeder not in order:
                return bound                # a part of the run not seen: keep the bound
            at, handed = order[feeder]
            waits = at
            if handed >= nbytes:            # handed a gradient this big: it passes one on
                waits = max((order[p][0] for p in producers.get(feeder, ()) if p in order),
                            default=at)
            additions.append((at, nbytes, waits))
    if not additions:
        return bound
    peak = max(2 * nbytes + sum(other for k, (a2, other, w2) in enumerate(additions)
                                if k != i and w2 <= at < a2)
               for i, (at, nbytes, _) in enumerate(additions))
    return min(sum(sizes.values()) + peak, bound)


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
