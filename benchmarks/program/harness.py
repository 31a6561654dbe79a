"""Runs one workload: checks every gradient, meters each peak, then times interleaved rounds.

Order, per workload:

1. every strategy runs one gradient (a compiled one compiles there: ``compile_s`` is that first
   call's wall time), compared with store-all's: the max over parameters of
   ``max|g - g_ref| / max|g_ref|``. An eager strategy off by more than ``RTOL`` is reported as
   FAILED and not measured further. A compiled one runs other kernels (and its own RNG for
   dropout), so its error is reported beside its numbers instead, and flagged above
   ``COMPILE_RTOL``;
2. one more gradient each under the profiler's allocation meter
   (:func:`benchmarks.torch.meter.peak_bytes`): the peak of torch-allocated CPU bytes during the
   call above those live at its start. Parameters and inputs exist before the call; the
   parameters' gradients are set to None before it, so every peak includes them (``grad_bytes``);
3. bincheck's rows (:func:`.strategies.bincheck_strategies`): ``memory=`` at each peer's metered
   peak less ``grad_bytes``, and at fractions of store-all's; checked and metered as above;
4. timed rounds, strategies interleaved and the order reversed every other round; time = median
   over rounds, every ratio the median over rounds of the ratio within a round
   (:func:`benchmarks.common.ratios.paired`).
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field

import torch

from ..common.ratios import paired
from ..torch.meter import peak_bytes
from . import strategies as S
from .models import Workload

RTOL = 1e-4             # float32, the same kernels recomputed: errors ~1e-7
COMPILE_RTOL = 1e-3     # inductor's fused kernels sum in another order


@dataclass
class Row:
    workload: str
    describe: str
    strategy: str
    kind: str
    label: str
    budget: float | None = None         # torch.compile: activation_memory_budget
    num_ckpts: int | None = None
    memory_budget: int | None = None    # bincheck memory= bytes
    budget_of: str | None = None
    status: str = "ok"
    note: str | None = None             # why not run, or a refusal's message
    max_rel_err: float | None = None    # against store-all's gradient
    compile_s: float | None = None      # torch.compile: the first call (compiles both passes)
    metered_peak: int | None = None     # bytes, profiler allocation events, above the start
    grad_bytes: int | None = None       # the parameters' gradients, in every peak
    peak_rel: float | None = None       # / store-all's
    share_rel: float | None = None      # (peak - grad_bytes) / store-all's: what checkpointing
                                        # changes, the gradients left out
    time_s: float | None = None         # median over rounds
    times_s: list = field(default_factory=list)
    rel_time: float | None = None       # / store-all's, median of per-round ratios
    ops: int | None = None              # bincheck: its .stats of the last backward
    plain_ops: int | None = None
    taped_ops: int | None = None
    lib_peak_bytes: int | None = None
    plan_s: float | None = None
    record_s: float | None = None
    predicted_peak: int | None = None   # bincheck: its plan's predicted peak + the trace
    trace_bytes: int | None = None      # bincheck: the recorded trace's bytes


class WorkloadRun:
    """The strategies of one workload, their rows, and the timing rounds."""

    def __init__(self, w: Workload, seed: int, progress=None) -> None:
        self.w, self.seed, self.log = w, seed, progress or (lambda s: None)
        self.live: list[tuple[S.Strategy, Row]] = []
        self.rows: list[Row] = []
        self.ref: list | None = None
        self.grad_bytes = sum(p.nbytes for p in w.params())

    def _zero(self) -> None:
        for p in self.w.params():
            p.grad = None

    def _run(self, st: S.Strategy) -> None:
        self._zero()
        torch.manual_seed(self.seed)          # the same dropout masks in every eager strategy
        st.gradient()

    def row(self, st: S.Strategy, status: str = "ok", note: str | None = None) -> Row:
        row = Row(self.w.name, self.w.describe, st.name, st.kind, st.label, st.budget,
                  st.num_ckpts, st.memory, st.budget_of, status, note)
        self.rows.append(row)
        return row

    def check_and_meter(self, st: S.Strategy) -> Row:
        row = self.row(st)
        t0 = time.perf_counter()
        try:
            self._run(st)
        except Exception as err:                # noqa: BLE001 - a peer's failure is a result
            row.status = f"error: {type(err).__name__}"
            row.note = f"{err}".split("\n")[0][:300]
            traceback.print_exc(file=sys.stderr)
            self.log(f"  {st.name}: {row.status}: {row.note}")
            return row
        if st.kind == "compile":
            row.compile_s = time.perf_counter() - t0
        g = [p.grad.detach().clone() for p in self.w.params()]
        if self.ref is None:
            self.ref = g
        row.max_rel_err = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
                              for a, b in zip(g, self.ref))
        if st.kind != "compile" and row.max_rel_err > RTOL:
            row.status = f"FAILED: gradient max rel err {row.max_rel_err:.2e}"
            self.log(f"  {st.name}: {row.status}")
            return row
        if st.kind == "compile" and row.max_rel_err > COMPILE_RTOL:
            row.note = (f"gradient differs from store-all's by {row.max_rel_err:.1e} (max rel "
                        f"err)" + (": dropout under inductor draws its own masks"
                                   if self.w.name == "gpt" else ""))
        self._zero()
        torch.manual_seed(self.seed)
        row.metered_peak = peak_bytes(st.gradient)
        row.grad_bytes = self.grad_bytes
        self._stats(st, row)
        self.live.append((st, row))
        self.log(f"  {st.name}: peak {row.metered_peak / 2**20:.2f} MiB, err "
                 f"{row.max_rel_err:.1e}" + ("" if row.compile_s is None else
                                             f", compile {row.compile_s:.1f} s"))
        return row

    def _stats(self, st: S.Strategy, row: Row) -> None:
        """bincheck's own numbers, where the strategy has them (issue 31's ``.stats``)."""
        stats = getattr(st.handle, "stats", None)
        if st.kind != "bincheck" or stats is None:
            return
        for name, attr in (("ops", "ops"), ("plain_ops", "plain_ops"),
                           ("taped_ops", "taped_ops"), ("lib_peak_bytes", "peak_bytes"),
                           ("record_s", "record_seconds"), ("trace_bytes", "trace_bytes")):
            setattr(row, name, getattr(stats, attr, None))
        plan = getattr(st.handle, "last_plan", None)      # planned once, at the first call
        row.plan_s = None if plan is None else plan.plan_seconds
        # the plan's predicted peak and the trace: what memory= counts, the gradients included
        row.predicted_peak = None if plan is None else plan.peak_bytes + stats.trace_bytes

    def rounds(self, n: int) -> None:
        """``n`` timed rounds of every live strategy, interleaved, the order reversed every
        other round."""
        times: dict[int, list[float]] = {id(r): [] for _, r in self.live}
        for k in range(n):
            order = self.live if k % 2 == 0 else self.live[::-1]
            for st, row in order:
                self._zero()
                torch.manual_seed(self.seed)
                gc.collect()
                t0 = time.perf_counter()
                st.gradient()
                times[id(row)].append(time.perf_counter() - t0)
        for _, row in self.live:
            row.times_s = times[id(row)]
            row.time_s = statistics.median(row.times_s)

    def relate(self) -> None:
        ref = next((r for r in self.rows if r.kind == "store-all" and r.time_s), None)
        if ref is None:
            return
        for _, row in self.live:
            if row.times_s:
                row.rel_time = paired(row.times_s, ref.times_s)
            row.peak_rel = row.metered_peak / ref.metered_peak
            row.share_rel = share(row) / share(ref)


def share(r: Row) -> int:
    """The peak less the parameters' gradients (there in every strategy, at their end)."""
    return r.metered_peak - r.grad_bytes


