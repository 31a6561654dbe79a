"""Validate any action stream symbolically and count what it costs.

:class:`Tracker` is the single statement of the schedule invariants (see ``actions``): it follows
indices only, so it can check a plan for millions of steps without running one. The executor runs
the same tracker in front of the real work, so what the tests validate is what gradients execute.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .actions import Action, Advance, Free, Restore, Reverse, Snapshot
from .validate import short_repr, check_positive_int


class ScheduleError(RuntimeError):
    """An action stream broke an invariant (see ``bincheck.schedule.actions``)."""


CONSUMED = -1


class Tracker:
    """Follows live state, stored states and adjoint position; raises ScheduleError on a bad action.

    Counts as it goes: ``plain_steps`` (steps inside ``Advance``), ``taped_steps`` (inside
    ``Reverse``), ``peak_checkpoints`` (most states stored in RAM at once), ``peak_disk`` (on disk),
    ``disk_writes`` / ``disk_reads`` (snapshots written, restores read from disk). With
    ``record=True`` it also lists the reversed steps in the order they were reversed.
    """

    __slots__ = ("seq_len", "live_index", "stored", "adjoint_index", "peak_checkpoints",
                 "plain_steps", "taped_steps", "reversed", "state_bytes", "tape_bytes",
                 "peak_bytes", "ram", "disk_writes", "disk_reads", "peak_disk")

    def __init__(self, seq_len: int | None, record: bool = False, state_bytes: int = 0,
                 tape_bytes: int = 0) -> None:
        # seq_len None: the length is not known yet (online schedules); see end_forward.
        # peak_bytes: most bytes held at once by stored states (state_bytes each) and, during a
        # Reverse(start, stop), the stop - start - 1 step tapes kept beyond the working one.
        self.seq_len = seq_len
        self.state_bytes, self.tape_bytes, self.peak_bytes = state_bytes, tape_bytes, 0
        self.ram: set[int] = set()          # the stored states kept in RAM (others: on disk)
        self.disk_writes = self.disk_reads = self.peak_disk = 0
        self.live_index = 0
        self.stored: set[int] = set()
        self.adjoint_index = seq_len
        self.peak_checkpoints = 0
        self.plain_steps = 0
        self.taped_steps = 0
        self.reversed: list[int] | None = [] if record else None

    def apply(self, action: Action) -> None:
        kind = type(action)
        first = action.start if kind is Advance or kind is Reverse else \
            action.index if kind is Snapshot or kind is Restore or kind is Free else 0
        if first < 0:
            self._fail(action, "state indices are >= 0")
        if kind is Advance:
            start, stop = action.start, action.stop
            if start != self.live_index or stop < start or (
                    self.seq_len is not None and stop > self.seq_len):
                self._fail(action, f"the live state is {self._live_name()}")
            self.plain_steps += stop - start
            self.live_index = stop
        elif kind is Reverse:
            start, stop = action.start, action.stop
            if start != self.live_index:
                self._fail(action, f"the live state is {self._live_name()}")
            if stop != self.adjoint_index or not start < stop:
                self._fail(action, f"the adjoint is at state {self.adjoint_index}")
            self.taped_steps += stop - start
            held = len(self.ram) * self.state_bytes + (stop - start - 1) * self.tape_bytes
            self.peak_bytes = max(self.peak_bytes, held)
            if self.reversed is not None:
                self.reversed.extend(range(stop - 1, start - 1, -1))
            self.live_index = CONSUMED
            self.adjoint_index = start
        elif kind is Snapshot:
            if action.index != self.live_index:
                self._fail(action, f"the live state is {self._live_name()}")
            if action.index in self.stored:
                self._fail(action, "that state is already stored")
            self.stored.add(action.index)
            if action.storage == "ram":
                self.ram.add(action.index)
                self.peak_checkpoints = max(self.peak_checkpoints, len(self.ram))
                self.peak_bytes = max(self.peak_bytes, len(self.ram) * self.state_bytes)
            elif action.storage == "disk":
                self.disk_writes += 1
                self.peak_disk = max(self.peak_disk, len(self.stored) - len(self.ram))
            else:
                self._fail(action, "storage must be 'ram' or 'disk'")
        elif kind is Restore:
            if action.index not in self.stored:
                self._fail(action, f"stored states are {sorted(self.stored)}")
            self.live_index = action.index
            self.disk_reads += action.index not in self.ram
        elif kind is Free:
            if action.index not in self.stored:
                self._fail(action, f"stored states are {sorted(self.stored)}")
            self.stored.remove(action.index)
            self.ram.discard(action.index)
        else:
            raise ScheduleError(f"unknown action {short_repr(action)} of type {type(action).__name__}: "
                                f"a schedule yields Advance, Snapshot, Restore, Free and Reverse")

    @property
    def peak_slots(self) -> int:                # the name before 0.2
        return self.peak_checkpoints

    def end_forward(self, seq_len: int) -> None:
        """An online stream's loop has stopped after ``seq_len`` steps: the adjoint starts there."""
        if self.seq_len is not None and self.seq_len != seq_len:
            raise ScheduleError(f"the stream was planned for {self.seq_len} steps, not {seq_len}")
        if self.adjoint_index is not None and self.adjoint_index != seq_len:
            raise ScheduleError("end_forward after the reverse sweep began")
        self.seq_len = self.adjoint_index = seq_len

    def finish(self) -> None:
        """Check that the stream reversed everything and left nothing stored."""
        if self.adjoint_index != 0:
            raise ScheduleError(f"the stream ended with the adjoint at state {self.adjoint_index}, "
                                f"not 0: steps 0..{self.adjoint_index - 1} were never reversed")
        if self.stored:
            raise ScheduleError(f"the stream ended with states {sorted(self.stored)} still stored")

    def _live_name(self) -> str:
        return "consumed by a Reverse" if self.live_index == CONSUMED else f"state {self.live_index}"

    def _fail(self, action: Action, why: str) -> None:
        raise ScheduleError(f"invalid action {action!r}: {why}")


