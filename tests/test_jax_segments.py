"""Kept taped segments under XLA's static allocation (issue 18, item 4).

With ``memory=`` and ``keep_segments="masked"``, ``bincheck.jax`` plans with :class:`FixedLeafPlan`:
``slots`` stored states and taped segments of at most ``leaf`` steps, both allocated all the time
(XLA cannot let a tape borrow the bytes of a freed slot), when that beats storing states only. A
segment is one ``jax.vjp`` of a masked scan of ``leaf`` steps.
"""

from dataclasses import replace

import pytest

from jax_helpers import (Counter, assert_close, closed_form, jax, plain_loop,  # noqa: E402
                         problem, tanh_cell, temp_bytes)
import jax.numpy as jnp  # noqa: E402

import bincheck  # noqa: E402
import bincheck.jax as bj  # noqa: E402
from bincheck.schedule.actions import Reverse  # noqa: E402
from bincheck.schedule.binomial import optimal_plain_steps  # noqa: E402
from bincheck.schedule.budget import BudgetPlan, Sizes  # noqa: E402
from bincheck.schedule.mixed import FixedLeafPlan, ReferenceTable  # noqa: E402
from bincheck.schedule.simulate import simulate  # noqa: E402

T = 120
BUDGET = 16_000             # 96-byte states: a budget where kept segments win (checked below)


# ------------------------------------------------------------------------------- the planner
@pytest.mark.parametrize("n", [1, 2, 7, 30, 61])
@pytest.mark.parametrize("slots", [1, 2, 3, 6])
@pytest.mark.parametrize("leaf", [1, 2, 3, 5])
def test_fixed_leaf_plan_is_the_exact_dp_optimum_and_valid(n, slots, leaf):
    plan = FixedLeafPlan(n, slots, leaf)
    top = min(slots, n)
    assert plan.plain_steps == ReferenceTable(n, [leaf] * (top + 1)).cost(n, top)
    cost = simulate(plan)
    assert cost.reversed == list(range(n - 1, -1, -1))
    assert cost.plain_steps == plan.plain_steps and cost.peak_checkpoints <= slots
    assert max(a.stop - a.start for a in plan if type(a) is Reverse) <= leaf
    first = next(a for a in plan if type(a) is Reverse)
    assert plan.first_reverse_start == first.start
    if leaf == 1:
        assert plan.plain_steps == optimal_plain_steps(n, slots)


def test_static_budget_holds_slots_and_the_longest_segment_side_by_side():
    sizes = Sizes(state_bytes=1_000, tape_bytes=3_000, work_bytes=10_000, segment_bytes=5_000)
    plan = BudgetPlan(300, 150_000, sizes, static=True)
    fixed = plan.schedule
    assert isinstance(fixed, FixedLeafPlan) and fixed.leaf > 1
    assert 10_000 + fixed.slots * 1_000 + 5_000 + (fixed.leaf - 1) * 3_000 <= 150_000
    assert plan.peak_bytes <= 150_000
    states_only = BudgetPlan(300, 150_000, replace(sizes, tape_bytes=None))
    assert plan.plain_steps < states_only.plain_steps
    # tapes too dear: states only, exactly Revolve's plan
    dear = BudgetPlan(300, 150_000, replace(sizes, tape_bytes=100_000), static=True)
    assert list(dear) == list(states_only)


# ----------------------------------------------------------------------------- through jax
def chosen(loop, *args):
    plan = loop.preview(*args)
    assert isinstance(plan.schedule, FixedLeafPlan) and plan.schedule.leaf > 1, str(plan)
    return plan


def test_segments_are_chosen_where_they_pay_and_the_budget_holds():
    params, h0, xs = problem(T)
    loop = bj.binomial_checkpoint(tanh_cell, T, memory=BUDGET, keep_segments="masked")
    plan = chosen(loop, params, h0, xs)
    sizes = replace(plan.sizes, tape_bytes=None)
    assert plan.plain_steps < BudgetPlan(T, BUDGET, sizes).plain_steps
    assert plan.peak_bytes <= BUDGET
    grad = jax.grad(lambda p, h, x: jnp.sum(loop(p, h, x) ** 2))
    assert temp_bytes(grad, params, h0, xs) <= BUDGET            # XLA's own meter