FRACTIONS = (0.5, 0.25, 0.1)     # bincheck memory= at these shares of store-all's peak


def bincheck_budgets(rows: list[Row], fractions=FRACTIONS) -> list[tuple[str, int]]:
    """(label, bytes): each measured peer's metered peak (``memory=`` counts the parameters'
    gradients too, as the meter does), and fractions of store-all's beyond the gradients (the
    part checkpointing can change) with the gradients added back."""
    ok = [r for r in rows if r.metered_peak is not None]
    out = [(r.label, r.metered_peak) for r in ok if r.kind != "store-all"]
    ref = next((r for r in ok if r.kind == "store-all"), None)
    if ref is not None:
        out += [(f"{f:.0%}", int(f * share(ref)) + ref.grad_bytes) for f in fractions]
    return out


def run_workload(w: Workload, rounds: int, seed: int, compile_budgets, binomial_ckpts,
                 compile_skip: str | None, log) -> list[Row]:
    """Every strategy on ``w``; ``compile_skip``: why torch.compile is not run (a row says so)."""
    torch.manual_seed(seed)
    run = WorkloadRun(w, seed, log)
    peers = S.peers(w, () if compile_skip else compile_budgets, binomial_ckpts)
    for st in peers:
        run.check_and_meter(st)
    if compile_skip:
        for b in compile_budgets:
            run.row(S.Strategy(f"torch.compile, activation_memory_budget={b:g}", "compile",
                               f"compile {b:g}", lambda: None, budget=b), "not run",
                    compile_skip)
    missing = S.bincheck_missing()
    if missing:
        run.row(S.Strategy("bincheck.torch (issue 31)", "bincheck", "bincheck", lambda: None),
                "pending", missing)
    else:
        for st in S.bincheck_strategies(w, bincheck_budgets(run.rows)):
            run.check_and_meter(st)
    t0 = time.perf_counter()
    run.rounds(rounds)
    run.relate()
    log(f"  {rounds} rounds in {time.perf_counter() - t0:.1f} s")
    return run.rows
