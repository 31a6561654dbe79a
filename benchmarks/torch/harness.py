"""Runs one cell: checks every gradient, meters memory, then times interleaved rounds.

Order, per cell:

1. every fixed strategy (store-all, the four peers, bincheck with each ``num_ckpts``) runs one
   gradient, compared with store-all's (max over parameters of ``max|g - g_ref| / max|g_ref|``);
   a strategy off by more than ``RTOL`` is reported and never metered nor timed;
2. each checked strategy runs one more gradient under the profiler's allocation meter
   (:func:`.meter.peak_bytes`), separately from the timings;
3. the budgets follow from those peaks: ``memory=`` at a fraction of store-all's loop share and at
   each peer's loop share, where a run's **loop share** is its metered peak minus the bytes that
   are not the loop's (``memory=`` counts snapshots, kept tapes and the working set only): the
   returned gradients (parameters, and h0 for reentrant ``checkpoint_sequential``) and the final
   state; parameters and inputs exist before the meter starts and are never in a peak. Each
   ``memory=`` run is checked and metered like the others (a budget below the loop's minimum is
   refused by bincheck before the forward: reported as such);
4. timed rounds, strategies interleaved and the order reversed every other round; each round
   first measures the per-step costs (a plain step, a taped step + backward into the running
   sums of the parameters' gradients: :func:`.meter.step_costs`), so that every
   bincheck run's bound uses costs measured in the same process and period. Time = median of
   the rounds; every ratio (time / store-all, time / bound, and target (a)'s bincheck / peer)
   is the median over rounds of the ratio within a round
   (:func:`benchmarks.common.ratios.paired`).
"""

from __future__ import annotations

import gc
import re
import statistics
import time
from dataclasses import dataclass, field

import torch

from ..common.ratios import paired
from ..common.rows import LoopRow
from . import strategies as S
from .meter import peak_bytes, step_costs

RTOL = 1e-4      # float32: recomputation replays the same kernels, so errors are ~1e-7


@dataclass
class Row(LoopRow):
    metered_peak: int | None = None     # bytes, profiler, above the start
    not_loop_bytes: int | None = None   # returned gradients + final state
    loop_bytes: int | None = None       # metered_peak - not_loop_bytes
    peak_rel: float | None = None       # metered_peak / store-all's
    time_s: float | None = None
    times_s: list = field(default_factory=list)
    rel_time: float | None = None       # time_s / store-all's
    plain_steps: int | None = None
    taped_steps: int | None = None
    lib_peak_bytes: int | None = None   # loop.stats.peak_bytes (the library's own accounting)
    plan_peak_bytes: int | None = None  # BudgetPlan.peak_bytes (memory= runs)
    plan_relative_time: float | None = None
    plan_kind: str | None = None        # Plan (states only) or MixedPlan (states and tapes)
    plain_s: float | None = None        # loop.stats medians over the rounds
    tape_s: float | None = None
    backward_s: float | None = None
    library_s: float | None = None
    bound_s: float | None = None        # plain_steps * plain step + taped_steps * taped step
    time_over_bound: float | None = None
    time_over_fresh_bound: float | None = None  # over the bound of the older taped cost
    bounds_s: list = field(default_factory=list)   # per round: that round's costs' bound
    ratios: str = "per-round"   # how the ratios were taken ("medians": runs before 2026-11-24)
    step_plain_ms: float | None = None  # per-step costs, medians over the rounds
    step_taped_ms: float | None = None  # taped step + backward into the running sums
    step_taped_fresh_ms: float | None = None   # the same into fresh tensors (the older bound)
    peer_plain_steps: int | None = None    # a peer's recomputed steps (checkpoint_sequential:
                                        # torch's split), on its row and on memory=<peer>'s
    peer_time_ratio: float | None = None   # memory=<peer>: time / the peer's, median over the
                                        # rounds of the ratio within a round (issue 29)
    device: str = "cpu"                 # "cuda": timed with synchronisation, metered by CUDA's
                                        # caching allocator


def _label(st: S.Strategy) -> str:
    if st.kind == "bincheck":
        return f"s={st.num_ckpts}" if st.memory is None else \
            f"mem={st.budget_of}" + (" +host" if st.offload else "")
    return {"store-all": "store-all", "per-step": "per-step", "seq-reentrant": "seq re",
            "seq-nonreentrant": "seq non-re", "nested": "nested"}[st.kind]


def max_rel_err(g: list, ref: list) -> float:
    return max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
               for a, b in zip(g, ref))


