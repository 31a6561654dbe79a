"""What one gradient through a checkpointed loop did, counted and timed by the library."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


class DiskCounts:
    """What a call's disk tier did, for stats with ``disk_*`` fields."""

    disk_bytes_written: int
    disk_bytes_read: int
    disk_io_seconds: float
    disk_wait_seconds: float

    def add_disk(self, disk: Any) -> None:
        """Add what a call's disk store wrote, read and waited for."""
        self.disk_bytes_written += disk.bytes_written
        self.disk_bytes_read += disk.bytes_read
        self.disk_io_seconds += disk.io_seconds
        self.disk_wait_seconds += disk.wait_seconds

    @property
    def disk_overlap(self) -> float | None:
        """The share of the disk I/O that ran beside the computation (None without I/O)."""
        if not self.disk_io_seconds:
            return None
        return max(0.0, 1.0 - self.disk_wait_seconds / self.disk_io_seconds)


@dataclass(repr=False)
class LoopStats(DiskCounts):
    """Counts and times of one call of a loop: its forward and its reverse sweep.

    ``plain_steps`` / ``taped_steps`` count ``fn`` evaluations; the times are seconds spent in
    plain steps, in taped steps (building the tape) and in backward passes over those tapes
    (including adding each step's parameter cotangent into the total). Whatever else a gradient
    costs is bookkeeping (planning, executor, pytree handling). ``library_seconds`` is the wall
    time spent inside the loop's forward and reverse sweep, so ``library_seconds - plain_seconds
    - tape_seconds - backward_seconds`` is the library's own overhead (the user's loss and
    autograd's graph outside the loop excluded). ``peak_checkpoints`` (also ``peak_snapshots``, its
    name before 0.2) is the most checkpoints the schedule held in RAM at once (the working state
    not counted, as in Revolve). ``peak_bytes`` is the
    library's own accounting of the most it held at once: the stored snapshots' array bytes
    (counted exactly) plus, for loops with a ``memory`` budget, the taped segment's steps at the
    measured tape size and the measured working set (see :mod:`bincheck.autograd.probe`).
    ``disk_bytes_written`` / ``disk_bytes_read``: array bytes of snapshots written to and read
    from disk (loops with ``disk=...``); ``disk_io_seconds``: time spent writing, reading and
    checksumming them (mostly on a background thread), ``disk_wait_seconds``: the part of it the
    loop waited for, so ``disk_overlap = 1 - disk_wait_seconds / disk_io_seconds`` of the I/O ran
    beside the computation. ``offload_bytes_written`` / ``offload_bytes_read``: bytes of snapshots
    copied to and from pinned host memory (``bincheck.torch`` loops with ``offload=True``), and
    ``offload_prefetched``: the restores whose copy up was started ahead.

    ``num_steps`` is the number of steps the call ran (a while loop's length).

    Each call of a loop fills its own LoopStats; ``loop.stats`` is replaced by a call's object
    when that call completes (its reverse sweep; a plain while-loop run, or a forward-mode-only
    call, at its end), so it always describes one whole call. Read ``st = loop.stats`` once and
    take several figures from ``st``: two reads of ``loop.stats`` may see two calls.
    """

    plain_steps: int = 0
    taped_steps: int = 0
    peak_snapshots: int = 0
    plain_seconds: float = 0.0
    tape_seconds: float = 0.0
    backward_seconds: float = 0.0
    library_seconds: float = 0.0
    peak_bytes: int = 0
    disk_bytes_written: int = 0
    disk_bytes_read: int = 0
    num_steps: int | None = None
    disk_io_seconds: float = 0.0
    disk_wait_seconds: float = 0.0
    offload_bytes_written: int = 0
    offload_bytes_read: int = 0
    offload_prefetched: int = 0

    def add_offload(self, tier: Any) -> None:
        """Add what a call's host-memory tier copied down and up."""
        self.offload_bytes_written += tier.bytes_written
        self.offload_bytes_read += tier.bytes_read
        self.offload_prefetched += tier.prefetched

    def __repr__(self) -> str:
        # The field keeps its pre-0.2 name (keyword, asdict); its repr uses today's.
        parts = [f"{'peak_checkpoints' if f.name == 'peak_snapshots' else f.name}="
                 f"{getattr(self, f.name)!r}" for f in fields(self)]
        return f"LoopStats({', '.join(parts)})"

    @property
    def peak_checkpoints(self) -> int:
        """The most checkpoints held in RAM at once (the ``peak_snapshots`` field)."""
        return self.peak_snapshots

    @property
    def overhead_seconds(self) -> float:
        """Time inside the library not spent in steps, taping or backward passes."""
        return self.library_seconds - self.plain_seconds - self.tape_seconds - \
            self.backward_seconds


@dataclass
class ProgramStats(DiskCounts):
    """What one gradient through a checkpointed program did (``g.stats``).

    ``ops``: primitive ops recorded; ``plain_ops``: op evaluations without a tape, the recording
    forward's included (as a loop's ``plain_steps`` count its forward's steps); ``taped_ops``:
    those run under a tape; ``stages``: the chain the plan was made on (ops, or groups of them);
    ``snapshots``: the most snapshots held at once (the empty one at cut 0 included, Revolve's
    convention); ``snapshot_bytes``: the most bytes they held at once (live sets, by reference);
    ``trace_bytes``: what the recorded trace holds; ``peak_bytes``: the library's own count of
    the most held at once (the trace, snapshots in RAM, and the plan's predicted tapes and
    working set); times in seconds, as :class:`LoopStats`'s, ``plan_seconds`` for planning;
    ``disk_*`` as :class:`LoopStats`'s (``disk=...``)."""

    ops: int = 0
    plain_ops: int = 0
    taped_ops: int = 0
    stages: int = 0
    snapshots: int = 0
    snapshot_bytes: int = 0
    trace_bytes: int = 0
    peak_bytes: int = 0
    record_seconds: float = 0.0
    plan_seconds: float = 0.0
    plain_seconds: float = 0.0
    tape_seconds: float = 0.0
    backward_seconds: float = 0.0
    library_seconds: float = 0.0
    disk_bytes_written: int = 0
    disk_bytes_read: int = 0
    disk_io_seconds: float = 0.0
    disk_wait_seconds: float = 0.0