@dataclass
class Cost:
    """What a stream costs: plain and taped step evaluations, the most checkpoints held in RAM
    at once, the steps in the order reversed, peak bytes, and disk writes/reads."""

    plain_steps: int
    taped_steps: int
    peak_checkpoints: int
    reversed: list[int] = field(default_factory=list)
    peak_bytes: int = 0
    disk_writes: int = 0
    disk_reads: int = 0
    peak_disk: int = 0

    @property
    def peak_slots(self) -> int:                # the name before 0.2
        return self.peak_checkpoints


def simulate(actions: Iterable[Action], seq_len: int | None = None) -> Cost:
    """Run ``actions`` symbolically; raise ScheduleError if invalid, else return its cost.

    ``actions`` is a schedule (``bincheck.plan(...)``, ``EqualSegments(...)``: anything with a
    ``seq_len`` attribute that iterates actions), or any iterable of actions when ``seq_len`` is
    given. A schedule's ``state_bytes`` / ``tape_bytes`` attributes, if any, price its peak bytes.
    """
    if seq_len is None:
        seq_len = getattr(actions, "seq_len", None)
        if seq_len is None:
            raise TypeError(
                f"simulate() takes a schedule (such as bincheck.plan(seq_len, num_ckpts) or "
                f"EqualSegments(seq_len, n): an iterable of actions with a seq_len attribute), or "
                f"an iterable of actions together with seq_len=...; got {short_repr(actions)} of type "
                f"{type(actions).__name__} and no seq_len")
    seq_len = check_positive_int("seq_len", seq_len)
    try:
        stream = iter(actions)
    except TypeError:
        raise TypeError(f"simulate() takes an iterable of actions; got {short_repr(actions)} of type "
                        f"{type(actions).__name__}") from None
    tracker = Tracker(seq_len, record=True, state_bytes=getattr(actions, "state_bytes", 0),
                      tape_bytes=getattr(actions, "tape_bytes", 0))
    for action in stream:
        tracker.apply(action)
    tracker.finish()
    return Cost(tracker.plain_steps, tracker.taped_steps, tracker.peak_checkpoints, tracker.reversed,
                tracker.peak_bytes, tracker.disk_writes, tracker.disk_reads, tracker.peak_disk)
