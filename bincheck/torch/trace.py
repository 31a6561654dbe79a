"""Recording one forward of any PyTorch code as a trace of aten ops, for :mod:`.program`.

The user's function runs once, as it would without bincheck (grad mode, modules, Python control
flow, hooks), under a ``TorchDispatchMode`` that writes down every aten op it reaches (below
autograd and autocast: the ops already decomposed and cast) and a saved-tensor hook that drops
what autograd would save (the graph of the recording is thrown away; only the bytes it would
have held are counted, as each op's tape). Each tensor an op makes is a *value* (an id); a tensor
the trace did not make (an argument, a parameter, a buffer, a closed-over tensor) is an
*external*, held by reference. Replaying an op is calling its ``OpOverload`` on the values of its
arguments (:mod:`.replay`).

What the trace records beside the ops, so that a replay is the recorded run:

* **Random ops** (``torch.Tag.nondeterministic_seeded``): the generator's state before each; a
  replay sets it back before running the op, so a dropout mask is the forward's.
* **Writes.** An op that writes into a tensor (``relu_``, ``add_``, BatchNorm's running
  statistics) makes a new value of it. An external written in place (``num_batches_tracked``)
  is copied once, before its first write, and replays write into copies of the copy: a
  module's buffers are updated once per forward, by the forward. A cut is never placed where a
  value live across it is written after it (a snapshot would be written into by its replay):
  ``Trace.cuttable``.
* **Aliases.** Values that share storage (views) form a group: a live set's bytes count each
  storage once, and a write to one member counts as a write to the group.
"""

from __future__ import annotations

import sys
import time
import weakref
from typing import Callable

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .ops import (fingerprint, flatten_args, no_dispatch, rng_state, tensors_of,
                  written_positions)

# what an op costs in the trace beside its constants (the Op object, its tuples, list slots;
# sys.getsizeof of a recorded conv op's parts: about 0.5 kB)
OP_OVERHEAD_B = 480


class Op:
    """One recorded aten op: ``func`` on ``consts`` (the flattened ``(args, kwargs)`` with the
    tensors left out) with ``slots`` ``(position, value id)`` filled in; its tensor results are
    the values ``outs``; ``writes`` ``(position, value id)`` the arguments it writes into (a new
    value each); ``copies`` the positions a replay copies before the op (externals it writes);
    ``rng`` the generator states to set before it."""

    __slots__ = ("func", "spec", "consts", "slots", "outs", "writes", "copies", "rng")

    def __init__(self, func, spec, consts, slots, outs, writes, copies, rng) -> None:
        self.func, self.spec, self.consts, self.slots = func, spec, consts, slots
        self.outs, self.writes, self.copies, self.rng = outs, writes, copies, rng


