"""bincheck.jax does optimal work in bounded memory: one gradient evaluates the step
t(l, s) + l times at run time (counted by a host callback, against the closed form), the traced
program and the number of traces do not grow with seq_len, and XLA's temporaries
(``memory_analysis``) are flat in seq_len, far below ``lax.scan``'s and within the predicted
bytes; a ``memory=`` budget holds under that meter."""

import pytest

from jax_helpers import (F32, F64, Counter, assert_close, closed_form, count_eqns,  # noqa
                         cubed_sum, jax, numpy_bptt, plain_loop, problem, tanh_cell, temp_bytes)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import bincheck  # noqa: E402
import bincheck.jax as bj  # noqa: E402
from bincheck.jax.tables import compile_plan, revolve_tables  # noqa: E402
from bincheck.schedule.binomial import Plan  # noqa: E402

ALL = (0, 1, 2)


def loss_of(run):
    return lambda p, h, x: cubed_sum(run(p, h, x))


# Lengths at and between the binomial thresholds C(s + r, s) (3: 4, 10, 20, 35; 6: 7, 28).
@pytest.mark.parametrize("s,lengths", [(1, (1, 2, 5, 13)), (2, (2, 3, 8, 21, 40)),
                                       (3, (4, 10, 27, 40)), (6, (7, 29, 40)), (50, (2, 40))])
def test_one_jitted_gradient_evaluates_the_step_t_plus_l_times(s, lengths):
    counter = Counter()
    loops = {T: bj.binomial_checkpoint(counter.wrap(tanh_cell, T), T, s) for T in lengths}
    problems = {T: problem(T, B=1, H=2, I=1, seed=T) for T in lengths}
    grads = jax.jit(lambda probs: {T: jax.grad(loss_of(loops[T]), ALL)(*probs[T])
                                   for T in lengths})(problems)
    runs = counter.settled()
    for T in lengths:
        want = closed_form(T, s)
        assert runs[T] == want + T, (T, s, runs[T], want + T)
        assert bincheck.plan(T, s).plain_steps == want
        assert (loops[T].plan.plain_steps, loops[T].plan.taped_steps) == (want, T)
        assert_close(grads[T], numpy_bptt(*problems[T])[1])


def test_the_primal_alone_evaluates_each_step_once():
    counter = Counter()
    T = 13
    loop = bj.binomial_checkpoint(counter.wrap(tanh_cell), T, 3)
    out = jax.jit(loop)(*problem(T, B=1, H=2, I=1))
    assert counter.settled()["fn"] == T
    assert_close(out, numpy_bptt(*problem(T, B=1, H=2, I=1))[0])


@pytest.mark.parametrize("T,s", [(1, 1), (9, 3)])
def test_integer_state_leaves_and_output_fn_cost_no_extra_step(T, s):
    counter = Counter()

    def step(p, st, x):
        return {"h": tanh_cell(p, st["h"], x), "n": st["n"] + 1}
    readout = lambda p, st, x: jnp.sum(st["h"] ** 2)           # noqa: E731
    loop = bj.binomial_checkpoint(counter.wrap(step), T, s, output_fn=readout)
    params, h0, xs = problem(T, B=1, H=2, I=1)

    def loss(p, h, x):
        final, ys = loop(p, {"h": h, "n": jnp.zeros((), jnp.int32)}, x)
        return jnp.sum(ys * jnp.arange(1, T + 1)) + jnp.sum(final["h"]) + final["n"]
    jax.jit(jax.grad(loss, ALL))(params, h0, xs)
    assert counter.settled()["fn"] == closed_form(T, s) + T


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 20, 59, 257, 1000, 3001])
def test_revolve_tables_are_the_tables_of_the_plan_s_actions(n):
    """The direct walk (what a num_ckpts loop compiles) equals the action stream's tables, which
    the schedule layer's tracker validates action by action."""
    for s in (1, 2, 3, 5, 10, 50, n + 1):
        want, got = compile_plan(Plan(n, s), n), revolve_tables(n, s)
        for name in want.__dataclass_fields__:
            a, b = getattr(want, name), getattr(got, name)
            if isinstance(a, np.ndarray):
                assert a.dtype == b.dtype and np.array_equal(a, b), (n, s, name)
            else:
                assert a == b, (n, s, name)


def test_program_size_and_traces_do_not_grow_with_the_length():
    sizes, traces = {}, {}
    params, h0, _ = problem(1, B=1, H=2, I=1)
    for T in (100, 1000, 10_000, 100_000):
        counter = Counter()
        loop = bj.binomial_checkpoint(counter.wrap(tanh_cell), T, 50)
        xs = jax.ShapeDtypeStruct((T, 1, 1), F64)
        jaxpr = jax.make_jaxpr(jax.grad(loss_of(loop), ALL))(params, h0, xs)
        sizes[T], traces[T] = count_eqns(jaxpr), counter.traces["fn"]
        assert sizes[T] > 3 * len(jaxpr.jaxpr.eqns)     # the loop bodies were counted
    assert len(set(sizes.values())) == 1, sizes
    assert len(set(traces.values())) == 1 and 1 <= traces[100] <= 8, traces


