"""Plan reuse for :func:`~bincheck.autograd.program.checkpoint_program`: the recording takes
the plan's first snapshots.

A call whose recorded trace has the same structure as the last call's (the same ops on the same
wiring, with results of the same sizes) is planned alike. So after each call the program keeps an
:class:`Expectation`: the last plan, the cuts its first sweep stops at (its snapshots, and the
start of its first taped segment), the values live at each of them (the previous trace's live
sets: ids only), and checksums of the trace's structure up to each of those cuts. The next
call's recording holds on to those values as the program makes them and, at each cut, checks
the structure recorded so far and takes the snapshot. If the structure differs anywhere, the
captures are dropped and the call is planned afresh; if it holds to the end, the backward starts
at the plan's first taped segment, with no replay of the first sweep: each op is evaluated one
time fewer (the recording is the first sweep).
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
from autograd.core import primitive_vjps

from ..schedule.actions import Advance, Reverse, Snapshot
from .trace import value_nbytes

MAX_CUTS = 256          # a first sweep stopping at more cuts is not captured (live sets per cut)


def structure(tr: Any, upto: int, crc: int = 0, start: int = 0) -> int:
    """A checksum of ops ``start .. upto - 1`` of the trace's structure (their templates' ops
    and traced positions, their parents and their results' sizes where recorded; from the
    start, which inputs are differentiated: their cotangents are planned), continuing ``crc``."""
    tmpl, starts = tr.tmpl, tr.start
    if start == 0:
        crc = zlib.crc32(memoryview(tr.dep)[:tr.n_in], crc)
    crc = zlib.crc32(memoryview(tmpl)[start:upto], crc)
    lo = starts[start] if start < len(starts) else len(tr.parents)
    hi = starts[upto] if upto < len(starts) else len(tr.parents)
    crc = zlib.crc32(memoryview(tr.parents)[lo:hi], crc)
    if tr.plan_limit is None:               # memory=: the sizes plan it too
        crc = zlib.crc32(memoryview(tr.out_bytes)[start:upto], crc)
    for index in sorted({tmpl[k] for k in range(start, upto)}):
        fun, argnums = tr.templates[index][:2]
        crc = zlib.crc32(repr((index, getattr(fun, "__qualname__", id(fun)), id(fun),
                               argnums)).encode(), crc)
    return crc


class Expectation:
    """What the next call expects (see the module docstring); None from :meth:`of` where the
    plan's first sweep cannot be captured."""

    def __init__(self, plan: Any, n: int, n_in: int, cuts: list[int], live: list,
                 checks: dict, tape_from: int | None = None, tape_bytes: int = -1) -> None:
        self.plan, self.n, self.n_in = plan, n, n_in
        self.cuts, self.checks = cuts, checks
        # the first taped segment, ``tape_from`` to the end: the recording tapes it (its
        # results' bytes ``tape_bytes`` at most, where they were recorded; -1: not counted)
        self.tape_from, self.tape_bytes = tape_from, tape_bytes
        # int32 arrays, held from the first gradient on (tuples of Python ints and a dict were
        # 74 kB for 870 values over 78 cuts, priced by no plan): the live sets of the cuts one
        # after another (``live_at[i]``: where cut ``cuts[i]``'s starts), the values some cut
        # captures in the order they are made, and the last cut capturing each
        self.live = np.concatenate(live).astype(np.int32) if live else np.zeros(0, np.int32)
        self.live_at = np.cumsum([0] + [len(x) for x in live])
        last_cut: dict[int, int] = {}
        for c, ids in zip(cuts, live):
            for v in ids.tolist():
                last_cut[v] = c
        self.need = np.array(sorted(last_cut), dtype=np.int32)
        self.need_cut = np.array([last_cut[v] for v in self.need.tolist()], dtype=np.int32)

    def live_ids(self, i: int) -> list[int]:
        """The values live at cut ``cuts[i]``."""
        return self.live[self.live_at[i]:self.live_at[i + 1]].tolist()

    @staticmethod
    def tape_fits(actions: Any, chain: Any, recording: int, room: int) -> int | None:
        """Where a recording that also captures the plan's first sweep may start taping (the
        start of its first Reverse), or None: only if ``recording`` bytes (what the recording
        holds alone), the snapshots it captures and that segment's tape fit in ``room``."""
        held = recording
        for action in actions:
            kind = type(action)
            if kind is Reverse:
                held += int(chain.tape[action.start:action.stop].sum())
                return action.start if action.stop == chain.n and held <= room else None
            if kind is Snapshot:
                held += int(chain.cuts[action.index])
        return None

    @classmethod
    def of(cls, tr: Any, plan: Any) -> "Expectation | None":
        if getattr(plan, "uses_disk", False) or tr.n == 0:
            return None
        cuts, tape_from = [0], None
        for action in plan.actions:            # the first sweep: its snapshots and advances
            kind = type(action)
            if kind is Reverse:                # a plan with a byte budget says if it fits
                if action.stop == tr.n:
                    tape_from = getattr(plan, "tape_from", action.start)
                break
            if kind is Advance or kind is Snapshot:
                c = action.stop if kind is Advance else action.index
                if c != cuts[-1]:
                    cuts.append(c)
                if len(cuts) > MAX_CUTS:
                    return None
        cuts = sorted(set(cuts))
        n_in = tr.n_in
        last = np.frombuffer(tr.last, dtype=np.int32)[n_in:]
        made = np.arange(tr.n)
        live = [np.flatnonzero((made < c) & (last >= c)) + n_in for c in cuts]
        checks, crc, prev = {}, 0, 0
        for c in cuts:
            crc = structure(tr, c, crc, prev)
            checks[c], prev = crc, c
        checks[tr.n] = structure(tr, tr.n, crc, prev)
        sizes = tr.out_bytes
        tape_bytes = -1 if sizes is None or tape_from is None else \
            int(np.frombuffer(sizes, dtype=np.int64)[tape_from:].sum())
        return cls(plan, tr.n, n_in, cuts, live, checks, tape_from, tape_bytes)


