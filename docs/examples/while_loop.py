"""Getting started: a loop of unknown length (explicit Euler until t >= 5)."""
import numpy
import autograd.numpy as np
from autograd import grad
from bincheck import checkpointed_while_loop


def cond_fn(k, state):                   # evaluated on plain values, not differentiated
    t, y = state
    return t < 5.0


def body_fn(k, state):                   # the step size depends on the state
    t, y = state
    dt = 0.01 / (1.0 + y[0] ** 2)
    return (t + dt, y + dt * np.stack([y[1], -k * np.sin(y[0])]))


run = checkpointed_while_loop(cond_fn, body_fn, num_ckpts=10, max_steps=None)


def final_angle(k, y0):
    return run(k, (0.0, y0))[1][0]


dk, dy0 = grad(final_angle, (0, 1))(1.5, numpy.array([0.5, 0.0]))
print(run.num_steps, run.stats.peak_checkpoints)    # how many steps the last call took


def plain(k, y0):                        # the same loop, taped whole by autograd
    state = (0.0, y0)
    while cond_fn(k, state):
        state = body_fn(k, state)
    return state[1][0]


assert numpy.allclose(dk, grad(plain)(1.5, numpy.array([0.5, 0.0])), rtol=1e-10)
assert run.stats.peak_checkpoints <= 10
