"""Measurement and output helpers shared by the parts: memory, time, gradient checks, files.

Memory is the ``tracemalloc`` peak during one gradient above what was allocated before it (numpy
allocations are traced); times are medians over rounds in which the variants are interleaved, so
that drift on a shared machine hits all alike. Files are written atomically with
``benchmarks.rnn.report.write_atomic`` (temporary file + rename).
"""

from __future__ import annotations

import csv
import gc
import io
import math
import os
import time
import tracemalloc
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy

from ..common.files import write_atomic

__all__ = ["write_atomic", "peak_mib", "timed", "interleaved_medians", "max_rel_err", "leaves",
           "csv_bytes", "md_table", "loglog_slope", "write_outputs", "png_bytes"]


def leaves(tree: Any) -> list:
    """Array leaves of nested dicts / tuples / lists, dict keys in sorted order."""
    if isinstance(tree, dict):
        return [leaf for k in sorted(tree) for leaf in leaves(tree[k])]
    if isinstance(tree, (tuple, list)):
        return [leaf for v in tree for leaf in leaves(v)]
    return [numpy.asarray(tree)]


def max_rel_err(g: Any, g_ref: Any) -> float:
    """Largest |g - g_ref| over all leaves, relative to the largest |g_ref| of that leaf.

    Scaling by the leaf's own magnitude keeps tiny entries of an O(1) gradient from dominating;
    an identically zero reference leaf must be matched exactly (returns inf otherwise).
    """
    worst = 0.0
    for a, b in zip(leaves(g), leaves(g_ref), strict=True):
        scale = float(numpy.max(numpy.abs(b))) if b.size else 0.0
        diff = float(numpy.max(numpy.abs(a - b))) if b.size else 0.0
        if scale == 0.0:
            worst = max(worst, 0.0 if diff == 0.0 else math.inf)
        else:
            worst = max(worst, diff / scale)
    return worst


def peak_mib(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Peak traced memory (MiB) of ``fn()`` above what was allocated before it, and its result."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        out = fn()
        return (tracemalloc.get_traced_memory()[1] - base) / 2**20, out
    finally:
        tracemalloc.stop()


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    gc.collect()
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def interleaved_medians(fns: Sequence[Callable[[], Any]], repeats: int) -> list[list[float]]:
    """``repeats`` rounds, each calling every fn once in order; the times, per fn."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            times[i].append(timed(fn)[0])
    return times


def loglog_slope(xs: Iterable[float], ys: Iterable[float]) -> float:
    """Least-squares slope of log(y) against log(x): the growth order y ~ x**slope."""
    lx, ly = numpy.log(numpy.asarray(list(xs), float)), numpy.log(numpy.asarray(list(ys), float))
    return float(numpy.polyfit(lx, ly, 1)[0])


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def csv_bytes(rows: list[dict], columns: Sequence[str]) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
        w.writerow([_cell(r.get(c)) for c in columns])
    return buf.getvalue().encode()


def md_table(header: Sequence[str], body: Iterable[Sequence[Any]], align: str | None = None) -> str:
    """A markdown table; ``align`` is one character per column, 'l' or 'r' (default: first l)."""
    align = align or "l" + "r" * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(lines) + "\n"


def png_bytes(fig) -> bytes:
    import matplotlib.pyplot as plt
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def write_outputs(out_dir: str, files: dict[str, bytes]) -> list[str]:
    """Write each file atomically into ``out_dir``; returns the paths written."""
    paths = []
    for name, data in files.items():
        path = os.path.join(out_dir, name)
        write_atomic(path, data)
        paths.append(path)
    return paths
