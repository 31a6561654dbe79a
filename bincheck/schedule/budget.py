"""Memory budgets in bytes: what a gradient within ``memory`` bytes costs, and the inverse.

A loop's memory during a gradient is a fixed working set — the live state, the state being
computed, the adjoint, one step's tape and what its backward allocates (``work_bytes``) — plus
what the schedule stores: snapshots (``state_bytes`` each) and kept tapes (``tape_bytes`` per
step, taped segments; see :mod:`bincheck.schedule.mixed`). ``memory`` covers both; the user's
arguments, the returned outputs and the returned cotangents are not the loop's.

Time is predicted from two measured costs: ``step_seconds`` (a plain step) and
``taped_step_seconds`` (taping a step and pulling a cotangent through it). Every schedule tapes
each step once, as store-all does, so relative to store-all a plan costs

    1 + plain_steps * step_seconds / (seq_len * taped_step_seconds),

an estimate that leaves out memory effects (store-all's large tapes often run slower per step).
"""

from __future__ import annotations

import sys
import warnings
from array import array
from collections.abc import Iterator
from dataclasses import dataclass

from .actions import Action
from .binomial import Plan
from .disk import DiskPlan, DiskTable, MixedInner
from .mixed import FixedLeafPlan, MixedPlan, best_fixed_leaf
from .units import format_bytes, parse_bytes
from .validate import check_positive_int, exactly_one_budget, short_repr

__all__ = ["BudgetPlan", "MemoryBudget", "Sizes", "format_bytes", "memory_for", "parse_bytes",
           "plan"]

# Above this many element operations (a few seconds) the exact mixed DP is not run: see BudgetPlan.
DP_WORK_LIMIT = 50_000_000
# With a disk: the states background I/O holds (one written behind, one read ahead), and the
# least predicted saving (a share of the gradient's time) for which the disk is used at all.
IO_STATES = 2
DISK_MIN_GAIN = 0.02


@dataclass(frozen=True)
class MemoryBudget:
    """A loop's schedule to be planned within ``memory`` bytes once its step has been measured
    (what ``binomial_checkpoint(fn, seq_len, memory=...)`` holds instead of a plan)."""

    seq_len: int
    memory: int
    disk: object = None    # None: RAM only; True: a temporary dir; a path; a front end's tier

    def __str__(self) -> str:
        where = "" if self.disk is None else ", more states " + getattr(self.disk, "where", "on disk")
        return f"memory budget: {self.seq_len} steps within {format_bytes(self.memory)}{where}"


@dataclass(frozen=True)
class Sizes:
    """What one step of a loop costs in bytes and seconds (measured by ``loop.preview``)."""

    state_bytes: int
    tape_bytes: int | None = None      # None: never keep tapes (states only)
    work_bytes: int = 0
    step_seconds: float | None = None
    taped_step_seconds: float | None = None
    write_seconds: float | None = None     # writing one state to disk (with disk=...)
    read_seconds: float | None = None      # reading it back
    segment_bytes: int = 0     # static allocation: what keeping any taped segment adds

    @property
    def minimum_memory(self) -> int:
        """The least memory a gradient can run in: one stored state and the working set."""
        return self.state_bytes + self.work_bytes


