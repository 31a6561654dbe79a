"""Bounded memory, measured with tracemalloc (deterministic: allocation sizes, not timings)."""

import autograd.numpy as np
import numpy
from autograd import grad

from bincheck import binomial_checkpoint
from helpers import peak_bytes, plain_loop, rnn_problem, tanh_rnn


def test_gradient_memory_is_20x_below_the_plain_loop():
    l, s = 1000, 10
    params, h0, xs = rnn_problem(l, H=64, B=8, D=8)
    loop = binomial_checkpoint(tanh_rnn, l, s)
    ours, g = peak_bytes(grad(lambda p: np.sum(loop(p, h0, xs) ** 2)), params)
    plain, g0 = peak_bytes(grad(lambda p: np.sum(plain_loop(tanh_rnn, p, h0, xs, l) ** 2)), params)
    for a, b in zip(g, g0):
        numpy.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-13)
    assert plain >= 20 * ours, f"plain {plain} B vs bincheck {ours} B: only {plain / ours:.1f}x"


def test_no_buffer_for_inputs_nobody_asked_for():
    """Differentiating params only must not allocate a (T, B, D) cotangent for the inputs."""
    l = 400
    params, h0, xs = rnn_problem(l, H=4, B=8, D=256)       # inputs dominate: 400*8*256*8 = 6.5 MB
    loop = binomial_checkpoint(tanh_rnn, l, 5)
    ours, _ = peak_bytes(grad(lambda p: np.sum(loop(p, h0, xs))), params)
    assert ours < xs.nbytes / 4, f"peak {ours} B vs inputs {xs.nbytes} B"
    with_inputs, _ = peak_bytes(grad(lambda x: np.sum(loop(params, h0, x))), xs)
    assert with_inputs >= xs.nbytes             # the requested buffer is there, and measured


def test_memory_grows_with_num_ckpts_not_seq_len():
    params, h0, xs = rnn_problem(2000, H=32, B=8, D=4)
    peaks = {}
    for l in (500, 2000):
        loop = binomial_checkpoint(tanh_rnn, l, 8)
        peaks[l], _ = peak_bytes(grad(lambda p: np.sum(loop(p, h0, xs[:l]))), params)
    assert peaks[2000] < 1.5 * peaks[500], peaks


def test_hvp_memory_stays_bounded():
    """Second order: an HVP holds the tangent loop's checkpoints, not O(seq_len) tapes."""
    from autograd import hessian_vector_product
    l, s = 300, 6
    params, h0, xs = rnn_problem(l, H=48, B=8, D=8)
    loop = binomial_checkpoint(tanh_rnn, l, s)
    f = lambda W: np.sum(loop((W,) + params[1:], h0, xs) ** 2)
    f0 = lambda W: np.sum(plain_loop(tanh_rnn, (W,) + params[1:], h0, xs, l) ** 2)
    v = numpy.random.RandomState(0).randn(*params[0].shape)
    ours, r = peak_bytes(hessian_vector_product(f), params[0], v)
    plain, r0 = peak_bytes(hessian_vector_product(f0), params[0], v)
    numpy.testing.assert_allclose(r, r0, rtol=1e-8, atol=1e-10)
    assert plain >= 10 * ours, f"plain {plain} B vs bincheck {ours} B: only {plain / ours:.1f}x"
