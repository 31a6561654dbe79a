"""bincheck.torch behaves as a careful user of torch.utils.checkpoint expects."""

import collections

import pytest

torch = pytest.importorskip("torch")
import bincheck.torch as bt  # noqa: E402
from torch import nn  # noqa: E402
from torch_helpers import (Counter, assert_close, plain_loop, problem, requiring,  # noqa: E402
                           tanh_cell)

T = 12


def dropout_cell(params, h, x):
    return torch.nn.functional.dropout(tanh_cell(params, h, x), p=0.3, training=True)


def test_dropout_gives_the_plain_loops_gradient_and_leaves_the_rng_stream_alone():
    params, h0, xs = problem(T)
    leaves = requiring(*params)
    torch.manual_seed(7)
    out = bt.binomial_checkpoint(dropout_cell, T, 2)(tuple(leaves), h0, xs)
    out.pow(2).sum().backward()
    after_ours = torch.rand(3)
    got = [v.grad.clone() for v in leaves]
    for v in leaves:
        v.grad = None
    torch.manual_seed(7)
    ref = plain_loop(dropout_cell, tuple(leaves), h0, xs, T)
    ref.pow(2).sum().backward()
    after_plain = torch.rand(3)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert_close(got, [v.grad for v in leaves])
    torch.testing.assert_close(after_ours, after_plain, rtol=0, atol=0)


def test_without_preserve_rng_state_dropout_replays_differ():
    """The control: the RNG handling is what makes the test above pass."""
    params, h0, xs = problem(T)
    leaves = requiring(*params)
    torch.manual_seed(7)
    loop = bt.binomial_checkpoint(dropout_cell, T, 2, preserve_rng_state=False)
    got = torch.autograd.grad(loop(tuple(leaves), h0, xs).pow(2).sum(), leaves)
    torch.manual_seed(7)
    want = torch.autograd.grad(plain_loop(dropout_cell, tuple(leaves), h0, xs, T).pow(2).sum(),
                               leaves)
    assert max(float((a - b).abs().max()) for a, b in zip(got, want)) > 1e-3


def test_a_step_that_draws_once_late_in_the_loop_still_replays_its_draw():
    """Only step T-3 draws (its input says so): the generators move once, after most snapshots
    were taken, and every replay of that step must draw what the forward drew."""
    params, h0, xs = problem(T)
    xs = xs.clone()
    xs[:, 0, 0] = 0.0
    xs[T - 3, 0, 0] = 100.0                   # the flag: this step draws

    def late(p, h, x):
        h = tanh_cell(p, h, x)
        return torch.nn.functional.dropout(h, 0.5, training=True) if x[0, 0] > 50 else h
    leaves = requiring(*params)
    torch.manual_seed(11)
    got = torch.autograd.grad(bt.binomial_checkpoint(late, T, 3)(tuple(leaves), h0, xs)
                              .pow(2).sum(), leaves)
    torch.manual_seed(11)
    want = torch.autograd.grad(plain_loop(late, tuple(leaves), h0, xs, T).pow(2).sum(), leaves)
    assert_close(got, want)


def test_a_loop_that_draws_nothing_queries_the_generators_once_in_its_backward(monkeypatch):
    """The forward saw the generators never move: the backward's snapshots share its RNG state
    without querying the generators (fork_rng's own query aside); restores still set it."""
    params, h0, xs = problem(40)
    leaves = requiring(*params)
    loop = bt.binomial_checkpoint(tanh_cell, 40, 3)
    out = loop(tuple(leaves), h0, xs).pow(2).sum()
    calls = collections.Counter()
    get, set_ = torch.get_rng_state, torch.set_rng_state

    def counted(name, f):
        def wrapped(*a):
            calls[name] += 1
            return f(*a)
        return wrapped
    monkeypatch.setattr(torch, "get_rng_state", counted("get", get))
    monkeypatch.setattr(torch, "set_rng_state", counted("set", set_))
    got = torch.autograd.grad(out, leaves)
    monkeypatch.undo()
    assert loop.stats.plain_steps > 40                       # restores and snapshots happened
    assert calls["get"] <= 1, calls
    want = torch.autograd.grad(plain_loop(tanh_cell, tuple(leaves), h0, xs, 40).pow(2).sum(),
                               leaves)
    assert_close(got, want)


