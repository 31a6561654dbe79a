"""checkpoint_program(..., memory=..., disk=...): a disk tier for any program (issue 30)."""

import os
import tracemalloc

import autograd.numpy as np
import numpy
import pytest
from autograd import grad
from autograd.extend import defvjp, primitive

import bincheck.runtime.disk as disk_tier
from bincheck import checkpoint_program

rng = numpy.random.RandomState(1)
Y, W = rng.rand(2000), 0.9          # a 16 kB state
STEPS = 300
calls = {"n": 0, "fail_at": None, "error": None, "dir": None, "files": None}


@primitive
def counted(x):
    """The identity, counting its evaluations; raises ``error`` at evaluation ``fail_at``."""
    calls["n"] += 1
    if calls["n"] == calls["fail_at"]:
        calls["files"] = sum(len(files) for _, _, files in os.walk(calls["dir"]))
        raise calls["error"]
    return x


defvjp(counted, lambda ans, x: lambda g: g)


def f(y, w):
    for _ in range(STEPS):
        y = counted(np.sin(y * w + 0.1))
    return np.sum(y)


def close(a, b):
    for u, v in zip(a, b):
        numpy.testing.assert_allclose(u, v, rtol=1e-12, atol=1e-14)


@pytest.fixture
def free_disk(monkeypatch):
    """A disk whose writes and reads cost nothing: the disk plan always pays."""
    measured = []
    monkeypatch.setattr(disk_tier, "disk_seconds",
                        lambda state, base: (measured.append(base), (0.0, 0.0))[1])
    return measured


def test_with_a_disk_the_gradient_is_exact_and_every_file_goes(tmp_path, free_disk):
    want = grad(f, (0, 1))(Y, W)
    g = checkpoint_program(f, memory=800_000, disk=str(tmp_path))
    assert g.preview(Y, W).uses_disk
    tracemalloc.start()
    try:
        got = grad(g, (0, 1))(Y, W)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    close(got, want)
    st = g.stats
    assert st.disk_bytes_written > 0 and st.disk_bytes_read > 0, st
    assert peak <= 800_000, peak
    assert os.listdir(tmp_path) == []
    # the disk was measured once for the program's snapshot size, not per gradient
    grad(g, (0, 1))(Y, W)
    assert free_disk == [str(tmp_path)] * len(free_disk) and len(free_disk) == 1


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()])
def test_an_error_mid_gradient_leaves_no_file(tmp_path, free_disk, error):
    g = checkpoint_program(f, memory=800_000, disk=str(tmp_path))
    # in the replay, past the forward, with snapshots on disk
    calls.update(n=0, fail_at=STEPS + STEPS // 2, error=error, dir=str(tmp_path))
    try:
        with pytest.raises(type(error)):
            grad(g, (0, 1))(Y, W)
    finally:
        calls.update(fail_at=None)
    assert calls["files"] > 0 and os.listdir(tmp_path) == []
    close(grad(g, (0, 1))(Y, W), grad(f, (0, 1))(Y, W))     # the program is still usable


def test_a_disk_that_does_not_pay_is_declined_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(disk_tier, "disk_seconds", lambda state, base: (10.0, 10.0))
    made = []
    real = disk_tier.DiskStore.__init__
    monkeypatch.setattr(disk_tier.DiskStore, "__init__",
                        lambda self, *a, **k: (made.append(1), real(self, *a, **k))[1])
    g = checkpoint_program(f, memory=800_000, disk=str(tmp_path))
    assert not g.preview(Y, W).uses_disk
    close(grad(g, (0, 1))(Y, W), grad(f, (0, 1))(Y, W))
    assert g.stats.disk_bytes_written == 0 and made == [] and os.listdir(tmp_path) == []


def test_disk_arguments_are_checked(tmp_path):
    with pytest.raises(TypeError, match="disk=... needs memory="):
        checkpoint_program(f, num_ckpts=4, disk=True)
    with pytest.raises(FileNotFoundError, match="no such directory"):
        checkpoint_program(f, memory=800_000, disk=str(tmp_path / "missing"))
    with pytest.raises(TypeError, match="disk must be None, True"):
        checkpoint_program(f, memory=800_000, disk=3)
    assert "disk=True" in repr(checkpoint_program(f, memory=800_000, disk=True))


# ---------------------------------------------------------------- the plan (framework-free)
def _walk(plan, n):
    from bincheck.schedule.simulate import Tracker
    tracker = Tracker(n)
    for action in plan:
        tracker.apply(action)
    tracker.finish()                   # every stage reversed once, last first
    return tracker


@pytest.mark.parametrize("seed", range(6))
def test_grouped_disk_plans_are_valid_and_counted_on_random_chains(seed):
    from bincheck.schedule.chain import Chain
    from bincheck.schedule.disk import DiskPlan, GroupedDisk
    r = numpy.random.RandomState(seed)
    n = int(r.randint(40, 400))
    plain = r.rand(n) + 0.1
    cuts = r.randint(1, 1000, n + 1)
    chain = Chain(plain, 3 * plain, r.randint(1, 500, n), cuts, 10_000)
    memory = 10_000 + 5_000 + int(r.randint(5, 40)) * 1000
    plan = GroupedDisk.best(chain, memory, write_seconds=0.5, read_seconds=0.5)
    assert plan is not None
    tracker = _walk(plan, n)
    assert tracker.plain_steps == plan.plain_stages and tracker.taped_steps == n
    assert tracker.peak_checkpoints <= plan.slots
    assert (tracker.disk_writes, tracker.disk_reads) == (plan.disk_writes, plan.disk_reads)
    # on its groups it is Disk-Revolve's optimum (tested against exhaustive search elsewhere)
    assert plan.plan.plain_steps == DiskPlan(plan.stages, plan.slots, plan.plan.write_cost,
                                             plan.plan.read_cost).plain_steps
    # the RAM bytes it holds: stored snapshots at its boundaries, within its predicted peak
    bounds, held, ram = plan.bounds, 0, set()
    for action in plan:
        if type(action).__name__ == "Snapshot" and action.storage == "ram":
            ram.add(action.index)
        elif type(action).__name__ == "Free":
            ram.discard(action.index)
        held = max(held, sum(int(cuts[c]) for c in ram))
        assert all(c in bounds for c in ram)
    assert chain.work + held <= plan.peak_bytes


def test_a_uniform_chain_in_as_many_groups_as_stages_is_disk_revolve():
    from bincheck.schedule.chain import Chain
    from bincheck.schedule.disk import DiskPlan, GroupedDisk
    n = 30
    chain = Chain(numpy.ones(n), 3 * numpy.ones(n), numpy.ones(n, int),
                  numpy.full(n + 1, 100), 0)
    plan = GroupedDisk(chain, 100 * 12 + 1 + 4 * 8 * 31 + 100, n, 2.0, 3.0)
    want = DiskPlan(n, plan.slots, 2.0, 2.0)        # a read ahead hides one step
    assert plan.bounds == list(range(n + 1))
    assert [repr(a) for a in plan] == [repr(a) for a in want]
    assert plan.seconds == pytest.approx(want.cost + 3 * n)
