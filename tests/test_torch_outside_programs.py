"""What new users running outside programs through the torch loops found (issue 29, items 1-5):
a closed-over tensor's gradient, dropout in output_fn, buffers updated per recomputation, stats
after an evaluation call, a loop's length taken from its inputs."""

import pytest

torch = pytest.importorskip("torch")
import bincheck.torch as bt  # noqa: E402
from torch import nn  # noqa: E402
from torch_helpers import (Counter, assert_close, closed_form, plain_loop, problem,  # noqa: E402
                           requiring, tanh_cell)

T = 12


# ------------------------------------------------------------------ 1. closed-over tensors
def closure_problem():
    params, h0, xs = problem(T)
    W, U, b = requiring(*params)
    return W, U, b, h0, xs


@pytest.mark.parametrize("num_ckpts", [1, 3, T])
def test_a_closed_over_tensor_that_requires_grad_is_refused_naming_its_shape(num_ckpts):
    W, U, b, h0, xs = closure_problem()

    def fn(p, h, x):
        return torch.tanh(h @ p + x @ U + b)

    loop = bt.binomial_checkpoint(fn, T, num_ckpts)
    with pytest.raises(ValueError, match=r"shape \(2, 4\).*params"):
        loop(W, h0, xs)
    assert U.grad is None and W.grad is None


def test_a_closed_over_module_s_parameters_are_refused():
    W, _, _, h0, xs = closure_problem()
    lin = nn.Linear(2, 4).double()

    def fn(p, h, x):
        return torch.tanh(h @ p + lin(x))

    with pytest.raises(ValueError, match=r"closes over"):
        bt.binomial_checkpoint(fn, T, 3)(W, h0, xs)


def test_a_closed_over_tensor_computed_with_a_graph_is_refused():
    W, U, b, h0, xs = closure_problem()
    U2 = U * 2.0                         # not a leaf: its graph reaches U

    def fn(p, h, x):
        return torch.tanh(h @ p + x @ U2)

    with pytest.raises(ValueError, match=r"shape \(2, 4\)"):
        bt.binomial_checkpoint(fn, T, 3)(W, h0, xs)


def test_a_closed_over_tensor_in_output_fn_is_refused():
    W, U, b, h0, xs = closure_problem()
    V = torch.randn(4, 1, dtype=torch.float64, requires_grad=True)
    loop = bt.binomial_checkpoint(tanh_cell, T, 3, output_fn=lambda p, h, x: h @ V)
    with pytest.raises(ValueError, match=r"output_fn.*shape \(4, 1\)"):
        loop((W, U, b), h0, xs)


def test_a_closed_over_tensor_in_a_while_loop_body_is_refused():
    """The forward of a while loop tapes nothing: the first taped step, in the first backward,
    refuses it, before any gradient reaches a parameter."""
    W, U, b, h0, _ = closure_problem()
    run = bt.checkpointed_while_loop(lambda p, s: bool(s[1] < 5),
                                     lambda p, s: (torch.tanh(s[0] @ p + b), s[1] + 1), 2)
    h = run(W, (h0, torch.tensor(0)))[0]
    with pytest.raises(ValueError, match=r"body_fn.*shape \(4,\)"):
        h.sum().backward()
    assert W.grad is None and b.grad is None


def test_closed_over_constants_are_fine_and_exact():
    """Tensors that need no gradient (and detached ones) may be closed over."""
    W, U, b, h0, xs = closure_problem()
    Uc, bc = U.detach(), b.detach()

    def fn(p, h, x):
        return torch.tanh(h @ p + x @ Uc + bc)

    got = torch.autograd.grad(bt.binomial_checkpoint(fn, T, 3)(W, h0, xs).sum(), W)
    want = torch.autograd.grad(plain_loop(fn, W, h0, xs, T).sum(), W)
    assert_close(got, want)


# ------------------------------------------------------------------ 2. dropout in output_fn
def dropping_output(p, h, x):
    return torch.nn.functional.dropout(h, p=0.5, training=True).sum(-1)


@pytest.mark.parametrize("num_ckpts", [2, 5, T])
@pytest.mark.parametrize("cell", ["plain", "dropout"])
def test_dropout_in_output_fn_gives_the_plain_loops_gradient(num_ckpts, cell):
    fn = tanh_cell if cell == "plain" else (
        lambda p, h, x: torch.nn.functional.dropout(tanh_cell(p, h, x), p=0.3, training=True))
    params, h0, xs = problem(T)
    leaves = requiring(*params)
    torch.manual_seed(3)
    loop = bt.binomial_checkpoint(fn, T, num_ckpts, output_fn=dropping_output)
    h, ys = loop(tuple(leaves), h0, xs)
    got = torch.autograd.grad(h.pow(2).sum() + ys.pow(2).sum(), leaves)
    after_ours = torch.rand(2)
    torch.manual_seed(3)
    h_ref, ys_ref = plain_loop(fn, tuple(leaves), h0, xs, T, dropping_output)
    want = torch.autograd.grad(h_ref.pow(2).sum() + ys_ref.pow(2).sum(), leaves)
    torch.testing.assert_close(ys, ys_ref, rtol=0, atol=0)
    assert_close(got, want)
    torch.testing.assert_close(after_ours, torch.rand(2), rtol=0, atol=0)


