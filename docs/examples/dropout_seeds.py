"""Recipe: randomness (dropout) from a per-step seed passed in inputs, checked with verify=True."""
import numpy
import autograd.numpy as np
from autograd import grad
from bincheck import binomial_checkpoint

T, B, H, KEEP = 200, 8, 32, 0.8


def cell(params, h, x):
    W, U = params
    # The mask is a function of this step's seed: a replay draws the same mask again.
    mask = numpy.random.default_rng(int(x["seed"])).random(h.shape) < KEEP
    h = np.where(mask, h / KEEP, 0.0)                  # inverted dropout on the recurrent state
    return np.tanh(np.dot(h, W) + np.dot(x["x"], U))


rng = numpy.random.RandomState(0)
params = (rng.randn(H, H) * 0.1, rng.randn(4, H) * 0.1)
h0 = rng.randn(B, H) * 0.1
epoch_seed = 1234                                      # a new one every batch or epoch
inputs = {"x": rng.randn(T, B, 4),
          "seed": numpy.random.SeedSequence(epoch_seed).generate_state(T)}   # (T,) integers

loop = binomial_checkpoint(cell, T, num_ckpts=8, verify=True)   # verify: replays must agree
g = grad(lambda p: np.sum(loop(p, h0, inputs) ** 2))(params)


def plain(p):
    h = h0
    for t in range(T):
        h = cell(p, h, {"x": inputs["x"][t], "seed": inputs["seed"][t]})
    return np.sum(h ** 2)


reference = grad(plain)(params)
assert all(numpy.allclose(a, b, rtol=1e-10) for a, b in zip(g, reference))
print("verified", loop.stats.plain_steps, "replayed steps drew the same masks")
