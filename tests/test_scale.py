"""Long loops: lazy planning and no recursion limit."""

import sys

import autograd.numpy as np
import numpy
from autograd import grad

from bincheck import binomial_checkpoint


def test_gradient_of_100k_steps_with_20_checkpoints():
    l = 100_000
    step = lambda a, x, _: x + a * np.sin(x)              # autonomous, tiny state
    loop = binomial_checkpoint(step, l, 20)
    assert sys.getrecursionlimit() < l
    a, x0 = 1e-5, numpy.array([0.3, -1.2])
    g = grad(lambda a, x: np.sum(loop(a, x, None)), (0, 1))(a, x0)
    # reference: forward-mode by hand, dx/da and dx/dx0 carried along the plain loop
    x, dxda, dxdx0 = x0.copy(), numpy.zeros(2), numpy.ones(2)
    for _ in range(l):
        j = 1 + a * numpy.cos(x)
        dxda, dxdx0 = j * dxda + numpy.sin(x), j * dxdx0
        x = x + a * numpy.sin(x)
    numpy.testing.assert_allclose(g[0], numpy.sum(dxda), rtol=1e-9)
    numpy.testing.assert_allclose(g[1], dxdx0, rtol=1e-9)
