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
from array import array
from typing import Any, Callable

import numpy as np
import torch

from .ops import set_rng_state

_SCALARS = (bool, int, float, complex, str, type(None))
_FAST_TYPES = frozenset((bool, int, str, type(None), torch.dtype, torch.device, torch.layout,
                         torch.memory_format))
OPEN_AFTER = 4          # templates differing only in integers before those are left open


def _const_key(c: Any) -> Any:
    """What identifies a constant argument in a template: scalars, dtypes, devices, layouts and
    memory formats by type and value (a float by its repr too: ``-0.0`` is not ``0.0``), lists
    and tuples of them likewise, anything else by identity."""
    t = type(c)
    if t in _SCALARS or isinstance(c, (torch.dtype, torch.device, torch.layout,
                                       torch.memory_format)):
        return (t, c, repr(c)) if t is float else (t, c)
    if t is list or isinstance(c, tuple):          # torch.Size too
        return (t, tuple(_const_key(x) for x in c))
    return (id(c),)


def storage_of(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


class Trace:
    """The ops of one forward, their values' sizes, liveness and groups, and the externals.

    Compact, as autograd's own trace (:mod:`bincheck.autograd.trace`): an op is its *template*
    (the aten op, its argument spec, its constant arguments, the positions of its tensors;
    repeated code shares one) and, in typed arrays, its template's index, its tensor arguments'
    value ids (from ``start[k]``) followed by the integers its template leaves open (``xs[t]``'s
    index: one template for every ``t``), the first value it makes and how many results it has. Values
    are numbered in the order ops make them: op ``k`` makes ``first[k] .. first[k + 1] - 1``,
    its results first, then a value for each argument it writes into that it did not return.
    The rare ops that write into an argument they do not return (an op returning what it writes,
    ``add_``, ``relu_``, needs no entry: its result is the new value), copy externals or draw
    random numbers keep those in ``extra``.
    Per value: the op that made it, its last reader, its storage group, the ops whose nodes
    saved it (``saver_ks[saver_start[v]:saver_start[v + 1]]`` once :meth:`finish` ran)."""

    def __init__(self) -> None:
        # (func, spec, consts, tensor positions, positions of the integers left open)
        self.templates: list[tuple] = []
        self._tkeys: dict = {}
        self._open: dict = {}
        self._fast: dict = {}
        self.tmpl, self.start, self.slot_ids = array("i"), array("i"), array("i")
        self.first, self.nout = array("i"), array("i")
        self.extra: dict[int, tuple] = {}     # op -> (writes, copies, rng state or None)
        self.grad_mode: dict[int, bool] = {}  # op of ops.GRAD_MODE_OPS -> grad mode it ran in
        self.externals: list[torch.Tensor] = []
        # sizes in 4-byte words while they fit (:meth:`widen` makes a column 8-byte words once
        # one does not); times in single precision (a planner's estimate)
        self.seconds = array("f")
        self.out_bytes = array("i")
        self.grad_in = array("i")             # per op: bytes of the gradients its backward makes
        self.grad_bytes = array("i")          # per value: its gradient's bytes (0: none)
        self.ext_last: list[int] = []         # per external: the last op reading it
        self.saved = bytearray()              # per storage group: did autograd save it
        self.defined = array("i")             # per value: the op that made it
        self.last = array("i")                # per value: the last op that reads it (n: output)
        self.group = array("i")               # per value: its storage group
        self.group_bytes = array("i")
        self.last_write: dict[int, int] = {}  # group -> last op writing into it
        self.ext_group: list[int] = []
        self.ext_grad: list[bool] = []         # per external: did it require grad
        self.ext_written: list[bool] = []
        self.written: list = []               # (external, its value before the first write)
        self.saver_v, self.saver_ks = array("i"), array("i")   # (value, op whose node saved it)
        self.saver_start = array("i")
        self.versions: list = []              # per external read as is: its version after
        self.prints: dict[int, tuple] | None = None
        self.rng_bytes = 0
        self.copied_bytes = 0
        self.signature = 0

    def widen(self, name: str) -> array:
        """Column ``name`` in 8-byte words (a size reached 2**31 bytes)."""
        wide = array("q", getattr(self, name))
        setattr(self, name, wide)
        return wide

    def push(self, name: str, x: int) -> None:
        """Append size ``x`` to column ``name``, widening it if needed."""
        try:
            getattr(self, name).append(x)
        except OverflowError:
            self.widen(name).append(x)

    def put(self, name: str, i: int, x: int) -> None:
        """Set entry ``i`` of size column ``name`` to ``x``, widening it if needed."""
        try:
            getattr(self, name)[i] = x
        except OverflowError:
            self.widen(name)[i] = x

    @property
    def n(self) -> int:
        return len(self.tmpl)

    @property
    def has_rng(self) -> bool:
        return any(e[2] is not None for e in self.extra.values())

    def template(self, func: Any, spec: tuple, consts: list, positions: tuple) -> tuple:
        """Op's template index and the integers it leaves open (written after the op's value
        ids): a template of its own while fewer than ``OPEN_AFTER`` ops differed from it only
        in integer constants (``xs[t]``'s index), then one template for all of them."""
        # an op site seen before with these very constants (of types whose equality is their
        # identity as a template's: not floats, -0.0 == 0.0) gets its answer again; one whose
        # integers are left open, that template (an entry per site, not per index)
        types = tuple(map(type, consts))
        fast = masked = known = None
        if _FAST_TYPES.issuperset(types):
            fast = (id(func), spec, positions, tuple(consts), types)
            known = self._fast.get(fast)
            if known is None:
                masked = (id(func), spec, positions, types, tuple(
                    [None if t is int and -2**31 <= c < 2**31 else c
                     for c, t in zip(consts, types)]))
                known = self._fast.get(masked)
        if known is None:
            known = self._template(func, spec, consts, positions)
            if fast is not None:
                self._fast[masked if known[1] else fast] = known
        index, open_ = known
        return index, ([consts[i] for i in open_] if open_ else ())

    def _template(self, func: Any, spec: tuple, consts: list, positions: tuple) -> tuple:
        keys = [_const_key(c) for c in consts]
        key = (func, spec, positions, tuple(keys))
        index = self._tkeys.get(key)
        if index is not None:
            return index, ()
        open_ = tuple(i for i, c in enumerate(consts) if type(c) is int and -2**31 <= c < 2**31)
        if open_:
            shape = ("open", func, spec, positions,
                     tuple(None if i in open_ else k for i, k in enumerate(keys)))
            index = self._open.get(shape)
            seen = self._tkeys.get(shape, 0) + 1
            if index is None and seen >= OPEN_AFTER:
                held = tuple(None if i in open_ else c for i, c in enumerate(consts))
                index = self._open[shape] = len(self.templates)
                self.templates.append((func, spec, held, positions, open_))
            if index is not None:
                return index, open_
            self._tkeys[shape] = seen
        index = self._tkeys[key] = len(self.templates)
        self.templates.append((func, spec, tuple(consts), positions, ()))
        return index, ()

    def func(self, k: int) -> Any:
        """Op ``k``'s aten op."""
        return self.templates[self.tmpl[k]][0]

    def values(self, k: int) -> Any:
        """Op ``k``'s tensor arguments' value ids (< 0: externals), in its positions' order."""
        s0 = self.start[k]
        return self.slot_ids[s0:s0 + len(self.templates[self.tmpl[k]][3])]

    def made(self, k: int) -> list[int]:
        """The values op ``k``'s replay gives, in order: its results, then the values of the
        arguments it writes into."""
        f = self.first[k]
        extra = self.extra.get(k)
        return list(range(f, f + self.nout[k])) + ([w for _, w in extra[0]] if extra else [])

    def finish(self) -> None:
        """The savers by value (counting sort), and the recording's key table dropped."""
        self._tkeys, self._open, self._fast = {}, {}, {}
        self.first.append(len(self.defined))
        count = array("i", [0]) * (len(self.defined) + 1)
        for v in self.saver_v:
            count[v + 1] += 1
        for v in range(len(self.defined)):
            count[v + 1] += count[v]
        ks = array("i", [0]) * len(self.saver_v)
        fill = array("i", count)
        for v, k in zip(self.saver_v, self.saver_ks):
            ks[fill[v]] = k
            fill[v] += 1
        self.saver_start, self.saver_ks, self.saver_v = count, ks, array("i")

    def savers(self, v: int) -> Any:
        return self.saver_ks[self.saver_start[v]:self.saver_start[v + 1]]

    def storage_bytes(self, values: Any) -> int:
        """The bytes of the storages of ``values`` (value ids), each storage once: what a
        snapshot of them holds as the model counts it (a view of an external, such as
        ``xs[t]``, none: it is the caller's, held anyway)."""
        group, group_bytes = self.group, self.group_bytes
        return sum(group_bytes[g] for g in {group[v] for v in values})

    def saver_counts(self) -> array:
        """How many nodes saved each value (an array indexed by value)."""
        s = self.saver_start
        return array("i", (s[v + 1] - s[v] for v in range(len(s) - 1)))

    @property
    def nbytes(self) -> int:
        """What the trace holds beyond the user's tensors: its arrays, templates and sparse
        entries, the generator states of random ops and the copies of externals written in
        place."""
        arrays = (self.tmpl, self.start, self.slot_ids, self.first, self.nout, self.seconds,
                  self.out_bytes, self.grad_in, self.grad_bytes, self.saved, self.defined,
                  self.last, self.group, self.group_bytes, self.saver_start, self.saver_ks,
                  self.saver_v)
        held = sum(sys.getsizeof(a) for a in arrays)
        held += sys.getsizeof(self.templates) + sum(
            sys.getsizeof(t) + sys.getsizeof(t[1]) + sys.getsizeof(t[2]) + sys.getsizeof(t[3]) +
            sys.getsizeof(t[4]) +
            sum(sys.getsizeof(c) for c in t[2] if not isinstance(c, (bool, type(None))))
            for t in self.templates)
        held += sys.getsizeof(self.extra) + 200 * len(self.extra) + \
            sys.getsizeof(self.ext_last) + 8 * len(self.ext_last)
        return held + self.rng_bytes + self.copied_bytes

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

    def rewind_rng(self) -> None:
        """Put each generator the recording drew from back in its state before its first draw
        (the default ones, and a caller's ``generator=``)."""
        seen = set()
        for k in sorted(self.extra):
            state = self.extra[k][2]
            if state is None:
                continue
            if state[0] == "generator":
                gen = self.templates[self.tmpl[k]][2][state[1]]
                if id(gen) not in seen:
                    seen.add(id(gen))
                    gen.set_state(state[2])
            elif state[:2] not in seen:
                seen.add(state[:2])
                set_rng_state(state)

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