def locked_mask_cell(p, h, x):
    """Draws a mask under its own fork_rng: it draws at every step, yet leaves the generator
    where it was (a locked / variational dropout drawn that way)."""
    h = tanh_cell(p, h, x)
    with torch.random.fork_rng(devices=[]):
        mask = (torch.rand_like(h) > 0.5).to(h.dtype)
    return h * mask * 2


@pytest.mark.parametrize("draw_between", [False, True])
def test_a_step_drawing_under_its_own_fork_rng_replays_the_forward_s_draws(draw_between):
    """The generators do not move, but replays must still draw from the forward's RNG state,
    also when the caller draws between the forward and the backward (found by review: skipping
    the restores' set gave another mask there)."""
    params, h0, xs = problem(T)
    leaves = requiring(*params)
    torch.manual_seed(11)
    out = bt.binomial_checkpoint(locked_mask_cell, T, 3)(tuple(leaves), h0, xs).pow(2).sum()
    if draw_between:
        torch.rand(100)
    got = torch.autograd.grad(out, leaves)
    torch.manual_seed(11)
    want = torch.autograd.grad(plain_loop(locked_mask_cell, tuple(leaves), h0, xs, T).pow(2)
                               .sum(), leaves)
    assert_close(got, want)


def test_autocast_is_reentered_in_the_backward():
    torch.manual_seed(0)
    cell = nn.RNNCell(8, 16)
    xs, h0 = torch.randn(T, 4, 8), torch.randn(4, 16)
    step = lambda c, h, x: c(x, h).float()                         # noqa: E731

    def grads(run, enabled=True):
        cell.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False, enabled=enabled):
            out = run()
        out.pow(2).sum().backward()
        return [p.grad.clone() for p in cell.parameters()]
    got = grads(lambda: bt.binomial_checkpoint(step, T, 3)(cell, h0, xs))
    want = grads(lambda: plain_loop(step, cell, h0, xs, T))
    assert_close(got, want, rtol=1e-6, atol=1e-7)
    full = grads(lambda: plain_loop(step, cell, h0, xs, T), enabled=False)   # float32 throughout
    assert max(float((a - b).abs().max()) for a, b in zip(got, full)) > 1e-4


def test_in_place_update_raises_naming_the_step_and_init_state_is_untouched():
    params, h0, xs = problem(T)
    W = requiring(params[0])[0]
    keep = h0.clone()

    def bad(p, h, x):
        if x[0, 0] > 10:                       # never true: the check must catch every step
            return h
        return h.mul_(0.5).add_(tanh_cell((p, params[1], params[2]), h, x))
    with pytest.raises(RuntimeError, match="in place at step 0"):
        bt.binomial_checkpoint(bad, T, 3)(W, h0, xs)
    torch.testing.assert_close(h0, keep, rtol=0, atol=0)


def test_a_stored_state_written_later_is_refused():
    params, h0, xs = problem(T)
    W = requiring(params[0])[0]
    seen = []

    def sneaky(p, h, x):
        seen.append(h)
        if len(seen) == T + 2:                 # a replay: write into an older state
            seen[0].add_(1.0)
        return tanh_cell((p, params[1], params[2]), h, x)
    loop = bt.binomial_checkpoint(sneaky, T, 2)
    with pytest.raises(RuntimeError, match=r"checkpoint of state \d+ .* modified in place"):
        loop(W, h0, xs).sum().backward()