def _storage(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


class Trace:
    """The ops of one forward, their values' sizes, liveness and groups, and the externals."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.externals: list[torch.Tensor] = []
        self.seconds: list[float] = []
        self.out_bytes: list[int] = []
        self.grad_in: list[int] = []          # per op: bytes of the gradients its backward makes
        self.grad_bytes: list[int] = []       # per value: its gradient's bytes (0: none)
        self.ext_last: list[int] = []         # per external: the last op reading it
        self.saved_groups: set[int] = set()   # storage groups autograd saved
        self.defined: list[int] = []          # per value: the op that made it
        self.last: list[int] = []             # per value: the last op that reads it (n: output)
        self.group: list[int] = []            # per value: its storage group
        self.group_bytes: list[int] = []
        self.last_write: dict[int, int] = {}  # group -> last op writing into it
        self.ext_group: list[int] = []
        self.ext_grad: list[bool] = []         # per external: did it require grad
        self.ext_written: list[bool] = []
        self.written: list = []               # (external, its value before the first write)
        self.savers: dict[int, list[int]] = {}   # value -> ops whose nodes saved it
        self.versions: list = []              # per external read as is: its version after
        self.prints: dict[int, tuple] | None = None
        self.rng_bytes = 0
        self.copied_bytes = 0
        self.signature = 0

    @property
    def n(self) -> int:
        return len(self.ops)

    @property
    def nbytes(self) -> int:
        """What the trace holds beyond the user's tensors: its ops and per-value columns, the
        generator states of random ops and the copies of externals written in place."""
        consts = sum(sys.getsizeof(c) for op in self.ops for c in op.consts
                     if not isinstance(c, (int, float, bool, type(None))))
        return self.n * (OP_OVERHEAD_B + 8) + 48 * len(self.defined) + consts + \
            self.rng_bytes + self.copied_bytes

    def check_versions(self) -> None:
        """Raise if a tensor the forward read (and did not write) was written in place since:
        replays and autograd's formulas would read its new value (plain autograd raises too)."""
        for t, v in zip(self.externals, self.versions):
            if v is not None and t._version != v:
                raise RuntimeError(
                    f"bincheck.torch: a tensor the checkpointed forward read (shape "
                    f"{tuple(t.shape)}, {t.dtype}) was modified by an in-place operation after "
                    f"the forward (version {v}, now {t._version}); its gradient would be wrong. "
                    f"Run the forward again after the change")

    def restore_written(self) -> None:
        """Put back the values the externals written in place had before the recording."""
        with torch.no_grad():
            for t, before in self.written:
                t.copy_(before)

    def cuttable(self) -> np.ndarray:
        """``ok[c]`` for cuts ``0..n``: no value live across cut ``c`` is written (through any
        alias) by an op at or after ``c``."""
        n = self.n
        bad = np.zeros(n + 2, dtype=np.int64)
        lw = self.last_write
        for v, g in enumerate(self.group):
            w = lw.get(g)
            if w is None:
                continue
            lo, hi = self.defined[v] + 1, min(self.last[v], w)
            if lo <= hi:
                bad[lo] += 1
                bad[hi + 1] -= 1
        ok = np.cumsum(bad)[:n + 1] == 0
        ok[0] = ok[n] = True
        return ok

    def live_sets(self) -> Callable[[int], tuple]:
        """``live(c)``: the values defined before cut ``c`` and read after it."""
        defined = np.asarray(self.defined)
        last = np.asarray(self.last)
        return lambda c: tuple(int(v) for v in np.flatnonzero((defined < c) & (last >= c)))


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

    __slots__ = ("capture", "keep_from")

    def __init__(self, capture: dict[int, tuple], keep_from: int | None) -> None:
        self.capture, self.keep_from = capture, keep_from


class _Recorder(TorchDispatchMode):
    def __init__(self, trace: Trace, rng: bool, plan0: Plan0 | None, verify: bool) -> None:
        super().__init__()
        self.tr, self.rng = trace, rng
        self.capture = plan0.capture if plan0 is not None else {}
        self.keep_from = plan0.keep_from if plan0 is not None else None
        self.need: dict[int, int] = {}            # value -> last cut capturing it
        for c, vs in self.capture.items():
            for v in vs:
                self.need[v] = max(self.need.get(v, 0), c)
        self.hold: dict[int, torch.Tensor] = {}
        self.captured: dict[int, dict] = {}
        self.kept: dict[int, torch.Tensor] = {}
        if verify:
            trace.prints = {}
        self.ids: dict[int, int] = {}             # id(tensor) -> value, while it lives
        self.refs: dict[int, weakref.ref] = {}
        self.ext: dict[int, int] = {}
        self.ptr_group: dict[int, int] = {}       # data_ptr -> group, for externals only
        self.ext_groups: set[int] = set()
        self.ext_versions: set[int] = set()      # values that are an external, written

    def value_of(self, t: torch.Tensor) -> int:
        """The value id of ``t``: >= 0 a recorded value, < 0 external ``-1 - index``."""
        v = self.ids.get(id(t))
        if v is not None:
            return v
        e = self.ext.get(id(t))
        if e is None:
            tr = self.tr
            e = len(tr.externals)
            tr.externals.append(t)
            tr.ext_grad.append(t.requires_grad)
            tr.ext_last.append(tr.n)
            tr.ext_written.append(False)
            self.ext[id(t)] = e
            ptr, nb = _storage(t)
            g = self.ptr_group.get(ptr) if ptr else None
            if g is None:
                g = len(tr.group_bytes)
                tr.group_bytes.append(0)          # externals are the user's: no bytes here
                if ptr:
                    self.ptr_group[ptr] = g
            tr.ext_group.append(g)
            self.ext_groups.add(g)
        return -1 - e

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
            ids, refs = self.ids, self.refs

            def forget(_: weakref.ref, i: int = i) -> None:
                ids.pop(i, None)
                refs.pop(i, None)
            self.refs[i] = weakref.ref(t, forget)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tr = self.tr
        k = tr.n
        if k in self.capture:                     # a snapshot the expected plan keeps
            hold = self.hold
            self.captured[k] = {v: hold[v] for v in self.capture[k] if v in hold}
            for v in [v for v in hold if self.need[v] <= k]:
                del hold[v]
        flat, spec = flatten_args(args, kwargs)
        slots, consts = [], list(flat)
        ptrs: dict[int, int] = {}
        grad_in = 0
        for pos, a in enumerate(flat):
            if isinstance(a, torch.Tensor):
                v = self.value_of(a)
                slots.append((pos, v))
                consts[pos] = None
                if v >= 0:
                    tr.last[v] = k
                else:
                    tr.ext_last[-1 - v] = k
                if a.requires_grad:
                    nb = a.numel() * a.element_size()
                    grad_in += nb
                    if v >= 0:
                        tr.grad_bytes[v] = nb
                ptr = a.untyped_storage().data_ptr()
                if ptr:
                    ptrs.setdefault(ptr, self._group(v))
        written = written_positions(func, flat, spec)
        copies = []
        for pos in written:
            v = dict(slots)[pos]
            if v < 0:
                e = -1 - v
                t = tr.externals[e]
                if self.ids.get(id(t)) is None and id(t) in self.ext:
                    # its first write: the trace keeps its value from before, for replays
                    with no_dispatch():
                        tr.externals[e] = t.detach().clone()
                    tr.ext_written[e] = True
                    tr.written.append((t, tr.externals[e]))
                    tr.copied_bytes += t.untyped_storage().nbytes()
                copies.append(pos)
            elif tr.group[v] in self.ext_groups and v not in self.ext_versions:
                raise NotImplementedError(
                    f"bincheck.torch: {func} writes in place into a view of a tensor the "
                    f"checkpointed function did not create (a parameter, buffer or argument); "
                    f"write into the tensor itself, or out of place")
        state = None
        if self.rng and torch.Tag.nondeterministic_seeded in func.tags:
            device = next((a.device for a in flat if isinstance(a, torch.Tensor)),
                          kwargs.get("device") or torch.device("cpu"))
            state = rng_state(torch.device(device))
            tr.rng_bytes += state[2].numel()
        t0 = time.perf_counter()
        out = func(*args, **kwargs)
        tr.seconds.append(time.perf_counter() - t0)
        outs, out_bytes = [], 0
        float_out = False
        for o in tensors_of(out):
            ptr, nb = _storage(o)
            g = ptrs.get(ptr) if ptr else None
            if g is None:
                g = len(tr.group_bytes)
                tr.group_bytes.append(nb)
                out_bytes += nb
            float_out = float_out or o.is_floating_point() or o.is_complex()
            outs.append(self.new_value(o, k, g))
        # a backward makes its inputs' gradients, unless it has none (no result to
        # differentiate, grad mode off) or only views them (results aliasing an input)
        if not float_out or not torch.is_grad_enabled() or \
                (not written and out_bytes == 0 and outs):
            grad_in = 0
        tr.grad_in.append(grad_in)
        writes = []
        for pos in written:
            t = flat[pos]
            v = self.ids.get(id(t))
            if v is None or tr.defined[v] != k:       # not returned: a new value of its own
                g = self._group(dict(slots)[pos])
                v = self.new_value(t, k, g)
            writes.append((pos, v))
            tr.last_write[tr.group[v]] = k
            if tr.group[v] in self.ext_groups:
                self.ext_versions.add(v)
        tr.ops.append(Op(func, spec, consts, tuple(slots), tuple(outs), tuple(writes),
                         tuple(copies), state))
        tr.out_bytes.append(out_bytes)
        if self.need or tr.prints is not None:
            made = tensors_of(out)
            made += [flat[pos] for pos, _ in writes]
            for v, t in zip(outs + [w for _, w in writes], made):
                if v in self.need:
                    self.hold[v] = t
                if tr.prints is not None:
                    tr.prints[v] = fingerprint(t)
        # the ops, their shapes and their wiring: a call with the same signature records the
        # same values, live sets and writes, so the last call's plan is this one's
        tr.signature = hash((tr.signature, func, tuple(slots), tuple(
            tuple(flat[p].shape) for p, _ in slots)))
        return out

    def pack(self, t: torch.Tensor) -> Saved:
        v = self.ids.get(id(t))
        tr = self.tr
        if v is None:                             # an external (or a tensor never dispatched)
            return Saved(-1, t)
        # the op whose node saves it: the last one recorded for its own result, else the next
        # (an input is saved before its op reaches the dispatcher)
        k = tr.n - 1 if tr.defined[v] == tr.n - 1 else tr.n
        tr.savers.setdefault(v, []).append(k)
        tr.saved_groups.add(tr.group[v])        # a storage counts once, whichever version
        if self.keep_from is not None and k >= self.keep_from - 1:
            self.kept[v] = t
        return Saved(v, None)


def record(fn: Callable, args: tuple, kwargs: dict, rng: bool, unpack: Callable,
           plan0: Plan0 | None = None, verify: bool = False) -> tuple:
    """Run ``fn(*args, **kwargs)`` once, recording it: ``(trace, result, value ids of the
    result's tensor leaves, recorder)`` (a result leaf the trace did not make is an external:
    id < 0). Autograd's saved tensors become :class:`Saved` handles that ``unpack`` resolves."""
    tr = Trace()
    rec = _Recorder(tr, rng, plan0, verify)
    with torch.autograd.graph.saved_tensors_hooks(rec.pack, unpack), rec:
        out = fn(*args, **kwargs)
    from torch.utils._pytree import tree_flatten
    leaves = tree_flatten(out)[0]
    ids = []
    for o in leaves:
        if isinstance(o, torch.Tensor):
            v = rec.value_of(o)
            if v >= 0:
                tr.last[v] = tr.n
                if o.requires_grad:
                    tr.grad_bytes[v] = o.numel() * o.element_size()
            else:
                tr.ext_last[-1 - v] = tr.n
            ids.append(v)
        else:
            ids.append(None)
    rec.hold.clear()
    tr.versions = [None if w else t._version for t, w in zip(tr.externals, tr.ext_written)]
    return tr, out, ids, rec
