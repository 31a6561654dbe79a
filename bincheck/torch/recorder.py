"""Recording one forward as a :class:`~.trace.Trace`: the ``TorchDispatchMode`` that writes down
every aten op the user's function reaches, and the saved-tensor hook that replaces what autograd
saves by a handle (see :mod:`.trace` for what is recorded and why).
"""

from __future__ import annotations

import time
import weakref
from array import array
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .ops import (fingerprint, flatten_args, no_dispatch, op_facts, refuse_unrecordable,
                  rng_state, tensors_of, written_positions)
from .trace import Trace, storage_of


class Saved:
    """What autograd holds for a saved tensor: a recorded value's id (its tensor is fetched
    at unpack), or an external tensor itself."""

    __slots__ = ("v", "t")

    def __init__(self, v: int, t: torch.Tensor | None) -> None:
        self.v, self.t = v, t


class Plan0:
    """What the forward does for a plan it expects (the last call's, if this call records the
    same ops): the live sets it captures as snapshots, and from which op it keeps what autograd
    saves (the plan's first taped segment)."""

    __slots__ = ("capture", "keep_from", "ops", "capture_bytes", "keep_bytes")

    def __init__(self, capture: dict[int, tuple], keep_from: int | None, ops: int,
                 capture_bytes: dict[int, int], keep_bytes: int) -> None:
        self.capture, self.keep_from = capture, keep_from
        # what the expected trace holds there: its ops, each snapshot's bytes and the kept
        # segment's (a forward that holds more records another trace: it stops capturing)
        self.ops, self.keep_bytes = ops, keep_bytes
        self.capture_bytes = capture_bytes