def test_retain_graph_twice_doubles_the_gradient():
    params, h0, xs = problem(T)
    leaves = requiring(*params, h0)
    W, U, b, h = leaves
    cell = Counter(tanh_cell)
    loss = bt.binomial_checkpoint(cell, T, 3)((W, U, b), h, xs).pow(2).sum()
    loss.backward(retain_graph=True)
    loss.backward()
    got = [v.grad.clone() for v in leaves]
    for v in leaves:
        v.grad = None
    plain_loop(tanh_cell, (W, U, b), h, xs, T).pow(2).sum().backward()
    assert_close(got, [2 * v.grad for v in leaves])


def test_create_graph_hessian_vector_product():
    params, h0, xs = problem(8)
    W, U, b = requiring(*params)
    v = torch.randn_like(W)

    def hvp(run):
        g = torch.autograd.grad(run(W).pow(2).sum(), W, create_graph=True)[0]
        return torch.autograd.grad((g * v).sum(), W)[0]
    loop = bt.binomial_checkpoint(tanh_cell, 8, 2)
    with pytest.warns(RuntimeWarning, match="create_graph"):
        got = hvp(lambda W: loop((W, U, b), h0, xs))
    assert_close([got], [hvp(lambda W: plain_loop(tanh_cell, (W, U, b), h0, xs, 8))])


def test_forward_mode_is_exact():
    import torch.autograd.forward_ad as fwAD
    params, h0, xs = problem(T)
    W, U, b = params
    dW = torch.randn_like(W)
    loop = bt.binomial_checkpoint(tanh_cell, T, 3)
    with fwAD.dual_level():
        out = loop((fwAD.make_dual(W, dW), U, b), h0, xs)
        tangent = fwAD.unpack_dual(out).tangent
    _, want = torch.func.jvp(lambda W: plain_loop(tanh_cell, (W, U, b), h0, xs, T), (W,), (dW,))
    torch.testing.assert_close(tangent, want, rtol=1e-12, atol=1e-14)
    _, got = torch.func.jvp(lambda W: loop((W, U, b), h0, xs), (W,), (dW,))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


def test_torch_func_grad_and_vmap():
    params, h0, xs = problem(T)
    W, U, b = params
    loop = bt.binomial_checkpoint(tanh_cell, T, 3)
    got = torch.func.grad(lambda W: loop((W, U, b), h0, xs).sum())(W)
    want = torch.func.grad(lambda W: plain_loop(tanh_cell, (W, U, b), h0, xs, T).sum())(W)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    batched = torch.func.vmap(lambda h: loop((W, U, b), h, xs))(torch.stack([h0, 2 * h0]))
    torch.testing.assert_close(batched[1], plain_loop(tanh_cell, (W, U, b), 2 * h0, xs, T))


def test_torch_compile_of_a_loss_calling_the_loop():
    params, h0, xs = problem(T)
    leaves = requiring(*params)
    loop = bt.binomial_checkpoint(tanh_cell, T, 3)
    compiled = torch.compile(lambda p: loop(p, h0, xs).pow(2).sum() * 0.5, backend="aot_eager")
    got = torch.autograd.grad(compiled(tuple(leaves)), leaves)
    want = torch.autograd.grad(plain_loop(tanh_cell, tuple(leaves), h0, xs, T).pow(2).sum() * 0.5,
                               leaves)
    assert_close(got, want)


def test_compiled_step():
    params, h0, xs = problem(T)
    leaves = requiring(*params)
    loop = bt.binomial_checkpoint(torch.compile(tanh_cell, backend="aot_eager"), T, 3)
    got = torch.autograd.grad(loop(tuple(leaves), h0, xs).sum(), leaves)
    want = torch.autograd.grad(plain_loop(tanh_cell, tuple(leaves), h0, xs, T).sum(), leaves)
    assert_close(got, want)


def test_verify_catches_a_nondeterministic_step():
    params, h0, xs = problem(T)
    W = requiring(params[0])[0]
    calls = []

    def drifting(p, h, x):
        calls.append(1)
        return tanh_cell((p, params[1], params[2]), h, x) + 1e-3 * len(calls)
    loop = bt.binomial_checkpoint(drifting, T, 2, verify=True)
    with pytest.raises(bt.NondeterministicStepError, match="differs when recomputed"):
        loop(W, h0, xs).sum().backward()
    ok = bt.binomial_checkpoint(tanh_cell, T, 2, verify=True)
    ok(tuple(requiring(*params)), h0, xs).sum().backward()


