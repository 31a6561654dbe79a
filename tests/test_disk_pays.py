"""Turning the disk on is never worse than leaving it off (issue 17, item 2).

The planner prices writes and reads by sustained throughput (fsync'ed writes, reads with the page
cache dropped), credits what the background worker overlaps, considers kept tapes beside disk
states, and declines the disk when it does not pay. The store writes behind and reads ahead on a
worker thread; the executor tells it which ``Restore`` comes next.
"""

import concurrent.futures
import os
import threading

import autograd.numpy as np
import numpy
import pytest
from autograd import grad

from bincheck import binomial_checkpoint, simulate
from bincheck.runtime import disk as disk_tier
from bincheck.runtime.disk import DiskStore
from bincheck.runtime.executor import Executor
from bincheck.runtime.store import MemoryStore
from bincheck.schedule.actions import Advance, Free, Reverse
from bincheck.schedule.budget import IO_STATES, BudgetPlan, Sizes
from bincheck.schedule.disk import DiskPlan, MixedInner, RevolveInner
from bincheck.schedule.mixed import MixedPlan
from bincheck.schedule.online import DiskOnlinePlanner, OnlinePlanner
from bincheck.schedule.online_budget import online_planner
from helpers import plain_loop


def heat(a, u, x):
    lap = np.roll(u, 1, 0) + np.roll(u, -1, 0) + np.roll(u, 1, 1) + np.roll(u, -1, 1) - 4 * u
    return u + a * lap + 0.01 * np.sin(u)


U0 = numpy.random.RandomState(0).rand(48, 48)
T = 120
LOSS = lambda run: (lambda a: np.sum(run(a, U0, None) ** 2))

# The issue's reproducer: min-char-rnn's sizes, where disk=True gave 1555 plain steps against
# 1888 without it at 600 kB, and 880 against 999 at 4 MB.
CHAR_RNN = Sizes(state_bytes=1152, tape_bytes=29776, work_bytes=440880, step_seconds=1.65e-5,
                 taped_step_seconds=6.43e-4, write_seconds=2e-5, read_seconds=1e-5)


# ------------------------------------------------------------------------------- the planner
@pytest.mark.parametrize("memory", [600_000, 4_000_000])
def test_issue_reproducer_disk_never_costs_more_than_ram_alone(memory):
    ram, disk = BudgetPlan(1000, memory, CHAR_RNN), BudgetPlan(1000, memory, CHAR_RNN, disk=True)
    assert disk.extra_seconds <= ram.extra_seconds
    assert disk.plain_steps <= ram.plain_steps
    assert disk.peak_bytes <= memory


@pytest.mark.parametrize("write,read", [(1e-6, 1e-6), (2e-3, 1e-3), (2e-2, 1e-2), (1.0, 1.0)])
@pytest.mark.parametrize("memory", [200_000, 450_000, 1_000_000])
@pytest.mark.parametrize("tape", [None, 3_000, 30_000])
def test_disk_plan_is_never_predicted_slower(write, read, memory, tape):
    sizes = Sizes(state_bytes=10_000, tape_bytes=tape, work_bytes=50_000, step_seconds=1e-3,
                  taped_step_seconds=3e-3, write_seconds=write, read_seconds=read)
    ram, disk = BudgetPlan(300, memory, sizes), BudgetPlan(300, memory, sizes, disk=True)
    assert disk.extra_seconds <= ram.extra_seconds
    assert disk.peak_bytes <= memory
    cost = simulate(disk)                        # every action valid, every step reversed
    assert cost.reversed == list(range(299, -1, -1))
    assert cost.plain_steps == disk.plain_steps
    if disk.uses_disk:
        assert disk.disk_note == "used" and cost.disk_writes > 0
        assert cost.peak_checkpoints <= disk.checkpoints
    else:                                        # declined: exactly RAM alone's plan
        assert disk.disk_note.startswith("declined") and list(disk) == list(ram)