class Capture:
    """The recording's side: hold the expected values as they are made and take each cut's
    snapshot once its structure checks; ``ok`` turns False at the first difference."""

    def __init__(self, expect: Expectation, tr: Any) -> None:
        self.expect, self.tr = expect, tr
        self.hold: dict[int, Any] = {}
        self.at = 0                                 # the next value in expect.need
        self.want = self._want()
        # the first taped segment's VJPs, (op, parent value ids, vjp) in the order they ran
        self.tape: list | None = [] if expect.tape_from is not None else None
        self.taped_bytes = 0
        self.snapshots: dict[int, dict] = {}
        self.ok = tr.n_in == expect.n_in
        self.crc, self.prev = 0, 0
        self.next = 0                        # index into expect.cuts
        self._cut(0)

    def made(self, k: int, value: Any) -> None:
        """Op ``k`` made ``value``."""
        if not self.ok:
            return
        e = self.expect
        v = self.tr.n_in + k
        if v == self.want:
            self.hold[v] = value
            self.at += 1
            self.want = self._want()
        if k + 1 >= e.n + 1:
            self.drop()
        elif self.next < len(e.cuts) and e.cuts[self.next] == k + 1:
            self._cut(k + 1)

    def taping(self, k: int, value: Any, fun: Any, args: tuple, kwargs: dict, argnums: tuple,
               parent_ids: list) -> None:
        """Op ``k`` ran: from the first taped segment on, keep its VJP as autograd's node
        would (the recording then is that segment's taped run). Given up (the replay tapes
        it) where its results outgrow the expected bytes or a VJP cannot be made."""
        tape, e = self.tape, self.expect
        if tape is None or k < e.tape_from:
            return
        if not self.ok:                         # the structure differs: nothing to tape
            self.tape = None
            return
        dep = self.tr.dep                       # only what autograd would differentiate
        keep = [j for j, p in enumerate(parent_ids) if dep[p]]
        if not keep:
            return
        if e.tape_bytes >= 0:
            self.taped_bytes += value_nbytes(value)
            if self.taped_bytes > e.tape_bytes:
                self.tape = None
                return
        try:
            vjp = primitive_vjps[fun](tuple(argnums[j] for j in keep), value, args, kwargs)
        except Exception:                       # the replay raises what autograd would
            self.tape = None
            return
        tape.append((k, tuple(parent_ids[j] for j in keep), vjp))

    def _want(self) -> int:
        need = self.expect.need
        return int(need[self.at]) if self.at < len(need) else -1

    def _cut(self, c: int) -> None:
        e, tr = self.expect, self.tr
        self.crc = structure(tr, c, self.crc, self.prev)
        self.prev = c
        if self.crc != e.checks[c]:
            self.drop()
            return
        hold = self.hold
        self.snapshots[c] = {v: hold[v] for v in e.live_ids(self.next)}
        for v in e.need[:self.at][e.need_cut[:self.at] == c].tolist():
            del hold[v]
        self.next += 1

    def drop(self) -> None:
        self.ok = False
        self.hold, self.snapshots, self.want, self.tape = {}, {}, -1, None

    def finish(self) -> dict | None:
        """The snapshots by cut if the whole trace had the expected structure, else None."""
        e, tr = self.expect, self.tr
        if not self.ok or tr.n != e.n or self.next != len(e.cuts) or \
                structure(tr, tr.n, self.crc, self.prev) != e.checks[tr.n]:
            self.drop()
            return None
        self.hold = {}
        return self.snapshots


class Captured:
    """The executor's stepper for the first sweep the recording did: an advance gives the
    snapshot the recording took at its end."""

    __slots__ = ("snapshots",)

    def __init__(self, snapshots: dict) -> None:
        self.snapshots = snapshots

    def advance(self, env: dict, start: int, stop: int) -> dict:
        return self.snapshots[stop]

    def reverse(self, env: dict, start: int, stop: int) -> None:
        raise AssertionError("the first sweep ends at its first Reverse")
