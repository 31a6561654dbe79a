"""Getting started: a Hessian-vector product through the checkpointed loop."""
import numpy
import autograd.numpy as np
from autograd import hessian_vector_product
from bincheck import binomial_checkpoint


def cell(params, h, x):
    W, U, b = params
    return np.tanh(np.dot(h, W) + np.dot(x, U) + b)


rng = numpy.random.RandomState(0)
W, U, b = rng.randn(16, 16) * 0.1, rng.randn(4, 16) * 0.1, numpy.zeros(16)
h0, xs = numpy.zeros((4, 16)), rng.randn(100, 4, 4)
loop = binomial_checkpoint(cell, seq_len=100, num_ckpts=5)

loss_W = lambda W: np.sum(loop((W, U, b), h0, xs) ** 2)
v = rng.randn(16, 16)
Hv = hessian_vector_product(loss_W)(W, v)     # forward, reverse, and the tangent loop


def plain_loss_W(W):
    h = h0
    for x in xs:
        h = cell((W, U, b), h, x)
    return np.sum(h ** 2)


assert numpy.allclose(Hv, hessian_vector_product(plain_loss_W)(W, v), rtol=1e-8)
print(Hv.shape)
