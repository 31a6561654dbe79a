"""What each autograd primitive's VJP holds at its peak, the source of ``VJP_PEAKS`` in
``bincheck/autograd/kept.py``: for every primitive autograd defines a VJP for (numpy, its fft
and linalg, scipy.special and scipy.stats), on 1-D float64 arrays of 100,000 entries taking 1, 2
or 3 of them (numpy.linalg's: 200x200 matrices), every argument and each alone differentiated,
the VJP call's tracemalloc peak over the largest of the op's arguments and results. ``python -m benchmarks.programs.vjp_peaks``
writes ``results/vjp-peaks.md`` (those above 3: the multiple every VJP is priced at)."""

from __future__ import annotations

import importlib
import os
import sys
import tracemalloc
import warnings

import numpy
from autograd.core import primitive_vjps

MODULES = ["autograd.numpy", "autograd.numpy.fft", "autograd.numpy.linalg",
           "autograd.scipy.special"] + [f"autograd.scipy.stats.{m}" for m in
                                        ("norm", "t", "gamma", "beta", "poisson", "chi2")]
N = 100_000
M = 200                 # numpy.linalg's: square matrices of M x M (the first one SPD)


def measure() -> list[tuple[float, str]]:
    names = {}
    for m in MODULES:
        mod = importlib.import_module(m)
        for sub in [mod] + [v for v in vars(mod).values() if type(v) is type(mod)]:
            for k, v in vars(sub).items():
                try:
                    if v in primitive_vjps:
                        names.setdefault(v, f"{sub.__name__}.{k}")
                except TypeError:
                    pass
    rng = numpy.random.RandomState(0)
    arrays = [rng.rand(N) + 0.5 for _ in range(3)]
    a = rng.rand(M, M)
    square = [a @ a.T + M * numpy.eye(M), rng.rand(M, M), rng.rand(M, M)]    # SPD first
    found = []
    for p, name in names.items():
        most = None
        trials = [(tuple(square[:n]), {}) for n in (1, 2)] if ".linalg." in name else \
            [(tuple(arrays[:n]), {}) for n in (1, 2, 3)]
        if name.endswith(".svd"):
            trials = [((square[1],), {"full_matrices": False}),
                      ((square[1],), {"compute_uv": False})]
        for args, kw in trials:
            n = len(args)
            try:
                ans = p.fun(*args, **kw)
            except Exception:               # noqa: BLE001 - not this many arguments
                continue
            outs = ans if isinstance(ans, tuple) else (ans,)
            if any(numpy.asarray(o).dtype.kind not in "fc" for o in outs):
                break
            for argnums in [tuple(range(n))] + [(i,) for i in range(n)]:
                try:
                    vjp = primitive_vjps[p](argnums, ans, args, kw)
                    g = tuple(numpy.ones_like(o) for o in outs) if isinstance(ans, tuple) \
                        else numpy.ones_like(ans) if numpy.shape(ans) else 1.0
                    tracemalloc.start()
                    base = tracemalloc.get_traced_memory()[0]
                    vjp(g)
                    peak = tracemalloc.get_traced_memory()[1] - base
                except Exception:           # noqa: BLE001 - no VJP for that argument
                    continue
                finally:
                    tracemalloc.stop()
                times = peak / max([x.nbytes for x in args] +
                                   [numpy.asarray(o).nbytes for o in outs])
                most = times if most is None else max(most, times)
            if not kw:
                break
        if most is not None:
            found.append((most, name))
    return sorted(found, reverse=True)


def main() -> None:
    warnings.filterwarnings("ignore")
    from importlib.metadata import version
    rows = measure()
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "vjp-peaks.md")
    with open(out, "w", encoding="utf-8") as f:
        f.write(f"# A VJP's peak over its op's largest array (autograd {version('autograd')}, "
                f"numpy {numpy.__version__}, N={N}, linalg {M}x{M}, tracemalloc)\n\n"
                f"{len(rows)} primitives measured; those above 3:\n\n"
                "| primitive | peak / largest array |\n|---|---:|\n")
        for times, name in rows:
            if times > 3.0:
                f.write(f"| {name} | {times:.2f} |\n")
    print(open(out, encoding="utf-8").read())


if __name__ == "__main__":
    sys.exit(main())