@pytest.mark.parametrize("jit", [False, True])
def test_gradients_with_segments_equal_scan_for_every_argument(jit):
    params, h0, xs = problem(T)
    readout = lambda p, h, x: jnp.sum(jnp.sin(h) * x[:, :1])            # noqa: E731
    loop = bj.binomial_checkpoint(tanh_cell, T, memory=BUDGET, output_fn=readout,
                                   keep_segments="masked")
    chosen(loop, params, h0, xs)

    def loss(run):
        def f(p, h, x):
            final, ys = run(p, h, x)
            return jnp.sum(final ** 3) + jnp.sum(ys * jnp.arange(1, T + 1))
        return f
    ref = lambda p, h, x: plain_loop(tanh_cell, p, h, x, output_fn=readout)   # noqa: E731
    g = jax.grad(loss(loop), (0, 1, 2))
    g = jax.jit(g) if jit else g
    assert_close(g(params, h0, xs), jax.grad(loss(ref), (0, 1, 2))(params, h0, xs))
    # each argument alone, too (symbolic zeros for the others): once, without jit (the same
    # un-jitted computation in both cases, so the jit case ran it a second time for nothing)
    if not jit:
        for k in range(3):
            assert_close(jax.grad(loss(loop), k)(params, h0, xs),
                         jax.grad(loss(ref), k)(params, h0, xs))


def test_segments_evaluate_the_plan_s_plain_steps_and_each_step_taped_once():
    params, h0, xs = problem(T)
    counter = Counter()
    loop = bj.binomial_checkpoint(counter.wrap(tanh_cell), T, memory=BUDGET, keep_segments="masked")
    plan = chosen(loop, params, h0, xs)
    counter = Counter()
    loop = bj.binomial_checkpoint(counter.wrap(tanh_cell), T, memory=BUDGET, keep_segments="masked")
    jax.jit(jax.grad(lambda p: jnp.sum(loop(p, h0, xs) ** 2)))(params)
    assert counter.settled()["fn"] == plan.plain_steps + T


def test_forward_mode_and_hvp_with_segments():
    params, h0, xs = problem(T)
    loop = bj.binomial_checkpoint(tanh_cell, T, memory=BUDGET, keep_segments="masked")
    chosen(loop, params, h0, xs)
    ref = lambda h: plain_loop(tanh_cell, params, h, xs)                   # noqa: E731
    tangent = jnp.ones_like(h0)
    assert_close(jax.jvp(lambda h: loop(params, h, xs), (h0,), (tangent,)),
                 jax.jvp(ref, (h0,), (tangent,)))
    loss = lambda run: (lambda h: jnp.sum(run(h) ** 2))                     # noqa: E731
    hvp = lambda f: jax.jvp(jax.grad(f), (h0,), (tangent,))[1]               # noqa: E731
    assert_close(hvp(loss(lambda h: loop(params, h, xs))), hvp(loss(ref)))


def test_integer_leaves_and_vmap_with_segments():
    params, h0, xs = problem(T)

    def step(p, st, x):
        h, n = st
        return tanh_cell(p, h, x), n + 1
    loop = bj.binomial_checkpoint(step, T, memory=BUDGET + 2_000, keep_segments="masked")
    chosen(loop, params, (h0, jnp.zeros((), jnp.int32)), xs)

    def loss(run):
        return lambda p, h: jnp.sum(run(p, (h, jnp.zeros((), jnp.int32)), xs)[0] ** 2)
    ref = lambda p, st, x: plain_loop(step, p, st, x)                      # noqa: E731
    assert_close(jax.grad(loss(loop), (0, 1))(params, h0),
                 jax.grad(loss(ref), (0, 1))(params, h0))
    final = loop(params, (h0, jnp.zeros((), jnp.int32)), xs)
    assert int(final[1]) == T
    hs = jnp.stack([h0, 2 * h0])
    batched = jax.vmap(jax.grad(loss(loop), 1), (None, 0))(params, hs)
    assert_close(batched, jax.vmap(jax.grad(loss(ref), 1), (None, 0))(params, hs))


def test_the_preview_names_the_static_plan():
    params, h0, xs = problem(T)
    loop = bj.binomial_checkpoint(tanh_cell, T, memory="16kB", keep_segments="masked")
    plan = chosen(loop, params, h0, xs)
    assert "mixed (states and taped segments)" in str(plan)
    assert plan.memory == bincheck.parse_bytes("16kB") == BUDGET
    assert repr(loop.plan.schedule) == repr(plan.schedule)


