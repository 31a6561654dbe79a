"""Runs the benchmark: checks gradients, counts evaluations, measures memory and time.

Per problem (cell, loss, seq_len, hidden, batch) every strategy is built, its gradient is compared
with store-all's (rtol 1e-8) before anything is timed, and then:

* evaluations: that checked gradient runs an instrumented step (and, on a per-step-loss problem,
  an instrumented per-step loss, bincheck's ``output_fn``) counting plain vs taped calls
  (``autograd.tracer.isbox``);
* tracemalloc: peak traced bytes during one gradient, above what was allocated before it;
* RSS: peak process memory increment during one gradient, by ``memory_profiler``, measured in a
  fresh child process (a parent's freed-but-kept heap would otherwise hide allocations);
* wall time: median of ``repeats`` gradients, strategies interleaved round by round.

Every ratio is against store-all measured in the same run.
"""

from __future__ import annotations

import gc
import multiprocessing
import time
import tracemalloc
from dataclasses import asdict, dataclass, field
from queue import Empty

import numpy
from autograd.tracer import isbox

from .cells import CELLS, CharLM
from .strategies import build, slice_inputs

LOSSES = ("final", "char-lm")


@dataclass(frozen=True)
class Problem:
    cell: str
    loss: str            # "final" (loss on the final state) or "char-lm" (loss at every step)
    seq_len: int
    hidden: int
    batch: int
    seed: int = 0

    @property
    def per_step(self) -> bool:
        return self.loss == "char-lm"

    @property
    def model(self):
        """A Cell (final-state loss) or a CharLM around the cell (per-step loss)."""
        return CharLM(CELLS[self.cell]) if self.per_step else CELLS[self.cell]

    def make(self):
        return self.model.init(self.hidden, self.batch, self.seq_len, self.seed)


@dataclass(frozen=True)
class Run:
    problem: Problem
    strategy: str
    num_ckpts: int | None = None

    @property
    def label(self) -> str:
        return self.strategy if self.num_ckpts is None else f"{self.strategy}(s={self.num_ckpts})"

    def build(self, step=None, readout=None):
        """``(built, params)``; ``step``/``readout`` replace the model's (to count calls)."""
        params, state0, inputs = self.problem.make()
        built = build(self.strategy, self.problem.model, state0, inputs, self.problem.seq_len,
                      step, readout, self.num_ckpts)
        return built, params


@dataclass
class Row:
    cell: str
    loss: str
    seq_len: int
    hidden: int
    batch: int
    strategy: str
    num_ckpts: int | None
    status: str = "ok"
    time_s: float | None = None
    slowdown: float | None = None
    times_s: list = field(default_factory=list)
    tracemalloc_peak_mib: float | None = None
    memory_saved_pct: float | None = None
    rss_peak_mib: float | None = None
    rss_saved_pct: float | None = None
    plain_evals: int | None = None
    taped_evals: int | None = None
    predicted_plain: int | None = None
    predicted_taped: int | None = None
    bookkeeping_pct: float | None = None
    library_overhead_pct: float | None = None
    plain_step_ms: float | None = None
    taped_step_ms: float | None = None
    # per-step-loss problems: evaluations of the per-step loss (output_fn), its plain cost
    out_plain_evals: int | None = None
    out_taped_evals: int | None = None
    predicted_out_plain: int | None = None
    predicted_out_taped: int | None = None
    output_step_ms: float | None = None

    def record(self) -> dict:
        d = asdict(self)
        d["times_s"] = " ".join(f"{t:.4f}" for t in self.times_s)
        return d


class Counter:
    """Wraps a step ``fn(params, state, x)`` or a per-step loss ``output_fn(params, state, x)``;
    counts evaluations under autograd's tape vs on plain arrays."""

    def __init__(self, fn):
        self.fn, self.plain, self.taped = fn, 0, 0

    def __call__(self, params, state, x):
        if isbox(params) or isbox(state) or any(
                isbox(v) for v in list(params.values()) + list(
                    state if isinstance(state, tuple) else (state,))):
            self.taped += 1
        else:
            self.plain += 1
        return self.fn(params, state, x)


def _leaves(g):
    return [g[k] for k in sorted(g)] if isinstance(g, dict) else list(g)


def gradients_agree(g, g_ref, rtol=1e-8) -> str | None:
    for a, b in zip(_leaves(g), _leaves(g_ref)):
        scale = numpy.max(numpy.abs(b)) or 1.0
        if not numpy.allclose(a, b, rtol=rtol, atol=rtol * 1e-3 * scale):
            err = numpy.max(numpy.abs(a - b) / (numpy.abs(b) + 1e-300))
            return f"gradient mismatch (max rel err {err:.2e})"
    return None


def tracemalloc_peak(gradient, params) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        gradient(params)
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def _rss_child(run: Run, queue) -> None:
    from memory_profiler import memory_usage
    built, params = run.build()
    gc.collect()
    base = memory_usage(-1, interval=0.005, timeout=0.05, max_usage=True)
    peak = memory_usage((built.gradient, (params,), {}), interval=0.005, max_usage=True)
    queue.put(float(peak) - float(base))


