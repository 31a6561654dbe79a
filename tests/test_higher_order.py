"""Forward mode, reverse-over-reverse and forward-over-reverse through checkpointed loops.

Every derivative is compared with the same autograd operator applied to the plain loop
(rtol 1e-8), over several (seq_len, num_ckpts) including seq_len = 1 and num_ckpts = 1.
"""

import autograd.numpy as np
import numpy
import pytest
from autograd import grad, hessian_vector_product, make_ggnvp, make_hvp, make_jvp
from autograd.test_util import check_grads

from bincheck import binomial_checkpoint, checkpointed_while_loop
from helpers import (assert_trees_close, autonomous, autonomous_problem, lstm, lstm_problem,
                    outputs_problem, plain_loop, rnn_problem, rnn_with_outputs, tanh_rnn)

CASES = [(1, 1), (1, 2), (4, 1), (6, 2), (9, 3), (5, 8)]
RTOL = 1e-8


def close(a, b):
    assert_trees_close(a, b, rtol=RTOL, atol=1e-12)


def rand_like(x, seed):
    return numpy.random.RandomState(seed).randn(*numpy.shape(x))


def pair(fn, l, s, with_outputs=False):
    loop = binomial_checkpoint(fn, l, s, with_outputs=with_outputs)
    return loop, (lambda p, st, x: plain_loop(fn, p, st, x, l, with_outputs))


@pytest.mark.parametrize("l,s", CASES)
def test_forward_mode_jvp(l, s):
    params, h0, xs = rnn_problem(l)
    loop, ref = pair(tanh_rnn, l, s)
    for argnum, x in ((0, params[0]), (1, h0), (2, xs)):
        def f(v, run):
            args = [params, h0, xs]
            args[argnum] = (v,) + params[1:] if argnum == 0 else v
            return run(*args)
        t = rand_like(x, argnum)
        close(make_jvp(lambda v: f(v, loop))(x)(t), make_jvp(lambda v: f(v, ref))(x)(t))


@pytest.mark.parametrize("l,s", CASES)
def test_forward_mode_lstm_and_outputs(l, s):
    params, state, xs = lstm_problem(l)
    loop, ref = pair(lstm, l, s)
    t = rand_like(state[1], 3)
    both = lambda out: out[0] + 2.0 * out[1]            # a single array output for make_jvp
    close(make_jvp(lambda c: both(loop(params, (state[0], c), xs)))(state[1])(t),
          make_jvp(lambda c: both(ref(params, (state[0], c), xs)))(state[1])(t))
    params, h0, xs = outputs_problem(l)
    loop, ref = pair(rnn_with_outputs, l, s, with_outputs=True)
    t = rand_like(params[3], 4)
    close(make_jvp(lambda V: loop(params[:3] + (V,), h0, xs)[1])(params[3])(t),
          make_jvp(lambda V: ref(params[:3] + (V,), h0, xs)[1])(params[3])(t))


@pytest.mark.parametrize("l,s", CASES)
def test_hessian_vector_products(l, s):
    params, h0, xs = rnn_problem(l)
    loop, ref = pair(tanh_rnn, l, s)
    loss = lambda run: lambda W, h, x: np.sum(np.sin(run((W,) + params[1:], h, x)))
    for argnum, x in ((0, params[0]), (1, h0), (2, xs)):
        v = rand_like(x, 10 + argnum)
        args = [params[0], h0, xs]
        close(hessian_vector_product(loss(loop), argnum)(*args, v),
              hessian_vector_product(loss(ref), argnum)(*args, v))


@pytest.mark.parametrize("l,s", CASES)
def test_grad_of_grad_lstm_dict_params(l, s):
    params, state, xs = lstm_problem(l)
    loop, ref = pair(lstm, l, s)
    v = {k: rand_like(a, 5) for k, a in params.items()}

    def gdotv(run):
        def f(p):
            g = grad(lambda q: np.sum(np.tanh(run(q, state, xs)[0])))(p)
            return sum(np.sum(g[k] * v[k]) for k in g)
        return f
    close(grad(gdotv(loop))(params), grad(gdotv(ref))(params))


@pytest.mark.parametrize("l,s", CASES)
def test_make_hvp_and_ggnvp(l, s):
    params, state, _ = autonomous_problem()
    loop, ref = pair(autonomous, l, s)
    q0 = state[0]
    f = lambda run: lambda q: np.sum(np.cos(run(params, (q, state[1]), None)[0]))
    v = rand_like(q0, 7)
    close(make_hvp(f(loop))(q0)[0](v), make_hvp(f(ref))(q0)[0](v))
    g = lambda run: lambda q: run(params, (q, state[1]), None)[0]
    G = lambda y: 0.5 * np.sum(np.sin(y) ** 2)
    close(make_ggnvp(g(loop), G)(q0)(v), make_ggnvp(g(ref), G)(q0)(v))


