"""Runs one cell: compiles, checks every gradient, measures memory, counts step evaluations, then
times interleaved rounds.

Order, per cell:

1. every fixed strategy (``lax.scan`` first, then the peers and bincheck at each ``num_ckpts``)
   is traced and compiled ahead of time (``jit(grad(loss)).lower(*args)``, then ``.compile()``;
   both timed, separately from the runs) with every array a jit argument; one gradient is
   compared with ``lax.scan``'s (max over parameters of ``max|g - g_ref| / max|g_ref|``): a
   strategy off by more than ``RTOL`` is reported and never timed;
2. memory: ``compiled.memory_analysis().temp_size_in_bytes`` (XLA's static allocation of the
   gradient's temporaries; arguments and outputs are not in it);
3. step evaluations, in a separate untimed run: the same strategy built around the step with a
   ``jax.debug.callback`` counter, compiled and run once;
4. the budgets follow from those temporaries: ``memory=`` at a fraction of ``lax.scan``'s and at
   each peer's (scan-remat, nested, every Equinox C); each is checked like the others (a budget
   below the loop's minimum is refused by bincheck at trace time: reported as such);
5. timed rounds, strategies interleaved and the order reversed every other round; each round
   first measures the per-step costs (compiled K-step scans of a plain step and of a taped step
   with its backward). Time = median of the rounds; "time / bound" is the median over rounds of
   the round's time over the bound from that round's step costs (comparisons between strategies
   in the report are likewise medians of per-round ratios).
"""

from __future__ import annotations

import gc
import re
import statistics
import sys
import time
from typing import Any, Callable

import jax
import numpy as np

from . import strategies as S
from .problem import Counter, Problem, StepCosts
from .rows import Row

RTOL = 1e-4      # float32; recomputation replays the same kernels, errors are ~1e-7 or 0


