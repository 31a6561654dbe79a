"""checkpoint_program with the containers and values a review found dropped or refused: dict
subclasses in and out (OrderedDict, defaultdict), objects bincheck cannot look into, integer
arrays returned, keyword arguments. Every expected gradient is plain autograd's of ``f``."""

from collections import OrderedDict, defaultdict

import autograd.numpy as np
import numpy
import pytest
from autograd import grad

from bincheck import checkpoint_program

X = numpy.array([0.1, 0.2, 0.3])


def body(x):
    for _ in range(5):
        x = np.sin(x) * 1.2
    return x


class Holder:
    def __init__(self, v):
        self.v = v


@pytest.mark.parametrize("make", [OrderedDict, lambda **kw: defaultdict(float, **kw)],
                         ids=["OrderedDict", "defaultdict"])
@pytest.mark.parametrize("budget", [{"num_ckpts": 2}, {"memory": 50_000_000}])
def test_a_dict_subclass_returned_carries_its_cotangents(make, budget):
    """An OrderedDict or defaultdict was one constant leaf: gradient 0 (plain: nonzero)."""
    def f(x):
        return make(a=body(x), b=x ** 2)

    def loss(h):
        return lambda x: np.sum(h(x)["a"]) + np.sum(h(x)["b"] * x) + np.sum(x ** 2)
    g = checkpoint_program(f, **budget)
    want = grad(loss(f))(X)
    for _ in range(2):              # the second call reuses the first's plan
        numpy.testing.assert_allclose(grad(loss(g))(X), want, rtol=1e-12)
    out = g(X)
    assert type(out) is type(f(X)) and list(out) == ["a", "b"]
    assert getattr(out, "default_factory", None) is getattr(f(X), "default_factory", None)


def test_an_object_holding_the_result_is_refused_not_dropped():
    """A user's object (or a dict subclass bincheck does not rebuild) holding a traced value
    cannot hand its cotangent over: a TypeError naming its type, not a zero gradient."""
    class MyDict(dict):
        pass
    for wrap, use, name in [(Holder, lambda o: o.v, "Holder"),
                            (lambda v: MyDict(a=v), lambda o: o["a"], "MyDict")]:
        g = checkpoint_program(lambda x: wrap(body(x)), num_ckpts=2)
        with pytest.raises(TypeError, match=rf"f returned a .*{name} that holds a value being "
                                             r"differentiated.*Supported: .*OrderedDicts"):
            grad(lambda x: np.sum(use(g(x))))(X)
    g = checkpoint_program(lambda x: (np.sum(body(x)), Holder("a label")), num_ckpts=2)
    assert grad(lambda x: g(x)[0])(X) == pytest.approx(grad(lambda x: np.sum(body(x)))(X))


def test_an_ordered_dict_argument_is_a_container():
    """boxable() recursed forever on a dict subclass (RecursionError)."""
    def f(x, p):
        y = x
        for _ in range(5):
            y = np.sin(y * p["w"])
        return np.sum(y)
    g = checkpoint_program(f, num_ckpts=2)
    numpy.testing.assert_allclose(grad(g)(X, OrderedDict(w=0.7)),
                                  grad(f)(X, OrderedDict(w=0.7)), rtol=1e-12)
    both = grad(lambda x, w: g(x, OrderedDict(w=w)), (0, 1))(X, 0.7)
    want = grad(lambda x, w: f(x, OrderedDict(w=w)), (0, 1))(X, 0.7)
    for u, v in zip(both, want):
        numpy.testing.assert_allclose(u, v, rtol=1e-12)


@pytest.mark.parametrize("budget", [{"num_ckpts": 1}, {"num_ckpts": 50}, {"memory": 50_000_000}])
def test_an_integer_array_returned_carries_its_cotangent_as_in_autograd(budget):
    """``(x * 10).astype(int)`` returned: autograd boxes it and pulls the cotangent back through
    astype ([2.1, 4.7, 6.5] below); it was returned as a constant ([1, 2, 3])."""
    def f(x):
        y = body(x)
        return (y * 10).astype(int), np.sum(y), (x * 10).astype(numpy.int32)

    def loss(h):
        def use(x):
            k, s, k32 = h(x)
            return np.sum(k * x) + s + np.sum(k32 * x ** 2)
        return use

    def unused(h):                                  # the integers' cotangents are zero
        return lambda x: h(x)[1]
    g = checkpoint_program(f, **budget)
    for _ in range(2):
        numpy.testing.assert_allclose(grad(loss(g))(X), grad(loss(f))(X), rtol=1e-12)
        numpy.testing.assert_allclose(grad(unused(g))(X), grad(unused(f))(X), rtol=1e-12)
    got = []
    grad(lambda x: got.append(g(x)) or got[0][1])(X)
    for u, v in zip(got[0][0::2], f(X)[0::2]):      # the values handed out are f's, exactly
        assert u._value.dtype == v.dtype and numpy.array_equal(u._value, v)


@pytest.mark.parametrize("budget", [{"num_ckpts": 2}, {"memory": 50_000_000}])
def test_keyword_arguments_are_passed_to_f_each_call_and_may_be_differentiated(budget):
    """g is called as f is: ``g(x, scale=2.0)`` raised TypeError (``__call__(*args)``). A
    keyword argument of another value, or one that changes the program's length, gives that
    call's own gradient (never the last call's trace), and one holding a traced value is
    differentiated as a positional one is."""
    def f(x, scale=1.0, steps=4):
        for _ in range(steps):
            x = np.sin(x) * scale
        return np.sum(x)
    g = checkpoint_program(f, **budget)
    assert g(X, scale=2.0) == f(X, scale=2.0)
    for kw in [{"scale": 2.0}, {"scale": 2.0}, {"scale": 0.5}, {"scale": 0.5, "steps": 7}, {}]:
        numpy.testing.assert_allclose(grad(g)(X, **kw), grad(f)(X, **kw), rtol=1e-12)
    both = grad(lambda x, s: g(x, scale=s), (0, 1))(X, 1.3)
    for u, v in zip(both, grad(lambda x, s: f(x, scale=s), (0, 1))(X, 1.3)):
        numpy.testing.assert_allclose(u, v, rtol=1e-12)
    assert g.preview(X, steps=9).plain_ops >= 0


def test_an_object_holding_a_finished_differentiation_s_value_is_no_hidden_cotangent():
    """A logger that kept an earlier gradient's loss (a box of a finished trace) passed to ``g``
    was refused as hiding a value being differentiated; plain autograd runs it."""
    class Logger:
        def __init__(self):
            self.history = []

    def f(x, log):
        y = np.sum(body(x) ** 2)
        log.history.append(y)
        return y
    log = Logger()
    g = checkpoint_program(f, num_ckpts=2)
    want = grad(f)(X, Logger())
    for _ in range(2):
        numpy.testing.assert_allclose(grad(g)(X, log), want, rtol=1e-12)


def test_an_object_too_large_to_search_is_warned_about_not_refused():
    big = Holder([numpy.zeros(1) for _ in range(20_000)])
    g = checkpoint_program(lambda x, b: np.sum(body(x)), num_ckpts=2)
    with pytest.warns(UserWarning, match="too large to search"):
        got = grad(g)(X, big)
    numpy.testing.assert_allclose(got, grad(lambda x: np.sum(body(x)))(X), rtol=1e-12)
