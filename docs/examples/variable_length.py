"""Recipe: a batch of sequences of different lengths, padded to T and masked inside fn."""
import numpy
import autograd.numpy as np
from autograd import grad
from bincheck import binomial_checkpoint

T, B, H = 120, 5, 16
lengths = numpy.array([120, 97, 60, 33, 1])           # true lengths, the longest = T


def cell(params, h, x):
    W, U = params
    new = np.tanh(np.dot(h, W) + np.dot(x["x"], U))
    return np.where(x["alive"][:, None], new, h)       # finished sequences keep their state


def readout(params, h, x):                             # per-step loss, zero after the end
    return np.sum(x["alive"] * np.sum(h ** 2, axis=1))


rng = numpy.random.RandomState(0)
params = (rng.randn(H, H) * 0.3, rng.randn(3, H) * 0.3)
h0 = numpy.zeros((B, H))
xs = rng.randn(T, B, 3)
inputs = {"x": xs, "alive": numpy.arange(T)[:, None] < lengths[None, :]}   # (T, B) bools

loop = binomial_checkpoint(cell, T, num_ckpts=10, output_fn=readout)


def loss(params):
    h_final, per_step = loop(params, h0, inputs)       # h_final[b] = state after lengths[b] steps
    return np.sum(per_step) + np.sum(h_final)


g = grad(loss)(params)


def plain(params):                                     # each sequence alone, at its own length
    total = 0.0
    for b in range(B):
        h = h0[b:b + 1]
        for t in range(lengths[b]):
            h = np.tanh(np.dot(h, params[0]) + np.dot(xs[t, b:b + 1], params[1]))
            total = total + np.sum(h ** 2)
        total = total + np.sum(h)
    return total


reference = grad(plain)(params)
assert all(numpy.allclose(a, b, rtol=1e-10) for a, b in zip(g, reference))
print("masked batch matches per-sequence loops")