def test_slow_disk_is_declined_and_fast_disk_is_used():
    base = dict(state_bytes=10_000, tape_bytes=None, work_bytes=50_000, step_seconds=1e-3,
                taped_step_seconds=3e-3)
    slow = BudgetPlan(300, 200_000, Sizes(**base, write_seconds=0.5, read_seconds=0.5), disk=True)
    fast = BudgetPlan(300, 200_000, Sizes(**base, write_seconds=1e-4, read_seconds=1e-4),
                      disk=True)
    assert not slow.uses_disk and "declined" in str(slow)
    assert fast.uses_disk and fast.plain_steps < slow.plain_steps


def test_reads_ahead_are_credited_one_step_and_writes_are_priced_in_full():
    sizes = Sizes(state_bytes=10_000, tape_bytes=None, work_bytes=50_000, step_seconds=1e-3,
                  taped_step_seconds=3e-3, write_seconds=4e-3, read_seconds=2.5e-3)
    plan = BudgetPlan(300, 200_000, sizes, disk=True)
    assert plan.write_cost == pytest.approx(4e-3) and plan.read_cost == pytest.approx(1.5e-3)
    assert plan.schedule.write_cost == pytest.approx(4.0)        # in plain steps
    assert plan.schedule.read_cost == pytest.approx(1.5)


def test_two_states_in_flight_are_reserved():
    sizes = Sizes(state_bytes=10_000, tape_bytes=None, work_bytes=50_000, step_seconds=1e-3,
                  taped_step_seconds=3e-3, write_seconds=1e-4, read_seconds=1e-4)
    plan = BudgetPlan(300, 200_000, sizes, disk=True)
    assert plan.uses_disk
    assert plan.checkpoints == (150_000 - plan.table_bytes - IO_STATES * 10_000) // 10_000
    assert plan.peak_bytes >= sizes.work_bytes + plan.checkpoints * 10_000 + \
        IO_STATES * 10_000 + plan.table_bytes


def test_disk_planner_keeps_taped_segments_where_they_pay():
    """With tapes small enough to keep, the RAM part of the disk plan is the mixed policy: it
    costs less than the states-only disk plan and than the mixed plan in RAM alone."""
    sizes = Sizes(state_bytes=10_000, tape_bytes=11_000, work_bytes=50_000, step_seconds=1e-3,
                  taped_step_seconds=3e-3, write_seconds=1.5e-3, read_seconds=1e-4)
    plan = BudgetPlan(400, 300_000, sizes, disk=True)
    assert plan.uses_disk and isinstance(plan.schedule.table.inner, MixedInner)
    assert "taped segments in RAM" in str(plan)
    ram = BudgetPlan(400, 300_000, sizes)
    states_only = DiskPlan(400, plan.checkpoints, plan.schedule.write_cost,
                           plan.schedule.read_cost)
    assert plan.schedule.cost < states_only.cost
    assert plan.extra_seconds < ram.extra_seconds
    cost = simulate(plan)
    assert cost.reversed == list(range(399, -1, -1)) and cost.plain_steps == plan.plain_steps
    # a segment longer than one step is taped whole somewhere, and the disk is used
    assert any(type(a) is Reverse and a.stop - a.start > 1 for a in plan)
    assert cost.disk_writes > 0
    # where the first sweep stops is the first Reverse's start, whatever the RAM part
    first = next(a for a in plan if type(a) is Reverse)
    assert plan.first_reverse_start == plan.schedule.first_reverse_start == first.start


@pytest.mark.parametrize("n", [1, 2, 7, 40, 150])
def test_mixed_inner_costs_what_its_actions_do(n):
    mixed = MixedPlan(200, 60_000, 10_000, 12_000)
    inner = MixedInner(mixed.table, mixed.top, 6)
    assert inner.cost(n) <= RevolveInner(6).cost(n)
    for stored in (False, True):
        actions = list(inner.actions_stored(n, 5) if stored else inner.actions(n, 5))
        plain = sum(a.stop - a.start for a in actions if type(a) is Advance)
        assert plain == inner.cost(n)
        assert sorted(s for a in actions if type(a) is Reverse
                      for s in range(a.start, a.stop)) == list(range(5, 5 + n))
        if stored:                               # the snapshot it was given is freed
            assert Free(5) in actions
    assert mixed.table.dp_rows == 0              # closed forms only: no exact-DP row built


