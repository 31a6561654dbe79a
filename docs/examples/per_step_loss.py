"""Recipe: a loss at every step, at bounded memory, with output_fn (how to train an RNN)."""
import numpy
import autograd.numpy as np
from autograd import grad
from bincheck import binomial_checkpoint

T, B, H, V = 300, 8, 32, 20             # steps, batch, hidden units, vocabulary


def step(params, h, x):                  # x = {"chars": (B,) ints, "targets": (B,) ints}
    return np.tanh(np.dot(h, params["W"]) + params["E"][x["chars"]] + params["b"])


def readout(params, h, x):               # output_fn: the loss of one step, a scalar
    logits = np.dot(h, params["Wo"]) + params["bo"]
    shifted = logits - np.max(logits, axis=1, keepdims=True)
    logp = shifted - np.log(np.sum(np.exp(shifted), axis=1, keepdims=True))
    return -np.mean(logp[np.arange(B), x["targets"]])


rng = numpy.random.RandomState(0)
params = {"W": rng.randn(H, H) * 0.1, "E": rng.randn(V, H) * 0.1, "b": numpy.zeros(H),
          "Wo": rng.randn(H, V) * 0.1, "bo": numpy.zeros(V)}
text = rng.randint(V, size=(T + 1, B))
inputs = {"chars": text[:-1], "targets": text[1:]}    # integers: carried, not differentiated
h0 = numpy.zeros((B, H))

loop = binomial_checkpoint(step, T, num_ckpts=20, output_fn=readout)


def loss(params):
    h_final, losses = loop(params, h0, inputs)         # losses: (T,), one scalar per step
    return np.mean(losses)


g = grad(loss)(params)


def plain_loss(params):                  # the same loss, every step taped by autograd
    h, total = h0, 0.0
    for t in range(T):
        x = {"chars": inputs["chars"][t], "targets": inputs["targets"][t]}
        h = step(params, h, x)
        total = total + readout(params, h, x)
    return total / T


reference = grad(plain_loss)(params)
assert all(numpy.allclose(g[k], reference[k], rtol=1e-10) for k in params)
print(sorted(g), loop.stats.plain_steps)