def test_verify_covers_output_fn():
    params, h0, xs = problem(T)
    leaves = requiring(*params)
    calls = [0]

    def drifting(p, h, x):                        # differs on every evaluation
        calls[0] += 1
        return h.sum(-1) * (1.0 + 1e-3 * calls[0])

    loop = bt.binomial_checkpoint(tanh_cell, T, 3, output_fn=drifting, verify=True)
    h, ys = loop(tuple(leaves), h0, xs)
    with pytest.raises(bt.NondeterministicStepError, match="output_fn"):
        torch.autograd.grad(ys.sum(), leaves)


def test_output_fn_without_draws_is_not_run_in_recomputations():
    params, h0, xs = problem(T)
    out = Counter(lambda p, h, x: h.sum(-1))
    loop = bt.binomial_checkpoint(tanh_cell, T, 3, output_fn=out)
    leaves = requiring(*params)
    h, ys = loop(tuple(leaves), h0, xs)
    torch.autograd.grad(ys.sum(), leaves)
    # once per step in the forward (the last, taped segment taped, its outputs reused by the
    # backward), once per step taped in the backward: never in the recomputations
    assert (out.plain, out.taped) == (T - 1, T)


# ------------------------------------------------------------------ 3. buffers
class NormCell(nn.Module):
    def __init__(self, H=4, I=2):
        super().__init__()
        self.lin = nn.Linear(H + I, H)
        self.norm = nn.BatchNorm1d(H)

    def forward(self, h, x):
        return torch.tanh(self.norm(self.lin(torch.cat([h, x], -1))))


def step(cell, h, x):
    return cell(h, x)


@pytest.mark.parametrize("kind", ["binomial", "memory", "while"])
def test_buffers_are_updated_once_per_step(kind):
    torch.manual_seed(0)
    ref = NormCell().double()
    cell = NormCell().double()
    cell.load_state_dict(ref.state_dict())
    _, h0, xs = problem(T)
    if kind == "binomial":
        loop = bt.binomial_checkpoint(step, T, 3)
    elif kind == "memory":
        loop = bt.binomial_checkpoint(step, T, memory="60KB")
    if kind == "while":
        run = bt.checkpointed_while_loop(lambda c, s: bool(s[1] < T),
                                         lambda c, s: (c(s[0], xs[s[1]]), s[1] + 1), 3)
        h = run(cell, (h0, torch.tensor(0)))[0]
    else:
        h = loop(cell, h0, xs)
    got = torch.autograd.grad(h.pow(2).sum(), list(cell.parameters()))
    want = torch.autograd.grad(plain_loop(step, ref, h0, xs, T).pow(2).sum(),
                               list(ref.parameters()))
    assert_close(got, want)
    for (name, a), (_, b) in zip(cell.named_buffers(), ref.named_buffers()):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=0, msg=name)
    assert int(cell.norm.num_batches_tracked) == T