class CellRun:
    """All strategies of one problem, their rows, and the timing rounds."""

    def __init__(self, prob: S.Problem, num_ckpts: list[int], fractions: list[float],
                 progress=None) -> None:
        self.prob, self.num_ckpts, self.fractions = prob, num_ckpts, fractions
        self.progress = progress
        self.live: list[tuple[S.Strategy, Row]] = []
        self.rows: list[Row] = []
        self.ref: list | None = None

    def _row(self, st: S.Strategy) -> Row:
        p = self.prob
        row = Row(p.cell_name, p.seq_len, p.hidden, p.batch, p.input_size, st.name, st.kind,
                  _label(st), st.num_ckpts, st.memory, st.budget_of, device=p.device,
                  peer_plain_steps=st.recomputed)
        self.rows.append(row)
        return row

    def _tick(self) -> None:
        if self.progress is not None:
            self.progress.update(1)

    def check_and_meter(self, st: S.Strategy) -> Row:
        p, row = self.prob, self._row(st)
        p.zero_grad()
        try:
            st.gradient()
        except ValueError as e:           # memory= below the loop's minimum: refused up front
            found = re.search(r"(\d+) bytes in all", str(e))
            row.status = "refused: below the loop's minimum" + (
                f" ({int(found.group(1)) / 2**20:.2f} MiB)" if found else "")
            row.note = str(e)
            self._tick()
            return row
        g = p.grads()
        if self.ref is None:
            self.ref = g
        row.max_rel_err = max_rel_err(g, self.ref)
        if row.max_rel_err > RTOL:
            row.status = f"FAILED: gradient max rel err {row.max_rel_err:.2e}"
            self._tick()
            return row
        p.zero_grad()
        row.metered_peak = peak_bytes(st.gradient, p.cuda)
        row.not_loop_bytes = p.param_bytes + st.extra_grad_bytes + p.state_bytes
        row.loop_bytes = row.metered_peak - row.not_loop_bytes
        if st.loop is not None:
            plan = getattr(st.loop, "last_plan", None)
            if plan is not None:
                row.plan_peak_bytes = plan.peak_bytes
                row.plan_relative_time = plan.relative_time
                row.plan_kind = type(plan.schedule).__name__
        self.live.append((st, row))
        self._tick()
        return row

    def build_and_check(self) -> None:
        p = self.prob
        for st in [S.store_all(p)] + S.peers(p) + [S.bincheck(p, s) for s in self.num_ckpts
                                                   if s <= p.seq_len]:
            self.check_and_meter(st)
        ref = self.rows[0]
        budgets = [(f"{100 * f:g} %", int(f * ref.loop_bytes)) for f in self.fractions]
        budgets += [(_label(st), row.loop_bytes) for st, row in self.live
                    if st.kind in S.PEERS]
        for what, memory in budgets:
            self.check_and_meter(S.bincheck(p, memory=max(memory, 1), budget_of=what))
        if p.cuda:          # the fractions again, with states beyond them in pinned host memory
            for f in self.fractions:
                self.check_and_meter(S.bincheck(p, memory=max(int(f * ref.loop_bytes), 1),
                                                budget_of=f"{100 * f:g} %", offload=True))

    def time_rounds(self, rounds: int) -> None:
        p = self.prob
        costs = []
        stats: dict[int, list] = {id(row): [] for _, row in self.live}
        for k in range(rounds):
            costs.append(step_costs(p))
            order = self.live if k % 2 == 0 else self.live[::-1]
            for st, row in order:
                p.zero_grad()
                gc.collect()
                p.sync()
                t0 = time.perf_counter()
                st.gradient()
                p.sync()
                row.times_s.append(time.perf_counter() - t0)
                if st.loop is not None:
                    stats[id(row)].append(st.loop.stats)
            self._tick()
        plain = statistics.median(c[0] for c in costs)
        taped = statistics.median(c[1] for c in costs)
        fresh = statistics.median(c[2] for c in costs)
        ref = self.rows[0]
        ref.time_s = statistics.median(ref.times_s)
        for st, row in self.live:
            row.time_s = statistics.median(row.times_s)
            row.rel_time = paired(row.times_s, ref.times_s)
            row.peak_rel = row.metered_peak / ref.metered_peak
            row.step_plain_ms, row.step_taped_ms = 1e3 * plain, 1e3 * taped
            row.step_taped_fresh_ms = 1e3 * fresh
            sts = stats[id(row)]
            if sts:
                row.plain_steps, row.taped_steps = sts[-1].plain_steps, sts[-1].taped_steps
                row.lib_peak_bytes = sts[-1].peak_bytes
                for name in ("plain", "tape", "backward", "library"):
                    setattr(row, f"{name}_s",
                            statistics.median(getattr(s, f"{name}_seconds") for s in sts))
                row.bound_s = row.plain_steps * plain + row.taped_steps * taped
                # each round's time over the bound of that round's step costs
                row.bounds_s = [row.plain_steps * c[0] + row.taped_steps * c[1] for c in costs]
                row.time_over_bound = paired(row.times_s, row.bounds_s)
                row.time_over_fresh_bound = paired(
                    row.times_s, [row.plain_steps * c[0] + row.taped_steps * c[2] for c in costs])
        # memory=<peer>, side by side with the peer at its own memory
        peers = {row.label: row for st, row in self.live if st.kind in S.PEERS}
        for st, row in self.live:
            peer = peers.get(row.budget_of) if st.kind == "bincheck" else None
            if peer is not None:
                row.peer_time_ratio = paired(row.times_s, peer.times_s)
                row.peer_plain_steps = peer.peer_plain_steps


def run_cell(prob: S.Problem, num_ckpts: list[int], fractions: list[float], rounds: int,
             progress=None) -> list[Row]:
    run = CellRun(prob, num_ckpts, fractions, progress)
    run.build_and_check()
    run.time_rounds(rounds)
    return run.rows


def expected_ticks(num_ckpts: list[int], fractions: list[float], rounds: int,
                   cuda: bool = False) -> int:
    """Progress units per cell: one per checked run, one per round."""
    offloaded = len(fractions) if cuda else 0
    return (1 + len(S.PEERS) + len(num_ckpts) + len(fractions) + len(S.PEERS) + offloaded
            + rounds)


def threads() -> int:
    return torch.get_num_threads()
