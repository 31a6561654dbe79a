"""FAQ: what happens with an in-place update, and with unseeded randomness under verify=True."""
import numpy
import autograd.numpy as np
from autograd import grad
from bincheck import NondeterministicStepError, binomial_checkpoint

rng = numpy.random.RandomState(0)
W, h0, xs = rng.randn(4, 4) * 0.5, rng.randn(2, 4), rng.randn(50, 2, 4)


def in_place(W, h, x):
    h += x                               # writes into the state it was given
    return np.tanh(np.dot(h, W))


try:
    binomial_checkpoint(in_place, 50, num_ckpts=5)(W, h0, xs)
except ValueError as err:
    print(str(err)[:75])                 # fn wrote into its state argument in place at step 0 ...
else:
    raise AssertionError("an in-place update must raise")


def out_of_place(W, h, x):
    h = h + x                            # a new array: snapshots stay intact
    return np.tanh(np.dot(h, W))


loop = binomial_checkpoint(out_of_place, 50, num_ckpts=5)
g = grad(lambda W: np.sum(loop(W, h0, xs)))(W)


def noisy(W, h, x):                      # unseeded: a replay draws different noise
    return np.tanh(np.dot(h + 0.1 * numpy.random.randn(*h.shape), W) + x)


checked = binomial_checkpoint(noisy, 50, num_ckpts=5, verify=True)
try:
    grad(lambda W: np.sum(checked(W, h0, xs)))(W)
except NondeterministicStepError as err:
    print(str(err)[:70])                 # verify=True: recomputing steps ... gave state ...
else:
    raise AssertionError("verify=True must catch the unseeded noise")
