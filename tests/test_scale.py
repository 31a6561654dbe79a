"""Long loops: lazy planning and no recursion limit. The 100k-step gradient (about 13 s) runs in
a subprocess beside the suite (``@pytest.mark.background``, tests/conftest.py); this file is its
script."""

import sys

import pytest


def check_100k_steps_with_20_checkpoints():
    import autograd.numpy as np
    import numpy
    from autograd import grad

    from bincheck import binomial_checkpoint
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
    print("ok")


def scale_script(out):
    return [__file__]


@pytest.mark.background("scale_script")
def test_gradient_of_100k_steps_with_20_checkpoints(background):
    out, _ = background
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


if __name__ == "__main__":
    check_100k_steps_with_20_checkpoints()
