"""Bad input fails early with a TypeError/ValueError naming the argument, the value and the rule."""

import autograd.numpy as np
import numpy
import pytest
from autograd import grad

from bincheck import binomial_checkpoint
from models import rnn_problem, tanh_rnn


class Counting:
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)


def test_fn_must_be_callable():
    with pytest.raises(TypeError, match=r"fn must be callable.*got 3"):
        binomial_checkpoint(3, 10, 2)


@pytest.mark.parametrize("name,kwargs", [("seq_len", {"seq_len": 0}), ("seq_len", {"seq_len": 2.0}),
                                         ("seq_len", {"seq_len": True}),
                                         ("num_ckpts", {"num_ckpts": -1}),
                                         ("num_ckpts", {"num_ckpts": 3.5}),
                                         ("num_ckpts", {"num_ckpts": False})])
def test_lengths_must_be_positive_ints(name, kwargs):
    args = {"seq_len": 10, "num_ckpts": 2, **kwargs}
    with pytest.raises((TypeError, ValueError), match=rf"{name} must be a positive int.*got "
                                                      rf"{kwargs[name]!r}"):
        binomial_checkpoint(tanh_rnn, **args)


def test_bool_rejected_as_type_error():
    with pytest.raises(TypeError):
        binomial_checkpoint(tanh_rnn, True, 2)
    with pytest.raises(TypeError, match="with_outputs"):
        binomial_checkpoint(tanh_rnn, 4, 2, with_outputs="yes")


@pytest.mark.parametrize("differentiate", [False, True])
def test_inputs_length_must_match(differentiate):
    params, h0, xs = rnn_problem(7)
    cell = Counting(tanh_rnn)
    loop = binomial_checkpoint(cell, 9, 2)
    run = (lambda: grad(lambda p: np.sum(loop(p, h0, xs)))(params)) if differentiate else \
        (lambda: loop(params, h0, xs))
    with pytest.raises(ValueError, match=r"inputs.*seq_len=9.*7"):
        run()
    assert cell.calls == 0                       # raised before any work


def test_inputs_leaf_in_a_tree_checked_too():
    params, h0, xs = rnn_problem(5)
    loop = binomial_checkpoint(lambda p, h, x: tanh_rnn(p, h, x[0]) + x[1], 5, 2)
    with pytest.raises(ValueError, match=r"seq_len=5.*a scalar"):
        loop(params, h0, (xs, 1.0))


def test_with_outputs_requires_a_pair():
    params, h0, xs = rnn_problem(4)
    loop = binomial_checkpoint(tanh_rnn, 4, 2, with_outputs=True)
    for run in (lambda: loop(params, h0, xs), lambda: grad(lambda p: np.sum(loop(p, h0, xs)[0]))(params)):
        with pytest.raises(TypeError, match=r"with_outputs=True.*2-tuple.*step 0"):
            run()


def test_state_structure_must_be_preserved():
    params, h0, xs = rnn_problem(4)
    loop = binomial_checkpoint(lambda p, st, x: (tanh_rnn(p, st[0], x),), 4, 2)
    with pytest.raises(ValueError, match=r"structure.*step 0.*\(leaf, leaf\).*\(leaf,\)"):
        grad(lambda h: np.sum(loop(params, (h, h), xs)[0]))(h0)


def test_state_shape_must_be_preserved():
    params, h0, xs = rnn_problem(4)
    loop = binomial_checkpoint(tanh_rnn, 4, 2)
    with pytest.raises(ValueError, match=r"shapes.*step 0.*\(4,\).*\(2, 4\)"):
        grad(lambda p: np.sum(loop(p, h0[0], xs)))(params)   # (4,) state broadcasts to (2, 4)


def test_shape_change_late_in_the_loop_is_caught():
    params, h0, xs = rnn_problem(6)
    bad = lambda p, h, x: tanh_rnn(p, h, x)[:1] if numpy.all(x == xs[3]) else tanh_rnn(p, h, x)
    loop = binomial_checkpoint(bad, 6, 2)
    with pytest.raises(ValueError, match=r"step 3"):
        loop(params, h0, xs)
