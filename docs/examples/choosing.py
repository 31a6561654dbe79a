"""Recipe: choosing num_ckpts or a memory budget before the first gradient."""
import numpy
import autograd.numpy as np
from autograd import grad
import bincheck
from bincheck import binomial_checkpoint


def cell(params, h, x):
    W, U, b = params
    return np.tanh(np.dot(h, W) + np.dot(x, U) + b)


rng = numpy.random.RandomState(0)
T = 500
params = (rng.randn(64, 64) * 0.1, rng.randn(8, 64) * 0.1, numpy.zeros(64))
h0, xs = numpy.zeros((16, 64)), rng.randn(T, 16, 8)

# 1. Counting checkpoints: the closed form, without running anything.
for s in (5, 10, 20, 50):
    p = bincheck.plan(T, s)
    print(f"num_ckpts={s:3d}: {p.plain_steps / T:.2f} plain steps per step")

# 2. A byte budget: measure one step, see the plan the first gradient would use.
loop = binomial_checkpoint(cell, T, memory="2MB")
preview = loop.preview(params, h0, xs)       # four evaluations of cell; nothing is taped for good
print(preview)
sizes = loop.measure(params, h0, xs)         # the measured bytes and seconds of one step
assert preview.peak_bytes <= 2_000_000 and sizes.state_bytes >= 16 * 64 * 8

# 3. The inverse: the least memory predicted to cost at most 1.3x store-all's time.
need = loop.memory_for(1.3, params, h0, xs)
assert need == bincheck.memory_for(T, 1.3, sizes)       # the same, from the measured sizes
print(f"at most 1.3x store-all: memory={need} ({bincheck.schedule.format_bytes(need)})")

# The same plans from sizes you give (what `python -m bincheck plan` does):
by_hand = bincheck.plan(T, memory=need, state_bytes=sizes.state_bytes,
                        tape_bytes=sizes.tape_bytes, work_bytes=sizes.work_bytes,
                        step_seconds=sizes.step_seconds,
                        taped_step_seconds=sizes.taped_step_seconds)
assert by_hand.relative_time <= 1.3
fast = binomial_checkpoint(cell, T, memory=need)        # a loop with that budget

# 4. Run, then read what the gradient did.
g = grad(lambda p: np.sum(loop(p, h0, xs) ** 2))(params)
stats = loop.stats
print(stats.plain_steps, stats.peak_checkpoints, stats.peak_bytes)
assert stats.plain_steps == loop.predicted_plain_steps and stats.peak_bytes <= 2_000_000
