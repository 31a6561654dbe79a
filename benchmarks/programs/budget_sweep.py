"""``python -m benchmarks.programs.budget_sweep``: does ``checkpoint_program(f, memory=m)`` hold
``m`` under tracemalloc, from each program's least budget up?

For each program the least budget is read off the error a budget of 1 byte raises; then at
``--points`` budgets from that least to ``--up-to`` times it (geometric), three gradients run
with the same ``g`` (the first plans, the next two reuse its plan and capture its snapshots),
each measured as the tests measure: ``gc.collect()`` first (so CPython's free lists start empty
and the tuples a call frees stay traced there), tracemalloc's peak above what is traced at its
start, over ``m``. Writes ``budget-sweep.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import sys
import time
import tracemalloc

import numpy

from ..reproduce.common import md_table, write_outputs
from .examples import nested, rnn


def programs():
    """(name, f, args, argnums): small and long programs, loops of data-dependent length."""
    import autograd.numpy as np
    rng = numpy.random.RandomState(0)

    def implicit_euler(p, y, steps=12, h=0.05):
        mu = p[0]
        for _ in range(steps):
            z = y
            while True:                       # Newton to a tolerance: data-dependent trips
                f = np.array([z[1], mu * (1 - z[0] ** 2) * z[1] - z[0]])
                r = z - y - h * f
                if np.max(np.abs(r)) < 1e-10:
                    break
                J = np.array([[1.0, -h], [h * (2 * mu * z[0] * z[1] + 1),
                                          1 - h * mu * (1 - z[0] ** 2)]])
                z = z - np.linalg.solve(J, r)
            y = z
        return np.sum(y ** 2)

    def branchy(x, w):
        for _ in range(6):
            x = np.sin(x * w) if np.sum(x) > 0 else np.cos(x) + w
        return np.sum(x)

    ones = numpy.ones(1000)

    def outer(x):
        for _ in range(300):                  # large temporaries that die within the step
            tmp = np.outer(x, ones)
            x = np.tanh(x + np.sum(tmp ** 2) * 1e-6)
        return np.sum(x)

    h = 6
    yield "rnn H=6 T=20", rnn, (rng.randn(h, h) * 0.4, rng.randn(3, h) * 0.4,
                                rng.randn(20, 2, 3), rng.randn(2, h)), (0, 1)
    yield "rnn H=64 T=100", rnn, (rng.randn(64, 64) / 8, rng.randn(64, 64) / 8,
                                  rng.randn(100, 8, 64), rng.randn(8, 64) * 0.1), (0, 1, 3)
    yield "nested", lambda y, w: nested(y, w, (1, 1, 7, 1, 2, 1, 12, 1)), \
        (rng.rand(5) + 0.5, 1.01), (0, 1)
    yield "implicit Euler", implicit_euler, (numpy.array([3.0]), numpy.array([1.0, 0.5])), (0, 1)
    yield "branchy", branchy, (rng.randn(4), 0.7), (0, 1)
    yield "outer 300", outer, (rng.randn(10),), (0,)
    # found by reviews of round 4: states of many arrays, distinct constants, a pull-back that
    # makes arrays larger than the op's result (solve's: A-sized)
    yield "list of 10 states", list_state, (0.7, rng.randn(10, 50)), (0, 1)
    yield "dict of 8 states", dict_state, (0.7, rng.randn(8, 3)), (0, 1)
    consts = [rng.randn(200) for _ in range(1500)]
    yield "1500 constants", lambda x: distinct(x, consts), (rng.randn(200),), (0,)
    A0 = rng.randn(32, 32) + 32 * numpy.eye(32)
    yield "solve loop", lambda w, x: solve_loop(w, x, A0), (0.5, rng.randn(32)), (0, 1)


def list_state(w, xs):
    import autograd.numpy as np
    s = [xs[i] for i in range(10)]
    for _ in range(150):
        s = [np.tanh(s[i] * w + s[(i + 1) % 10]) for i in range(10)]
    return sum(np.sum(v) for v in s)


def dict_state(w, xs):
    import autograd.numpy as np
    s = {f"k{i}": xs[i] for i in range(8)}
    for _ in range(200):
        s = {k: np.tanh(v * w + s[f"k{(i + 1) % 8}"]) for i, (k, v) in enumerate(s.items())}
    return sum(np.sum(v) for v in s.values())


def distinct(x, consts):
    import autograd.numpy as np
    for c in consts:
        x = np.tanh(x + c)
    return np.sum(x)


def solve_loop(w, x, A0):
    import autograd.numpy as np
    for _ in range(200):
        x = np.linalg.solve(A0 + w * numpy.eye(len(A0)), x) * 30.0
    return np.sum(x)


def least_budget(f, args, argnums) -> int:
    from autograd import grad

    from bincheck import checkpoint_program
    try:
        grad(checkpoint_program(f, memory=1), argnums)(*args)
    except ValueError as e:
        return int(re.search(r"(\d+) bytes in all", str(e)).group(1))
    raise AssertionError("a budget of 1 byte was accepted")


def sweep(f, args, argnums, points: int, up_to: float) -> list[tuple[int, list[float]]]:
    from autograd import grad

    from bincheck import checkpoint_program
    least = least_budget(f, args, argnums)
    grad(f, argnums)(*args)                    # autograd's own first-call caches
    out = []
    for m in sorted({int(x) for x in numpy.geomspace(least, up_to * least, points)}):
        g = grad(checkpoint_program(f, memory=m), argnums)
        ratios = []
        for _ in range(3):
            gc.collect()
            tracemalloc.start()
            try:
                base = tracemalloc.get_traced_memory()[0]
                g(*args)
                ratios.append((tracemalloc.get_traced_memory()[1] - base) / m)
            finally:
                tracemalloc.stop()
        out.append((m, ratios))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.programs.budget_sweep",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--points", type=int, default=10)
    p.add_argument("--up-to", type=float, default=15.0)
    p.add_argument("--out", default=os.path.join("benchmarks", "programs", "results"))
    a = p.parse_args(argv)
    t0 = time.time()
    load0 = open("/proc/loadavg").read().split()[:3]
    body, worst = [], [0.0, 0.0]
    for name, f, args, argnums in programs():
        rows = sweep(f, args, argnums, a.points, a.up_to)
        first = max(r[0] for _, r in rows)
        again = max(max(r[1:]) for _, r in rows)
        at_least = rows[0][1]
        worst = [max(worst[0], first), max(worst[1], again)]
        body.append((name, rows[0][0], f"{rows[-1][0] / rows[0][0]:.1f}", len(rows),
                     f"{at_least[0]:.3f}", f"{max(at_least[1:]):.3f}", f"{first:.3f}",
                     f"{again:.3f}"))
        print(name, body[-1], flush=True)
    text = (f"# checkpoint_program: tracemalloc's peak over memory=, from the least budget up\n\n"
            f"Run: `python -m benchmarks.programs.budget_sweep --points {a.points} --up-to "
            f"{a.up_to:g}`, {time.strftime('%Y-%m-%d %H:%M')}, Python "
            f"{sys.version.split()[0]}, load average at start {' '.join(load0)}, "
            f"{time.time() - t0:.0f} s. Each budget: three gradients with one `g` (the first "
            f"plans; the next reuse the plan and capture its snapshots), each after "
            f"`gc.collect()`, peak above the traced bytes at its start.\n\n"
            + md_table(("program", "least budget B", "up to x least", "budgets",
                        "first call at least", "repeated at least", "worst first call",
                        "worst repeated call"), body)
            + f"\nWorst over all: first calls {worst[0]:.3f}, repeated calls {worst[1]:.3f} "
              f"of `memory=`.\n")
    for path in write_outputs(a.out, {"budget-sweep.md": text.encode()}):
        print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
