"""bincheck.torch's disk tier: raw bytes with a CRC (no pickle; bfloat16 round-trips), exact
gradients, files private and removed after success, errors and interrupts."""

import os

import pytest

torch = pytest.importorskip("torch")
import bincheck.torch as bt  # noqa: E402
from bincheck.runtime.disk import CorruptSnapshotError, DiskStore  # noqa: E402
from bincheck.torch.store import TENSORS  # noqa: E402
from torch_helpers import assert_close, plain_loop, problem, requiring, tanh_cell  # noqa: E402

# The disk is priced as free so that the planner uses it: these tests check the store.
pytestmark = pytest.mark.usefixtures("cheap_disk")

T = 60


def test_codec_round_trips_dtypes_numpy_lacks(tmp_path):
    store = DiskStore(str(tmp_path), TENSORS)
    state = {"h": torch.randn(3, 4).to(torch.bfloat16), "n": torch.arange(5),
             "z": torch.tensor(2.5, dtype=torch.float64), "b": torch.tensor([True, False]),
             "view": torch.randn(4, 6)[:, ::2]}
    store.put(0, state)
    back = store.get(0)
    for k, v in state.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape
        assert torch.equal(back[k], v), k
    files = os.listdir(store.path)
    assert files and all(f.endswith(".npy") for f in files)
    name = os.path.join(store.path, files[0])
    with open(name, "r+b") as f:                  # flip one byte of data
        f.seek(-1, os.SEEK_END)
        byte = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CorruptSnapshotError):
        store.get(0)
    store.close()
    assert not os.path.exists(store.path)


def disk_problem():
    params, h0, xs = problem(T, B=16, H=32, I=4)
    return requiring(*params), h0, xs


def test_disk_gradient_is_exact_and_leaves_nothing_behind(tmp_path):
    leaves, h0, xs = disk_problem()
    loop = bt.binomial_checkpoint(tanh_cell, T, memory="80kB", disk=str(tmp_path))
    plan = loop.preview(tuple(leaves), h0, xs)
    assert plan.schedule.disk_writes > 0, str(plan)     # the budget forces states to disk
    got = torch.autograd.grad(loop(tuple(leaves), h0, xs).pow(2).sum(), leaves)
    want = torch.autograd.grad(plain_loop(tanh_cell, tuple(leaves), h0, xs, T).pow(2).sum(),
                               leaves)
    assert_close(got, want)
    assert loop.stats.disk_bytes_written > 0 and loop.stats.disk_bytes_read > 0
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("error", [KeyboardInterrupt, ValueError])
def test_files_are_removed_after_an_error_in_the_backward(tmp_path, error):
    leaves, h0, xs = disk_problem()
    calls = []

    def failing(p, h, x):
        calls.append(1)
        if len(calls) == T + 10:           # the forward (with the probe) made T + 4
            raise error("stop")
        return tanh_cell(p, h, x)
    loop = bt.binomial_checkpoint(failing, T, memory="80kB", disk=str(tmp_path))
    out = loop(tuple(leaves), h0, xs)
    assert os.listdir(tmp_path)                   # the call's private directory exists
    with pytest.raises(error):
        out.sum().backward()
    assert os.listdir(tmp_path) == []


def test_disk_needs_memory():
    with pytest.raises(TypeError, match="disk=... needs memory"):
        bt.binomial_checkpoint(tanh_cell, T, 4, disk=True)