# ---------------------------------------------------------------------- memory (XLA's meter)
B, H = 16, 64
STATE = B * H * 4                  # one float32 state: 4 KiB


def rnn(T):
    """A tanh RNN (float32, H=64, B=16); xs only as a shape (nothing allocated)."""
    g = np.random.default_rng(0)
    params = tuple(jnp.asarray(g.normal(size=(H, H)) * 0.1, F32) for _ in range(2))
    return params, jnp.zeros((B, H), F32), jax.ShapeDtypeStruct((T, B, H), F32)


def rnn_cell(p, h, x):
    return jnp.tanh(h @ p[0] + x @ p[1])


def concrete(args):
    """``loop.preview`` takes arrays: zeros for the shapes."""
    return jax.tree.map(lambda v: jnp.zeros(v.shape, v.dtype), args)


def params_grad(run):
    return jax.grad(lambda p, h, x: jnp.sum(run(p, h, x)))


def test_temporaries_are_flat_in_the_length_and_95_percent_below_scan():
    s = 50
    temps = {}
    for T in (100, 1000, 10_000):
        loop = bj.binomial_checkpoint(rnn_cell, T, s)
        temps[T] = temp_bytes(params_grad(loop), *rnn(T))
    scan = temp_bytes(params_grad(lambda p, h, x: plain_loop(rnn_cell, p, h, x)), *rnn(1000))
    assert max(temps.values()) <= 1.01 * min(temps.values()), temps
    assert temps[1000] <= 0.05 * scan, (temps, scan)
    work = bj.binomial_checkpoint(rnn_cell, 1000, s).preview(*concrete(rnn(1000))).sizes.work_bytes
    for T, temp in temps.items():
        assert temp <= (s + 1) * STATE + work, (T, temp, work)
        assert temp <= (s + 1) * STATE + 64 * 1024, (T, temp)   # a bound the code does not set


def tiny(T):
    g = np.random.default_rng(1)
    params = (jnp.asarray(g.normal(size=(4, 4)) * 0.5), jnp.asarray(g.normal(size=(2, 4))),
              jnp.zeros(4, F64))
    return params, jnp.zeros((3, 4), F64), jax.ShapeDtypeStruct((T, 3, 2), F64)


@pytest.mark.parametrize("make,cell,budgets", [
    (rnn, rnn_cell, [100_000, "1MB"]),
    (tiny, tanh_cell, [4_000, 16_000]),      # 96-byte states: XLA's bookkeeping dominates
], ids=["tanh-64x16-f32", "tanh-4x3-f64"])
def test_a_memory_budget_holds_under_memory_analysis(make, cell, budgets):
    T = 300
    checkpoints = []
    for memory in budgets:
        loop = bj.binomial_checkpoint(cell, T, memory=memory)
        planned = loop.preview(*concrete(make(T)))
        memory = bincheck.parse_bytes(memory)
        assert planned.peak_bytes <= memory
        temp = temp_bytes(params_grad(loop), *make(T))
        assert temp <= memory, (memory, temp, planned.sizes)
        assert repr(loop.plan.schedule) == repr(planned.schedule)
        checkpoints.append(planned.plain_steps)
    assert checkpoints[0] > checkpoints[1], checkpoints      # more memory, fewer plain steps


@pytest.mark.parametrize("memory", [100_000, "1MB"])
def test_a_memory_budget_with_per_step_outputs_holds_beside_the_outputs(memory):
    """With ``output_fn`` the stacked outputs and their cotangent are ``seq_len`` long, results
    of the loop as for ``lax.scan``, which ``memory=`` does not count (docs/jax.rst): the
    gradient's temporaries stay within the budget plus those two."""
    T = 300

    def readout(p, h, x):
        return jnp.tanh(h @ p[1]).sum(axis=-1)            # (B,) a step

    loop = bj.binomial_checkpoint(rnn_cell, T, memory=memory, output_fn=readout)

    def loss(p, h, x):
        final, ys = loop(p, h, x)
        return jnp.sum(final) + jnp.sum(ys * jnp.arange(1, T + 1)[:, None])
    args = rnn(T)
    planned = loop.preview(*concrete(args))
    memory = bincheck.parse_bytes(memory)
    assert planned.peak_bytes <= memory
    temp = temp_bytes(jax.grad(loss), *args)
    ys_bytes = T * B * 4
    assert temp <= memory + 2 * ys_bytes, (memory, temp, ys_bytes, planned.sizes)