def test_threads_and_nested_calls_share_one_loop():
    import threading
    params, h0, xs = problem(T)
    loop = bt.binomial_checkpoint(tanh_cell, T, 3)
    results, errors = {}, []

    def work(k):
        try:
            leaves = requiring(*params)
            results[k] = torch.autograd.grad(loop(tuple(leaves), h0 * k, xs).sum(), leaves)
        except Exception as err:          # noqa: BLE001
            errors.append(err)
    threads = [threading.Thread(target=work, args=(k,)) for k in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for k in (1, 2, 3):
        leaves = requiring(*params)
        want = torch.autograd.grad(plain_loop(tanh_cell, tuple(leaves), h0 * k, xs, T).sum(),
                                   leaves)
        assert_close(results[k], want)


def test_threads_share_one_module():
    import threading
    torch.manual_seed(0)
    cell = nn.GRUCell(3, 4).double()
    xs = torch.randn(T, 2, 3, dtype=torch.float64)
    step = lambda c, h, x: c(x, h)                                   # noqa: E731
    loop = bt.binomial_checkpoint(step, T, 2)
    results, errors = {}, []
    # Read before the threads start: while a call tapes a segment, the module's parameter
    # attributes are that call's aliases (as under torch.func.functional_call; documented).
    params = list(cell.parameters())

    def work(k):
        try:
            h0 = torch.full((2, 4), 0.1 * k, dtype=torch.float64)
            for _ in range(3):
                results[k] = torch.autograd.grad(loop(cell, h0, xs).pow(2).sum(), params)
        except Exception as err:          # noqa: BLE001
            errors.append(err)
    threads = [threading.Thread(target=work, args=(k,)) for k in (1, 2, 3, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(type(p) is nn.Parameter for p in cell.parameters())   # all put back
    for k in (1, 2, 3, 4):
        h0 = torch.full((2, 4), 0.1 * k, dtype=torch.float64)
        want = torch.autograd.grad(plain_loop(step, cell, h0, xs, T).pow(2).sum(),
                                   list(cell.parameters()))
        assert_close(results[k], want)


def test_in_place_write_in_a_segment_taped_by_the_forward_is_refused():
    """seq_len=1 (or a budget that tapes everything): no plain step sees the write, the taped
    segment's check must (found by review: a retained backward then gave a wrong gradient)."""
    W = torch.randn(3, 3, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2, 3, dtype=torch.float64)
    keep = h0.clone()

    def bad(p, h, x):
        h.mul_(2.0)
        return torch.tanh(h @ p)
    for loop in (bt.binomial_checkpoint(bad, 1, 1), bt.binomial_checkpoint(bad, 5, memory="1GB")):
        with pytest.raises(RuntimeError, match="in place (at step|in one of steps)"):
            loop(W, h0, None)
    torch.testing.assert_close(h0, keep, rtol=0, atol=0)


def test_create_graph_with_a_float_in_params():
    W = torch.randn(3, 3, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2, 3, dtype=torch.float64)
    fn = lambda p, h, x: torch.tanh(h @ p["W"] * p["s"])             # noqa: E731
    v = torch.randn_like(W)

    def hvp(run):
        g = torch.autograd.grad(run(W).pow(2).sum(), W, create_graph=True)[0]
        return torch.autograd.grad((g * v).sum(), W)[0]
    loop = bt.binomial_checkpoint(fn, 4, 2)
    with pytest.warns(RuntimeWarning, match="create_graph"):
        got = hvp(lambda W: loop({"W": W, "s": 0.5}, h0, None))
    assert_close([got], [hvp(lambda W: plain_loop(fn, {"W": W, "s": 0.5}, h0, None, 4))])