class _Recorder(TorchDispatchMode):
    def __init__(self, trace: Trace, rng: bool, plan0: Plan0 | None, verify: bool) -> None:
        super().__init__()
        self.tr, self.rng = trace, rng
        self.capture = plan0.capture if plan0 is not None else {}
        self.keep_from = plan0.keep_from if plan0 is not None else None
        self.plan0 = plan0
        self.kept_groups: set[int] = set()
        self.kept_bytes = 0
        self.need: dict[int, int] = {}            # value -> last cut capturing it
        for c, vs in self.capture.items():
            for v in vs:
                self.need[v] = max(self.need.get(v, 0), c)
        # the values a capture will take, by weak reference: a strong one taken while a
        # factory op (``torch.arange``) returns makes torch hand the caller a detached alias, a
        # ``detach`` recorded as one more op (another trace than the expected one)
        self.hold: dict[int, weakref.ref] = {}
        self.captured: dict[int, dict] = {}
        self.kept: dict[int, torch.Tensor] = {}
        self.maybe: list[int] = []                # kept: the result of the op before the cut
        if verify:
            trace.prints = {}
        self.ids: dict[int, int] = {}             # id(tensor) -> value, while it lives
        self.refs: dict[int, weakref.ref] = {}
        self.ext: dict[int, int] = {}
        self.ptr_group: dict[int, int] = {}       # data_ptr -> group, for externals only
        self.ext_groups: set[int] = set()
        self.ext_versions: set[int] = set()      # values that are an external, written
        self.gptr = array("q")                    # per group: its storage's address

    def value_of(self, t: torch.Tensor) -> int:
        """The value id of ``t``: >= 0 a recorded value, < 0 external ``-1 - index``."""
        v = self.ids.get(id(t))
        if v is not None:
            return v
        e = self.ext.get(id(t))
        if e is None:
            refuse_unrecordable(t)
            tr = self.tr
            e = len(tr.externals)
            tr.externals.append(t)
            tr.ext_grad.append(t.requires_grad)
            tr.ext_last.append(tr.n)
            tr.ext_written.append(False)
            self.ext[id(t)] = e
            ptr, nb = storage_of(t)
            g = self.ptr_group.get(ptr) if ptr else None
            if g is None:
                g = len(tr.group_bytes)
                tr.push("group_bytes", 0)        # externals are the user's: no bytes here
                tr.saved.append(0)
                self.gptr.append(0)             # externals' storages may move (FSDP's do)
                if ptr:
                    self.ptr_group[ptr] = g
            tr.ext_group.append(g)
            self.ext_groups.add(g)
            tr.signature = hash((tr.signature, e, t.shape, t.dtype, t.device))
        return -1 - e

    def diverged(self) -> None:
        """This forward is not the expected plan's (it captured or kept more than that trace
        did, or runs longer): capture and keep nothing more, and drop what it holds (the call
        plans its own trace from the start). A forward that went on keeping would hold the
        planned segment's tape for other ops (a loop 1.7x its budget, before the backward let
        go of them)."""
        self.capture, self.need, self.keep_from, self.plan0 = {}, {}, None, None
        self.hold.clear()
        self.captured.clear()
        self.kept.clear()

    def _group(self, v: int) -> int:
        return self.tr.group[v] if v >= 0 else self.tr.ext_group[-1 - v]

    def new_value(self, t: torch.Tensor, k: int, group: int) -> int:
        tr = self.tr
        v = len(tr.defined)
        tr.defined.append(k)
        tr.last.append(k)
        tr.grad_bytes.append(0)
        tr.group.append(group)
        self.remember(t, v)
        return v

    def remember(self, t: torch.Tensor, v: int) -> None:
        """``t`` is value ``v`` until it dies (its id may then be another tensor's)."""
        i = id(t)
        self.ids[i] = v
        if i not in self.refs:
            self.refs[i] = weakref.ref(t, self._forget(i))

    def _forget(self, i: int) -> Callable:
        """The callback dropping id ``i`` once its tensor dies (it holds the dicts, not the
        recorder: no reference cycle)."""
        ids, refs = self.ids, self.refs

        def forget(_: weakref.ref) -> None:
            ids.pop(i, None)
            refs.pop(i, None)
        return forget

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tr = self.tr
        k = len(tr.tmpl)
        if k in self.capture:                     # a snapshot the expected plan keeps
            hold = self.hold
            got = {v: hold[v]() for v in self.capture[k] if v in hold}
            # the forward's own tensors (the call detaches them once the forward is over: see
            # ``ProgramCall.start``)
            self.captured[k] = got = {v: t for v, t in got.items() if t is not None}
            for v in [v for v in hold if self.need[v] <= k]:
                del hold[v]
            if len(got) != len(self.capture[k]) or \
                    tr.storage_bytes(got) > self.plan0.capture_bytes.get(k, 0):
                self.diverged()
        elif self.plan0 is not None and k >= self.plan0.ops:
            self.diverged()
        facts = op_facts(func)
        flat, spec = flatten_args(args, kwargs)
        consts = list(flat)
        positions: list[int] = []
        vals: list[int] = []
        ids, last, group, gptr = self.ids, tr.last, tr.group, self.gptr
        ptrs: dict[int, int] = {}           # the arguments' storages (now: one may have moved)
        grad_in = 0
        for pos, a in enumerate(flat):
            if isinstance(a, torch.Tensor):
                v = ids.get(id(a))
                if v is None:
                    v = self.value_of(a)
                    tr.ext_last[-1 - v] = k
                    g = tr.ext_group[-1 - v]
                else:
                    last[v] = k
                    g = group[v]
                ptr = a.untyped_storage().data_ptr()
                if v >= 0 and ptr != gptr[g] and ptr and gptr[g]:
                    raise NotImplementedError(
                        f"bincheck.torch: {func} reads a tensor the checkpointed function "
                        f"made whose storage was replaced outside torch's ops since "
                        f"(``t.data = ...``): a replay would read the old one; assign the new "
                        f"tensor to the name instead, or write with ``t.copy_``")
                if ptr and ptr not in ptrs:
                    ptrs[ptr] = g
                positions.append(pos)
                vals.append(v)
                consts[pos] = None
                if a.requires_grad:
                    nb = a.numel() * a.element_size()
                    grad_in += nb
                    if v >= 0:
                        tr.put("grad_bytes", v, nb)
        if self.maybe and k == self.keep_from:
            # saved by the op before the cut (not the segment's) unless this one reads it
            for v in self.maybe:
                if v not in vals:
                    self.kept.pop(v, None)
            self.maybe = []
        written = written_positions(func, flat, spec) if facts[2] or facts[3] else ()
        copies = []
        if written:
            by_pos = dict(zip(positions, vals))
            for pos in written:
                v = by_pos[pos]
                if v < 0:
                    e = -1 - v
                    t = tr.externals[e]
                    if ids.get(id(t)) is None and id(t) in self.ext:
                        # its first write: the trace keeps its value from before, for replays
                        with no_dispatch():
                            tr.externals[e] = t.detach().clone()
                        tr.ext_written[e] = True
                        tr.written.append((t, tr.externals[e]))
                        tr.copied_bytes += t.untyped_storage().nbytes()
                    copies.append(pos)
                elif group[v] in self.ext_groups and v not in self.ext_versions:
                    raise NotImplementedError(
                        f"bincheck.torch: {func} writes in place into a view of a tensor the "
                        f"checkpointed function did not create (a parameter, buffer or "
                        f"argument); write into the tensor itself, or out of place (modules "
                        f"that do this inside, such as InstanceNorm with track_running_stats="
                        f"True and Embedding with max_norm, belong outside the checkpointed "
                        f"function)")
        state = None
        if self.rng and facts[1]:
            # a caller's ``generator=``: its state (a replay draws from a copy of it); else
            # the default generator's of the op's device
            gen = next((i for i, a in enumerate(flat) if isinstance(a, torch.Generator)), None)
            if gen is not None:
                state = ("generator", gen, flat[gen].get_state())
            else:
                device = next((a.device for a in flat if isinstance(a, torch.Tensor)),
                              kwargs.get("device") or torch.device("cpu"))
                state = rng_state(torch.device(device))
            tr.rng_bytes += state[2].numel()
        if facts[5]:
            tr.grad_mode[k] = torch.is_grad_enabled()
        t0 = time.perf_counter()
        out = func._op(*args, **kwargs)
        tr.seconds.append(time.perf_counter() - t0)
        defined, grad_bytes, refs = tr.defined, tr.grad_bytes, self.refs
        tr.first.append(len(defined))
        outs, out_bytes = [], 0
        float_out = False
        made = tensors_of(out)
        for o in made:
            st = o.untyped_storage()
            ptr = st.data_ptr()
            g = ptrs.get(ptr) if ptr else None  # sharing an argument's storage: its group
            if g is None:
                nb = st.nbytes()
                g = len(tr.group_bytes)
                tr.push("group_bytes", nb)
                tr.saved.append(0)
                gptr.append(ptr)
                out_bytes += nb
            float_out = float_out or o.is_floating_point() or o.is_complex()
            v = len(defined)                # a new value (:meth:`new_value`, inlined)
            defined.append(k)
            last.append(k)
            grad_bytes.append(0)
            group.append(g)
            outs.append(v)
            i = id(o)
            ids[i] = v
            if i not in refs:
                refs[i] = weakref.ref(o, self._forget(i))
        # a backward makes its inputs' gradients, unless it has none (no result to
        # differentiate, grad mode off) or only views them (results aliasing an input)
        if not float_out or not torch.is_grad_enabled() or \
                (not written and out_bytes == 0 and outs):
            grad_in = 0
        tr.push("grad_in", grad_in)
        writes = []
        for pos in written:
            t = flat[pos]
            v = ids.get(id(t))
            if v is None or tr.defined[v] != k:       # not returned: a new value of its own
                g = self._group(by_pos[pos])
                v = self.new_value(t, k, g)
            writes.append((pos, v))
            tr.last_write[group[v]] = k
            if group[v] in self.ext_groups:
                self.ext_versions.add(v)
            else:
                gptr[group[v]] = t.untyped_storage().data_ptr()     # ``resize_`` may move it
        positions = tuple(positions)
        index, words = tr.template(func, spec, consts, positions)
        tr.tmpl.append(index)
        tr.start.append(len(tr.slot_ids))
        tr.slot_ids.extend(vals)
        if words:
            tr.slot_ids.extend(words)
        tr.nout.append(len(outs))
        # a written argument the op returns is already one of its results
        extra_writes = tuple(w for w in writes if w[1] not in outs) if writes else ()
        if extra_writes or copies or state is not None:
            tr.extra[k] = (extra_writes, tuple(copies), state)
        tr.push("out_bytes", out_bytes)
        if self.need or tr.prints is not None:
            held = made + [flat[pos] for pos, _ in writes]
            for v, t in zip(outs + [w for _, w in writes], held):
                if v in self.need:
                    self.hold[v] = weakref.ref(t)
                if tr.prints is not None:
                    tr.prints[v] = fingerprint(t)
        # the ops, their wiring and what they made (each external's at its first read): a call
        # with the same signature records the same values, live sets and writes, so the last
        # call's plan is this one's (dtypes and devices too: a float64 call's values are twice
        # a float32 call's bytes)
        tr.signature = hash((tr.signature, id(func), positions, tuple(vals),
                             tuple([(o.shape, o.dtype, o.device) for o in made])))
        return out

    def pack(self, t: torch.Tensor) -> Saved:
        v = self.ids.get(id(t))
        tr = self.tr
        if v is None:                             # an external (or a tensor never dispatched)
            return Saved(-1, t)
        # the op whose node saves it: the last one recorded for its own result, else the next
        # (an input is saved before its op reaches the dispatcher)
        n = len(tr.tmpl)
        k = n - 1 if tr.defined[v] == n - 1 else n
        tr.saver_v.append(v)
        tr.saver_ks.append(k)
        tr.saved[tr.group[v]] = 1               # a storage counts once, whichever version
        # the plan's first taped segment (ops from ``keep_from`` on) keeps what its nodes save:
        # those packed once the op before it ran (an input is packed before its op runs; after
        # that op, a result packed is its own op's or the next op's input: see ``maybe``)
        if self.keep_from is not None and n >= self.keep_from:
            if n == self.keep_from and k == n - 1:
                self.maybe.append(v)
            self.kept[v] = t
            g = tr.group[v]
            if g not in self.kept_groups:
                self.kept_groups.add(g)
                self.kept_bytes += tr.group_bytes[g]
                if self.kept_bytes > self.plan0.keep_bytes:
                    self.diverged()
        return Saved(v, None)


