"""Taped segments of one static length (``keep_segments=True`` with ``memory=``): the loop as
``seq_len / L`` super-steps, each a ``lax.scan`` of ``L`` steps, checkpointed by the planner's
Revolve plan over the super-steps (``bincheck/jax/segments.py``)."""

import pytest

from jax_helpers import (assert_close, jax, lstm_cell, lstm_problem,  # noqa: E402
                         plain_loop, problem, tanh_cell, temp_bytes)
import jax.numpy as jnp  # noqa: E402

import bincheck.jax as bj  # noqa: E402
from bincheck.jax import segments  # noqa: E402
from bincheck.jax.segments import StaticSegmentsPlan, candidates  # noqa: E402
from bincheck.schedule.binomial import optimal_plain_steps  # noqa: E402

T = 120
BUDGET = 12_000             # 96-byte states: static segments of 15 steps win here (checked)
LSTM_BUDGET = 10_000        # lstm_problem(96): 4-step segments, 92 plain steps against 119


def static(loop, *args):
    plan = loop.preview(*args)
    assert isinstance(plan, StaticSegmentsPlan), str(plan)
    return plan


def leaves_loss(out):
    return sum(jnp.sum(v ** 3) for v in jax.tree.leaves(out))


# --------------------------------------------------------------------------- the choice
def test_candidates_are_divisors_leaving_three_segments_spread_on_a_log_scale():
    # 13 divisors of 120 in 2..40; 8 log-spaced targets 2, 3.07, 4.71, 7.24, 11.1, 17.1, 26.2,
    # 40 (by hand) -> the nearest divisor of each on a log scale:
    assert candidates(120) == [2, 3, 5, 8, 12, 15, 24, 40]
    assert candidates(12) == [2, 3, 4]
    assert candidates(1000)[-1] == 50 and len(candidates(1000)) == 8
    assert candidates(97) == [] and candidates(5) == []         # prime; too short for three
    for n in (6, 60, 64, 360, 1000, 4096):
        got = candidates(n)
        assert all(n % L == 0 and 2 <= L <= min(64, n // 3) for L in got) and len(got) <= 8


def test_segments_must_save_a_tenth_of_the_evaluations():
    class Fake:
        plain_steps = 0
    assert segments.SEGMENT_MIN_GAIN == 0.10
    # 120 steps, states only 100 plain: 220 evaluations; segments may take 0.9 * 220 - 120 = 78
    for plain, kept in ((39, True), (40, False)):          # 2-step segments: 78, 80 plain
        fake = Fake()
        fake.plain_steps = plain
        got = segments.choose(120, 100, lambda L: fake if L == 2 else None)
        assert (got is not None) == kept and (not kept or got == (2, fake))


@pytest.mark.parametrize("n", [120, 1000, 4096])
def test_choose_skips_only_lengths_that_cannot_win(n):
    # A stand-in planner: a segment of L steps costs `work * L` slots' worth of bytes. The
    # bound t(n / L, most_slots) must never skip the length that trying every one finds.
    class Fake:
        def __init__(self, plain):
            self.plain_steps = plain
    for most in (2, 5, 20, 60, 400, 5000):
        for work in (0, 1, 3):
            tried = []

            def plan_for_length(L):
                tried.append(L)
                slots = most - work * L
                return None if slots < 1 else Fake(optimal_plain_steps(n // L, slots))
            states_only = optimal_plain_steps(n, most)
            every = segments.choose(n, states_only, plan_for_length)
            tried_every, tried[:] = list(tried), []
            fast = segments.choose(n, states_only, plan_for_length, most)
            assert (every and (every[0], every[1].plain_steps)) == \
                (fast and (fast[0], fast[1].plain_steps)), (most, work)
            assert set(tried) <= set(tried_every) == set(candidates(n))
    assert len(tried) < len(tried_every)          # most=5000, work=3: some were skipped


@pytest.mark.parametrize("cell,make,n", [(tanh_cell, problem, 120), (lstm_cell, lstm_problem, 96)])
@pytest.mark.parametrize("budget", [6_000, 12_000, 40_000])
def test_the_budget_holds_under_xla_s_meter_and_segments_beat_states_only(cell, make, n,
                                                                            budget):
    args = make(n)
    loop = bj.binomial_checkpoint(cell, n, memory=budget, keep_segments=True)
    plan = loop.preview(*args)
    states_only = bj.binomial_checkpoint(cell, n, memory=budget,
                                         keep_segments=False).preview(*args)
    assert plan.plain_steps <= states_only.plain_steps
    if isinstance(plan, StaticSegmentsPlan):
        L = plan.segment_len
        assert plan.plain_steps == L * plan.inner.plain_steps < states_only.plain_steps
        assert plan.inner.plain_steps == optimal_plain_steps(n // L, plan.inner.checkpoints)
    assert plan.peak_bytes <= budget
    assert temp_bytes(jax.grad(lambda *a: leaves_loss(loop(*a))), *args) <= budget


WIDE = dict(B=16, H=128, I=128, dtype=jnp.float32)      # 8 KiB states, 8 KiB input rows
WIDE_BUDGET = 1400 * 1024


def wide_problem():
    (W, U, b), h0, xs = problem(200, **WIDE)
    return (W / 8, U / 8, b), h0, xs             # a contracting cell: gradients of order one


def wide_loss(loop):
    return lambda p, h, x: jnp.sum(loop(p, h, x) ** 2)


def test_the_budget_holds_when_the_inputs_are_differentiated_too():
    # A segment's sizes were a sum of parts that undercounted what XLA holds when the inputs'
    # windows get cotangents: 1.018 of this budget in 25-step segments (before ea20aad).
    args = wide_problem()
    loop = bj.binomial_checkpoint(tanh_cell, 200, memory=WIDE_BUDGET, keep_segments=True)
    temp = temp_bytes(jax.grad(wide_loss(loop), (0, 1, 2)), *args)
    assert isinstance(loop.plan, StaticSegmentsPlan) and temp <= WIDE_BUDGET


def test_the_plan_knows_whether_the_inputs_are_differentiated():
    # Without input cotangents a segment holds less (no window cotangent), so the same budget
    # keeps longer segments or more of them; the reverse mode picks the plan once it knows.
    args = wide_problem()
    loop = bj.binomial_checkpoint(tanh_cell, 200, memory=WIDE_BUDGET, keep_segments=True)
    plans = {False: loop.preview(*args), True: loop.preview(*args, differentiate_inputs=True)}
    assert plans[False].plain_steps < plans[True].plain_steps
    ref = lambda p, h, x: plain_loop(tanh_cell, p, h, x)                    # noqa: E731
    for wrt_x, argnums in ((False, (0, 1)), (True, (0, 2))):
        grad = jax.jit(jax.grad(wide_loss(loop), argnums))
        assert_close(grad(*args), jax.grad(wide_loss(ref), argnums)(*args), rtol=1e-4)
        assert str(loop.plan) == str(plans[wrt_x])
        assert temp_bytes(jax.grad(wide_loss(loop), argnums), *args) <= WIDE_BUDGET


def test_the_custom_vjp_fallback_plans_for_differentiated_inputs(monkeypatch):
    # without hijax every input cotangent is computed (sweep.build), so the plan is always the
    # one for differentiated inputs
    from bincheck.jax import forward
    monkeypatch.setattr(forward, "HIJAX", False)    # what jax < 0.8.1 gets
    args = problem(T)
    loop = bj.binomial_checkpoint(tanh_cell, T, memory=BUDGET, keep_segments=True)
    plan = loop.preview(*args, differentiate_inputs=True)
    assert isinstance(plan, StaticSegmentsPlan)
    ref = lambda p, h, x: plain_loop(tanh_cell, p, h, x)                    # noqa: E731
    for argnums in (0, (0, 2)):
        grad = jax.jit(jax.grad(lambda *a: leaves_loss(loop(*a)), argnums))
        assert_close(grad(*args), jax.grad(lambda *a: leaves_loss(ref(*a)), argnums)(*args))
        assert str(loop.plan) == str(plan)


def test_the_gradient_publishes_the_plan_and_remat_around_the_loop_is_exact():
    params, h0, xs = problem(T)
    loop = bj.binomial_checkpoint(tanh_cell, T, memory=BUDGET, keep_segments=True)
    ref = lambda p, h, x: plain_loop(tanh_cell, p, h, x)                    # noqa: E731
    assert_close(loop(params, h0, xs), ref(params, h0, xs))
    assert loop.plan is None                  # a call without a gradient chooses nothing
    want = jax.grad(lambda *a: leaves_loss(ref(*a)))(params, h0, xs)
    # under jax.checkpoint JAX transposes the forward-mode rule (docs/jax.rst): exact, but
    # not the checkpointed sweep, and it warns so
    with pytest.warns(bj.RematWarning, match="stores every step"):
        rematted = jax.grad(jax.checkpoint(lambda *a: leaves_loss(loop(*a))))(params, h0, xs)
    assert_close(rematted, want)
    assert_close(jax.grad(lambda *a: leaves_loss(loop(*a)))(params, h0, xs), want)
    assert str(loop.plan) == str(loop.preview(params, h0, xs))


def test_a_length_without_candidates_stores_states_only():
    args = problem(97)
    plan = bj.binomial_checkpoint(tanh_cell, 97, memory=BUDGET, keep_segments=True).preview(*args)
    assert not isinstance(plan, StaticSegmentsPlan)
    assert plan.plain_steps == bj.binomial_checkpoint(tanh_cell, 97, memory=BUDGET,
                                                      keep_segments=False).preview(
        *args).plain_steps


# --------------------------------------------------------------------------- through jax
@pytest.mark.parametrize("jit", [False, True])
def test_gradients_equal_scan_for_every_argument_with_per_step_outputs(jit):
    params, h0, xs = problem(T)
    readout = lambda p, h, x: jnp.sum(jnp.sin(h) * x[:, :1])             # noqa: E731
    loop = bj.binomial_checkpoint(tanh_cell, T, memory=BUDGET, output_fn=readout,
                                   keep_segments=True)
    static(loop, params, h0, xs)

    def loss(run):
        def f(p, h, x):
            final, ys = run(p, h, x)
            assert ys.shape == (T,)
            return jnp.sum(final ** 3) + jnp.sum(ys * jnp.arange(1, T + 1))
        return f
    ref = lambda p, h, x: plain_loop(tanh_cell, p, h, x, output_fn=readout)    # noqa: E731
    g = jax.grad(loss(loop), (0, 1, 2))
    g = jax.jit(g) if jit else g
    assert_close(g(params, h0, xs), jax.grad(loss(ref), (0, 1, 2))(params, h0, xs))
    if jit:                                              # each argument alone (once)
        for k in range(3):
            assert_close(jax.jit(jax.grad(loss(loop), k))(params, h0, xs),
                         jax.grad(loss(ref), k)(params, h0, xs))
    final, ys = loop(params, h0, xs)                      # the primal
    assert_close((final, ys), ref(params, h0, xs))


def test_counts_are_the_plan_s_plain_steps_and_each_step_taped_once():
    params, h0, xs = problem(T)
    evals = []

    def counted(p, h, x):
        # the operand ties the callback to the state: inside a segment's scan a callback
        # without one is loop-invariant and would be hoisted out (tests' Counter has none)
        jax.debug.callback(lambda _: evals.append(1), h[0, 0])
        return tanh_cell(p, h, x)
    loop = bj.binomial_checkpoint(counted, T, memory=BUDGET, keep_segments=True)
    plan = static(loop, params, h0, xs)
    jax.jit(jax.grad(lambda p: jnp.sum(loop(p, h0, xs) ** 2)))(params)
    jax.effects_barrier()
    assert len(evals) == plan.plain_steps + T
    assert loop.plan.plain_steps == plan.plain_steps        # what the call used = the preview


def test_lstm_pytree_state_forward_mode_hvp_and_vmap():
    params, state, xs = lstm_problem(96)
    loop = bj.binomial_checkpoint(lstm_cell, 96, memory=LSTM_BUDGET, keep_segments=True)
    static(loop, params, state, xs)
    ref = lambda s: plain_loop(lstm_cell, params, s, xs)                   # noqa: E731
    run = lambda s: loop(params, s, xs)                                    # noqa: E731
    tangent = jax.tree.map(jnp.ones_like, state)
    assert_close(jax.jvp(run, (state,), (tangent,)), jax.jvp(ref, (state,), (tangent,)))
    hvp = lambda f: jax.jvp(jax.grad(lambda s: leaves_loss(f(s))), (state,), (tangent,))[1]  # noqa
    assert_close(hvp(run), hvp(ref))
    batch = jax.tree.map(lambda v: jnp.stack([v, 2 * v]), state)
    per = lambda f: jax.vmap(jax.grad(lambda s: leaves_loss(f(s))))(batch)  # noqa: E731
    assert_close(per(run), per(ref))


def test_scan_drop_in_with_integer_leaves_and_no_inputs():
    params, h0, _ = problem(T)

    def f(carry, _):
        h, n = carry
        h = tanh_cell(params, h, jnp.ones((h.shape[0], 2)))
        return (h, n + 1), jnp.sum(h)
    init = (h0, jnp.zeros((), jnp.int32))
    (h, n), ys = bj.scan(f, init, None, length=T, memory=BUDGET, keep_segments=True)
    (h_ref, n_ref), ys_ref = jax.lax.scan(f, init, None, length=T)
    assert int(n) == T == int(n_ref)
    assert_close((h, ys), (h_ref, ys_ref))

    def loss(scan):
        def go(h0):
            (h, _), ys = scan(f, (h0, jnp.zeros((), jnp.int32)), None, length=T)
            return jnp.sum(h ** 2) + jnp.sum(ys)
        return go
    ours = loss(lambda *a, **k: bj.scan(*a, **k, memory=BUDGET, keep_segments=True))
    assert_close(jax.grad(ours)(h0), jax.grad(loss(jax.lax.scan))(h0))


def test_keep_segments_values():
    import numpy as np
    with pytest.raises(TypeError, match="keep_segments must be False, True or 'masked'"):
        bj.binomial_checkpoint(tanh_cell, T, memory=BUDGET, keep_segments="yes")
    with pytest.raises(TypeError, match="keep_segments"):
        bj.binomial_checkpoint(tanh_cell, T, memory=BUDGET, keep_segments=1)
    loop = bj.binomial_checkpoint(tanh_cell, T, memory=BUDGET, keep_segments=np.True_)
    static(loop, *problem(T))                   # numpy booleans are booleans
    with pytest.raises(TypeError, match="keep_segments='masked' plans within a byte budget"):
        bj.binomial_checkpoint(tanh_cell, T, 10, keep_segments="masked")
    assert segments.MIN_SEGMENTS == 3