# ------------------------------------------------------------------------------- the pricing
def test_price_is_measured_on_synced_writes_and_uncached_reads(tmp_path, monkeypatch):
    synced, dropped = [], []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    monkeypatch.setattr(disk_tier, "_drop_cache", lambda name: dropped.append(name))
    state = numpy.zeros(2**18)                   # 2 MiB: 16 files (32 MiB)
    write, read = disk_tier.disk_seconds(state, str(tmp_path))
    assert len(synced) == len(dropped) == 16
    assert write > 0 and read > 0
    synced.clear()
    disk_tier.disk_seconds(numpy.zeros(2**23), str(tmp_path))   # 64 MiB: two files at least
    assert len(synced) == 2
    synced.clear()
    disk_tier.disk_seconds(numpy.zeros(16), str(tmp_path))      # 128 B: as many as allowed
    assert len(synced) == disk_tier.PROBE_MAX_FILES
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------ the store's worker thread
def test_put_returns_before_the_write_and_copies_what_it_writes(tmp_path, monkeypatch):
    gate, real_save = threading.Event(), numpy.save
    monkeypatch.setattr(numpy, "save", lambda *a, **k: (gate.wait(10), real_save(*a, **k))[1])
    store = DiskStore(str(tmp_path), background=True)
    try:
        state = numpy.arange(6.0)
        store.put(3, state)                      # returns with the write still held back
        state[:] = -1.0                          # the caller's array changes afterwards
        assert not store._writing.done()
        gate.set()
        numpy.testing.assert_array_equal(store.get(3), numpy.arange(6.0))
        assert store.io_seconds > 0
    finally:
        gate.set()
        store.close()
    assert os.listdir(tmp_path) == []


