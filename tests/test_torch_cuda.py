"""bincheck.torch on a CUDA device: exact gradients, the RNG of the device kept with each
snapshot, and ``offload=True`` with its real copier (pinned host memory, a side stream, the next
restore prefetched), its budget held under ``torch.cuda.max_memory_allocated``.

These tests need a GPU. They carry the ``cuda`` marker, which the default run deselects (CI has no
GPU; see setup.cfg); run them with ``pytest -m cuda`` on a machine with one, where a missing
device is an error, not a skip.
"""

import pytest

torch = pytest.importorskip("torch")
import bincheck.torch as bt  # noqa: E402
from bincheck.torch.offload import CudaCopies, HostTier  # noqa: E402
from torch_helpers import assert_close, plain_loop, problem, requiring, tanh_cell  # noqa: E402

pytestmark = pytest.mark.cuda
T = 120


@pytest.fixture(autouse=True)
def cuda():
    assert torch.cuda.is_available(), "the cuda tests need a CUDA device (pytest -m cuda)"
    return torch.device("cuda")


def cuda_problem(B=64, H=256, I=16):
    params, h0, xs = problem(T, B=B, H=H, I=I)
    return requiring(*(p.cuda() for p in params)), h0.cuda(), xs.cuda()


def dropout_cell(params, h, x):
    return torch.nn.functional.dropout(tanh_cell(params, h, x), 0.2, training=True)


@pytest.mark.parametrize("cell", [tanh_cell, dropout_cell])
def test_cuda_gradient_is_exact(cell):
    leaves, h0, xs = cuda_problem()
    loop = bt.binomial_checkpoint(cell, T, 6)
    torch.manual_seed(1)
    got = torch.autograd.grad(loop(tuple(leaves), h0, xs).pow(2).sum(), leaves)
    torch.manual_seed(1)
    want = torch.autograd.grad(plain_loop(cell, tuple(leaves), h0, xs, T).pow(2).sum(), leaves)
    assert_close(got, want)
    assert loop.stats.plain_steps == loop.plan.plain_steps


def test_gru_module_on_cuda():
    cell = torch.nn.GRUCell(16, 128).double().cuda()
    h0 = torch.randn(8, 128, dtype=torch.float64, device="cuda")
    xs = torch.randn(T, 8, 16, dtype=torch.float64, device="cuda")
    loop = bt.binomial_checkpoint(lambda c, h, x: c(x, h), T, 5)
    loop(cell, h0, xs).pow(2).sum().backward()
    got = [p.grad.clone() for p in cell.parameters()]
    cell.zero_grad()
    plain_loop(lambda c, h, x: c(x, h), cell, h0, xs, T).pow(2).sum().backward()
    assert_close(got, [p.grad for p in cell.parameters()])


def test_offload_is_exact_prefetches_and_holds_the_device_budget():
    leaves, h0, xs = cuda_problem()
    state_bytes = h0.numel() * h0.element_size()
    probe = bt.binomial_checkpoint(tanh_cell, T, memory="1GB")
    minimum = probe.preview(tuple(leaves), h0, xs).sizes.minimum_memory
    memory = minimum + 4 * state_bytes
    loop = bt.binomial_checkpoint(tanh_cell, T, memory=memory, offload=True)
    plan = loop.preview(tuple(leaves), h0, xs)
    assert plan.uses_disk and plan.schedule.disk_writes > 0, str(plan)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    got = torch.autograd.grad(loop(tuple(leaves), h0, xs).pow(2).sum(), leaves)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    want = torch.autograd.grad(plain_loop(tanh_cell, tuple(leaves), h0, xs, T).pow(2).sum(),
                               leaves)
    assert_close(got, want)
    st = loop.stats
    assert st.offload_bytes_written == plan.schedule.disk_writes * state_bytes
    assert st.offload_prefetched == plan.schedule.disk_reads
    grad_bytes = sum(p.numel() * p.element_size() for p in leaves)
    assert peak - grad_bytes <= memory, (peak - grad_bytes, memory, str(plan))


def test_host_tier_copies_through_pinned_memory():
    tier = HostTier(CudaCopies(torch.device("cuda")))
    h = torch.randn(256, 256, device="cuda")
    want = h.clone()
    tier.put(3, h)
    assert tier._entries[3][1][0].is_pinned()
    tier.prefetch(3)
    back = tier.get(3)
    assert back.device.type == "cuda" and torch.equal(back, want) and tier.prefetched == 1
    tier.pop(3)
    tier.close()


def test_copies_wait_for_the_compute_stream_and_the_restore_waits_for_them():
    """Delays put on one stream must not let the other read too early (cuda._sleep spins)."""
    tier = HostTier(CudaCopies(torch.device("cuda")))
    want = torch.randn(1024, 1024, device="cuda")
    h = torch.zeros_like(want)
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)           # the compute stream is busy...
    h.copy_(want)                            # ...before it writes the state
    tier.put(3, h)                           # the copy down must wait for that write
    with torch.cuda.stream(tier.copies.side):
        torch.cuda._sleep(200_000_000)       # the side stream is busy before the copy up...
    tier.prefetch(3)
    back = tier.get(3)                       # ...which the compute stream must wait for
    assert torch.equal(back, want)
    tier.pop(3)
    tier.close()
