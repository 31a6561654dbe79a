"""checkpointed_while_loop: gradients equal the plain Python while loop; counts; bounds; errors."""

import autograd.numpy as np
import numpy
import pytest
from autograd import grad, make_vjp

from bincheck import checkpointed_while_loop
from bincheck.schedule.binomial import beta, optimal_plain_steps
from helpers import Counter, assert_trees_close, peak_bytes, plain_while


# --- explicit Euler until t >= T_end, with a state-dependent step size
def euler_cond(p, st):
    return st[0] < p["T_end"]


def euler_body(p, st):
    t, y = st
    dt = p["h"] / (1.0 + y[0] ** 2)              # step size depends on the state
    dy = np.stack([y[1], -p["k"] * np.sin(y[0]) - 0.1 * y[1]])
    return (t + dt, y + dt * dy)


EULER_P = {"T_end": 3.0, "h": 0.05, "k": 1.7}
EULER_Y0 = numpy.array([0.4, -0.2])


# --- Newton's method for x^3 + a x - c = 0, to tolerance
def newton_cond(p, x):
    return abs(x ** 3 + p[0] * x - p[1]) > 1e-12


def newton_body(p, x):
    return x - (x ** 3 + p[0] * x - p[1]) / (3 * x ** 2 + p[0])


# --- Siskind & Pearlmutter: outer loop over data, inner loop length varies wildly with the
# data; flattened into one while loop over atomic steps. State: (outer index, x, acc).
DATA = numpy.array([0.9, 1e-3, 0.5, 1e-7, 0.3, 2e-2])


def sp_cond(p, st):
    return st[0] < len(DATA)


def sp_body(p, st):
    i, x, acc = st                               # i: an int counter (not differentiated)
    d = DATA[i]
    if x > d:                                    # inner step: shrink x until it is below d
        return (i, x * p["q"], acc)
    return (i + 1, x + p["w"] * d + 1.0, acc + x * x)   # outer step: accumulate, restart


SP_P = {"q": 0.7, "w": 0.3}


@pytest.mark.parametrize("s", [1, 2, 3, 5, 200])
def test_euler_until_t_end(s):
    run = checkpointed_while_loop(euler_cond, euler_body, s)
    ref = plain_while(euler_cond, euler_body)
    loss = lambda r: lambda p, y0: np.sum(r(p, (0.0, y0))[1] ** 2)
    g = grad(loss(run), (0, 1))(EULER_P, EULER_Y0)
    g0 = grad(loss(ref), (0, 1))(EULER_P, EULER_Y0)
    assert_trees_close(g, g0)
    assert run.num_steps > 40


@pytest.mark.parametrize("s", [1, 2, 4])
def test_newton_to_tolerance(s):
    run = checkpointed_while_loop(newton_cond, newton_body, s)
    ref = plain_while(newton_cond, newton_body)
    p = numpy.array([0.5, 3.0])
    g = grad(lambda p, x0: run(p, x0), (0, 1))(p, 4.0)
    g0 = grad(lambda p, x0: ref(p, x0), (0, 1))(p, 4.0)
    assert_trees_close(g, g0)
    assert run.num_steps >= 5


@pytest.mark.parametrize("s", [2, 3, 6])
def test_siskind_pearlmutter_nested_loops(s):
    run = checkpointed_while_loop(sp_cond, sp_body, s)
    ref = plain_while(sp_cond, sp_body)
    loss = lambda r: lambda p, x0: r(p, (0, x0, 0.0))[2]
    g = grad(loss(run), (0, 1))(SP_P, 1.3)
    g0 = grad(loss(ref), (0, 1))(SP_P, 1.3)
    assert_trees_close(g, g0)
    assert run.num_steps > 60                    # the inner loops really vary: 1e-7 takes ~45


@pytest.mark.parametrize("s", [1, 2, 3, 5, 8])
def test_counts_match_offline_optimum_up_to_beta2(s):
    for n in sorted({1, 2, 3, s + 1, beta(s, 2) - 1, beta(s, 2)}):
        if n < 1:
            continue
        body = Counter(lambda p, st: (st[0] + 1.0, np.sin(st[1] * p)))
        run = checkpointed_while_loop(lambda p, st: st[0] < n, body, s)
        grad(lambda p, y: run(p, (0.0, y))[1], (0, 1))(0.9, 0.3)   # both args: one sweep
        assert run.num_steps == n
        assert body.taped == n
        assert body.plain == optimal_plain_steps(n, s) + 1, (s, n)
        assert run.stats.peak_snapshots <= s


def test_memory_bounded_whatever_the_length():
    for n in (10, 1000, 5000):
        run = checkpointed_while_loop(lambda p, st: st[0] < n,
                                      lambda p, st: (st[0] + 1.0, st[1] * p), 4)
        grad(lambda p: run(p, (0.0, 1.0))[1])(1.0001)
        assert run.stats.peak_snapshots <= 4
        assert run.stats.taped_steps == n


def test_zero_steps_is_identity():
    run = checkpointed_while_loop(lambda p, x: False, lambda p, x: x * p, 3)
    vjp, ans = make_vjp(lambda p, x: run(p, x), (0, 1))(2.0, numpy.array([1.0, 2.0]))
    gp, gx = vjp(numpy.array([3.0, 4.0]))
    assert run.num_steps == 0
    numpy.testing.assert_array_equal(ans, [1.0, 2.0])
    numpy.testing.assert_array_equal(gx, [3.0, 4.0])
    assert gp == 0.0


def test_max_steps():
    body = lambda p, x: x + p
    run = checkpointed_while_loop(lambda p, x: x < 10.0, body, 2, max_steps=10)
    assert run(1.0, 0.0) == 10.0                 # exactly max_steps steps is allowed
    with pytest.raises(RuntimeError, match=r"max_steps=10"):
        run(0.5, 0.0)
    with pytest.raises(RuntimeError, match=r"max_steps=10"):
        grad(lambda p: run(p, 0.0))(0.5)


def test_plain_call_matches_and_keeps_nothing():
    run = checkpointed_while_loop(euler_cond, euler_body, 3)
    out = run(EULER_P, (0.0, EULER_Y0))
    ref = plain_while(euler_cond, euler_body)(EULER_P, (0.0, EULER_Y0))
    assert_trees_close(out, ref, rtol=0, atol=0)
    # a plain call stores no snapshots: its memory is a few states, not num_ckpts of them
    big = numpy.ones(100_000)
    run = checkpointed_while_loop(lambda p, st: st[0] < 50, lambda p, st: (st[0] + 1, st[1] * p),
                                  40)
    peak, _ = peak_bytes(run, 1.0, (0, big))
    assert peak < 4 * big.nbytes


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(cond_fn=3), TypeError, "cond_fn must be callable"),
    (dict(body_fn=None), TypeError, "body_fn must be callable"),
    (dict(num_ckpts=0), ValueError, "num_ckpts must be a positive int.*got 0"),
    (dict(num_ckpts=2.5), TypeError, "num_ckpts"),
    (dict(max_steps=-1), ValueError, "max_steps.*got -1"),
    (dict(max_steps=1.5), TypeError, "max_steps.*got 1.5"),
])
def test_bad_arguments(kwargs, exc, match):
    args = dict(cond_fn=euler_cond, body_fn=euler_body, num_ckpts=3)
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        checkpointed_while_loop(**args)


def test_state_structure_checked():
    run = checkpointed_while_loop(lambda p, st: st[0] < 3, lambda p, st: (st[0] + 1,), 2)
    with pytest.raises(ValueError, match="structure.*step 0"):
        grad(lambda y: run(1.0, (0.0, y))[0])(1.0)