def max_rel_err(g: Any, ref: Any) -> float:
    return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))
                     / max(float(np.max(np.abs(np.asarray(b)))), 1e-30))
               for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(ref)))


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class CellRun:
    """All strategies of one problem, their rows, and the timing rounds."""

    def __init__(self, prob: Problem, num_ckpts: list[int], fractions: list[float],
                 count: bool = True, keep_segments: bool = False) -> None:
        self.prob, self.num_ckpts, self.fractions, self.count = prob, num_ckpts, fractions, count
        self.keep_segments = keep_segments
        self.live: list[tuple[Any, Row]] = []       # (compiled gradient, row)
        self.rows: list[Row] = []
        self.ref: Any = None

    def _row(self, st: S.Strategy) -> Row:
        p = self.prob
        row = Row(p.cell, p.seq_len, p.hidden, p.batch, p.input_size, st.name, st.kind,
                  st.label, st.num_ckpts, st.memory, st.budget_of)
        self.rows.append(row)
        return row

    def _grad(self, f: Callable) -> Any:
        loss = self.prob.loss
        return jax.jit(jax.grad(lambda p, s0, xs: loss(f(p, s0, xs))))

    def check(self, st: S.Strategy) -> Row:
        p, row = self.prob, self._row(st)
        T = p.seq_len
        t0 = time.perf_counter()
        try:
            lowered = self._grad(st.build(p.step)).lower(*p.args)
        except ValueError as e:       # memory= below the loop's minimum: refused at trace time
            if st.memory is None or "below the least" not in str(e):
                raise
            found = re.search(r"(\d+) bytes in all", str(e))
            row.status = "refused: below the loop's minimum" + (
                f" ({int(found.group(1)) / 2**20:.3f} MiB)" if found else "")
            row.note = str(e)
            _log(f"  {st.name}: {row.status}")
            return row
        t1 = time.perf_counter()
        compiled = lowered.compile()
        row.lower_s, row.compile_s = t1 - t0, time.perf_counter() - t1
        g = jax.block_until_ready(compiled(*p.args))
        if self.ref is None:
            self.ref = g
        row.max_rel_err = max_rel_err(g, self.ref)
        del g
        row.temp_bytes = int(compiled.memory_analysis().temp_size_in_bytes)
        if st.loops:
            plan = st.loops[0].plan
            row.plain_steps, row.taped_steps = plan.plain_steps, plan.taped_steps
            row.expected_evals = plan.plain_steps + plan.taped_steps
            if st.memory is not None:
                row.plan_num_ckpts = plan.checkpoints
                row.plan_segment = getattr(plan.schedule, "leaf", 1)
                row.plan_peak_bytes = plan.peak_bytes
        else:
            row.expected_evals = {"scan": T, "scan-remat": 2 * T, "nested": 2 * T}.get(st.kind)
        if row.max_rel_err > RTOL:
            row.status = f"FAILED: gradient max rel err {row.max_rel_err:.2e}"
            _log(f"  {st.name}: {row.status}")
            return row
        if self.count:
            counter = Counter()
            counted = self._grad(st.build(counter.wrap(p.step))).lower(*p.args).compile()
            jax.block_until_ready(counted(*p.args))
            jax.effects_barrier()
            row.evals = counter.count
            del counted
            if len(st.loops) > 1 and st.loops[1].plan.plain_steps != row.plain_steps:
                row.note = (f"the counted run planned {st.loops[1].plan.plain_steps} plain "
                            f"steps, the timed one {row.plain_steps}")
        self.live.append((compiled, row))
        _log(f"  {st.name}: compile {row.lower_s + row.compile_s:.2f} s, temp "
             f"{row.temp_bytes / 2**20:.3f} MiB, err {row.max_rel_err:.1e}, evals {row.evals}")
        return row

    def build_and_check(self) -> None:
        T = self.prob.seq_len
        for st in S.fixed(T, self.num_ckpts):
            self.check(st)
        ref = self.rows[0]
        if ref.status != "ok":
            return
        budgets = [(f"{100 * f:g} %", int(f * ref.temp_bytes)) for f in self.fractions]
        budgets += [(row.label, row.temp_bytes) for _, row in self.live
                    if row.kind in S.PEERS]
        for what, memory in budgets:
            self.check(S.bincheck(T, memory=max(memory, 1), budget_of=what))
            if self.keep_segments:          # the same budget with kept segments, side by side
                self.check(S.bincheck(T, memory=max(memory, 1), budget_of=what,
                                      keep_segments=True))

    def time_rounds(self, rounds: int, costs: StepCosts) -> None:
        p = self.prob
        measured = []
        for k in range(rounds):
            gc.collect()
            gc.disable()                 # no collector pauses inside a timed call
            try:
                measured.append(costs.measure())
                order = self.live if k % 2 == 0 else self.live[::-1]
                for compiled, row in order:
                    t0 = time.perf_counter()
                    jax.block_until_ready(compiled(*p.args))
                    row.times_s.append(time.perf_counter() - t0)
            finally:
                gc.enable()
            _log(f"  round {k + 1}/{rounds} done")
        plain = statistics.median(c[0] for c in measured)
        taped = statistics.median(c[1] for c in measured)
        ref = self.rows[0]
        for _, row in self.live:
            row.time_s = statistics.median(row.times_s)
            row.step_plain_ms, row.step_taped_ms = 1e3 * plain, 1e3 * taped
            if row.plain_steps is not None:
                row.bound_s = row.plain_steps * plain + row.taped_steps * taped
                # each round against the bound from that round's step costs: the load of a
                # shared machine drifts between rounds, much less within one
                row.bounds_s = [row.plain_steps * c[0] + row.taped_steps * c[1]
                                for c in measured]
                row.time_over_bound = statistics.median(
                    t / b for t, b in zip(row.times_s, row.bounds_s))
        for _, row in self.live:
            row.rel_time = statistics.median(t / s for t, s in zip(row.times_s, ref.times_s))
        for row in self.rows:
            if row.temp_bytes is not None and ref.temp_bytes:
                row.temp_rel = row.temp_bytes / ref.temp_bytes


def run_cell(prob: Problem, num_ckpts: list[int], fractions: list[float], rounds: int,
             count: bool = True, keep_segments: bool = False) -> list[Row]:
    run = CellRun(prob, num_ckpts, fractions, count, keep_segments)
    costs = StepCosts(prob)
    run.build_and_check()
    if run.rows[0].status == "ok":
        run.time_rounds(rounds, costs)
    return run.rows