@pytest.mark.parametrize("l,s", CASES)
def test_forward_over_reverse(l, s):
    params, h0, xs = outputs_problem(l)
    loop, ref = pair(rnn_with_outputs, l, s, with_outputs=True)
    f = lambda run: lambda h: np.sum(run(params, h, xs)[1] ** 3)
    v = rand_like(h0, 8)
    close(make_jvp(grad(f(loop)))(h0)(v), make_jvp(grad(f(ref)))(h0)(v))
    # and reverse over forward
    close(grad(lambda h: make_jvp(f(loop))(h)(v)[1])(h0),
          grad(lambda h: make_jvp(f(ref))(h)(v)[1])(h0))


@pytest.mark.parametrize("l,s", [(1, 1), (5, 2), (8, 3)])
def test_check_grads_second_order(l, s):
    params, h0, xs = rnn_problem(l, H=2, B=1, D=2)
    loop = binomial_checkpoint(tanh_rnn, l, s)
    check_grads(lambda p, h, x: np.sum(np.sin(loop(p, h, x))), modes=["fwd", "rev"], order=2)(
        params, h0, xs)
    params, state, xs = lstm_problem(l, H=2, B=1, D=1)
    loop = binomial_checkpoint(lstm, l, s)
    check_grads(lambda p, st, x: np.sum(np.sin(loop(p, st, x)[0])), modes=["fwd", "rev"],
                order=2)(params, state, xs)
    params, state, _ = autonomous_problem()
    loop = binomial_checkpoint(autonomous, l, s)
    check_grads(lambda q, p: np.sum(loop(params, (q, p), None)[0] ** 2), modes=["fwd", "rev"],
                order=2)(*state)


def test_third_order_scalar():
    l, s = 6, 2
    step = lambda a, x, _: np.sin(a * x) + x
    loop, ref = pair(step, l, s)
    d3 = lambda run: grad(grad(grad(lambda a: run(a, 0.3, None))))
    numpy.testing.assert_allclose(d3(loop)(0.7), d3(ref)(0.7), rtol=RTOL)


@pytest.mark.parametrize("s", [1, 2, 4])
def test_while_loop_second_order(s):
    cond = lambda p, st: st[0] < 1.0
    body = lambda p, st: (st[0] + 0.1, st[1] + 0.1 * np.tanh(p * st[1]))
    run = checkpointed_while_loop(cond, body, s)

    def ref(p, st):
        while cond(p, st):
            st = body(p, st)
        return st
    f = lambda r: lambda p, y: np.sum(r(p, (0.0, y))[1] ** 2)
    y0, p0 = numpy.array([0.3, -0.5]), 1.3
    v = rand_like(y0, 9)
    close(hessian_vector_product(f(run), 1)(p0, y0, v), hessian_vector_product(f(ref), 1)(p0, y0, v))
    close(grad(grad(f(run), 0), 0)(p0, y0), grad(grad(f(ref), 0), 0)(p0, y0))
    close(make_jvp(lambda y: f(run)(p0, y))(y0)(v), make_jvp(lambda y: f(ref)(p0, y))(y0)(v))


@pytest.mark.parametrize("as_dict", [False, True])
def test_mixed_orders_with_params_boxed_as_one_container(as_dict):
    """grad w.r.t. a tuple/dict of weights boxes it whole; the tangent loop gets one ZERO for it
    (review finding: forward-over-reverse and reverse-over-forward used to crash)."""
    params, h0, xs = rnn_problem(6, H=3, B=2, D=2, seed=1)
    loop, ref = pair(tanh_rnn, 6, 2)
    v = rand_like(h0, 5)
    pack = (lambda p: {"W": p[0], "U": p[1], "b": p[2]}) if as_dict else (lambda p: p)
    unpack = (lambda p: (p["W"], p["U"], p["b"])) if as_dict else (lambda p: p)
    L = lambda run: (lambda p, h: np.sum(run(unpack(p), h, xs) ** 3))
    close(make_jvp(lambda h: grad(L(loop), 0)(pack(params), h))(h0)(v)[1],
          make_jvp(lambda h: grad(L(ref), 0)(pack(params), h))(h0)(v)[1])
    rof = lambda run: grad(lambda p: np.sum(make_jvp(lambda h: run(unpack(p), h, xs))(h0)(v)[1]
                                            ** 2))(pack(params))
    close(rof(loop), rof(ref))
