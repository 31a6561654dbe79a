"""The disk tier: optimal plans (exhaustive search), exact gradients, and the reliability clauses —
files removed when freed and after success, errors and interrupts; clear OSErrors; corruption
detected; numeric arrays only, dtypes and integers exact."""

import errno
import heapq
import itertools
import os

import autograd.numpy as np
import numpy
import pytest
from autograd import grad, make_vjp

from bincheck import binomial_checkpoint, checkpointed_while_loop, simulate
from bincheck.runtime.disk import CorruptSnapshotError, DiskStore
from bincheck.schedule.binomial import optimal_plain_steps
from bincheck.schedule.disk import DiskPlan
from bincheck.schedule.online import DiskOnlinePlanner
from helpers import drive_online, plain_loop, plain_while

# These tests check the disk store (files, checksums, cleanup): the disk is priced as free so
# that the planner uses it; whether it pays is tested in test_disk_pays.py.
pytestmark = pytest.mark.usefixtures("cheap_disk")


def brute(n, cm, w, r):
    """Least plain steps + w * writes + r * reads to reverse n steps, over every action sequence
    (any state may be kept in RAM, at most cm of them, and/or on disk), by Dijkstra."""
    start = (0, frozenset(), frozenset(), n)
    dist, queue, tie = {start: 0.0}, [(0.0, 0, start)], itertools.count()
    while queue:
        d, _, st = heapq.heappop(queue)
        if d > dist[st]:
            continue
        live, ram, disk, f = st
        if f == 0:
            return d
        moves = []
        if live >= 0:
            if live < f - 1:
                moves.append((1.0, (live + 1, ram, disk, f)))
            elif live == f - 1:
                moves.append((0.0, (-1, ram, disk, f - 1)))       # tape the last step
            if live not in ram and len(ram) < cm:
                moves.append((0.0, (live, ram | {live}, disk, f)))
            if live not in disk:
                moves.append((w, (live, ram, disk | {live}, f)))
        for k in ram:
            moves += [(0.0, (k, ram, disk, f))] if k < f else []
            moves.append((0.0, (live, ram - {k}, disk, f)))
        for k in disk:
            moves += [(r, (k, ram, disk, f))] if k < f else []
            moves.append((0.0, (live, ram, disk - {k}, f)))
        for c, nxt in moves:
            if d + c < dist.get(nxt, float("inf")) - 1e-12:
                dist[nxt] = d + c
                heapq.heappush(queue, (d + c, next(tie), nxt))


COSTS = [(0.5, 0.5), (1.0, 1.0), (2.0, 0.5), (0.3, 2.0), (5.0, 5.0)]


@pytest.mark.parametrize("w,r", COSTS)
def test_disk_plan_is_optimal_against_exhaustive_search(w, r):
    for n in range(1, 8):
        for cm in (1, 2):
            plan = DiskPlan(n, cm, w, r)
            cost = simulate(plan)
            total = cost.plain_steps + w * cost.disk_writes + r * cost.disk_reads
            assert cost.reversed == list(range(n - 1, -1, -1))
            assert cost.peak_checkpoints <= cm
            assert total == pytest.approx(plan.cost) == pytest.approx(brute(n, cm, w, r))


@pytest.mark.parametrize("n,cm", [(50, 2), (200, 3), (1000, 5)])
def test_disk_plan_valid_and_never_worse_than_ram_only(n, cm):
    for w, r in COSTS + [(1e9, 1e9)]:
        plan = DiskPlan(n, cm, w, r)
        cost = simulate(plan)
        assert cost.reversed == list(range(n - 1, -1, -1)) and cost.peak_checkpoints <= cm
        total = cost.plain_steps + w * cost.disk_writes + r * cost.disk_reads
        assert total == pytest.approx(plan.cost) and total <= optimal_plain_steps(n, cm)
        if w == 1e9:
            assert (cost.disk_writes, cost.plain_steps) == (0, optimal_plain_steps(n, cm))
    assert simulate(DiskPlan(1000, 5, 0.5, 0.5)).disk_writes > 0   # cheap disk is used


def test_online_disk_planner_streams():
    for cm, period in [(1, 1), (2, 3), (3, 10)]:
        for n in list(range(0, 30)) + [101]:
            planner = DiskOnlinePlanner(cm, period)
            tracker, _ = drive_online(planner, n)
            assert tracker.reversed == list(range(n - 1, -1, -1))
            assert tracker.peak_checkpoints <= cm
            assert tracker.plain_steps + (1 if n else 0) == n + planner.predicted_reverse_steps(n)


def heat(a, u, x):
    lap = np.roll(u, 1, 0) + np.roll(u, -1, 0) + np.roll(u, 1, 1) + np.roll(u, -1, 1) - 4 * u
    return u + a * lap + 0.01 * np.sin(u)


