"""Regressions from review: containers, dtypes, closures and validation at the edges."""

import autograd.numpy as np
import numpy
import pytest
from autograd import grad, hessian_vector_product, make_jvp, value_and_grad

from bincheck import CheckpointedLoop, binomial_checkpoint, checkpointed_while_loop
from helpers import assert_trees_close, plain_loop, rnn_problem, tanh_rnn


def test_dict_order_is_the_users():
    params, h0, xs = rnn_problem(6)
    params = {"W": params[0], "U": params[1], "b": params[2]}    # not sorted

    def cell(p, h, x):
        W, U, b = p.values()                                     # relies on insertion order
        return np.tanh(np.dot(h, W) + np.dot(x, U) + b)
    loop = binomial_checkpoint(cell, 6, 2)
    v, g = value_and_grad(lambda h: np.sum(loop(params, h, xs)))(h0)
    v0, g0 = value_and_grad(lambda h: np.sum(plain_loop(cell, params, h, xs, 6)))(h0)
    assert v == pytest.approx(v0, rel=1e-12)
    assert_trees_close(g, g0)


def test_state_dict_returned_in_another_key_order():
    step = lambda p, st, x: {"b": st["b"] * p, "a": st["a"] + st["b"]}   # keys swapped
    loop = binomial_checkpoint(step, 5, 2)
    f = lambda p, st: loop(p, st, None)["a"]
    st0 = {"a": 1.0, "b": 2.0}
    g = grad(f, (0, 1))(0.9, st0)
    g0 = grad(lambda p, st: plain_loop(step, p, st, None, 5)["a"], (0, 1))(0.9, st0)
    assert_trees_close(g, g0)


def test_mixed_type_dict_keys():
    step = lambda p, st, x: {1: st[1] * p, "a": st["a"] + st[1]}
    loop = binomial_checkpoint(step, 4, 2)
    assert grad(lambda p: loop(p, {1: 2.0, "a": 1.0}, None)["a"])(0.5) == pytest.approx(
        grad(lambda p: plain_loop(step, p, {1: 2.0, "a": 1.0}, None, 4)["a"])(0.5))


@pytest.mark.parametrize("y", ["loss", None, (), {"a": "b"}])
def test_non_numeric_y_is_rejected(y):
    params, h0, xs = rnn_problem(4)
    step = lambda p, h, x: (tanh_rnn(p, h, x), y)
    loop = binomial_checkpoint(step, 4, 2, with_outputs=True)
    with pytest.raises(TypeError, match=r"y must be an array, a scalar, or a tuple/list/dict"):
        loop(params, h0, xs)


def test_closure_over_a_differentiated_value_is_rejected():
    params, h0, xs = rnn_problem(6)
    W, U = params[0], params[1]

    def loss(W, h):
        step = lambda p, h, x: np.tanh(np.dot(h, W) + np.dot(x, U))
        return np.sum(binomial_checkpoint(step, 6, 2)(None, h, xs) ** 2)
    for argnums in ((0, 1), 0):
        with pytest.raises(TypeError, match="closes over a value.*params"):
            grad(loss, argnums)(W, h0)


def test_integer_array_initial_state_second_order():
    step = lambda p, s, x: np.sin(s * p) + 1
    loop = binomial_checkpoint(step, 3, 2)
    f = lambda p: np.sum(loop(p, numpy.array([1, 2, 3]), None) ** 2)
    f0 = lambda p: np.sum(plain_loop(step, p, numpy.array([1, 2, 3]), None, 3) ** 2)
    assert grad(f)(0.5) == pytest.approx(grad(f0)(0.5), rel=1e-10)
    assert hessian_vector_product(f)(0.5, 1.0) == pytest.approx(
        hessian_vector_product(f0)(0.5, 1.0), rel=1e-10)
    assert make_jvp(f)(0.5)(1.0)[1] == pytest.approx(make_jvp(f0)(0.5)(1.0)[1], rel=1e-10)


