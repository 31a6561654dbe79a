"""Recipe: a time-stepping simulation (1-D heat equation), its gradient within a byte budget,
with states spilling to disk."""
import numpy
import autograd.numpy as np
from autograd import grad
from bincheck import binomial_checkpoint

N, STEPS = 1000, 600                     # grid points, time steps
dx = 1.0 / N
dt = 0.2 * dx ** 2                       # explicit Euler is stable for dt <= dx^2 / 2


def heat_step(kappa, u, x):              # params: the conductivity field; no per-step input
    flux = kappa * (u[1:] - u[:-1]) / dx
    du = np.concatenate([flux[:1], flux[1:] - flux[:-1], -flux[-1:]]) / dx
    return u + dt * du


grid = numpy.linspace(0, 1, N)
u0 = numpy.exp(-100 * (grid - 0.3) ** 2)            # the initial temperature
kappa = 1.0 + 0.5 * numpy.sin(3 * grid[:-1])        # conductivity between grid points
target = numpy.exp(-50 * (grid - 0.5) ** 2)


def misfit(loop):
    return lambda kappa, u0: np.sum((loop(kappa, u0, None) - target) ** 2) * dx


# RAM only, within 800 kB: as many states and taped segments as fit.
ram = binomial_checkpoint(heat_step, STEPS, memory="800kB")
# 450 kB of RAM and as many states on disk as the Disk-Revolve plan wants.
spill = binomial_checkpoint(heat_step, STEPS, memory="450kB", disk=True)
print(ram.preview(kappa, u0))
print(spill.preview(kappa, u0))

g_ram = grad(misfit(ram), (0, 1))(kappa, u0)
g_disk = grad(misfit(spill), (0, 1))(kappa, u0)
stats = spill.stats
print(f"disk: {stats.disk_bytes_written} bytes written, {stats.disk_bytes_read} read")

reference = grad(misfit(binomial_checkpoint(heat_step, STEPS, num_ckpts=STEPS)), (0, 1))(kappa, u0)
for a, b, c in zip(g_ram, g_disk, reference):
    assert numpy.allclose(a, c, rtol=1e-9) and numpy.allclose(b, c, rtol=1e-9)
assert ram.stats.peak_bytes <= 800_000 and stats.peak_bytes <= 450_000