U0 = numpy.random.RandomState(0).rand(48, 48)
T = 120
LOSS = lambda run: (lambda a: np.sum(run(a, U0, None) ** 2))


def test_gradient_with_disk_matches_and_cleans_up(tmp_path):
    loop = binomial_checkpoint(heat, T, memory="600kB", disk=str(tmp_path))
    plan = loop.preview(0.1, U0, None)
    assert plan.schedule.disk_writes > 0                         # RAM alone is too small
    g = grad(LOSS(loop))(0.1)
    assert g == pytest.approx(grad(LOSS(lambda a, u, x: plain_loop(heat, a, u, x, T)))(0.1),
                              rel=1e-12)
    assert os.listdir(tmp_path) == []
    st = loop.stats
    assert st.disk_bytes_written == plan.schedule.disk_writes * U0.nbytes
    assert st.disk_bytes_read == plan.schedule.disk_reads * U0.nbytes
    assert st.plain_steps == plan.plain_steps and st.peak_snapshots <= plan.checkpoints


def test_while_loop_with_disk(tmp_path):
    cond = lambda a, st: st[0] < 90
    body = lambda a, st: (st[0] + 1, heat(a, st[1], None))
    run = checkpointed_while_loop(cond, body, memory="600kB", disk=str(tmp_path))
    g = grad(lambda a: np.sum(run(a, (0, U0))[1] ** 2))(0.1)
    g0 = grad(lambda a: np.sum(plain_while(cond, body)(a, (0, U0))[1] ** 2))(0.1)
    assert g == pytest.approx(g0, rel=1e-12)
    assert run.stats.disk_bytes_written > 0 and os.listdir(tmp_path) == []


class Boom(Exception):
    pass


def failing_at(evaluation, exc=Boom):
    calls = [0]

    def step(a, u, x):
        calls[0] += 1
        if calls[0] == evaluation:
            raise exc("step failed")
        return heat(a, u, x)
    return step


@pytest.mark.parametrize("exc", [Boom, KeyboardInterrupt])
@pytest.mark.parametrize("when", ["forward", "reverse"])
def test_directory_removed_after_an_error(tmp_path, exc, when):
    probe_and_forward = 4 + T                  # the probe's four evaluations, then the forward
    evaluation = 4 + T // 2 if when == "forward" else probe_and_forward + 5
    loop = binomial_checkpoint(failing_at(evaluation, exc), T, memory="600kB",
                               disk=str(tmp_path))
    with pytest.raises(exc):
        grad(LOSS(loop))(0.1)
    assert os.listdir(tmp_path) == []


def test_files_removed_as_snapshots_are_freed(tmp_path):
    loop = binomial_checkpoint(heat, T, memory="600kB", disk=str(tmp_path))
    loop.preview(0.1, U0, None)
    vjp, _ = make_vjp(LOSS(loop))(0.1)
    (folder,) = os.listdir(tmp_path)
    held = len(os.listdir(tmp_path / folder))
    assert 0 < held <= loop.plan.schedule.disk_writes
    vjp(1.0)
    assert os.listdir(tmp_path) == []


def test_unusable_directories_raise_an_oserror_naming_the_path(tmp_path, monkeypatch):
    missing = tmp_path / "no-such-dir"
    with pytest.raises(OSError, match="no-such-dir"):
        grad(LOSS(binomial_checkpoint(heat, T, memory="600kB", disk=str(missing))))(0.1)

    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")
    monkeypatch.setattr("tempfile.mkdtemp", refuse)
    with pytest.raises(OSError, match=f"could not create a snapshot directory in .*"
                                      f"{tmp_path.name}.*Permission denied"):
        grad(LOSS(binomial_checkpoint(heat, T, memory="600kB", disk=str(tmp_path))))(0.1)


