"""What each autograd primitive's VJP holds at its peak, the source of ``VJP_PEAKS`` in
``bincheck/autograd/kept.py``: for every primitive autograd defines a VJP for (numpy, its fft
and linalg, scipy.special and scipy.stats), on 1-D float64 arrays of 100,000 entries taking 1, 2
or 3 of them, every argument and each alone differentiated, the VJP call's tracemalloc peak over
the largest of the op's arguments and result. ``python -m benchmarks.programs.vjp_peaks``
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
    found = []
    for p, name in names.items():
        most = None
        for n in (1, 2, 3):
            args = tuple(arrays[:n])
            try:
                ans = numpy.asarray(p.fun(*args))
            except Exception:               # noqa: BLE001 - not this many arguments
                continue
            if ans.dtype.kind not in "fc":
                break
            for argnums in [tuple(range(n))] + [(i,) for i in range(n)]:
                try:
                    vjp = primitive_vjps[p](argnums, ans, args, {})
                    g = numpy.ones_like(ans) if ans.shape else 1.0
                    tracemalloc.start()
                    base = tracemalloc.get_traced_memory()[0]
                    vjp(g)
                    peak = tracemalloc.get_traced_memory()[1] - base
                except Exception:           # noqa: BLE001 - no VJP for that argument
                    continue
                finally:
                    tracemalloc.stop()
                times = peak / max([a.nbytes for a in args] + [ans.nbytes])
                most = times if most is None else max(most, times)
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
                f"numpy {numpy.__version__}, N={N}, tracemalloc)\n\n"
                f"{len(rows)} primitives measured; those above 3:\n\n"
                "| primitive | peak / largest array |\n|---|---:|\n")
        for times, name in rows:
            if times > 3.0:
                f.write(f"| {name} | {times:.2f} |\n")
    print(open(out, encoding="utf-8").read())


if __name__ == "__main__":
    sys.exit(main())
