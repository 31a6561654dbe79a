"""The disk tier measured: a 2-D heat equation whose snapshots do not fit the RAM budget.

``u <- u + a * laplacian(u)`` on an N x N float64 grid (periodic 5-point stencil), loss
``sum(u_T ** 2)``, gradient w.r.t. ``a``. First the gradient of exactly this code path (disk on,
RAM tight) is checked against store-all on a small grid. Then, at the full size, three runs:
the plain forward (no gradient; the reference time), bincheck with ``disk=True`` and bincheck with
RAM only at the same budget (more recomputation). Each gradient runs in a fresh child process that
reports its wall time, peak RSS increment (memory_profiler) and tracemalloc-free counts, so the
runs cannot share a heap. Default: N=1024 (8 MB states), 2000 steps, 160 MB; ``--quick``: N=256,
400 steps, 9 MB.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
from dataclasses import asdict, dataclass

import autograd.numpy as np
import numpy
from autograd import grad

from bincheck import binomial_checkpoint

FULL = dict(n=1024, steps=2000, memory="160MB")
QUICK = dict(n=256, steps=400, memory="9MB")


def heat(a, u, x):
    lap = np.roll(u, 1, 0) + np.roll(u, -1, 0) + np.roll(u, 1, 1) + np.roll(u, -1, 1) - 4.0 * u
    return u + a * lap


def initial(n: int) -> numpy.ndarray:
    return numpy.random.RandomState(0).rand(n, n)


@dataclass
class DiskRow:
    run: str
    n: int
    steps: int
    memory: str
    seconds: float | None = None
    vs_forward: float | None = None
    rss_peak_mib: float | None = None
    plain_steps: int | None = None
    checkpoints_in_ram: int | None = None
    disk_written_mib: float | None = None
    disk_read_mib: float | None = None
    predicted_plain: int | None = None
    vs_ram_only: float | None = None
    disk_plan: str | None = None        # "used", or why the planner declined the disk
    write_mb_s: float | None = None     # the probe's sustained throughput (fsync'ed, MB/s)
    read_mb_s: float | None = None      # ... reading back with the page cache dropped
    io_seconds: float | None = None     # time in snapshot file I/O and checksums
    wait_seconds: float | None = None   # the part of it the gradient waited for
    overlap: float | None = None        # 1 - wait / io
    round_seconds: list | None = None   # each round's time (the row reports the median round)
    round_speedups: list | None = None  # each round's RAM-only time / this run's
    status: str = "ok"


def check_gradient(n: int = 96, steps: int = 150) -> str:
    """The disk code path against store-all on a small grid; returns 'ok' or the mismatch."""
    u0, a = initial(n), 0.1
    with tempfile.TemporaryDirectory() as tmp:
        loop = binomial_checkpoint(heat, steps, memory=int(4.5 * u0.nbytes) + 1_000_000,
                                   disk=tmp)
        plan = loop.preview(a, u0, None)
        g = grad(lambda a: np.sum(loop(a, u0, None) ** 2))(a)
        left = os.listdir(tmp)

    def store_all(a):
        u = u0
        for _ in range(steps):
            u = heat(a, u, None)
        return np.sum(u ** 2)
    g0 = grad(store_all)(a)
    if plan.schedule.disk_writes == 0:
        return "check did not use the disk"
    if left:
        return f"files left behind: {left}"
    return "ok" if abs(g - g0) <= 1e-10 * abs(g0) else f"gradient mismatch {g} vs {g0}"


def _child(kind: str, n: int, steps: int, memory: str, queue) -> None:
    try:
        queue.put(_measure_child(kind, n, steps, memory))
    except BaseException as err:                  # report, never leave the parent waiting
        queue.put({"error": f"{type(err).__name__}: {err}"})


def _measure_child(kind: str, n: int, steps: int, memory: str) -> dict:
    from memory_profiler import memory_usage
    u0, a = initial(n), 0.1
    if kind == "forward":
        def work():
            u = u0
            for _ in range(steps):
                u = heat(a, u, None)
            return u
        loop = None
    else:
        loop = binomial_checkpoint(heat, steps, memory=memory,
                                   disk=True if kind == "disk" else None)
        plan = loop.preview(a, u0, None)
        work = lambda: grad(lambda a: np.sum(loop(a, u0, None) ** 2))(a)
    base = memory_usage(-1, interval=0.01, timeout=0.1, max_usage=True)
    t0 = time.perf_counter()
    peak = memory_usage((work, (), {}), interval=0.02, max_usage=True)
    seconds = time.perf_counter() - t0
    out = dict(seconds=seconds, rss=float(peak) - float(base))
    if loop is not None:
        st, sz = loop.stats, plan.sizes
        out.update(plain=st.plain_steps, ram=st.peak_checkpoints,
                   written=st.disk_bytes_written, read=st.disk_bytes_read,
                   predicted=plan.plain_steps, note=plan.disk_note or None,
                   io=st.disk_io_seconds, wait=st.disk_wait_seconds, overlap=st.disk_overlap)
        if sz.write_seconds:
            out.update(write_mb_s=u0.nbytes / sz.write_seconds / 1e6,
                       read_mb_s=u0.nbytes / sz.read_seconds / 1e6)
    return out


def run_child(kind: str, n: int, steps: int, memory: str) -> dict:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(kind, n, steps, memory, queue))
    proc.start()
    try:
        while True:
            try:
                return queue.get(timeout=5)
            except Exception:                    # queue.Empty: is the child still there?
                if not proc.is_alive():
                    return {"error": f"the measuring process died (exit code {proc.exitcode})"}
    finally:
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()


def measure(quick: bool, progress=print, repeats: int = 1) -> list[DiskRow]:
    """The three runs, ``repeats`` rounds (each round runs each once, in turn, so that a change
    in the machine's load falls on all of them); each row reports the median round."""
    cfg = QUICK if quick else FULL
    n, steps, memory = cfg["n"], cfg["steps"], cfg["memory"]
    status = check_gradient()
    progress(f"  gradient check (disk path vs store-all, 96x96, 150 steps): {status}")
    kinds = ("forward", "disk", "ram-only")
    results: dict[str, list[dict]] = {kind: [] for kind in kinds}
    errors: dict[str, str] = {}
    for round_ in range(repeats):
        for kind in kinds:
            if kind in errors or (status != "ok" and kind != "forward"):
                continue
            r = run_child(kind, n, steps, memory)
            if "error" in r:
                errors[kind] = r["error"]
                progress(f"  {kind}: {r['error']}")
                continue
            results[kind].append(r)
            progress(f"  round {round_ + 1}, {kind}: {r['seconds']:.1f} s, "
                     f"RSS +{r['rss']:.0f} MiB")
    rows = []
    for kind in kinds:
        row = DiskRow(kind, n, steps, memory if kind != "forward" else "-")
        runs = results[kind]
        if status != "ok" and kind != "forward":
            row.status = "not run: " + status
        elif kind in errors:
            row.status = errors[kind]
        if row.status != "ok" or not runs:
            rows.append(row)
            continue
        r = sorted(runs, key=lambda r: r["seconds"])[(len(runs) - 1) // 2]     # the median
        row.seconds, row.rss_peak_mib = r["seconds"], max(x["rss"] for x in runs)
        row.round_seconds = [x["seconds"] for x in runs]
        if "plain" in r:
            row.plain_steps, row.checkpoints_in_ram = r["plain"], r["ram"]
            row.disk_written_mib, row.disk_read_mib = r["written"] / 2**20, r["read"] / 2**20
            row.predicted_plain = r["predicted"]
            row.disk_plan = r["note"]
            if r["io"]:
                row.io_seconds, row.wait_seconds, row.overlap = r["io"], r["wait"], r["overlap"]
            row.write_mb_s, row.read_mb_s = r.get("write_mb_s"), r.get("read_mb_s")
        rows.append(row)
    ram = next((r for r in rows if r.run == "ram-only" and r.seconds), None)
    for row in rows:
        if row.seconds is not None and rows[0].seconds:
            row.vs_forward = row.seconds / rows[0].seconds
        if row.seconds is not None and ram is not None and row.run != "forward":
            row.vs_ram_only = ram.seconds / row.seconds
            row.round_speedups = [a / b for a, b in zip(ram.round_seconds, row.round_seconds)]
    return rows


def markdown(rows: list[DiskRow]) -> str:
    r0 = rows[0]
    out = [f"**Heat equation, {r0.n}x{r0.n} float64 grid ({r0.n * r0.n * 8 / 2**20:.2g} MiB "
           f"state), {r0.steps} steps, gradient w.r.t. the diffusion coefficient**", "",
           "| run | budget | time (s) | vs plain forward | speed-up over RAM only | peak RSS "
           "increment (MiB) | plain evals (predicted) | checkpoints in RAM | disk written / "
           "read (MiB) | I/O time / waited (s) | I/O overlapped |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r.status != "ok":
            out.append(f"| {r.run} | {r.memory} | {r.status} | | | | | | | | |")
            continue
        evals = "–" if r.plain_steps is None else f"{r.plain_steps} ({r.predicted_plain})"
        disk = "–" if not r.disk_written_mib else \
            f"{r.disk_written_mib:.0f} / {r.disk_read_mib:.0f}"
        io = "–" if r.io_seconds is None else f"{r.io_seconds:.1f} / {r.wait_seconds:.1f}"
        overlap = "–" if r.overlap is None else f"{100 * r.overlap:.0f} %"
        speed = "–" if r.vs_ram_only is None else f"{r.vs_ram_only:.2f}×"
        out.append(f"| {r.run} | {r.memory} | {r.seconds:.1f} | {r.vs_forward:.2f}× | {speed} | "
                   f"{r.rss_peak_mib:.0f} | {evals} | {r.checkpoints_in_ram or '–'} | {disk} | "
                   f"{io} | {overlap} |")
    disk = next((r for r in rows if r.run == "disk" and r.status == "ok"), None)
    if disk is not None and disk.round_seconds and len(disk.round_seconds) > 1:
        out += ["", f"Medians of {len(disk.round_seconds)} rounds (each round runs each once, in "
                    f"turn); the median round's counts. Disk times "
                    f"{' / '.join(f'{t:.1f}' for t in disk.round_seconds)} s; speed-up over RAM "
                    f"only per round {' / '.join(f'{x:.2f}×' for x in disk.round_speedups)}."]
    if disk is not None and disk.write_mb_s:
        out += ["", f"Disk throughput measured by the probe in the median round (each state "
                    f"written and fsync'ed; read back with the page cache dropped): write "
                    f"{disk.write_mb_s:.0f} MB/s, read {disk.read_mb_s:.0f} MB/s. The planner: "
                    f"{disk.disk_plan}."]
    return "\n".join(out) + "\n"


def as_dicts(rows: list[DiskRow]) -> list[dict]:
    out = [asdict(r) for r in rows]
    for d in out:                                   # one CSV cell each
        for key in ("round_seconds", "round_speedups"):
            if d[key] is not None:
                d[key] = " ".join(f"{x:.4g}" for x in d[key])
    return out