def test_a_background_write_error_is_raised_not_lost(tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")
    store = DiskStore(str(tmp_path), background=True)
    try:
        monkeypatch.setattr(numpy, "save", full)
        store.put(0, numpy.ones(4))
        with pytest.raises(OSError, match="could not write snapshot file"):
            store.get(0)
    finally:
        store.close()
    assert os.listdir(tmp_path) == []


def test_a_failed_write_is_raised_by_the_next_call_once_it_has_failed(tmp_path, monkeypatch):
    """Not only by a call that needs that snapshot: by any call after the failure."""
    real_save = numpy.save
    store = DiskStore(str(tmp_path), background=True)
    try:
        store.put(0, numpy.ones(4))
        concurrent.futures.wait([store._writing])
        monkeypatch.setattr(numpy, "save", lambda *a, **k: (_ for _ in ()).throw(
            OSError(28, "No space left on device")))
        store.put(1, numpy.ones(4))
        concurrent.futures.wait([store._writing])
        monkeypatch.setattr(numpy, "save", real_save)
        with pytest.raises(OSError, match="1-0.npy"):
            store.get(0)                         # snapshot 0 is fine; the failure of 1 is told
    finally:
        store.close()
    assert os.listdir(tmp_path) == []


def test_prefetched_snapshot_is_read_on_the_worker(tmp_path):
    store = DiskStore(str(tmp_path), background=True)
    try:
        store.put(0, numpy.ones(5))
        store.put(1, numpy.full(5, 2.0))
        store.prefetch(0)
        assert store._ahead is not None and store._ahead[0] == 0
        numpy.testing.assert_array_equal(store.get(0), numpy.ones(5))
        assert store._ahead is None
        store.prefetch(1)
        store.pop(1)                             # a prefetch of a freed snapshot is dropped
        assert store._ahead is None and 1 not in store
    finally:
        store.close()


class Recorder:
    """A stepper and a store's prefetch log, in the order things happen."""

    def __init__(self):
        self.log = []

    def advance(self, state, start, stop):
        self.log.append(("advance", start))
        return stop

    def reverse(self, state, start, stop):
        self.log.append(("reverse", start))


@pytest.mark.parametrize("n,cm,w,r", [(60, 3, 2.0, 1.0), (200, 4, 1.0, 0.5), (90, 2, 0.3, 0.1)])
def test_every_disk_read_is_started_before_the_computation_that_precedes_it(tmp_path, n, cm,
                                                                            w, r):
    plan = DiskPlan(n, cm, w, r)
    rec = Recorder()
    store = MemoryStore(DiskStore(str(tmp_path), background=True))
    real = store.disk.prefetch
    store.disk.prefetch = lambda i: (rec.log.append(("prefetch", i)), real(i))[1]
    restores = []
    real_get = store.disk.get
    store.disk.get = lambda i: (rec.log.append(("restore", i)), restores.append(i),
                                real_get(i))[2]
    try:
        executor = Executor(n, 0, store)
        actions = iter(plan)
        first = executor.run(actions, rec, until=Reverse)
        executor.run([first], rec)
        executor.run(actions, rec)
        executor.tracker.finish()
    finally:
        store.disk.close()
    assert restores and plan.disk_reads == len(restores)
    log = rec.log
    for k, event in enumerate(log):
        if event[0] == "restore":
            # the computation just before it ran after its prefetch was issued
            last = max(j for j in range(k) if log[j][0] in ("advance", "reverse"))
            assert ("prefetch", event[1]) in log[:last]


def test_while_loop_budget_too_small_for_the_disk_warns_and_keeps_ram():
    sizes = Sizes(state_bytes=10_000, tape_bytes=None, work_bytes=50_000, step_seconds=1e-3,
                  taped_step_seconds=3e-3, write_seconds=1e-4, read_seconds=1e-4)
    with pytest.warns(RuntimeWarning, match="second tier .disk=, offload=. is not used"):
        states, planner = online_planner(75_000, sizes, disk=True)
    assert states == 2 and isinstance(planner, OnlinePlanner)
    states, planner = online_planner(95_000, sizes, disk=True)       # 4 states: 2 in flight
    assert states == 4 - IO_STATES and isinstance(planner, DiskOnlinePlanner)


def test_reads_ahead_only_with_a_disk():
    assert not MemoryStore().reads_ahead
    assert not MemoryStore(DiskStore(None, background=False)).reads_ahead


# --------------------------------------------------------------------------- through a loop
def test_a_declined_disk_creates_no_directory_and_gives_the_same_gradient(tmp_path, monkeypatch):
    monkeypatch.setattr(disk_tier, "disk_seconds", lambda *args, **kwargs: (10.0, 10.0))
    loop = binomial_checkpoint(heat, T, memory="600kB", disk=str(tmp_path))
    plan = loop.preview(0.1, U0, None)
    assert not plan.uses_disk and plan.disk_note.startswith("declined")
    ram = binomial_checkpoint(heat, T, memory="600kB")
    g = grad(LOSS(loop))(0.1)
    assert g == pytest.approx(grad(LOSS(lambda a, u, x: plain_loop(heat, a, u, x, T)))(0.1),
                              rel=1e-12)
    assert g == grad(LOSS(ram))(0.1)
    assert loop.stats.plain_steps == ram.stats.plain_steps
    assert loop.stats.disk_bytes_written == 0 and loop.stats.disk_io_seconds == 0
    assert os.listdir(tmp_path) == []


def test_loop_reports_its_io_time_and_overlap(tmp_path, cheap_disk):
    loop = binomial_checkpoint(heat, T, memory="600kB", disk=str(tmp_path))
    assert loop.preview(0.1, U0, None).uses_disk
    grad(LOSS(loop))(0.1)
    st = loop.stats
    assert st.disk_bytes_written > 0 and st.disk_io_seconds > 0
    assert 0 <= st.disk_wait_seconds and 0.0 <= st.disk_overlap <= 1.0
    assert os.listdir(tmp_path) == []
