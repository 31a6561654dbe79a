"""``checkpoint_program(..., memory=..., disk=...)``: a disk tier for a recorded program.

With a disk, the plan may also be Disk-Revolve over groups of the trace's ops
(:class:`~bincheck.schedule.disk.GroupedDisk`): a few snapshots in RAM within the budget, as
many as pay on disk. A snapshot's write and read are priced by measuring the disk with a state
of the largest live set's bytes (:func:`~bincheck.runtime.disk.disk_seconds`: synced writes,
uncached reads), once per program and size. The disk plan is kept only where it is predicted to
save at least ``DISK_MIN_GAIN`` of the best plan in RAM alone, as the loops decide; else no
file is written.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime import disk as disk_tier
from ..schedule.budget import DISK_MIN_GAIN, IO_STATES
from ..schedule.chain import Chain
from ..schedule.disk import GroupedDisk

# What the disk tier's own objects hold beside the snapshots it writes and reads: its worker
# thread and queue, numpy's .npy header parsing, the files' entries (tracemalloc: 99.5 kB at the
# peak over 100 puts and read-ahead gets of 128-byte states, 47 kB beside four 16 kB states)
DISK_OVERHEAD_B = 128 * 1024


def disk_costs(program: Any, nbytes: int) -> tuple[float, float]:
    """Seconds to write and to read a snapshot of ``nbytes`` on ``program``'s disk (cached)."""
    costs = program.disk_costs.get(nbytes)
    if costs is None:
        state = {0: np.zeros(max(1, nbytes // 8))}
        costs = program.disk_costs[nbytes] = disk_tier.disk_seconds(state, program.disk)
    return costs


def disk_plan(program: Any, chain: Chain, free: int, ram_seconds: float) -> Any:
    """A :class:`GroupedDisk` plan within ``free`` bytes predicted to beat ``ram_seconds`` (the
    best plan in RAM alone) by ``DISK_MIN_GAIN`` of it, or None."""
    write, read = disk_costs(program, int(chain.cuts.max()))
    plan = GroupedDisk.best(chain, free - DISK_OVERHEAD_B, write, read, in_flight=IO_STATES)
    if plan is None or plan.seconds > (1.0 - DISK_MIN_GAIN) * ram_seconds:
        return None
    plan.peak_bytes += DISK_OVERHEAD_B
    return plan