def record(fn: Callable, args: tuple, kwargs: dict, rng: bool, unpack: Callable,
           plan0: Plan0 | None = None, verify: bool = False) -> tuple:
    """Run ``fn(*args, **kwargs)`` once, recording it: ``(trace, result, value ids of the
    result's tensor leaves, recorder)`` (a result leaf the trace did not make is an external:
    id < 0). Autograd's saved tensors become :class:`Saved` handles that ``unpack`` resolves."""
    if torch.autograd.forward_ad._current_level >= 0:
        raise NotImplementedError(
            "bincheck.torch: forward-mode AD (torch.func.jvp, torch.autograd.forward_ad) is "
            "active; bincheck.torch checkpoints reverse-mode autograd: call the function "
            "plainly there")
    tr = Trace()
    rec = _Recorder(tr, rng, plan0, verify)
    try:
        with torch.autograd.graph.saved_tensors_hooks(rec.pack, unpack), rec:
            out = fn(*args, **kwargs)
    except NotImplementedError as err:
        if str(err).startswith("bincheck.torch"):   # refused by bincheck: as if not called
            tr.restore_written()
            tr.rewind_rng()
        raise
    from torch.utils._pytree import tree_flatten
    leaves = tree_flatten(out)[0]
    ids = []
    for o in leaves:
        if isinstance(o, torch.Tensor):
            v = rec.value_of(o)
            if v >= 0:
                tr.last[v] = tr.n
                if o.requires_grad:
                    tr.put("grad_bytes", v, o.numel() * o.element_size())
            else:
                tr.ext_last[-1 - v] = tr.n
            ids.append(v)
        else:
            ids.append(None)
    rec.hold.clear()
    tr.finish()
    tr.versions = [None if w else t._version for t, w in zip(tr.externals, tr.ext_written)]
    return tr, out, ids, rec
