"""Recipe: drive bincheck's Executor from your own solver with a hand-written adjoint, as with
pyrevolve: no autograd, only the schedule and the executor."""
import itertools

import numpy
import bincheck
from bincheck import Executor, Reverse

H, N = 0.01, 1000                        # step size, number of steps


def step(k, u, t):                       # explicit Euler for u' = -k sin(u) + cos(t h)
    return u + H * (-k * numpy.sin(u) + numpy.cos(t * H))


class Stepper:
    """What a step is, forward and backward: ``advance`` and ``reverse`` (see bincheck.runtime)."""

    def __init__(self, k):
        self.k = k
        self.adjoint = None              # dJ/du at the adjoint's position
        self.dk = 0.0                    # dJ/dk, accumulated
        self.plain = self.reversed = 0

    def advance(self, u, start, stop):   # plain steps start..stop-1
        for t in range(start, stop):
            u = step(self.k, u, t)
        self.plain += stop - start
        return u

    def reverse(self, u, start, stop):   # steps start..stop-1, last first, adjoint at stop
        states = [u]
        for t in range(start, stop - 1):             # recompute the segment's inner states
            states.append(step(self.k, states[-1], t))
        for t in range(stop - 1, start - 1, -1):
            u_t = states[t - start]
            self.dk += self.adjoint @ (-H * numpy.sin(u_t))
            self.adjoint = self.adjoint * (1 - H * self.k * numpy.cos(u_t))
        self.reversed += stop - start


def gradient(k, u0, schedule):
    """J = |u_N|^2 / 2 and (dJ/dk, dJ/du0), following ``schedule``."""
    stepper = Stepper(k)
    executor = Executor(N, u0)           # RAM store; pass store=... for your own storage
    actions = iter(schedule)
    first = executor.run(actions, stepper, until=Reverse)      # the forward sweep
    u_final = step(k, executor.live, first.start)             # the last step, for J
    stepper.plain += 1
    stepper.adjoint = u_final                                   # dJ/du_N
    executor.run(itertools.chain([first], actions), stepper)   # the reverse sweep
    executor.tracker.finish()            # every step reversed, nothing left stored
    return 0.5 * u_final @ u_final, stepper.dk, stepper.adjoint, stepper


k, u0 = 1.3, numpy.linspace(-1.0, 1.0, 5)
schedule = bincheck.plan(N, 10)          # 10 checkpoints, the initial state included
J, dk, du0, stepper = gradient(k, u0, schedule)
print(f"J = {J:.6f}, dJ/dk = {dk:.6f}; plain steps {stepper.plain} = t(N, 10) + 1 "
      f"({schedule.plain_steps} + 1)")
assert stepper.plain == schedule.plain_steps + 1 and stepper.reversed == N

# Checks: store-all (every state kept) and central finite differences.
_, dk_all, du0_all, _ = gradient(k, u0, bincheck.plan(N, N))
assert numpy.isclose(dk, dk_all, rtol=1e-12) and numpy.allclose(du0, du0_all, rtol=1e-12)
eps = 1e-6
Jp = gradient(k + eps, u0, bincheck.plan(N, N))[0]
Jm = gradient(k - eps, u0, bincheck.plan(N, N))[0]
assert numpy.isclose(dk, (Jp - Jm) / (2 * eps), rtol=1e-6)