class BudgetPlan:
    """The optimal schedule for ``seq_len`` steps within ``memory`` bytes, with its predictions.

    Iterating yields the actions. ``plain_steps`` / ``taped_steps`` are the evaluations of ``fn``
    one gradient makes (the last segment is taped in the forward, so no extra plain step);
    ``peak_bytes`` is the working set plus the most the schedule stores at once plus the
    planner's own memory (``table_bytes``: the mixed plan's recorded walk, the disk table), all
    within ``memory``; ``relative_time`` is the predicted time against store-all (None without
    step timings).
    """

    def __init__(self, seq_len: int, memory: int, sizes: Sizes, disk: bool = False,
                 static: bool = False) -> None:
        self.seq_len = check_positive_int("seq_len", seq_len)
        self.memory, self.sizes, self.disk, self.static = memory, sizes, disk, static
        if memory < sizes.minimum_memory:
            raise ValueError(
                f"memory={memory} bytes is below the least this loop needs: one stored state "
                f"({sizes.state_bytes} bytes) and the working set of one taped step and its "
                f"backward ({sizes.work_bytes} bytes), {sizes.minimum_memory} bytes in all")
        store = memory - sizes.work_bytes
        slots = self._slots = store // sizes.state_bytes
        self.table_bytes = 0                # the planner's own tables, inside the budget
        self.write_cost = self.read_cost = 0.0      # seconds per state, overlap credited
        self._ram_plain = 0
        self.disk_note = ""                 # with disk: "used", or why it was declined
        self._ram_plan(seq_len, store, slots)
        if disk:
            self._disk_plan(seq_len, store)

    def _ram_plan(self, seq_len: int, store: int, slots: int) -> None:
        """The best plan in RAM alone: Revolve, or the mixed policy where kept tapes help
        (with ``static``: tapes cannot borrow freed slots' bytes; see ``FixedLeafPlan``)."""
        sizes = self.sizes
        self.schedule: Plan | MixedPlan = Plan(seq_len, slots)     # states only: Revolve
        self.schedule_bytes = min(slots, seq_len) * sizes.state_bytes
        if self.static:     # XLA: the slots and the longest segment allocated side by side
            fixed = None if sizes.tape_bytes is None else best_fixed_leaf(
                seq_len, store - sizes.segment_bytes, sizes.state_bytes, sizes.tape_bytes,
                self.schedule.plain_steps)
            if fixed is not None:
                self.schedule, self._slots = fixed, fixed.slots
                self.schedule_bytes = min(fixed.slots, seq_len) * sizes.state_bytes + \
                    sizes.segment_bytes + (fixed.leaf - 1) * sizes.tape_bytes
        # Kept tapes can help only if one fits beside the working set (the longest leaf, with
        # every slot's bytes freed, is ``1 + store // tape_bytes``).
        elif sizes.tape_bytes is not None and store >= sizes.tape_bytes:
            mixed = self._mixed(store)
            # The planner's own bytes can cost the mixed plan more than kept tapes save: keep
            # the better of the two.
            if mixed is not None and mixed.plain_steps < self.schedule.plain_steps:
                self.schedule, self.table_bytes = mixed, mixed.nbytes
                self.schedule_bytes = mixed.memory + self.table_bytes
        self._ram_plain = self.schedule.plain_steps     # what the disk plan must beat

    def _disk_plan(self, seq_len: int, store: int) -> None:
        """With a disk tier: Disk-Revolve over the RAM left once the disk planner's table and the
        two states the background I/O holds (one written behind, one read ahead) are set aside,
        its RAM part run by the mixed policy where the mixed table is closed-form (else by
        Revolve); kept only if it is predicted to save at least ``DISK_MIN_GAIN`` of the
        gradient's time over RAM alone, else the disk is declined (``uses_disk`` False)."""
        sizes = self.sizes
        if not (sizes.step_seconds and sizes.write_seconds is not None and
                sizes.read_seconds is not None):
            raise ValueError("planning with disk needs step_seconds, write_seconds and "
                             "read_seconds (loop.preview measures them)")
        self.write_cost, self.read_cost = io_costs(sizes)
        table = DiskTable.bytes_for(seq_len)
        ram = store - table - IO_STATES * sizes.state_bytes
        cm = ram // sizes.state_bytes
        if cm < 1:
            self.disk_note = (f"declined: the disk planner's table ({table} bytes) and "
                              f"{IO_STATES} states in flight leave no RAM slot")
            return
        inner, inner_bytes = None, min(cm, seq_len) * sizes.state_bytes
        if sizes.tape_bytes is not None and ram >= sizes.tape_bytes:
            mixed = MixedPlan(seq_len, ram, sizes.state_bytes, sizes.tape_bytes)
            inner = MixedInner(mixed.table, mixed.top, cm)
            inner_bytes = max(inner_bytes, mixed.memory)
        step = sizes.step_seconds
        plan = DiskPlan(seq_len, cm, self.write_cost / step, self.read_cost / step, inner)
        if inner is not None:
            plan.plain_steps                    # walks the schedule once
            if mixed.table.dp_rows:             # a walk needed exact-DP rows: not budgeted
                inner, inner_bytes = None, min(cm, seq_len) * sizes.state_bytes
                plan = DiskPlan(seq_len, cm, self.write_cost / step, self.read_cost / step)
        ram_time = self._ram_plain * step
        disk_time = plan.cost * step
        total = seq_len * (sizes.taped_step_seconds or step)
        if disk_time >= ram_time - DISK_MIN_GAIN * (total + ram_time):
            why = "no saving" if disk_time >= ram_time else \
                f"a saving below {DISK_MIN_GAIN:.0%} of the gradient's {total + ram_time:.3g} s"
            self.disk_note = (f"declined: {disk_time:.3g} s of recomputation and I/O predicted "
                              f"against {ram_time:.3g} s of recomputation in RAM alone, {why}")
            return
        self.schedule, self.table_bytes = plan, table
        self.schedule_bytes = inner_bytes + table + IO_STATES * sizes.state_bytes
        self._slots, self.disk_note = cm, "used"

    def _mixed(self, store: int) -> MixedPlan | None:
        """The mixed plan whose snapshots, kept tapes and walk fit ``store`` bytes, or None (store
        states only) when the exact DP would take too long or does not fit.

        Where closed forms do not cover the budget, the exact DP's rows (4 bytes per step per
        row) are built here, at planning time, before the forward holds anything, and must fit
        ``store`` together with the walk being recorded; the plan then keeps only that walk
        (:meth:`MixedPlan.compact`, at most 8 bytes per step), whose bytes come out of the
        budget: a plan that does not fit with them is made again with them taken off.
        """
        seq_len, sizes, budget = self.seq_len, self.sizes, store
        for _ in range(4):
            mixed = MixedPlan(seq_len, budget, sizes.state_bytes, sizes.tape_bytes)
            work = mixed.table.dp_work(seq_len, mixed.top)
            if work > DP_WORK_LIMIT:
                # No closed form here and the exact DP would take long: plan states only
                # (Revolve, closed form) and say what that may cost.
                warnings.warn(
                    f"planning {seq_len} steps within {format_bytes(self.memory)} with kept tapes "
                    f"needs the exact dynamic program (about {work / 2e7:.0f} s); storing states "
                    f"only instead: {Plan(seq_len, self.checkpoints).plain_steps} plain steps, "
                    f"where the optimum is at least "
                    f"{mixed.table.lower_bound(seq_len, mixed.top)}",
                    RuntimeWarning, stacklevel=3)
                return None
            # The rows and the walk being recorded exist together: refuse before building them.
            walk = sys.getsizeof(array("i")) + 8 * (seq_len + 1)
            if mixed.table.row_bytes_needed(seq_len, mixed.top) + walk > store:
                return None
            mixed.compact()
            if mixed.dp_row_bytes + mixed.nbytes > store:                # pragma: no cover
                return None
            if mixed.memory + mixed.nbytes <= store:
                return mixed
            budget = store - mixed.nbytes
            if budget < sizes.state_bytes:
                return None
        return None

    def __iter__(self) -> Iterator[Action]:
        return iter(self.schedule)

    @property
    def checkpoints(self) -> int:
        """How many states fit the budget (in RAM), at most ``seq_len``: the loop has no more
        states to store. A mixed plan may hold fewer and keep taped segments instead."""
        return min(self._slots, self.seq_len)

    @property
    def slots(self) -> int:                 # the name before 0.2
        return self.checkpoints

    @property
    def plain_steps(self) -> int:
        return self.schedule.plain_steps

    @property
    def taped_steps(self) -> int:
        return self.seq_len

    @property
    def first_reverse_start(self) -> int:
        return self.schedule.first_reverse_start

    @property
    def peak_bytes(self) -> int:
        """Bound on what the loop holds: the working set plus the schedule's stored bytes."""
        return self.sizes.work_bytes + self.schedule_bytes

    @property
    def io_bytes(self) -> int:
        """Bytes reserved for the disk's background I/O (two states in flight; 0 in RAM)."""
        return IO_STATES * self.sizes.state_bytes if self.uses_disk else 0

    @property
    def uses_disk(self) -> bool:
        """Whether the plan stores states on disk (False: RAM alone, by request or because the
        disk was declined: ``disk_note`` says why)."""
        return isinstance(self.schedule, DiskPlan)

    @property
    def extra_seconds(self) -> float | None:
        """Predicted seconds beyond store-all's: the plain steps, and the disk I/O as priced by
        ``io_costs`` (None without ``step_seconds``)."""
        s = self.sizes
        if not s.step_seconds:
            return None
        extra = self.plain_steps * s.step_seconds
        if isinstance(self.schedule, DiskPlan):
            extra += self.schedule.disk_writes * self.write_cost + \
                self.schedule.disk_reads * self.read_cost
        return extra

    @property
    def relative_time(self) -> float | None:
        s = self.sizes
        if not s.step_seconds or not s.taped_step_seconds:
            return None
        return 1.0 + self.extra_seconds / (self.seq_len * s.taped_step_seconds)

    def __repr__(self) -> str:
        return f"BudgetPlan({self.seq_len}, memory={self.memory}, {self.sizes})"

    def __str__(self) -> str:
        l, s = self.seq_len, self.sizes
        tier, where, ram = getattr(self.disk, "labels", ("disk", "on disk", "RAM"))  # a tier's
        kind = "mixed (states and taped segments)" \
            if isinstance(self.schedule, (MixedPlan, FixedLeafPlan)) \
            else (f"{tier} (states in {ram} and {where}, taped segments in {ram})"
                  if isinstance(self.schedule.table.inner, MixedInner)
                  else f"{tier} (states in {ram} and {where})") \
            if isinstance(self.schedule, DiskPlan) \
            else "binomial (states only)"
        lines = [f"{kind} plan: {l} steps within {format_bytes(self.memory)}",
                 f"  state {format_bytes(s.state_bytes)}, step tape "
                 f"{format_bytes(s.tape_bytes) if s.tape_bytes else 'not kept'}, working set "
                 f"{format_bytes(s.work_bytes)}",
                 f"  checkpoints       : {self.checkpoints} fit"
                 f"{' (every state)' if self.checkpoints == l else ''}",
                 f"  plain evaluations : {self.plain_steps} ({self.plain_steps / l:.3g} per step)",
                 f"  taped evaluations : {l}",
                 *([f"  {tier:<18}: {self.schedule.disk_writes} writes, "
                    f"{self.schedule.disk_reads} reads of {format_bytes(s.state_bytes)}"]
                   if isinstance(self.schedule, DiskPlan) else
                   [f"  {tier:<18}: {self.disk_note}"] if self.disk else []),
                 *([f"  planner memory    : {format_bytes(self.table_bytes)} (in the budget)"]
                   if self.table_bytes else []),
                 f"  peak bytes        : {format_bytes(self.peak_bytes)} (at most)"]
        # The measured prices, as the command line takes them (--step-seconds, ...): what a
        # preview's reader needs to replay this plan or ask for --max-slowdown.
        times = [f"--{name.replace('_', '-')} {value:.3g}" for name, value in (
            ("step_seconds", s.step_seconds), ("taped_step_seconds", s.taped_step_seconds),
            ("write_seconds", s.write_seconds), ("read_seconds", s.read_seconds))
            if value is not None]
        if times:
            lines.append(f"  step times        : {' '.join(times)}")
        if self.relative_time is not None:
            lines.append(f"  predicted time    : {self.relative_time:.3g}x store-all")
        return "\n".join(lines)


