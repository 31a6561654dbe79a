"""What a taped op's VJP keeps (bincheck.autograd.kept): the tape a memory plan charges."""

import numpy
import autograd.numpy as np
from autograd import grad

from bincheck import checkpoint_program
from helpers import peak_bytes

rng = numpy.random.RandomState(3)


def test_tape_charges_only_what_the_vjps_keep():
    """sum's VJP keeps only its operand's shape: the 160 kB temporaries of a taped segment die
    after their last use (the replay frees them as an advance does) and the plan charges them
    no tape, so 2 MB tapes the whole program at once: no snapshot, no recomputation, within
    the budget. (Charged a result an op, the plan stored snapshots and replayed ops again.)"""
    big = 20_000

    def f(x):
        for _ in range(8):
            tmp = np.outer(x, numpy.ones(big // x.size))
            x = np.tanh(x + np.sum(tmp) * 1e-6)
        return np.sum(x)
    x = rng.randn(16)
    g = checkpoint_program(f, memory=2_000_000)
    peak, got = peak_bytes(lambda: grad(g)(x))
    assert numpy.allclose(got, grad(f)(x))
    st = g.stats
    assert st.snapshots == 1 and st.plain_ops == st.ops, st
    assert peak <= 2_000_000


def test_closure_keeps_names_what_a_vjp_references():
    from bincheck.autograd.kept import closure_keeps
    a, b = rng.randn(4, 4), rng.randn(4, 4)
    for fun, args, argnums, want in [
            (np.tanh, (a,), (0,), (False, (True,), 0)),          # its input
            (np.exp, (a,), (0,), (True, (False,), 0)),           # its result
            (np.add, (a, b), (0, 1), (False, (False, False), 0)),  # shapes only
            (np.dot, (a, b), (0, 1), (False, (True, True), 0))]:
        ans = fun.fun(*args)
        assert closure_keeps(fun, argnums, ans, args, {}) == want, fun
