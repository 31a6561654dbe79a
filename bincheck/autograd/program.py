"""``checkpoint_program``: optimal checkpointing of any autograd program, with no annotation.

``g = checkpoint_program(f, num_ckpts=20)`` (or ``memory="50MB"``) is differentiated as ``f`` is,
holding only a few snapshots. One gradient of ``g``:

1. **Record** (the primitive's forward): ``f`` runs once on boxes of a trace of its own
   (:mod:`.trace`), every primitive op written to a compact trace; Python control flow, side
   effects and random draws happen once, as in plain autograd. Its result is the call's result.
2. **Plan**: the trace is a chain of stages, one per op (or groups of ops, cut where few bytes
   are live: :mod:`bincheck.schedule.chain`), each priced by its recorded time and its result's
   bytes, each cut by its live set. ``num_ckpts``: Revolve's plan over the ops (``t(n, s)``
   plain op evaluations), or the weighted optimum on short traces; ``memory``: the cost-optimal
   plan within the bytes left after the trace.
3. **Replay** (the VJP): the plan's actions run through the usual :class:`~bincheck.runtime.
   Executor`. A snapshot at cut ``c`` is a dict of references to the values live there; an
   advance replays ops with their raw functions, freeing each value after its last use; a
   reverse replays its segment on boxes of autograd's reverse mode and pulls the cotangents
   back, last op first, with autograd's own node VJPs and accumulation
   (:func:`~bincheck.autograd.replay.pull_back`), so the arithmetic is plain autograd's.

A call whose trace has the last call's structure reuses its plan, its recording taking the
plan's first snapshots and taping its first reversed segment (:mod:`.expect`): the replay
starts by pulling back through that tape, and no op of the first sweep runs twice.

Under an outer derivative of the gradient (``grad`` of ``grad``, Hessian-vector products) or
forward mode, ``g`` runs ``f`` itself: exact, without checkpointing.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
from autograd.core import defvjp_argnums, vspace
from autograd.tracer import isbox, primitive

from ..runtime.disk import open_disk
from ..runtime.executor import Executor
from ..runtime.front import Configured
from ..runtime.stats import ProgramStats
from ..runtime.store import MemoryStore
from ..schedule.binomial import Plan
from ..schedule.budget import parse_bytes
from ..schedule.chain import Chain, ChainPlan, minimum_memory
from ..schedule.chain_dp import dp_stages
from ..schedule.grouped import GroupedRevolve
from ..schedule.validate import (NUM_CKPTS_RULE, check_bool, check_callable, check_disk,
                                 check_positive_int, exactly_one_budget)
from ..tree import flatten, unflatten
from ..schedule.actions import Reverse
from .boundary import (as_carried, carrier_of, expand_boxes, refuse_hidden_boxes,
                       reverse_traced)
from .expect import Capture, Captured, Expectation
from .kept import tape_bytes, vjp_peak
from .program_disk import disk_plan
from .probe import INTERPRETER_BYTES
from .replay import Recorded, Replay, env_nbytes
from .trace import Trace, boxable, record, value_nbytes

# What a taped op costs beside its plain evaluation and its result: autograd's box, node, VJP
# closure and the replay's bookkeeping (tracemalloc: ~2.2 kB an op beside a 768-byte result)
TAPED_OVERHEAD_S = 3e-5
TAPED_OVERHEAD_B = 2000
# What a snapshot, a value in it and the sweep itself hold beside the values' bytes: the
# snapshot's dict, the store's and tracker's entries (tracemalloc: about 0.7 kB a snapshot of
# one small array), an array's header and dict slot, and the sweep's executor, tracker,
# cotangent dict and their tables (about 50 kB on the nested loop of 460 ops)
SNAPSHOT_OVERHEAD_B = 1500
VALUE_OVERHEAD_B = 200
SWEEP_OVERHEAD_B = 64 * 1024
PLANNING_BYTES_PER_OP = 168     # planning's per-op arrays (times, sizes, live bytes) at once,
                                # and the recording's columns beside them (owners: 4 B): at 112
                                # a loop of 8000 float ops peaked at 1.15 of its least budget
GROUP_BYTES = 160               # grouping's arrays and bounds, per group (tracemalloc: ~100)
# The share of the budget (after the trace) the plan may predict, and the floor of the free
# lists' reserve: peaks reached 1.007-1.029 of budgets planned to the byte; with these, at most
# 0.857 of memory= (six programs x 10 budgets: results/budget-sweep.md), 0.97 on the T=1000 RNN
MODEL_SHARE = 0.9
FREE_LIST_B = 96 * 1024

# Above this many ops a ``num_ckpts`` plan is Revolve's over the ops: it needs no per-op times or
# bytes, so the recording drops them (the forward then holds the trace alone)
REVOLVE_ABOVE = 64


class ProgramCall:
    """One call of a checkpointed program: its trace, plan and stats, from its forward (the
    recording) to its VJP (the replay)."""

    def __init__(self, program: "CheckpointedProgram", rebuild: Callable,
                 wanted: set | None = None) -> None:
        # rebuild: leaves -> (args, kwargs); wanted: the boxed leaves
        self.program, self.rebuild, self.wanted = program, rebuild, wanted
        self.stats = ProgramStats()
        self.trace: Trace | None = None
        self.inputs: list = []
        self.plan: Any = None
        self.captured: dict | None = None    # cut -> the snapshot the recording took there
        self.tape: tuple | None = None       # (start, VJPs) of the segment the recording taped
        self.packed: list[int] = []          # value ids of the primitive's outputs

    def forward(self, leaves: tuple, learn: bool = True) -> tuple:
        """Record ``f`` (taking the expected plan's first snapshots, :mod:`.expect`) and plan;
        with ``learn``, what the next call may expect is this call's plan."""
        t0 = time.perf_counter()
        program, stats = self.program, self.stats
        self.inputs = list(leaves)
        expect = program.expected.get("last") if learn else None
        capture: list = []

        def started(tr: Trace) -> None:
            if expect is not None:
                capture.append(Capture(expect, tr))
                tr.watch = capture[0].made
                tr.taping = capture[0].taping
        tr, (ids, values, out_def) = record(
            lambda a, kw: program.f(*a, **kw), self.inputs, self.rebuild, program.verify,
            REVOLVE_ABOVE if program.memory is None else None, started, self.wanted)
        tr.watch = tr.taping = None
        t1 = time.perf_counter()
        self.trace, self.out = tr, (ids, values, out_def)
        stats.ops = stats.plain_ops = tr.n
        stats.record_seconds = t1 - t0
        stats.plain_seconds = t1 - t0
        self.captured = capture[0].finish() if capture else None
        if self.captured is not None:       # the last call's structure: its plan, captured,
            self.plan = expect.plan         # and its first reversed segment's VJPs, taped
            if capture[0].tape:
                self.tape = (expect.tape_from, capture[0].tape)
        else:
            self.plan = program.plan_for(tr, self.inputs)
            if learn:
                nxt = Expectation.of(tr, self.plan)
                if nxt is None:
                    program.expected.pop("last", None)
                else:
                    program.expected["last"] = nxt
        tr.release_plan_columns()
        stats.trace_bytes = tr.nbytes
        stats.stages = self.plan.stages
        stats.plan_seconds = time.perf_counter() - t1
        # every traced result leaf is an output, an integer array made from a traced float too
        # (autograd boxes it, pulling its cotangent back through ``astype``): a float carrier
        self.packed = [i for i in ids if i >= 0]
        stats.library_seconds += time.perf_counter() - t0
        return tuple(v if boxable(v) else carrier_of(v) for i, v in zip(ids, values) if i >= 0)

    def result(self, packed: Any) -> Any:
        """``f``'s result: the primitive's outputs in place of the recorded leaves."""
        ids, values, out_def = self.out
        it = iter(packed[i] for i in range(len(self.packed)))
        leaves = [v if i < 0 else next(it) if boxable(v) else as_carried(next(it), v)
                  for i, v in zip(ids, values)]
        return unflatten(out_def, leaves)

    def backward(self, argnums: tuple, g: Any) -> tuple:
        t0 = time.perf_counter()
        tr, stats = self.trace, self.stats
        if tr is None:
            raise RuntimeError("bincheck: this program call's backward already ran")
        replay = Replay(tr, self.inputs, stats, set(argnums))
        for o, c in zip(self.packed, g):
            replay.ct[o] = c if o not in replay.ct else vspace(c).add(replay.ct[o], c)
        disk = open_disk(self.program.disk) if self.plan.uses_disk else None
        store = MemoryStore(disk, size=env_nbytes)
        executor = Executor(tr.n, {}, store)
        actions = iter(self.plan.actions)   # a Plan or ChainPlan: re-iterable
        try:
            if self.captured is not None:   # the recording ran the first sweep
                first = executor.run(actions, Captured(self.captured), until=Reverse)
                self.captured = None
                tape, self.tape = self.tape, None
                executor.apply(first, replay if tape is None else Recorded(replay, *tape))
            executor.run(actions, replay)
        finally:                  # the call's files go, whatever ended the sweep
            if disk is not None:
                stats.add_disk(disk)
                disk.close()
        executor.tracker.finish()
        stats.snapshots = executor.tracker.peak_checkpoints
        stats.snapshot_bytes = store.peak_nbytes
        stats.peak_bytes = stats.trace_bytes + max(store.peak_nbytes, self.plan.peak_bytes)
        stats.library_seconds += time.perf_counter() - t0
        self.program.stats = stats
        ct, inputs = replay.ct, self.inputs
        return tuple(ct[a] if a in ct else vspace(inputs[a]).zeros() for a in argnums)


class ProgramPlan:
    """The actions a call replays, and what the planner predicted of them: ``peak_bytes``
    (in RAM), ``seconds``, ``plain_ops`` and ``taped_ops`` of the replay; ``uses_disk``, with
    ``disk_writes`` and ``disk_reads`` (snapshots), where it keeps snapshots on disk;
    ``tape_from``, where a later call's recording may start taping
    (``bincheck/autograd/expect.py``)."""

    def __init__(self, actions: tuple, stages: int, peak_bytes: int, seconds: float | None,
                 plain_ops: int | Callable[[], int], taped_ops: int) -> None:
        self.actions, self.stages, self.peak_bytes, self.seconds = actions, stages, \
            peak_bytes, seconds
        self._plain_ops, self.taped_ops = plain_ops, taped_ops
        self.uses_disk = getattr(actions, "uses_disk", False)
        self.disk_writes, self.disk_reads = (getattr(actions, a, 0) for a in ("disk_writes",
                                                                              "disk_reads"))

    @property
    def plain_ops(self) -> int:
        """Op evaluations without a tape in the replay (counted when first asked, where that
        streams the plan)."""
        if callable(self._plain_ops):
            self._plain_ops = self._plain_ops()
        return self._plain_ops


def _forward(*leaves: Any, call: ProgramCall) -> tuple:
    return call.forward(leaves)


program_primitive = primitive(_forward)
defvjp_argnums(program_primitive,
               lambda argnums, ans, args, kwargs: lambda g: kwargs["call"].backward(argnums, g))


class CheckpointedProgram(Configured):
    """``g(*args)``: ``f(*args)``, differentiated with few snapshots; see
    :func:`checkpoint_program`."""

    def __init__(self, f: Callable, num_ckpts: int | None, memory: int | None,
                 verify: bool, disk: Any = None) -> None:
        self.f, self.num_ckpts, self.memory = f, num_ckpts, memory
        self.verify, self.disk = verify, disk
        self.disk_costs: dict = {}        # measured (write, read) seconds per snapshot size
        self.expected: dict = {}          # "last": what the next call expects (:mod:`.expect`)
        self._freeze()
        self.stats = ProgramStats()

    def __repr__(self) -> str:
        name = getattr(self.f, "__name__", repr(self.f))
        budget = f"num_ckpts={self.num_ckpts}" if self.memory is None else \
            f"memory={self.memory}"
        disk = "" if self.disk is None else f", disk={self.disk!r}"
        return f"checkpoint_program({name}, {budget}{disk})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # keyword arguments are leaves as positional ones are (recorded anew each call)
        leaves, tree_def = flatten(expand_boxes((args, kwargs)))
        boxed = [v for v in leaves if isbox(v)]
        # not differentiated (or forward mode), or a derivative of the gradient: f itself
        if not any(reverse_traced(v) for v in boxed) or any(isbox(v._value) for v in boxed) or \
                len({v._trace for v in boxed}) > 1:
            return self.f(*args, **kwargs)
        refuse_hidden_boxes(leaves, "checkpoint_program's g was given", {boxed[0]._trace})
        call = ProgramCall(self, lambda ls: unflatten(tree_def, ls),
                           {i for i, v in enumerate(leaves) if isbox(v)})
        return call.result(program_primitive(*leaves, call=call))

    def plan_for(self, tr: Trace, self_inputs: list = ()) -> "ProgramPlan":
        """The plan of one recorded call (see the module docstring); ``self_inputs``: its
        argument leaves (their cotangents are part of the working set)."""
        n = tr.n
        if n == 0:
            return ProgramPlan((), 0, 0, None, 0, 0)
        if self.memory is None and n > REVOLVE_ABOVE:   # Revolve over the ops, streamed: no
            plan = Plan(n, self.num_ckpts)      # per-op arrays (they would grow with the trace)
            return ProgramPlan(plan, n, 0, None, plan.plain_steps, n)
        cuts = tr.cut_bytes(VALUE_OVERHEAD_B)
        seconds = np.frombuffer(tr.seconds, dtype=np.float64)
        out_bytes = np.frombuffer(tr.out_bytes, dtype=np.int64)
        # what a sweep holds beside its snapshots and the live values (the chain counts those):
        # the cotangents at the adjoint's cut (a live set), the inputs' cotangents (summed in
        # place), the sweep's own objects, and what a VJP makes at once: its temporaries and the
        # cotangents it pulls back, tanh's 3 times the op's largest array (an input's too: a std
        # along an axis of a 300x300 input held 1.28x memory=, priced by its result), or more
        sizes = [value_nbytes(v) for i, v in enumerate(self_inputs) if tr.dep[i]]  # wanted
        inputs, largest = sum(sizes), max(sizes, default=0)
        out_max = int(out_bytes.max())
        work = int(cuts.max()) + inputs + SWEEP_OVERHEAD_B + max(3 * max(out_max, largest),
            vjp_peak(tr, out_bytes, [value_nbytes(v) for v in self_inputs]))
        tape, back = tape_bytes(tr, out_bytes, TAPED_OVERHEAD_B)
        chain = Chain(seconds, 3.0 * seconds + TAPED_OVERHEAD_S, tape,
                      cuts + SNAPSHOT_OVERHEAD_B, work, back=back)
        # CPython's free lists keep what a call frees traced: the recording's template keys (and
        # the tuples that built their templates: twice their own) and a floor, beside the model;
        # after the sweep, its tapes' tuples too: INTERPRETER_BYTES in all, as the loops reserve
        reserve = min(INTERPRETER_BYTES, FREE_LIST_B + 2 * tr.freed_bytes)
        # after the sweep the caller's reverse pass sums the inputs' cotangents into a zero
        # container of its own: the inputs twice (2.34 MiB measured for inputs of 1.06 MiB)
        final = 2 * inputs + SWEEP_OVERHEAD_B + INTERPRETER_BYTES - reserve
        if self.memory is None:
            cp = ChainPlan(chain, num_ckpts=self.num_ckpts)
        else:
            trace_bytes = tr.nbytes
            planning = PLANNING_BYTES_PER_OP * n      # the per-op arrays planning builds
            big, tape = int(chain.cuts.max()), int(chain.tape.max())
            exact = inputs + largest       # arrays of known bytes: the model's share is not theirs
            # the margin: the model's error (MODEL_SHARE) or CPython's free lists (``reserve``);
            # the recording held its template keys and a live set beside its per-op columns (20 B)
            model = max(minimum_memory(chain), chain.work + 3 * big + tape, planning, final,
                        tr.keys_bytes + int(cuts.max()) + 20 * n)
            model -= exact
            need = exact + max(int(model / MODEL_SHARE), model + reserve) + \
                trace_bytes + 1
            if self.memory < need:
                raise ValueError(f"memory={self.memory} bytes is below the least this program "
                                 f"needs: its trace ({trace_bytes} bytes), its largest live set "
                                 f"and op taped alone, or planning's arrays, and CPython's free "
                                 f"lists, {need} bytes in all")
            room = self.memory - trace_bytes - exact
            free = exact + min(int(room * MODEL_SHARE), room - reserve)
            # the least predicted time of: Revolve over the ops (fits from the minimum up),
            # Revolve over many groups of ops (few recomputations where cuts are small), the
            # DP over a few dozen groups (it may keep taped segments)
            found = [self.revolve_within(chain, free)]      # one op taped at a time
            # its group arrays and bounds (about GROUP_BYTES a group) share the tables' room
            room = (free - planning) // 2 // GROUP_BYTES
            groups = GroupedRevolve.best(chain, free, largest=room) if room >= 64 else None
            if groups is not None:
                found.append(ProgramPlan(groups, groups.stages, groups.peak_bytes,
                                         groups.seconds, lambda: groups.plain_stages,
                                         groups.taped_stages))
            try:
                # planning holds the trace and the planner's tables: they share the budget
                cp = ChainPlan(chain, memory=free, table_budget=(free - planning) // 2,
                               max_stages=dp_stages(float(seconds.sum())))
            except ValueError:
                pass
            else:
                cp.release()
                found.append(ProgramPlan(cp, cp.stages, cp.peak_bytes, cp.seconds,
                                         cp.plain_stages, cp.taped_stages))
            best = min((p for p in found if p is not None), key=lambda p: p.seconds)
            on_disk = disk_plan(self, chain, free, best.seconds) if self.disk else None
            if on_disk is not None:
                best = ProgramPlan(on_disk, on_disk.stages, on_disk.peak_bytes, on_disk.seconds,
                                   on_disk.plain_stages, on_disk.taped_stages)
            best.peak_bytes = max(best.peak_bytes, final)   # a repeated call's recording tapes
            best.tape_from = Expectation.tape_fits(         # too, where that fits
                best.actions, chain, tr.keys_bytes + int(cuts.max()) + 20 * n, free)
            return best
        cp.release()
        return ProgramPlan(cp, cp.stages, cp.peak_bytes, cp.seconds, cp.plain_stages,
                           cp.taped_stages)

    @staticmethod
    def revolve_within(chain: Chain, free: int) -> ProgramPlan | None:
        """Revolve's plan over the ops with as many snapshots as ``free`` bytes hold at the
        largest live set (one op taped at a time from a live cut), or None if none fits."""
        n, big, tape = chain.n, int(chain.cuts.max()), int(chain.tape.max())
        room = free - chain.work - 2 * big - tape     # the live cut and the next one
        if room < 0:
            return None
        slots = min(n, 1 + room // big if big else n)
        plan = Plan(n, slots)
        mean_plain, mean_taped = chain.plain.mean(), chain.taped.mean()
        return ProgramPlan(plan, n, chain.work + (slots + 1) * big + tape,
                           plan.plain_steps * mean_plain + n * mean_taped, plan.plain_steps, n)

    def preview(self, *args: Any, **kwargs: Any) -> "ProgramPlan":
        """Record ``f(*args, **kwargs)`` once and return the plan a gradient with respect to
        every argument would use: ``peak_bytes`` and ``seconds`` predicted, ``plain_ops`` and
        ``taped_ops`` of the replay."""
        leaves, tree_def = flatten(expand_boxes((args, kwargs)))
        call = ProgramCall(self, lambda ls: unflatten(tree_def, ls))
        call.forward(tuple(leaves), learn=False)
        return call.plan


def checkpoint_program(f: Callable, num_ckpts: int | None = None, *,
                       memory: int | str | None = None, disk: bool | str | None = None,
                       verify: bool = False) -> CheckpointedProgram:
    """``g = checkpoint_program(f, num_ckpts=20)`` (or ``memory="50MB"``): ``g(*args, **kw)``
    returns ``f(*args, **kw)``, and ``grad``/``make_vjp``/``jacobian`` of ``g`` equal plain
    autograd's of ``f`` while holding at most ``num_ckpts`` snapshots (the empty one at the start included) of the
    values live at a cut, or within ``memory`` bytes, the recorded trace included. ``f`` is any
    function autograd can differentiate (arrays, floats, nested tuples/lists/dicts, Python
    control flow on values, closures over its arguments, ``@primitive``\\ s). Each call records
    ``f`` anew, so control flow may differ per call. ``g.stats`` (:class:`~bincheck.ProgramStats`)
    describes the last gradient; ``g.preview(*args)`` the plan for ``args``.

    ``disk=True`` (a private temporary directory) or ``disk="/some/dir"`` (a private
    subdirectory of it), with ``memory``, adds a disk tier: snapshots beyond the RAM budget go
    to ``.npy`` files, placed by Disk-Revolve over groups of the ops with the disk's measured
    write and read times, where that is predicted to be faster than RAM alone (else no file is
    written); the files and the directory are removed when the gradient ends, also after an
    error or KeyboardInterrupt.

    A value being differentiated that ``f`` reaches without receiving it (a closure over a
    traced weight) is refused with a ValueError: pass it as an argument. ``verify=True``
    compares every replayed op with the recorded run and raises
    :class:`~bincheck.NondeterministicStepError` if one differs (a captured array written in
    place between two uses). Under ``grad`` of ``grad`` or forward mode, ``g`` runs ``f``
    itself (exact, without checkpointing)."""
    check_callable("f", f, "f(*args) -> result")
    exactly_one_budget(num_ckpts, memory)
    disk = check_disk(disk, memory)
    if memory is not None:
        memory = parse_bytes(memory)
    else:
        num_ckpts = check_positive_int("num_ckpts", num_ckpts, NUM_CKPTS_RULE)
    return CheckpointedProgram(f, num_ckpts, memory, check_bool("verify", verify), disk)