class Counting(nn.Module):
    """A step whose output depends on a buffer it updates: recomputations must see the value
    the forward saw."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(0.5, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    def forward(self, h, x):
        self.count += 1
        return torch.tanh(h * self.w + x.sum(-1, keepdim=True) * 0.1 * self.count)


@pytest.mark.parametrize("num_ckpts", [1, 3])
def test_a_step_reading_a_buffer_it_updates_is_exact(num_ckpts):
    ref, cell = Counting(), Counting()
    _, h0, xs = problem(T)
    h = bt.binomial_checkpoint(step, T, num_ckpts)(cell, h0, xs)
    got = torch.autograd.grad(h.pow(2).sum(), [cell.w])
    want = torch.autograd.grad(plain_loop(step, ref, h0, xs, T).pow(2).sum(), [ref.w])
    assert_close(got, want)
    assert float(cell.count) == T


def test_a_retained_graph_and_the_memory_probe_leave_buffers_as_the_plain_loop():
    torch.manual_seed(0)
    ref, cell = NormCell().double(), NormCell().double()
    cell.load_state_dict(ref.state_dict())
    _, h0, xs = problem(T)
    loop = bt.binomial_checkpoint(step, T, memory="60KB")
    h = loop(cell, h0, xs)
    loss = h.pow(2).sum()
    loss.backward(retain_graph=True)
    loss.backward()
    plain_loop(step, ref, h0, xs, T)
    for (name, a), (_, b) in zip(cell.named_buffers(), ref.named_buffers()):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=0, msg=name)


# ------------------------------------------------------------------ 4. stats
def test_stats_describe_the_last_gradient_not_an_evaluation():
    params, h0, xs = problem(T)
    loop = bt.binomial_checkpoint(tanh_cell, T, 3)
    leaves = requiring(*params)
    loop(tuple(leaves), h0, xs).sum().backward()
    stats = loop.stats
    assert stats.plain_steps == closed_form(T, 3)
    with torch.no_grad():
        loop(tuple(leaves), h0, xs)
    assert loop.stats is stats


# ------------------------------------------------------------------ 5. lengths from inputs
def test_a_loop_without_seq_len_takes_it_from_its_inputs():
    params, h0, xs = problem(T)
    loop = bt.binomial_checkpoint(tanh_cell, num_ckpts=3)
    for n in (T, 5, T, 1):
        leaves = requiring(*params)
        got = torch.autograd.grad(loop(tuple(leaves), h0, xs[:n]).pow(2).sum(), leaves)
        assert loop.stats.plain_steps == closed_form(n, 3)
        assert loop.stats.num_steps == n
        want = torch.autograd.grad(plain_loop(tanh_cell, tuple(leaves), h0, xs[:n], n)
                                   .pow(2).sum(), leaves)
        assert_close(got, want)


def test_a_budgeted_loop_without_seq_len_plans_per_length():
    params, h0, xs = problem(T)
    loop = bt.binomial_checkpoint(tanh_cell, memory="17KB")
    for n in (T, 7):
        leaves = requiring(*params)
        loop(tuple(leaves), h0, xs[:n]).sum().backward()
        assert loop.last_plan.seq_len == n
        assert loop.stats.num_steps == n


def test_a_loop_without_seq_len_needs_inputs():
    params, h0, _ = problem(T)
    loop = bt.binomial_checkpoint(tanh_cell, num_ckpts=3)
    with pytest.raises(ValueError, match="seq_len"):
        loop(params, h0, None)


def test_memory_for_on_a_torch_loop():
    params, h0, xs = problem(200)
    loop = bt.binomial_checkpoint(tanh_cell, 200, memory="1MB")
    fast = loop.memory_for(3.0, params, h0, xs)
    slow = loop.memory_for(1.5, params, h0, xs)
    assert isinstance(fast, int) and 0 < fast <= slow
    with pytest.raises(ValueError, match="max_relative_time"):
        loop.memory_for(0.5, params, h0, xs)


# ------------------------------------------------------------------ the while loop's draws
@pytest.mark.parametrize("num_ckpts", [1, 3, T + 1])
def test_dropout_in_a_while_loop_gives_the_plain_loops_gradient(num_ckpts):
    """The forward runs step n before the planner keeps state n-1: the snapshot and the state
    the reversal starts from must keep the RNG state from before their step (the shipped loop
    taped its last step with the caller's stream and restored snapshots one step late)."""
    params, h0, _ = problem(T)
    W = requiring(params[0])[0]

    def body(p, s):
        return torch.nn.functional.dropout(torch.tanh(s[0] @ p), 0.3, True), s[1] + 1

    def cond(p, s):
        return bool(s[1] < T)

    torch.manual_seed(1)
    h = bt.checkpointed_while_loop(cond, body, num_ckpts)(W, (h0, torch.tensor(0)))[0]
    got = torch.autograd.grad(h.pow(2).sum(), W)
    torch.manual_seed(1)
    s = (h0, torch.tensor(0))
    while cond(W, s):
        s = body(W, s)
    torch.testing.assert_close(h, s[0], rtol=0, atol=0)
    assert_close(got, torch.autograd.grad(s[0].pow(2).sum(), W))


class ViewBuffer(nn.Module):
    """A buffer that is a view of another: restores must keep them aliased (review finding)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(0.5, dtype=torch.float64))
        self.register_buffer("base", torch.zeros(2, dtype=torch.float64))
        self.register_buffer("v", self.base[:1])

    def forward(self, h, x):
        self.base += 1
        return torch.tanh(h * self.w + x.sum(-1, keepdim=True) * 0.1 * self.v)


@pytest.mark.parametrize("num_ckpts", [1, 3])
def test_a_buffer_viewing_another_stays_its_view(num_ckpts):
    ref, cell = ViewBuffer(), ViewBuffer()
    _, h0, xs = problem(T)
    h = bt.binomial_checkpoint(step, T, num_ckpts)(cell, h0, xs)
    got = torch.autograd.grad(h.pow(2).sum(), [cell.w])
    want = torch.autograd.grad(plain_loop(step, ref, h0, xs, T).pow(2).sum(), [ref.w])
    assert_close(got, want)
    assert float(cell.v) == T and cell.v.untyped_storage().data_ptr() == \
        cell.base.untyped_storage().data_ptr()
