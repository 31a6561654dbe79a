"""Recipe: nested loops as one flat checkpointed_while_loop, counters in the state."""
import numpy
import autograd.numpy as np
from autograd import grad
from bincheck import checkpointed_while_loop

OUTER = 40
INNER = [1 + (7 * i) % 13 for i in range(OUTER)]    # inner lengths: uneven (could be data-driven)


def inner_step(w, x, i, j):              # the work of one inner iteration
    return np.tanh(w * x + 0.1 * np.sin(i + 0.5 * j))


def outer_update(w, x, i):               # what runs after each inner loop
    return 0.9 * x + 0.1 * np.roll(x, 1)


def body(w, state):                      # ONE inner iteration, then maybe the outer update
    i, j, x = state                      # i, j: Python ints, carried along (not differentiated)
    x = inner_step(w, x, i, j)
    if j + 1 < INNER[i]:
        return (i, j + 1, x)
    return (i + 1, 0, outer_update(w, x, i))


def cond(w, state):
    return state[0] < OUTER


run = checkpointed_while_loop(cond, body, num_ckpts=8)
rng = numpy.random.RandomState(0)
w, x0 = 0.5 + 0.4 * rng.rand(6), rng.randn(6)
loss = lambda w, x0: np.sum(run(w, (0, 0, x0))[2] ** 2)
dw, dx0 = grad(loss, (0, 1))(w, x0)
print(run.num_steps, "inner iterations in all, at most", run.stats.peak_checkpoints, "held")


def nested(w, x0):                       # the program as written, taped whole by autograd
    x = x0
    for i in range(OUTER):
        for j in range(INNER[i]):
            x = inner_step(w, x, i, j)
        x = outer_update(w, x, i)
    return np.sum(x ** 2)


assert run.num_steps == sum(INNER)
assert numpy.allclose(dw, grad(nested)(w, x0), rtol=1e-10)
assert numpy.allclose(dx0, grad(nested, 1)(w, x0), rtol=1e-10)
