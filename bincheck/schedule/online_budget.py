"""A while loop's online planner within a byte budget (its length unknown, its tapes not kept)."""

from __future__ import annotations

import warnings

from .budget import IO_STATES, BudgetPlan, Sizes, io_costs
from .online import DiskOnlinePlanner, OnlinePlanner, disk_period
from .units import format_bytes


def online_planner(memory: int, sizes: Sizes, disk: bool = False) -> tuple[int, object]:
    """A while loop's online planner holding the states that fit ``memory`` bytes beside the
    working set, and that number of states; with ``disk``, periodic disk checkpoints priced by
    the measured write and read times. A budget below the minimum raises the ValueError of
    :class:`BudgetPlan`, naming it."""
    if memory < sizes.minimum_memory:
        BudgetPlan(1, memory, sizes)            # raises, naming the minimum
    states = (memory - sizes.work_bytes) // sizes.state_bytes
    if disk and states <= IO_STATES:        # no RAM slot beside the I/O's own: RAM alone
        warnings.warn(f"the second tier (disk=, offload=) is not used: {format_bytes(memory)} "
                      f"holds {states} state(s) beside the working set, and the tier needs "
                      f"{IO_STATES + 1} (one in RAM, {IO_STATES} in flight); the while loop keeps "
                      f"{states} in RAM",
                      RuntimeWarning, stacklevel=3)
    if not disk or states <= IO_STATES:
        return states, OnlinePlanner(states)
    # As for BudgetPlan: two states in flight, the same prices.
    states -= IO_STATES
    write, read = io_costs(sizes)
    return states, DiskOnlinePlanner(states, disk_period(
        states, write / sizes.step_seconds, read / sizes.step_seconds))
