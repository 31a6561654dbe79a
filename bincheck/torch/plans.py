"""A trace's plan as :mod:`.program` runs it: its stages and actions, its predictions, and what
a forward that expects it takes as it runs (the snapshots at the cuts the plan's first advances
reach, and the tape of its first taped segment)."""

from __future__ import annotations

from ..schedule.actions import Advance, Reverse
from .recorder import Plan0
from .trace import Trace


class ProgramPlan:
    """The stages (op bounds) and actions of one trace's plan, its predictions, and what a
    forward that expects it does (``plan0``: the snapshots it captures, where it keeps the
    saved tensors)."""

    def __init__(self, bounds: list[int], actions: tuple, peak_bytes: int, seconds: float,
                 plain_stages: int, taped_stages: int) -> None:
        self.bounds, self.actions = bounds, actions
        self.stages = len(bounds) - 1
        self.peak_bytes, self.seconds = peak_bytes, seconds
        self.plain_stages, self.taped_stages = plain_stages, taped_stages
        self.plan0, self.keep_from = None, None
        self.plan_seconds = 0.0                 # how long planning took (once per op sequence)

    def expect(self, trace: Trace) -> None:
        """Work out what the forward captures for this plan: the live set at every cut the
        plan's first advances reach (before its first taped segment), and from which op on it
        keeps autograd's saved tensors (that segment's)."""
        live = trace.live_sets()
        capture: dict[int, tuple] = {}
        for action in self.actions:
            if type(action) is Advance:
                c = self.bounds[action.stop]
                capture[c] = live(c)
            elif type(action) is Reverse:
                c = self.bounds[action.start]
                capture[c] = live(c)
                self.keep_from = c
                break
        capture.pop(0, None)
        sizes = {c: trace.storage_bytes(vs) for c, vs in capture.items()}
        kept = 0
        if self.keep_from is not None:          # what the recorder's pack keeps from there on
            starts, ks = trace.saver_start, trace.saver_ks
            kept = trace.storage_bytes(v for v in range(len(trace.group)) if any(
                k >= self.keep_from or k == self.keep_from - 1 == trace.defined[v]
                for k in ks[starts[v]:starts[v + 1]]))
        self.plan0 = Plan0(capture, self.keep_from, trace.n, sizes, kept)

    def __repr__(self) -> str:
        return (f"ProgramPlan(stages={self.stages}, peak_bytes={self.peak_bytes}, "
                f"seconds={self.seconds:.4g}, plan_seconds={self.plan_seconds:.3g})")


class _Captured:
    """The stepper of the advances the forward did: each gives the snapshot it captured. (A
    module-level class: one defined in a method is a reference cycle, and would hold the
    captured snapshots until the garbage collector ran.)"""

    __slots__ = ("captured", "bounds")

    def __init__(self, captured: dict, bounds: list[int]) -> None:
        self.captured, self.bounds = captured, bounds

    def advance(self, env: dict, a: int, b: int) -> dict:
        return self.captured[self.bounds[b]]

    def reverse(self, env: dict, a: int, b: int) -> None:
        raise AssertionError("unreachable")