def test_integer_outputs_in_forward_mode():
    params, h0, xs = rnn_problem(5)
    step = lambda p, st, x: ((st[0] + 1, tanh_rnn(p, st[1], x)), st[0])
    loop = binomial_checkpoint(step, 5, 2, with_outputs=True)
    f = lambda W, run: np.sum(run((W,) + params[1:], (0, h0), xs)[0][1])
    ref = lambda p, st, x: plain_loop(step, p, st, x, 5, with_outputs=True)
    t = numpy.ones_like(params[0])
    assert make_jvp(lambda W: f(W, loop))(params[0])(t)[1] == pytest.approx(
        make_jvp(lambda W: f(W, ref))(params[0])(t)[1], rel=1e-10)
    numpy.testing.assert_array_equal(loop(params, (0, h0), xs)[1], numpy.arange(5))


def test_outputs_dtype_is_promoted_like_stack():
    params, h0, xs = rnn_problem(4)
    step = lambda p, h, x: (tanh_rnn(p, h, x), np.sum(h ** 2))
    loop = binomial_checkpoint(step, 4, 2, with_outputs=True)
    ys = loop(params, h0.astype(numpy.float32), xs)[1]
    ys0 = plain_loop(step, params, h0.astype(numpy.float32), xs, 4, with_outputs=True)[1]
    assert ys.dtype == ys0.dtype == numpy.float64
    numpy.testing.assert_array_equal(ys, ys0)


def test_numpy_integer_lengths_accepted():
    loop = binomial_checkpoint(tanh_rnn, numpy.int64(5), numpy.int32(2))
    assert loop.seq_len == 5 and type(loop.seq_len) is int


def test_schedule_and_planner_validated():
    with pytest.raises(TypeError, match=r"schedule must be a plan.*got 10"):
        CheckpointedLoop(tanh_rnn, 10)
    with pytest.raises(TypeError, match=r"planner must be None or a callable.*3"):
        from bincheck import WhileLoop
        WhileLoop(lambda p, s: False, lambda p, s: s, 2, planner=3)


def test_cond_fn_must_return_a_bool():
    run = checkpointed_while_loop(lambda p, y: y < 1.0, lambda p, y: y + p, 2)
    with pytest.raises(TypeError, match=r"cond_fn must return a bool; after 0 steps.*ndarray"):
        run(0.5, numpy.array([0.0, 0.5]))


def test_inputs_error_names_the_leaf():
    params, h0, xs = rnn_problem(5)
    loop = binomial_checkpoint(lambda p, h, x: tanh_rnn(p, h, x[0]), 5, 2)
    with pytest.raises(ValueError, match=r"leading length 4 \(leaf 1 of 2\)"):
        loop(params, h0, (xs, xs[:4]))


def test_integer_state_leaf_gets_integer_zeros_as_in_plain_autograd():
    """Plain autograd gives a carried integer array leaf of the state integer zeros of its shape
    and dtype; the loop gave None."""
    step = lambda p, s, x: (s[0] + 1, s[1] * p)
    init = (numpy.arange(2), numpy.ones(2))
    f = lambda run: lambda p, s: np.sum(run(p, s, None)[1])
    ref = lambda p, s, x: plain_loop(step, p, s, x, 5)
    for argnums in (1, (0, 1)):
        got = grad(f(binomial_checkpoint(step, 5, 2)), argnums)(1.5, init)
        want = grad(f(ref), argnums)(1.5, init)
        ds, ds0 = (got[1], want[1]) if argnums != 1 else (got, want)
        assert ds[0] is not None and ds[0].dtype == ds0[0].dtype and ds0[0].dtype.kind == "i"
        numpy.testing.assert_array_equal(ds[0], ds0[0])
        numpy.testing.assert_allclose(ds[1], ds0[1], rtol=1e-12)


def test_integer_state_leaf_the_steps_turn_into_floats_is_refused():
    """Its real gradient is not zero (plain autograd differentiates through it): refuse rather
    than answer zeros."""
    loop = binomial_checkpoint(lambda p, h, x: h * p, 5, 2)
    with pytest.raises(TypeError, match="integer leaf of init_state .*int.*float64.*astype"):
        grad(lambda p, h: np.sum(loop(p, h, None)), 1)(1.5, numpy.arange(3))
    # differentiating params only is fine: the integer initial state is a constant
    assert grad(lambda p: np.sum(loop(p, numpy.arange(3), None)))(1.5) == pytest.approx(
        grad(lambda p: np.sum(plain_loop(lambda p, h, x: h * p, p, numpy.arange(3), None, 5)))(1.5))
