"""bincheck.torch's ``offload=True`` tier (pinned host memory below a CUDA device).

Without a GPU, the tier runs with :class:`~bincheck.torch.offload.SyncCopies` (synchronous copies
between CPU tensors) in place of the CUDA copier: these tests check the tier's logic (planning
with it, prefetching the next restore, copies that are private, the in-place guard, the RNG kept
with each snapshot, exact gradients). The CUDA copier itself is tested in test_torch_cuda.py,
which runs only with ``pytest -m cuda`` on a machine with a GPU.
"""

import pytest

torch = pytest.importorskip("torch")
import bincheck.torch as bt  # noqa: E402
from bincheck.torch import offload  # noqa: E402
from bincheck.torch.offload import HostTier, SyncCopies  # noqa: E402
from torch_helpers import (allocation_peak, assert_close, plain_loop, problem,  # noqa: E402
                           requiring, tanh_cell)

T = 60


class Late(SyncCopies):
    """Copies that finish late, as CUDA copies on a side stream: a copy down reports done only
    after ``lag`` checks; a copy up holds NaN until ``use`` is called with its own event."""

    def __init__(self, lag=3):
        self.lag, self.checks = lag, {}

    def down(self, leaves):
        hosts, _ = super().down(leaves)
        event = object()
        self.checks[event] = 0
        return hosts, event

    def done(self, event):
        self.checks[event] += 1
        return self.checks[event] > self.lag

    def settle(self, event):
        if not isinstance(event, tuple):     # a copy up (the tier's pricing) is left alone
            self.checks[event] = self.lag + 1

    def up(self, hosts):
        leaves = [torch.full_like(h, float("nan")) if h.is_floating_point() else h.clone()
                  for h in hosts]
        return leaves, (hosts, leaves)

    def use(self, event, leaves):
        hosts, pending = event
        assert pending is leaves, "a copy up handed to the wrong restore"
        for leaf, host in zip(leaves, hosts):
            leaf.copy_(host)


@pytest.fixture(params=["sync", "late"])
def host_copies(request, monkeypatch):
    """CPU states accepted by offload=True, copied by a stand-in (see the module docstring)."""
    made = []

    def copies_for(leaves):
        made.append(SyncCopies() if request.param == "sync" else Late())
        return made[-1]
    monkeypatch.setattr(offload, "copies_for", copies_for)
    return made


def offload_problem():
    params, h0, xs = problem(T, B=16, H=32, I=4)
    return requiring(*params), h0, xs


def dropout_cell(params, h, x):
    W, U, b = params
    return torch.nn.functional.dropout(torch.tanh(h @ W + x @ U + b), 0.3, training=True)


@pytest.mark.parametrize("cell, memory", [(tanh_cell, "80kB"), (dropout_cell, "160kB")])
def test_offloaded_gradient_is_exact(host_copies, cell, memory):
    leaves, h0, xs = offload_problem()
    h0 = h0.clone().requires_grad_()
    xs = xs.clone().requires_grad_()
    loop = bt.binomial_checkpoint(cell, T, memory=memory, offload=True)
    plan = loop.preview(tuple(leaves), h0, xs)
    assert plan.uses_disk and plan.schedule.disk_writes > 0, str(plan)   # the host tier is used
    assert "pinned host memory" in str(loop.schedule) and "host offload" in str(plan)
    torch.manual_seed(3)
    got = torch.autograd.grad(loop(tuple(leaves), h0, xs).pow(2).sum(), leaves + [h0, xs])
    after = torch.rand(1)
    torch.manual_seed(3)
    want = torch.autograd.grad(plain_loop(cell, tuple(leaves), h0, xs, T).pow(2).sum(),
                               leaves + [h0, xs])
    assert torch.equal(after, torch.rand(1))     # the caller's RNG stream as the plain loop's
    assert_close(got, want)
    st = loop.stats
    assert st.plain_steps == loop.last_plan.plain_steps and st.taped_steps == T
    state_bytes = h0.numel() * h0.element_size()     # RNG states are kept beside, not copied
    assert st.offload_bytes_written == plan.schedule.disk_writes * state_bytes
    assert st.offload_bytes_read == plan.schedule.disk_reads * state_bytes
    # every restore from the host tier was copied up ahead, during the step or segment before it
    assert st.offload_prefetched == plan.schedule.disk_reads
    assert st.disk_bytes_written == 0
    assert len(host_copies) >= 2                 # the probe priced the copies, the call used one


def test_snapshots_are_private_copies():
    tier = HostTier(SyncCopies())
    h = torch.arange(6.0).reshape(2, 3)
    tier.put(4, {"h": h, "n": torch.tensor(7)})
    h.add_(100.0)                            # after the copy: the snapshot keeps the old values
    back = tier.get(4)
    assert torch.equal(back["h"], torch.arange(6.0).reshape(2, 3)) and int(back["n"]) == 7
    back["h"].mul_(0.0)                      # a write into a restored state stays there
    assert torch.equal(tier.get(4)["h"], torch.arange(6.0).reshape(2, 3))
    assert tier.bytes_written == 6 * 4 + 8 and tier.bytes_read == 2 * (6 * 4 + 8)
    tier.pop(4)
    assert 4 not in tier
    with pytest.raises(KeyError, match="no checkpoint of state 4"):
        tier.get(4)


class InFlight(SyncCopies):
    """Copies down that stay unfinished until ``settle``, as a CUDA copy on a side stream."""

    def __init__(self):
        self.finished = set()

    def down(self, leaves):
        hosts, _ = super().down(leaves)
        return hosts, object()

    def done(self, event):
        return event is None or id(event) in self.finished

    def settle(self, event):
        self.finished.add(id(event))


