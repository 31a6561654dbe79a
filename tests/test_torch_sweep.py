"""The reverse sweep reverses most steps alone, inline (``Sweep.run``); those steps get every
check and statistic a taped segment gets (``Steps.tape``, ``Sweep.pull_back``). Each test runs
both: a ``num_ckpts`` loop (inline single steps) and the same loop with ``verify=True`` (every
step through the general path)."""

import pytest

torch = pytest.importorskip("torch")
import bincheck.torch as bt  # noqa: E402
from torch_helpers import assert_close, plain_loop, problem, requiring, tanh_cell  # noqa: E402

T = 8
PATHS = pytest.mark.parametrize("verify", [False, True], ids=["inline", "general"])


def only_when_taped_at(step, fn, bad):
    """``fn``, except that step ``step`` run under grad mode (taped) does ``bad`` instead."""
    def wrapped(p, h, x):
        if torch.is_grad_enabled() and float(x[0, 0].detach()) == step:
            return bad(p, h, x)
        return fn(p, h, x)
    return wrapped


def numbered(xs):
    xs = xs.clone()
    xs[:, 0, 0] = torch.arange(len(xs), dtype=xs.dtype)   # step t can tell it is step t
    return xs


@PATHS
def test_a_taped_step_that_writes_its_input_is_refused_naming_the_step(verify):
    params, h0, xs = problem(T)
    xs = numbered(xs)

    def bad(p, h, x):
        x.mul_(1.0)                          # same values, but the caller's xs was written
        return tanh_cell(p, h, x)
    W, U, b = requiring(*params)
    loop = bt.binomial_checkpoint(only_when_taped_at(3, tanh_cell, bad), T, 2, verify=verify)
    out = loop((W, U, b), h0, xs)
    with pytest.raises(RuntimeError, match="in place at step 3"):
        out.pow(2).sum().backward()


@PATHS
def test_a_taped_step_that_writes_its_state_is_refused_naming_the_step(verify):
    """Step 0's input state needs no gradient (init_state does not require one), so torch
    itself allows the write: bincheck's check must refuse it."""
    params, h0, xs = problem(T)
    xs = numbered(xs)
    keep = h0.clone()

    def bad(p, h, x):
        return tanh_cell(p, h.mul_(1.0), x)     # same values: only the version moves
    W, U, b = requiring(*params)
    loop = bt.binomial_checkpoint(only_when_taped_at(0, tanh_cell, bad), T, 2, verify=verify)
    out = loop((W, U, b), h0, xs)
    with pytest.raises(RuntimeError, match="in place at step 0"):
        out.pow(2).sum().backward()
    torch.testing.assert_close(h0, keep, rtol=0, atol=0)


@PATHS
def test_a_taped_step_that_returns_another_shape_is_refused_naming_the_step(verify):
    params, h0, xs = problem(T)
    xs = numbered(xs)

    def bad(p, h, x):
        return tanh_cell(p, h, x)[:-1]
    W, U, b = requiring(*params)
    loop = bt.binomial_checkpoint(only_when_taped_at(2, tanh_cell, bad), T, 2, verify=verify)
    out = loop((W, U, b), h0, xs)
    with pytest.raises(ValueError, match="at step 2 state leaf 0 was shape"):
        out.pow(2).sum().backward()


@PATHS
@pytest.mark.parametrize("wrt", ["params", "params+h0", "h0"])
def test_both_paths_give_the_plain_loops_gradient_and_counts(verify, wrt):
    params, h0, xs = problem(T)
    W, U, b, h = requiring(*params, h0)
    wanted = {"params": [W, U, b], "params+h0": [W, U, b, h], "h0": [h]}[wrt]
    loop = bt.binomial_checkpoint(tanh_cell, T, 3, verify=verify)
    got = torch.autograd.grad(loop((W, U, b), h, xs).pow(2).sum(), wanted)
    want = torch.autograd.grad(plain_loop(tanh_cell, (W, U, b), h, xs, T).pow(2).sum(), wanted)
    assert_close(got, want)
    assert loop.stats.taped_steps == T
    assert loop.stats.plain_steps == bt.binomial_checkpoint(tanh_cell, T, 3).plan.plain_steps


@pytest.mark.parametrize("num_ckpts", [2, 3, 5])
def test_the_sweep_holds_no_state_beyond_the_plan_s(num_ckpts):
    """At every plain step of the backward, the state-sized tensors alive are at most: the
    stored states (``num_ckpts``, state 0's copy included), the step's input and output, the
    adjoint, the parameter's gradient being summed and the loop's result the caller holds:
    ``num_ckpts + 5``. (A review found the inline single steps holding theirs until the next
    Reverse, and the forward's last live state for the whole backward: 11 at two slots.)"""
    import gc
    # T2=12 (was 20): the most alive is the same, 7, 8 and 9 at 2, 3 and 5 slots (the bound
    # binds at 2 and 3), in 33 of the costly looks at every object instead of 86 (at T2=10
    # three slots never all hold a state at a plain step: 7)
    T2, N = 12, 4099

    def alive():
        return {o.untyped_storage().data_ptr() for o in gc.get_objects()
                if type(o) is torch.Tensor and o.numel() == N}
    g = torch.Generator().manual_seed(0)
    w = torch.randn(N, dtype=torch.float64, generator=g).requires_grad_()
    xs = torch.randn(T2, N, dtype=torch.float64, generator=g)
    h0 = torch.randn(N, dtype=torch.float64, generator=g)
    gc.collect()
    given = alive() | {v.untyped_storage().data_ptr() for v in (w, xs, h0)}   # not the loop's
    most, backward = [0], [False]

    def step(p, h, x):
        out = torch.tanh(h * p + x)
        if backward[0] and not torch.is_grad_enabled():
            most[0] = max(most[0], len(alive() - given))
        return out
    loop = bt.binomial_checkpoint(step, T2, num_ckpts)
    out = loop(w, h0, xs)
    loss = out.sum()
    backward[0] = True
    loss.backward()
    assert loop.stats.plain_steps > T2            # replays ran, and were looked at
    assert 0 < most[0] <= num_ckpts + 5, most[0]


@pytest.mark.parametrize("where", ["forward's last step", "inputs differentiated"])
def test_a_single_taped_step_of_the_general_path_is_checked_too(where):
    """``Steps.tape`` tapes a single step without its loop: the forward's last step, and every
    step when the inputs' cotangents are wanted (no inline path then). Its output is checked."""
    params, h0, xs = problem(T)
    xs = numbered(xs)
    step = T - 1 if where == "forward's last step" else 2

    def bad(p, h, x):
        return tanh_cell(p, h, x)[:-1]
    W, U, b = requiring(*params)
    if where == "inputs differentiated":
        xs.requires_grad_()
    loop = bt.binomial_checkpoint(only_when_taped_at(step, tanh_cell, bad), T, 2)
    with pytest.raises(ValueError, match=f"at step {step} state leaf 0 was shape"):
        loop((W, U, b), h0, xs).pow(2).sum().backward()