def test_full_disk_raises_naming_the_file_and_leaves_nothing(tmp_path, monkeypatch):
    loop = binomial_checkpoint(heat, T, memory="600kB", disk=str(tmp_path))
    loop.preview(0.1, U0, None)
    real_save, writes = numpy.save, [0]

    def save(f, array, allow_pickle=True):
        writes[0] += 1
        if writes[0] == 3:
            f.write(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(f, array, allow_pickle=allow_pickle)
    monkeypatch.setattr(numpy, "save", save)
    with pytest.raises(OSError, match=r"could not write snapshot file .*\.npy.*No space left"):
        grad(LOSS(loop))(0.1)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupted_snapshot_is_detected(tmp_path, damage):
    loop = binomial_checkpoint(heat, T, memory="600kB", disk=str(tmp_path))
    loop.preview(0.1, U0, None)
    vjp, _ = make_vjp(LOSS(loop))(0.1)
    (folder,) = os.listdir(tmp_path)
    victim = tmp_path / folder / sorted(os.listdir(tmp_path / folder))[0]
    data = bytearray(victim.read_bytes())
    if damage == "truncate":
        data = data[:-100]
    else:
        data[-10] ^= 0xFF                      # one byte of the array's data
    victim.write_bytes(bytes(data))
    with pytest.raises(CorruptSnapshotError, match=victim.name):
        vjp(1.0)
    assert os.listdir(tmp_path) == []


def test_store_round_trips_dtypes_integers_and_python_scalars(tmp_path):
    store = DiskStore(str(tmp_path))
    state = {"f32": numpy.linspace(0, 1, 7, dtype=numpy.float32), "i64": numpy.arange(5) * 2**40,
             "u8": numpy.arange(3, dtype=numpy.uint8), "n": 7, "t": 0.25, "c": 1 + 2j,
             "b": numpy.array([True, False]), "flag": True, "zero_d": numpy.array(0.5),
             "np_int": numpy.int64(2**50 + 1), "np_f32": numpy.float32(1.5),
             "strided": numpy.arange(12.0).reshape(3, 4)[:, ::2]}
    store.put(3, state)
    back = store.get(3)
    for k, v in state.items():
        assert type(back[k]) is type(v), k
        assert numpy.shape(back[k]) == numpy.shape(v), k
        if isinstance(v, (numpy.ndarray, numpy.generic)):
            assert back[k].dtype == v.dtype, k
        if isinstance(v, numpy.ndarray):
            assert not back[k].flags.writeable
        numpy.testing.assert_array_equal(back[k], v)
    with pytest.raises(TypeError, match="only numeric arrays go to disk.*dtype object"):
        store.put(4, (numpy.array([object()]),))
    store.close()
    assert os.listdir(tmp_path) == []


def test_disk_needs_memory_and_a_sensible_value():
    with pytest.raises(TypeError, match=r"disk=\.\.\. needs memory=\.\.\."):
        binomial_checkpoint(heat, 10, 3, disk=True)
    with pytest.raises(TypeError, match="disk must be None, True .* or a directory path"):
        binomial_checkpoint(heat, 10, memory="1MB", disk=3)


def test_zero_d_and_numpy_scalar_state_leaves_through_disk(tmp_path):
    """0-d arrays and numpy scalars keep their shape: the cotangent of a 0-d initial state is 0-d,
    and an in-place counter update on a numpy integer is legal."""
    def step(a, st, x):
        t, k, u = st
        k += 1                                    # rebinds: numpy scalars are immutable
        return (t + 0.5, k, heat(a * t, u, None))
    st0 = (numpy.array(0.1), numpy.int64(0), U0)
    loop = binomial_checkpoint(step, 60, memory="600kB", disk=str(tmp_path))
    f = lambda run: (lambda a, t0: np.sum(run(a, (t0, st0[1], U0), None)[2] ** 2))
    g = grad(f(loop), (0, 1))(0.1, st0[0])
    g0 = grad(f(lambda a, st, x: plain_loop(step, a, st, x, 60)), (0, 1))(0.1, st0[0])
    assert numpy.shape(g[1]) == ()
    assert loop.stats.disk_bytes_written > 0
    numpy.testing.assert_allclose(g, g0, rtol=1e-12)


def test_forward_mode_writes_no_snapshots(tmp_path):
    """make_jvp through disk loops: no VJP can follow, so nothing goes to disk (review finding)."""
    from autograd import make_jvp
    cond = lambda a, st: st[0] < 40
    body = lambda a, st: (st[0] + 1, heat(a, st[1], None))
    run = checkpointed_while_loop(cond, body, memory="600kB", disk=str(tmp_path))
    written = []
    real_put = DiskStore.put

    def put(self, index, state):
        written.append(index)
        return real_put(self, index, state)
    DiskStore.put = put
    try:
        make_jvp(lambda a: np.sum(run(a, (0, U0))[1]))(0.1)(1.0)
        loop = binomial_checkpoint(heat, 40, memory="600kB", disk=str(tmp_path))
        make_jvp(lambda a: np.sum(loop(a, U0, None)))(0.1)(1.0)
        assert written == []                 # no snapshot: the probes' timing uses no put
        grad(lambda a: np.sum(loop(a, U0, None)))(0.1)
    finally:
        DiskStore.put = real_put
    assert written                           # a gradient of the same loop does write
    assert os.listdir(tmp_path) == []


def test_memory_store_without_disk_names_a_missing_checkpoint():
    from bincheck.runtime.store import MemoryStore
    store = MemoryStore()
    store.put(0, numpy.ones(3))
    assert store.get(0).sum() == 3 and 0 in store and 5 not in store
    for op in (store.get, store.pop):
        with pytest.raises(KeyError, match="no checkpoint of state 5"):
            op(5)