@pytest.mark.parametrize("then", ["get", "pop"])
def test_a_write_during_the_copy_down_is_an_error(then):
    tier = HostTier(InFlight())
    h = torch.ones(3)
    tier.put(2, h)
    h.add_(1.0)                              # before the copy is known to have run
    with pytest.raises(RuntimeError, match="state 2 .* modified in place while it was being "
                                           "copied to host memory"):
        getattr(tier, then)(2)


def test_prefetch_hands_its_copy_to_the_next_get_of_that_snapshot_only():
    tier = HostTier(Late())
    tier.put(1, torch.ones(2))
    tier.put(5, torch.full((2,), 5.0))
    tier.prefetch(5)
    tier.prefetch(5)                         # already under way: not copied twice
    assert torch.equal(tier.get(1), torch.ones(2)) and tier.prefetched == 0
    assert torch.equal(tier.get(5), torch.full((2,), 5.0)) and tier.prefetched == 1
    tier.prefetch(1)
    tier.pop(1)                              # a dropped snapshot's copy up is dropped too
    assert tier._ahead is None
    tier.close()
    assert 5 not in tier


def test_one_copy_down_in_flight():
    copies = Late(lag=10**9)                 # never seen done unless waited for
    tier = HostTier(copies)
    first, second = torch.ones(3), torch.zeros(3)
    tier.put(1, first)
    tier.put(2, second)                      # waits for the copy of 1, releasing its tensors
    assert tier._entries[1][3] is None and tier._entries[2][3] is not None
    first.add_(1.0)                          # after its copy: no error, the snapshot unchanged
    assert torch.equal(tier.get(1), torch.ones(3))


class Unseen(SyncCopies):
    """Host copies in numpy memory, which the profiler's torch allocation meter does not see (as
    it does not see pinned memory against a CUDA device's)."""

    def down(self, leaves):
        return [v.detach().numpy().copy() for v in leaves], None

    def up(self, hosts):
        return [torch.from_numpy(h.copy()) for h in hosts], None


def test_the_device_budget_holds_with_the_host_tier(monkeypatch):
    monkeypatch.setattr(offload, "copies_for", lambda leaves: Unseen())
    params, h0, xs = problem(T, B=32, H=64, I=16, dtype=torch.float32)
    leaves = requiring(*params)
    grad_bytes = sum(p.numel() * 4 for p in leaves)
    state = h0.numel() * 4
    memory = bt.binomial_checkpoint(tanh_cell, T, memory="1GB").preview(
        tuple(leaves), h0, xs).sizes.minimum_memory + 3 * state
    loop = bt.binomial_checkpoint(tanh_cell, T, memory=memory, offload=True)
    assert loop.preview(tuple(leaves), h0, xs).schedule.disk_writes > 0
    _, peak = allocation_peak(
        lambda: torch.autograd.grad(loop(tuple(leaves), h0, xs).pow(2).sum(), leaves))
    assert 0 < peak - grad_bytes <= memory, (peak - grad_bytes, memory)
    assert loop.stats.offload_bytes_read > 0


@pytest.mark.parametrize("kwargs, error, match", [
    ({"offload": "yes", "memory": "1MB"}, TypeError, "offload must be None, False or True"),
    ({"offload": 1, "memory": "1MB"}, TypeError, "offload must be None, False or True"),
    ({"offload": True, "num_ckpts": 4}, TypeError, "offload=True needs memory="),
    ({"offload": True, "memory": "1MB", "disk": True}, ValueError, "three-tier plan"),
])
def test_offload_arguments_are_checked(kwargs, error, match):
    with pytest.raises(error, match=match):
        bt.binomial_checkpoint(tanh_cell, T, **kwargs)


def test_offload_of_cpu_states_is_refused_before_the_forward():
    leaves, h0, xs = offload_problem()
    calls = []

    def counted(p, h, x):
        calls.append(1)
        return tanh_cell(p, h, x)
    loop = bt.binomial_checkpoint(counted, T, memory="80kB", offload=True)
    with pytest.raises(ValueError, match="must be on one CUDA device; it is on cpu"):
        loop(tuple(leaves), h0, xs)
    assert len(calls) <= 4                   # the probe's steps only, no forward sweep
    assert offload.check_offload(False, None, None) is None


def test_a_while_loop_offloads_too(host_copies):
    """``checkpointed_while_loop(..., memory=, offload=True)``: the online planner's periodic
    second-tier checkpoints go to host memory; the gradient is the plain while loop's."""
    leaves, h0, xs = offload_problem()
    W, U, b = leaves
    x = xs[0]

    def body(p, st):
        h, k = st
        return tanh_cell(p, h, x), k + 1

    def cond(p, st):
        return int(st[1]) < 150
    start = (h0, torch.tensor(0))
    run = bt.checkpointed_while_loop(cond, body, memory="160kB", offload=True)
    got = torch.autograd.grad(run(tuple(leaves), start)[0].pow(2).sum(), leaves)
    st = start
    while cond(None, st):
        st = body(tuple(leaves), st)
    want = torch.autograd.grad(st[0].pow(2).sum(), leaves)
    assert_close(got, want)
    stats = run.stats
    assert run.num_steps == 150 and stats.taped_steps == 150
    assert stats.offload_bytes_written > 0 and stats.offload_bytes_read > 0, stats
    assert stats.disk_bytes_written == 0
    with pytest.raises(ValueError, match="three-tier"):
        bt.checkpointed_while_loop(cond, body, memory="60kB", offload=True, disk=True)
