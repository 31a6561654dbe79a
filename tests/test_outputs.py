"""Per-step outputs: output_fn (never recomputed in replays), tree-valued y, and their derivatives,
all against the plain loop."""

import autograd.numpy as np
import numpy
import pytest
from autograd import grad, hessian_vector_product, make_jvp

from bincheck import NondeterministicStepError, binomial_checkpoint
from bincheck.tree import flatten
from helpers import Counter, assert_trees_close, closed_form, lstm, lstm_problem, plain_loop, \
    rnn_problem, tanh_rnn

CASES = [(1, 1), (2, 1), (6, 2), (13, 3), (9, 20)]


def readout(params, h, x):
    """A per-step loss: softmax cross-entropy of a linear readout against a target in x."""
    logits = np.dot(h, params[3])
    logp = logits - np.log(np.sum(np.exp(logits), axis=1, keepdims=True))
    return -np.sum(logp * x["target"])


def readout_pair(params, h, x):
    logits = np.dot(h, params[3])
    logp = logits - np.log(np.sum(np.exp(logits), axis=1, keepdims=True))
    return (logp, -np.sum(logp * x["target"]))


def cell(params, h, x):
    return tanh_rnn(params[:3], h, x["x"])


def problem(l, seed=0, V=5):
    params, h0, xs = rnn_problem(l, seed=seed)
    rng = numpy.random.RandomState(seed + 1)
    targets = numpy.eye(V)[rng.randint(V, size=(l, xs.shape[1]))]
    return params + (rng.randn(h0.shape[1], V) * 0.5,), h0, {"x": xs, "target": targets}


def total(out):
    """A loss over the final state and every output leaf."""
    final, ys = out
    return sum(np.sum(v ** 2) for v in flatten(final)[0]) + \
        sum(np.sum(np.sin(v)) for v in flatten(ys)[0])


@pytest.mark.parametrize("out_fn", [readout, readout_pair])
@pytest.mark.parametrize("l,s", CASES)
def test_output_fn_gradient_matches_the_plain_loop(out_fn, l, s):
    params, h0, xs = problem(l)
    loop = binomial_checkpoint(cell, l, s, output_fn=out_fn)
    ref = lambda p, h, x: plain_loop(cell, p, h, x, l, output_fn=out_fn)
    assert_trees_close(loop(params, h0, xs), ref(params, h0, xs), rtol=1e-14)
    g = grad(lambda p, h, x: total(loop(p, h, x)), (0, 1, 2))(params, h0, xs)
    g0 = grad(lambda p, h, x: total(ref(p, h, x)), (0, 1, 2))(params, h0, xs)
    assert_trees_close(g, g0)


@pytest.mark.parametrize("l,s", [(5, 1), (21, 3), (34, 4), (50, 50)])
def test_output_fn_runs_once_plain_and_once_taped_never_in_replays(l, s):
    params, h0, xs = problem(l)
    step, out = Counter(cell), Counter(readout)
    loop = binomial_checkpoint(step, l, s, output_fn=out)
    grad(lambda p: np.sum(loop(p, h0, xs)[1]))(params)
    # once plain per step in the forward (the last step's too, although the forward tapes that
    # step for the reverse sweep) and once taped per step: the documented contract
    assert (out.plain, out.taped) == (l, l)
    assert (step.plain, step.taped) == (closed_form(l, s), l)     # replays still recompute fn


def test_plain_call_computes_each_output_once():
    params, h0, xs = problem(12)
    out = Counter(readout)
    final, ys = binomial_checkpoint(cell, 12, 2, output_fn=out)(params, h0, xs)
    assert (out.plain, out.taped) == (12, 0) and ys.shape == (12,)


def test_tree_outputs_with_outputs_true():
    l = 8
    params, state, xs = lstm_problem(l)

    def step(p, st, x):
        h, c = lstm(p, st, x)
        return (h, c), {"h_sum": np.sum(h, axis=1), "pair": (np.sum(c), h[0])}
    loop = binomial_checkpoint(step, l, 3, with_outputs=True)
    ref = lambda p: plain_loop(step, p, state, xs, l, with_outputs=True)
    out = loop(params, state, xs)
    assert out[1]["h_sum"].shape == (l, 2) and out[1]["pair"][0].shape == (l,)
    assert_trees_close(grad(lambda p: total(loop(p, state, xs)))(params),
                       grad(lambda p: total(ref(p)))(params))


