"""Getting started: the gradient of a tanh RNN through binomial_checkpoint."""
import numpy
import autograd.numpy as np
from autograd import grad
from bincheck import binomial_checkpoint


def cell(params, h, x):                  # one step: fn(params, state, x) -> new state
    W, U, b = params
    return np.tanh(np.dot(h, W) + np.dot(x, U) + b)


rng = numpy.random.RandomState(0)
params = (rng.randn(32, 32) * 0.1, rng.randn(4, 32) * 0.1, numpy.zeros(32))
h0 = numpy.zeros((8, 32))                 # state: (batch, hidden)
xs = rng.randn(200, 8, 4)                 # inputs: (seq_len, batch, input)

loop = binomial_checkpoint(cell, seq_len=200, num_ckpts=10)


def loss(params, h0, xs):
    return np.sum(loop(params, h0, xs) ** 2)


dparams, dh0, dxs = grad(loss, (0, 1, 2))(params, h0, xs)   # one reverse sweep for all three

# The same gradient as the plain Python loop (which tapes all 200 steps):
def plain_loss(params, h0, xs):
    h = h0
    for x in xs:
        h = cell(params, h, x)
    return np.sum(h ** 2)


reference = grad(plain_loss)(params, h0, xs)
assert all(numpy.allclose(a, b, rtol=1e-10) for a, b in zip(dparams, reference))
stats = loop.stats                        # what the last gradient did
print(stats.plain_steps, stats.taped_steps, stats.peak_checkpoints)     # 522 200 10
# t(200, 10) = 522 plain steps, each step taped once, at most 10 checkpoints held
assert (stats.plain_steps, stats.taped_steps, stats.peak_checkpoints) == (522, 200, 10)