def memory_for(seq_len: int, max_relative_time: float, sizes: Sizes) -> int:
    """The least memory (bytes) whose plan is predicted to cost at most ``max_relative_time``
    times store-all. Needs ``sizes.step_seconds`` and ``sizes.taped_step_seconds``."""
    seq_len = check_positive_int("seq_len", seq_len)
    if not sizes.step_seconds or not sizes.taped_step_seconds:
        raise ValueError("memory_for needs step_seconds and taped_step_seconds (measure them with "
                         "loop.preview(...), or pass them)")
    if isinstance(max_relative_time, bool) or not isinstance(max_relative_time, (int, float)):
        raise TypeError(f"max_relative_time must be a number (times store-all, >= 1); got "
                        f"{short_repr(max_relative_time)} of type {type(max_relative_time).__name__}")
    if not max_relative_time >= 1.0:
        raise ValueError(f"max_relative_time must be >= 1.0 (store-all itself); got "
                         f"{max_relative_time!r}")
    # Cost never rises with memory (more memory only adds choices), so bisect on bytes. At
    # seq_len * state_bytes every state fits: plain steps = first_reverse_start <= seq_len - 1.
    lo = sizes.minimum_memory
    hi = max(lo, sizes.work_bytes + seq_len * max(sizes.state_bytes, sizes.tape_bytes or 0))

    def fits(memory: int) -> bool:
        return BudgetPlan(seq_len, memory, sizes).relative_time <= max_relative_time
    if not fits(hi):
        raise ValueError(f"no memory budget reaches {max_relative_time}x store-all with these "
                         f"step costs; the best is {BudgetPlan(seq_len, hi, sizes).relative_time:.3g}x")
    while hi - lo > max(1, sizes.state_bytes // 64):
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi


def plan(seq_len: int, num_ckpts: int | None = None, *, memory: int | str | None = None,
         state_bytes: int | str | None = None, tape_bytes: int | str | None = None,
         work_bytes: int | str = 0, step_seconds: float | None = None,
         taped_step_seconds: float | None = None) -> Plan | BudgetPlan:
    """The optimal schedule for ``seq_len`` steps: within ``num_ckpts`` stored states, or within
    ``memory`` bytes.

    ``plan(l, s)``: Revolve's binomial schedule holding at most ``s`` states, the initial one
    included (``plan(l, 1)`` recomputes every step from the initial state; ``s >= l`` keeps every
    state). ``plan(l, memory="50MB", state_bytes="256KB", tape_bytes=..., work_bytes=...,
    step_seconds=..., taped_step_seconds=...)``: the best schedule storing states and, if
    ``tape_bytes`` is given, taped segments within the bytes, with predicted evaluations, peak
    bytes and time relative to store-all (a :class:`BudgetPlan`; ``loop.preview`` measures the
    sizes for you). Iterating either yields actions lazily.
    """
    exactly_one_budget(num_ckpts, memory)
    if num_ckpts is not None:
        extra = {k: v for k, v in (("state_bytes", state_bytes), ("tape_bytes", tape_bytes),
                                   ("step_seconds", step_seconds),
                                   ("taped_step_seconds", taped_step_seconds)) if v is not None}
        if extra or work_bytes:
            raise TypeError(f"plan(seq_len, num_ckpts) takes no sizes; got {', '.join(extra)}: "
                            f"pass memory=... to plan within bytes")
        return Plan(seq_len, num_ckpts)
    if state_bytes is None:
        raise TypeError("plan(seq_len, memory=...) needs state_bytes (the bytes of one state); "
                        "loop.preview(params, init_state, inputs) measures it")
    sizes = Sizes(parse_bytes(state_bytes, "state_bytes"),
                  None if tape_bytes is None else parse_bytes(tape_bytes, "tape_bytes"),
                  0 if not work_bytes else parse_bytes(work_bytes, "work_bytes"),
                  _seconds("step_seconds", step_seconds),
                  _seconds("taped_step_seconds", taped_step_seconds))
    return BudgetPlan(seq_len, parse_bytes(memory), sizes)


def _seconds(name: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds; got {short_repr(value)}")
    return float(value)


def io_costs(sizes: Sizes) -> tuple[float, float]:
    """Seconds a disk write and a disk read cost the loop, from the measured sustained times.

    A read is started ahead, during the step or segment before its ``Restore``: one plain step
    of it is credited (a taped step, longer, would hide more). A write is written behind, but is
    priced in full: on the heat-equation benchmark the worker's copies, checksums and page-cache
    traffic slowed the steps beside it by about as much as the overlap saved (see
    ``benchmarks/budget/README.md``)."""
    return sizes.write_seconds, max(0.0, sizes.read_seconds - sizes.step_seconds)