def test_output_fn_and_with_outputs_are_exclusive():
    with pytest.raises(ValueError, match="output_fn and with_outputs=True are mutually exclusive"):
        binomial_checkpoint(cell, 5, 2, with_outputs=True, output_fn=readout)
    with pytest.raises(TypeError, match="output_fn must be callable"):
        binomial_checkpoint(cell, 5, 2, output_fn="readout")


def test_outputs_must_keep_their_structure():
    params, h0, xs = problem(5)
    shifty = lambda p, h, x: np.sum(h) if x["x"][0, 0] != xs["x"][3, 0, 0] else (np.sum(h), 1.0)
    with pytest.raises(ValueError, match=r"same structure and shapes; step 3"):
        binomial_checkpoint(cell, 5, 2, output_fn=shifty)(params, h0, xs)


@pytest.mark.parametrize("l,s", [(6, 2), (9, 3)])
def test_higher_order_through_output_fn(l, s):
    params, h0, xs = problem(l)
    loop = binomial_checkpoint(cell, l, s, output_fn=readout_pair)
    ref = lambda p, h, x: plain_loop(cell, p, h, x, l, output_fn=readout_pair)
    f = lambda V, run: total(run(params[:3] + (V,), h0, xs))
    V, v = params[3], numpy.random.RandomState(2).randn(*params[3].shape)
    close = lambda a, b: assert_trees_close(a, b, rtol=1e-8, atol=1e-12)
    close(make_jvp(lambda V: loop(params[:3] + (V,), h0, xs)[1][1])(V)(v)[1],
          make_jvp(lambda V: ref(params[:3] + (V,), h0, xs)[1][1])(V)(v)[1])
    close(hessian_vector_product(lambda V: f(V, loop))(V, v),
          hessian_vector_product(lambda V: f(V, ref))(V, v))
    W, w = params[0], numpy.random.RandomState(3).randn(*params[0].shape)
    g = lambda W, run: total(run((W,) + params[1:], h0, xs))
    close(hessian_vector_product(lambda W: g(W, loop))(W, w),
          hessian_vector_product(lambda W: g(W, ref))(W, w))
    close(grad(lambda h: np.sum(grad(lambda h: total(loop(params, h, xs)))(h) ** 2))(h0),
          grad(lambda h: np.sum(grad(lambda h: total(ref(params, h, xs)))(h) ** 2))(h0))


def test_output_fn_with_verify():
    params, h0, xs = problem(15)
    good = binomial_checkpoint(cell, 15, 3, output_fn=readout, verify=True)
    ref = lambda p: total(plain_loop(cell, p, h0, xs, 15, output_fn=readout))
    assert_trees_close(grad(lambda p: total(good(p, h0, xs)))(params), grad(ref)(params))
    calls = [0]

    def noisy(p, h, x):                      # differs between its plain and taped evaluations
        calls[0] += 1
        return readout(p, h, x) + 1e-3 * calls[0]
    bad = binomial_checkpoint(cell, 15, 3, output_fn=noisy, verify=True)
    with pytest.raises(NondeterministicStepError, match="the output y of step"):
        grad(lambda p: total(bad(p, h0, xs)))(params)


def test_output_fn_within_a_memory_budget():
    l = 60
    params, h0, xs = problem(l)
    loop = binomial_checkpoint(cell, l, memory="400kB", output_fn=readout_pair)
    ref = lambda p: total(plain_loop(cell, p, h0, xs, l, output_fn=readout_pair))
    assert_trees_close(grad(lambda p: total(loop(p, h0, xs)))(params), grad(ref)(params))
    assert loop.stats.peak_bytes <= 400_000


@pytest.mark.parametrize("l,s", [(1, 1), (3, 3), (6, 2)])
def test_output_fn_closing_over_a_differentiated_value_raises(l, s):
    """Whether the step is run plain or inside the forward's taped last segment (all of it when
    l = 1), a y carrying an outside box would lose that dependency: refused, naming output_fn."""
    params, h0, xs = problem(l)

    def loss(w):
        loop = binomial_checkpoint(cell, l, s, output_fn=lambda p, h, x: w * readout(p, h, x))
        return np.sum(loop(params, h0, xs)[1])
    with pytest.raises(TypeError, match="output_fn returned an autograd box"):
        grad(loss)(1.5)