def test_segments_are_opt_in_and_need_a_byte_budget():
    params, h0, xs = problem(T)
    default = bj.binomial_checkpoint(tanh_cell, T, memory=BUDGET)
    plan = default.preview(params, h0, xs)
    assert not isinstance(plan.schedule, FixedLeafPlan) and plan.sizes.tape_bytes is None
    with pytest.raises(TypeError, match="keep_segments=True plans within a byte budget"):
        bj.binomial_checkpoint(tanh_cell, T, 10, keep_segments=True)
    with pytest.raises(TypeError, match="keep_segments"):
        bj.binomial_checkpoint(tanh_cell, T, memory=BUDGET, keep_segments="yes")
    carry, _ = bj.scan(lambda h, x: (tanh_cell(params, h, x), None), h0, xs, memory=BUDGET,
                       keep_segments="masked")
    assert_close(carry, plain_loop(tanh_cell, params, h0, xs))


@pytest.mark.parametrize("T,slots,leaf", [(1, 1, 2), (2, 1, 2), (5, 1, 8), (6, 2, 3), (9, 1, 3)])
def test_short_loops_and_a_loop_taped_whole(T, slots, leaf):
    """Through the tables directly: a first segment that starts at step 0 (the whole loop one
    segment, no plain step before it) and loops of one or two steps."""
    from bincheck.jax.boundary import Flat
    from bincheck.jax.forward import checkpointed
    from bincheck.jax.tables import compile_plan
    params, h0, xs = problem(T, B=2, H=3, I=2)
    plan = FixedLeafPlan(T, slots, leaf)
    tables = compile_plan(iter(plan), T, leaf)
    assert (tables.first_lo == 0) == (leaf >= T)

    def whole(p, h, x):
        new = tanh_cell(p, h, x)
        return new, jnp.sum(new * x[:, :1])

    def loss(p, h, x):
        flat = Flat(whole, p, h, x, T)
        loop = checkpointed(flat, tables)
        new, ys = loop(flat.p, flat.h, flat.x, tuple(jnp.asarray(a) for a in tables.arrays()))
        return jnp.sum(new[0] ** 3) + jnp.sum(ys[0] ** 2)
    readout = lambda p, h, x: jnp.sum(h * x[:, :1])                       # noqa: E731

    def ref(p, h, x):
        final, ys = plain_loop(tanh_cell, p, h, x, output_fn=readout)
        return jnp.sum(final ** 3) + jnp.sum(ys ** 2)
    assert_close(jax.grad(loss, (0, 1, 2))(params, h0, xs), jax.grad(ref, (0, 1, 2))(params, h0, xs))


# ---------------------------------------------- recipe: segments of one static length (docs)
def super_step_scan(f, L):
    """docs/jax.rst's recipe: ``f(carry, x) -> (carry, y)`` run ``L`` steps at a time, as one
    ``lax.scan`` (a super-step) that bincheck checkpoints and tapes whole."""
    def block(carry, xs_block):
        return jax.lax.scan(f, carry, xs_block)
    return block


@pytest.mark.parametrize("T,L,s", [(24, 4, 3), (30, 5, 2), (12, 12, 1), (40, 8, 6)])
def test_static_segments_recipe_is_exact_and_counts_L_times_revolve(T, L, s):
    """The loop over ``T / L`` super-steps: gradients equal ``lax.scan``'s for every argument,
    per-step outputs included; the step runs ``L * t(T / L, s)`` times plain and ``T`` taped
    (each reversed super-step is one taped scan), counted at run time."""
    params, h0, xs = problem(T)
    evals = []

    def f(p):
        def step(h, x):
            # the operand ties the callback to the carry (else a scan may hoist it)
            jax.debug.callback(lambda _: evals.append(1), h[0, 0])
            h = tanh_cell(p, h, x)
            return h, jnp.sum(jnp.sin(h) * x[:, :1])
        return step

    def loss(run):
        def go(p, h, x):
            final, ys = run(f(p), h, x)
            return jnp.sum(final ** 3) + jnp.sum(ys * jnp.arange(1, T + 1))
        return go

    def recipe(step, h, x):
        n = T // L
        carry, ys = bj.scan(super_step_scan(step, L), h, x.reshape((n, L) + x.shape[1:]),
                            num_ckpts=s)
        return carry, ys.reshape((T,) + ys.shape[2:])
    plain = lambda step, h, x: jax.lax.scan(step, h, x)                     # noqa: E731
    got = jax.jit(jax.grad(loss(recipe), (0, 1, 2)))(params, h0, xs)
    jax.effects_barrier()
    counted, evals[:] = len(evals), []
    assert counted == L * closed_form(T // L, s) + T
    assert_close(got, jax.grad(loss(plain), (0, 1, 2))(params, h0, xs))