class RssChild:
    """The peak RSS increment (MiB) of one gradient, measured in a fresh process started now;
    :meth:`result` waits for it (None if the child fails or runs out of time)."""

    def __init__(self, run: Run) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.queue = ctx.Queue()
        self.proc = ctx.Process(target=_rss_child, args=(run, self.queue))
        self.proc.start()

    def result(self, timeout: float = 600.0) -> float | None:
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    return self.queue.get(timeout=0.2)
                except Empty:
                    if not self.proc.is_alive() and self.queue.empty():
                        return None                 # the child died without a result
            return None
        finally:
            self.proc.join(timeout=60)
            if self.proc.is_alive():
                self.proc.kill()


def rss_peak_mib(run: Run) -> float | None:
    """Peak RSS increment (MiB) of one gradient, measured in a fresh process."""
    return RssChild(run).result()


def plain_step_seconds(problem: Problem, reps: int = 50) -> tuple[float, float | None]:
    """Seconds of one plain step and of one plain per-step loss (None without one); each the
    faster of two rounds of ``reps`` calls (the first may run cold)."""
    model = problem.model
    params, state, inputs = problem.make()
    xs = [slice_inputs(inputs, t % problem.seq_len) for t in range(reps)]
    step = model.step if problem.per_step else model.fn

    def timed(fn):
        best = float("inf")
        for _ in range(2):
            t0 = time.perf_counter()
            for x in xs:
                fn(params, state, x)
            best = min(best, (time.perf_counter() - t0) / reps)
        return best
    return timed(step), timed(model.readout) if problem.per_step else None


def run_problem(problem: Problem, runs: list[Run], repeats: int, measure_rss: bool,
                progress=None) -> list[Row]:
    """Measure every run of one problem; ``runs[0]`` must be store-all (the reference)."""
    assert runs[0].strategy == "store-all"
    rows, builts, params = [], [], None
    g_ref = None
    # The RSS child of a run (a fresh process) runs while this process checks and traces the
    # next run: neither measures the other's memory, and this process starts and collects
    # children only between tracemalloc windows, on its only thread. One child at a time; the
    # timed rounds start only when the last one has finished.
    child = None
    for run in runs:
        row = Row(problem.cell, problem.loss, problem.seq_len, problem.hidden, problem.batch,
                  run.strategy, run.num_ckpts)
        model = problem.model
        steps = Counter(model.step if problem.per_step else model.fn)
        outs = Counter(model.readout) if problem.per_step else None
        counted, params = run.build(steps, outs)
        g = counted.gradient(params)                    # checked, counted; warms caches up
        if g_ref is None:
            g_ref = g
        else:
            bad = gradients_agree(g, g_ref)
            if bad:
                row.status = "FAILED: " + bad           # reported, never timed
        row.predicted_plain, row.predicted_taped = counted.predicted_plain, counted.predicted_taped
        row.predicted_out_plain = counted.predicted_out_plain
        row.predicted_out_taped = counted.predicted_out_taped
        built, _ = run.build()                          # the uninstrumented gradient, timed
        if row.status == "ok":
            row.plain_evals, row.taped_evals = steps.plain, steps.taped
            if outs is not None and counted.predicted_out_taped is not None:
                row.out_plain_evals, row.out_taped_evals = outs.plain, outs.taped
            row.tracemalloc_peak_mib = tracemalloc_peak(built.gradient, params) / 2**20
        if child is not None:
            rows[child[0]].rss_peak_mib = child[1].result()
            child = None
        if measure_rss and row.status == "ok":
            child = (len(rows), RssChild(run))
        rows.append(row)
        builts.append(built)
        if progress is not None:
            progress.update(1)
    if child is not None:                  # the last child has finished before any timing
        rows[child[0]].rss_peak_mib = child[1].result()

    live = [i for i, r in enumerate(rows) if r.status == "ok"]
    bookkeeping = {i: [] for i in live}
    overhead = {i: [] for i in live}
    taped_ms = {i: [] for i in live}
    for _ in range(repeats):                            # interleaved rounds
        for i in live:
            gc.collect()
            t0 = time.perf_counter()
            builts[i].gradient(params)
            wall = time.perf_counter() - t0
            rows[i].times_s.append(wall)
            loop = builts[i].loop
            if loop is not None:
                st = loop.stats
                work = st.plain_seconds + st.tape_seconds + st.backward_seconds
                bookkeeping[i].append((wall - work) / wall)
                overhead[i].append(st.overhead_seconds / wall)
                taped_ms[i].append(1e3 * (st.tape_seconds + st.backward_seconds) /
                                   max(st.taped_steps, 1))
        if progress is not None:
            progress.update(1)

    plain_s, output_s = plain_step_seconds(problem)
    ref = rows[0]
    for i in live:
        r = rows[i]
        r.time_s = float(numpy.median(r.times_s))
        r.slowdown = r.time_s / ref.time_s
        r.memory_saved_pct = 100.0 * (1.0 - r.tracemalloc_peak_mib / ref.tracemalloc_peak_mib)
        if r.rss_peak_mib is not None and ref.rss_peak_mib:
            r.rss_saved_pct = 100.0 * (1.0 - r.rss_peak_mib / ref.rss_peak_mib)
        if bookkeeping[i]:
            r.bookkeeping_pct = 100.0 * float(numpy.median(bookkeeping[i]))
            r.library_overhead_pct = 100.0 * float(numpy.median(overhead[i]))
            r.taped_step_ms = float(numpy.median(taped_ms[i]))
        r.plain_step_ms = 1e3 * plain_s
        r.output_step_ms = None if output_s is None else 1e3 * output_s
    return rows
