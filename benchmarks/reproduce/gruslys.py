"""Part C: A. Gruslys, R. Munos, I. Danihelka, M. Lanctot, A. Graves, "Memory-Efficient
Backpropagation Through Time" (NIPS 2016, arXiv 1606.03401).

Their claim (abstract, the only part of the paper in the material available to us): a dynamic
programme chooses what to cache and what to recompute within a memory budget, and "for sequences
of length 1000, our algorithm saves 95% of memory usage while using only one third more time per
iteration than the standard BPTT". The body (cost model, recurrences, alpha, figures) was not
found; see README.md for what was searched. The model below is therefore derived here, in the
usual reading of the abstract and of the policies' names, and nothing in it is attributed to them.

The cost model (ours). T steps; a step's forward run either keeps its *internal state* (what its
backward needs: in autograd, its tape) or not. Memory is counted in hidden states: a hidden state
costs 1 unit, an internal state ``alpha`` units; the live state and the one internal state being
back-propagated are working memory, not counted (as bincheck's ``work_bytes``). Every step is
back-propagated once from its internal state, so the backward work is the same T operations for
every policy; the cost of a policy is its number of *forward* operations, C, and standard BPTT
(keep every internal state) costs C = T. In bincheck's counts C = taped + plain = T + plain:
every step is taped exactly once (its one forward that keeps the internal state), so ``plain`` is
exactly the recomputation, C - T. Cost per time step = C / T = 1 + plain / T.

With m units (the initial hidden state included when it is kept), Q(n, m, f) = the fewest plain
forwards to reverse n steps whose first input state x0 is live; f says whether x0 can be restored
for free (it sits in a kept internal state of the parent). For n >= 2::

    Q(n, m, f) = min( Q(n-1, m-alpha, True)                       keep step 0's internal state
                                                                  (x1 restorable from it)
                      min_{1<=j<n} j + Q(n-j, m-[not f], False) + Q(j, m, f) )
                                                                  store x0 (1 unit unless f),
                                                                  advance j plain, recurse right
                                                                  then left

Q(1, m, f) = Q(0, m, f) = 0 and Q = inf when m < 0. The answer is Q(T, m, False): in the left
part x0's unit is free again, so the left part may store it again or drop it (restore and drop).
The three policies are restrictions of this recursion:

* **HSM** (hidden states only): without the first branch Q(T, m, False) = t(T, m), Revolve's
  binomial optimum, bincheck's ``plan(T, m)`` (``num_ckpts = m``);
* **ISM** (internal states only; h0 kept throughout, 1 unit): with k = floor((m-1)/alpha) slots,
  I(n, k) = min_{0<=i<n} i + I(i, k) + I(n-1-i, k-1), I(0, k) = 0, I(n, -1) = inf for n >= 1
  (advance i plain, keep step i's internal state, reverse the right part from it, consume it,
  reverse the left part from h0);
* **MSM** (both): the whole recursion.

bincheck's mixed policy (:class:`bincheck.schedule.MixedPlan`) is MSM *without* the "restorable
for free" flag: a kept tape is never a restart point (autograd's tape of a step holds its input
and intermediates, not necessarily its output), so its cost is >= MSM's; the tables show by how
much. ``tests/test_reproduce.py`` checks the recursions against an exhaustive search of every
action sequence on small cases, HSM against Revolve, and MSM <= bincheck's mixed <= HSM.

Measured: bincheck (``binomial_checkpoint(fn, T, memory=...)``) on the tanh RNN and the LSTM of
``benchmarks/rnn/cells.py`` at budgets of m hidden states, converted with the measured
``state_bytes`` of ``loop.preview`` as ``memory = m * state_bytes + work_bytes`` (so that the
schedule's share is exactly m states, the model's m; the working set is what bincheck reserves
for one taped step and its backward). Per budget: plain/taped evaluations of an instrumented cell
(checked against the plan), the gradient (checked against store-all, max relative error <=
1e-10), the tracemalloc peak of one gradient and the median time of interleaved gradients against
store-all in the same run. Two more budgets: 5 % of store-all's tracemalloc peak, and the least
memory bincheck predicts to stay within 4/3 of store-all's time (``loop.memory_for``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy
from autograd import grad

from bincheck import CheckpointedLoop, binomial_checkpoint
from bincheck.schedule import BudgetPlan
from bincheck.schedule.binomial import optimal_plain_steps
from bincheck.schedule.mixed import leaf_lengths
from bincheck.schedule.mixed_chain import ChainTable

from ..rnn.cells import CELLS, final_loss
from ..rnn.harness import Counter
from .common import (csv_bytes, interleaved_medians, leaves, max_rel_err, md_table, peak_mib,
                     png_bytes)

INF = math.inf
ALPHAS = (1, 2, 5, 10)          # internal state / hidden state sizes for the model curves
BETA = 2.0                      # backward = 2 forwards: the usual assumption for the time reading
CLAIM_SAVED, CLAIM_TIME = 0.95, 4.0 / 3.0


@dataclass(frozen=True)
class Config:
    seq_len: int
    hidden: int
    batch: int
    units: tuple[int, ...]      # measured budgets, in hidden states
    model_len: int              # T of the model curves
    model_units: int            # the curves' largest m


FULL = Config(1000, 256, 32, (5, 10, 20, 50, 100, 200, 500), 1000, 1000)
QUICK = Config(1000, 64, 16, (5, 20, 50, 200), 1000, 1000)
SMOKE = Config(40, 6, 2, (3, 8), 60, 60)
CELL_NAMES = ("tanh", "lstm")
CELL_COLORS = {"tanh": "C9", "lstm": "C4"}       # apart from the alpha curves' C0-C3


# --------------------------------------------------------------------------- the cost model
def hsm_plain(T: int, m: int) -> int:
    """Hidden-state memorization with m states (x0 included): Revolve's t(T, m)."""
    return optimal_plain_steps(T, m)


def ism_plain(T: int, K: int) -> numpy.ndarray:
    """Internal-state memorization: I(T, k) for k = 0..K internal-state slots (h0 kept apart).

    Vectorized over k: row n needs rows < n of every column (i + I(i, k)) and of column k-1."""
    K = min(K, max(T - 1, 0))
    Q = numpy.full((T + 1, K + 1), INF)
    A = numpy.full((T + 1, K + 1), INF)            # A[i, k] = i + I(i, k)
    Q[0], A[0] = 0.0, 0.0
    for n in range(1, T + 1):
        Q[n, 0] = A[n - 1, 0]                      # no slot: advance n-1 from h0, tape the last
        if K:
            Q[n, 1:] = numpy.min(A[:n, 1:] + Q[n - 1::-1, :K], axis=0)
        A[n] = n + Q[n]
    return Q[T]


def msm_plain(T: int, alpha: int, M: int, tapes: bool = True) -> numpy.ndarray:
    """Mixed memorization (the module's Q): Q(T, m, False) for m = 0..M, integer ``alpha``.

    ``tapes=False`` leaves only hidden states (then Q = Revolve's t(T, m)). Vectorized over m:
    O(T^2 M) element operations, a few seconds for T = M = 1000."""
    F = numpy.full((T + 1, M + 1), INF)            # Q(n, m, False)
    R = numpy.full((T + 1, M + 1), INF)            # Q(n, m, True): x0 restorable for free
    AF = numpy.full((T + 1, M + 1), INF)           # j + Q(j, m, False)
    AR = numpy.full((T + 1, M + 1), INF)
    F[0] = R[0] = F[1] = R[1] = 0.0
    AF[0] = AR[0] = 0.0
    AF[1] = AR[1] = 1.0
    keep = numpy.full(M + 1, INF)
    for n in range(2, T + 1):
        keep[:] = INF
        if tapes and alpha <= M:
            keep[alpha:] = R[n - 1, :M + 1 - alpha]
        adv = numpy.full(M + 1, INF)
        adv[1:] = numpy.min(AF[1:n, 1:] + F[n - 1:0:-1, :M], axis=0)
        F[n] = numpy.minimum(keep, adv)
        AF[n] = n + F[n]
        R[n] = numpy.minimum(keep, numpy.min(AR[1:n] + F[n - 1:0:-1], axis=0))
        AR[n] = n + R[n]
    return F[T]


def bincheck_mixed_plain(T: int, ms, state_bytes: int, tape_bytes: int) -> list[int]:
    """bincheck's mixed policy (taped segments, no restart from a kept tape) within m states'
    bytes, for each m in ``ms``: the table :class:`~bincheck.schedule.MixedPlan` plans with."""
    ms = list(ms)
    table = ChainTable(T, leaf_lengths(max(ms) * state_bytes, state_bytes, tape_bytes))
    return [int(table.cost(T, m)) for m in ms]


def model_curves(T: int, M: int, alphas=ALPHAS, log=print) -> dict:
    """Plain forwards of each policy for m = 1..M hidden-state units (index m)."""
    ms = numpy.arange(M + 1)
    hsm = numpy.array([INF] + [hsm_plain(T, m) for m in range(1, M + 1)])
    ism_k = ism_plain(T, M)
    out = {"m": ms, "hsm": hsm}
    for a in alphas:
        log(f"  model: alpha = {a}")
        k = numpy.clip((ms - 1) // a, -1, len(ism_k) - 1)
        out[("ism", a)] = numpy.where(k >= 0, ism_k[numpy.maximum(k, 0)], INF)
        out[("msm", a)] = msm_plain(T, a, M)
        out[("bincheck", a)] = numpy.array([INF] + bincheck_mixed_plain(T, range(1, M + 1), 1, a))
    return out


def per_step(plain, T: int):
    return 1.0 + numpy.asarray(plain, float) / T


def time_ratio(cost_per_step, beta: float = BETA):
    """Time per iteration against standard BPTT when a backward costs ``beta`` forwards."""
    return (numpy.asarray(cost_per_step, float) + beta) / (1.0 + beta)


def least_units(plain: numpy.ndarray, T: int, target_per_step: float) -> int | None:
    ok = numpy.nonzero(per_step(plain, T) <= target_per_step + 1e-12)[0]
    return int(ok[0]) if len(ok) else None


# --------------------------------------------------------------------------- measurements
def plain_loop(step, T: int):
    def run(params, state, xs):
        for t in range(T):
            state = step(params, state, xs[t])
        return state
    return run


def planned(fn, T: int, memory: int, params, state0, xs) -> BudgetPlan:
    """``loop.preview``'s plan, walked once (which, since bincheck counts its planner's memory in
    the budget, allocates nothing that stays)."""
    plan = binomial_checkpoint(fn, T, memory=memory).preview(params, state0, xs)
    plan.first_reverse_start
    for _ in plan:
        pass
    return plan


def measure(cell_name: str, cfg: Config, repeats: int, seed: int, log=print) -> tuple[list, dict]:
    """bincheck at the budgets of ``cfg`` against store-all, one cell; rows and its sizes."""
    cell, T = CELLS[cell_name], cfg.seq_len
    params, state0, xs = cell.init(cfg.hidden, cfg.batch, T, seed)

    def loss_of(run):
        return lambda p: final_loss(cell, run(p, state0, xs))

    store_all = grad(loss_of(plain_loop(cell.fn, T)))
    sa_peak, g_ref = peak_mib(lambda: store_all(params))
    returned = sum(v.nbytes for v in leaves(g_ref)) / 2**20      # in every peak: the gradient
    sizes = binomial_checkpoint(cell.fn, T, memory=2**40).measure(params, state0, xs)
    sb, tb, wb = sizes.state_bytes, sizes.tape_bytes, sizes.work_bytes
    info = dict(cell=cell_name, state_bytes=sb, tape_bytes=tb, work_bytes=wb, alpha=tb / sb,
                step_ms=1e3 * sizes.step_seconds, taped_step_ms=1e3 * sizes.taped_step_seconds,
                store_all_peak_mib=sa_peak, returned_mib=returned)
    log(f"  {cell_name}: state {sb} B, tape {tb} B (alpha {tb / sb:.2f}), work {wb} B; plain "
        f"step {info['step_ms']:.3f} ms, taped + backward {info['taped_step_ms']:.3f} ms; "
        f"store-all peak {sa_peak:.1f} MiB")
    base = dict(cell=cell_name, seq_len=T, hidden=cfg.hidden, batch=cfg.batch, state_bytes=sb,
                tape_bytes=tb, work_bytes=wb, alpha=tb / sb)
    rows = [dict(base, budget="store-all", units=None, memory_mib=None, status="ok",
                 plain_evals=0, predicted_plain=0, taped_evals=T, peak_mib=sa_peak,
                 grad_max_rel_err=0.0)]
    budgets = [(f"m = {m}", m * sb + wb) for m in cfg.units]
    budgets.append(("5 % of store-all's peak", int((1 - CLAIM_SAVED) * sa_peak * 2**20)))
    probe = binomial_checkpoint(cell.fn, T, memory=2**40)
    try:
        budgets.append(("least for 4/3 (predicted)",
                        probe.memory_for(CLAIM_TIME, params, state0, xs)))
    except ValueError as err:
        rows.append(dict(base, budget="least for 4/3 (predicted)", status=f"refused: {err}"))
    gradients = [store_all]
    for label, memory in budgets:
        row = dict(base, budget=label, memory_mib=memory / 2**20, units=(memory - wb) / sb)
        try:
            plan = planned(cell.fn, T, memory, params, state0, xs)
            plan_mib = plan.table_bytes / 2**20         # the planner's memory, in the budget
        except ValueError as err:
            rows.append(dict(row, status=f"refused: {err}"))
            log(f"  {cell_name} {label}: refused ({err})")
            continue
        # The plan's schedule runs as a fixed plan (no probe inside the timed gradients), as
        # before bincheck fixed running a BudgetPlan itself (README). Same actions, same counts.
        fixed = plan.schedule
        counter = Counter(cell.fn)
        counted = grad(loss_of(CheckpointedLoop(counter, fixed)))
        peak, g = peak_mib(lambda: counted(params))
        err = max_rel_err(g, g_ref)
        ok = err <= 1e-10 and counter.plain == plan.plain_steps and counter.taped == T
        row.update(status="ok" if ok else "FAILED: gradient or counts differ from store-all / "
                   "the plan", plain_evals=counter.plain, predicted_plain=plan.plain_steps,
                   taped_evals=counter.taped, checkpoints=plan.checkpoints,
                   policy=type(plan.schedule).__name__, peak_mib=peak, plan_mib=plan_mib,
                   within_budget=peak - returned <= memory / 2**20, grad_max_rel_err=err,
                   predicted_slowdown=plan.relative_time)
        rows.append(row)
        if ok:
            gradients.append(grad(loss_of(CheckpointedLoop(cell.fn, fixed))))
        log(f"  {cell_name} {label}: {row['units']:.1f} states' bytes, {plan.plain_steps} plain "
            f"(counted {counter.plain}), peak {peak:.2f} MiB of a {memory / 2**20:.2f} MiB "
            f"budget (plan's table {plan_mib:.2f} MiB), grad err {err:.1e}")
    live = [r for r in rows if r["status"] == "ok"]
    times = interleaved_medians([lambda g=g: g(params) for g in gradients], repeats)
    for r, ts in zip(live, times):
        r["time_s"] = float(numpy.median(ts))
        r["times_s"] = " ".join(f"{t:.4f}" for t in ts)
    for r in live:
        r["slowdown"] = r["time_s"] / live[0]["time_s"]
        r["saved_pct"] = 100.0 * (1.0 - r["peak_mib"] / sa_peak)
        r["cost_per_step"] = 1.0 + r["plain_evals"] / T
        r["model_time_beta2"] = float(time_ratio(r["cost_per_step"]))
    return rows, info


COLUMNS = ["cell", "seq_len", "hidden", "batch", "budget", "status", "units", "memory_mib",
           "state_bytes", "tape_bytes", "work_bytes", "alpha", "policy", "checkpoints",
           "plain_evals", "predicted_plain", "taped_evals", "cost_per_step", "peak_mib",
           "within_budget", "plan_mib", "saved_pct", "time_s", "slowdown", "predicted_slowdown", "model_time_beta2",
           "grad_max_rel_err", "times_s"]


# --------------------------------------------------------------------------- tables
def _c(plain, T):
    return "–" if plain is None or not numpy.isfinite(plain) else f"{1 + plain / T:.3g}"


def model_tables(curves: dict, T: int, alphas=ALPHAS) -> str:
    M = len(curves["m"]) - 1
    grid = [m for m in (5, 10, 20, 50, 100, 200, 500, 1000) if m <= M]
    out = [f"### The model: forward operations per time step, T = {T}\n",
           "C / T = 1 + plain / T (standard BPTT = 1). m = memory in hidden states (x0 "
           "included); an internal state costs alpha. MSM = the exact mixed recursion (an "
           "internal state is a restart point); bincheck = bincheck's mixed DP (taped segments, "
           "no restart from a tape).\n"]
    head = ["policy"] + [f"m = {m}" for m in grid]
    body = [["HSM (any alpha)"] + [_c(curves["hsm"][m], T) for m in grid]]
    for a in alphas:
        for key, name in (("msm", "MSM"), ("bincheck", "bincheck's mixed"), ("ism", "ISM")):
            body.append([f"{name}, alpha = {a}"] + [_c(curves[(key, a)][m], T) for m in grid])
    out.append(md_table(head, body))
    return "\n".join(out)


def claim_table(curves: dict, T: int, alphas=ALPHAS) -> str:
    """Where "95 % saved at one third more time" sits in the model, under each reading."""
    M = len(curves["m"]) - 1
    out = [f"### \"95 % of memory saved at one third more time\" in the model (T = {T})\n",
           "Memory normalisations: **hidden** — 100 % = T hidden states, so 95 % saved = "
           f"{round(0.05 * T)} units; **internal** — 100 % = what standard BPTT keeps, T "
           "internal states = alpha·T units, so 95 % saved = 0.05·alpha·T units. Time readings: "
           "**F** — time ∝ forward operations, one third more = C/T ≤ 4/3; **F+B** — a backward "
           f"costs {BETA:g} forwards, time ∝ C/T + {BETA:g}, one third more = C/T ≤ 2 (one "
           "recomputation per step). Cells: C/T, then the time ratio under F+B in brackets.\n"]
    head = ["alpha", "memory for 95 %", "HSM", "ISM", "MSM", "holds under F?", "holds under F+B?"]
    body = []
    for a in alphas:
        readings = (("hidden", round(0.05 * T)), ("internal", round(0.05 * a * T)))
        for norm, m in readings[:1] if a == 1 else readings:
            norm = "hidden = internal" if a == 1 else norm
            if m > M:
                body.append([a, f"{norm}: {m} units", "beyond the curves", "", "", "", ""])
                continue
            cs = [curves["hsm"][m], curves[("ism", a)][m], curves[("msm", a)][m]]
            cells = [f"{_c(p, T)} ({float(time_ratio(1 + p / T)):.2f}×)" if numpy.isfinite(p)
                     else "–" for p in cs]
            f_ok = [n for n, p in zip(("HSM", "ISM", "MSM"), cs) if 1 + p / T <= 4 / 3 + 1e-12]
            fb_ok = [n for n, p in zip(("HSM", "ISM", "MSM"), cs) if 1 + p / T <= 2 + 1e-12]
            body.append([a, f"{norm}: {m} units ({100 * m / (a * T):.1f} % of alpha·T)", *cells,
                         ", ".join(f_ok) or "no", ", ".join(fb_ok) or "no"])
    out.append(md_table(head, body, "rllllll"))
    out.append("\nLeast memory (units; % of T hidden states / % of alpha·T) for which MSM reaches "
               "each reading's target:\n")
    body = []
    for a in alphas:
        row = [a]
        for target in (4 / 3, 2.0):
            m = least_units(curves[("msm", a)], T, target)
            row.append("beyond the curves" if m is None else
                       f"{m} ({100 * m / T:.1f} % / {100 * m / (a * T):.1f} %)")
        m = least_units(curves["hsm"], T, 2.0)
        row.append("never (C/T ≥ 2 − 1/T)" if m is None else str(m))
        body.append(row)
    out.append(md_table(["alpha", "MSM: C/T ≤ 4/3 (F)", "MSM: C/T ≤ 2 (F+B)",
                         "HSM: C/T ≤ 2"], body))
    return "\n".join(out)


def measured_table(rows: list[dict], infos: list[dict]) -> str:
    out = []
    for info in infos:
        rs = [r for r in rows if r["cell"] == info["cell"]]
        r0 = rs[0]
        out.append(f"### Measured: {info['cell']}, T = {r0['seq_len']}, H = {r0['hidden']}, "
                   f"B = {r0['batch']}, gradient w.r.t. params\n")
        out.append(f"preview: state {info['state_bytes']} B, step tape {info['tape_bytes']} B "
                   f"(**alpha = {info['alpha']:.2f}**), working set {info['work_bytes']} B; plain "
                   f"step {info['step_ms']:.3f} ms, taped step + backward "
                   f"{info['taped_step_ms']:.3f} ms (ratio "
                   f"{info['taped_step_ms'] / info['step_ms']:.2f}); store-all tracemalloc peak "
                   f"{info['store_all_peak_mib']:.1f} MiB = "
                   f"{info['store_all_peak_mib'] * 2**20 / info['state_bytes']:.0f} states' "
                   f"bytes. Every peak includes the returned gradient, "
                   f"{info['returned_mib']:.2f} MiB; 'within' = peak minus it <= the budget; the "
                   f"plan's table = the planner's own memory the plan keeps (its recorded walk; "
                   f"`BudgetPlan.table_bytes`), inside the budget and the peak.\n")
        body = []
        for r in rs:
            if r["status"] != "ok":
                body.append([r["budget"], r["status"]] + [""] * 11)
                continue
            body.append([
                r["budget"], "–" if r["units"] is None else f"{r['units']:.1f}",
                "–" if r["memory_mib"] is None else f"{r['memory_mib']:.2f}",
                r.get("policy", "store-all"),
                f"{r['plain_evals']} ({r['predicted_plain']})", f"{r['cost_per_step']:.3f}",
                f"{r['peak_mib']:.2f}",
                "–" if r.get("within_budget") is None else "yes" if r["within_budget"] else "**no**",
                "–" if r.get("plan_mib") is None else f"{r['plan_mib']:.2f}",
                f"{r['saved_pct']:.1f} %", f"{r['slowdown']:.2f}×",
                "–" if r.get("predicted_slowdown") is None else f"{r['predicted_slowdown']:.2f}×",
                f"{r['model_time_beta2']:.2f}×"])
        out.append(md_table(["budget", "m (states' bytes)", "budget MiB", "plan",
                             "plain evals (plan)", "C/T", "peak MiB", "within", "plan's table MiB",
                             "saved", "time vs store-all", "bincheck predicts",
                             f"model F+B (beta = {BETA:g})"], body, "lrrlrrrlrrrrr"))
        out.append("\n" + "\n".join(f"* {line}" for line in claim_points(rs)) + "\n")
    return "\n".join(out)


def claim_points(rs: list[dict]) -> list[str]:
    """The claim's two readings on bincheck's measured curve, for one cell's rows."""
    ok = [r for r in rs if r["status"] == "ok" and r["units"] is not None]
    lines = []
    for r in ok:
        if r["budget"].startswith("5 %"):
            lines.append(f"at 5 % of store-all's peak ({r['units']:.0f} states' bytes beyond the "
                         f"working set): {r['saved_pct']:.1f} % saved, C/T = "
                         f"{r['cost_per_step']:.2f}, measured {r['slowdown']:.2f}× (bincheck "
                         f"predicts {r['predicted_slowdown']:.2f}×, the model F+B "
                         f"{r['model_time_beta2']:.2f}×)")
        elif r["budget"].startswith("least"):
            lines.append(f"least memory predicted within 4/3 ({r['units']:.0f} states' bytes): "
                         f"{r['saved_pct']:.1f} % saved, measured {r['slowdown']:.2f}×")
    within = [r for r in ok if r["slowdown"] <= CLAIM_TIME]
    if within:
        best = max(within, key=lambda r: r["saved_pct"])
        lines.append(f"largest saving measured at <= 4/3 of store-all's time: "
                     f"{best['saved_pct']:.1f} % ({best['budget']}, {best['slowdown']:.2f}×)")
    over = [r for r in ok if r["slowdown"] > CLAIM_TIME]
    if over:
        lines.append("above 4/3: " + ", ".join(f"{r['budget']} ({r['slowdown']:.2f}×, "
                                                f"{r['saved_pct']:.1f} % saved)" for r in over))
    else:
        lines.append("no budget measured above 4/3 of store-all's time")
    return lines


def markdown(rows, infos, curves, T_model, repeats, env) -> str:
    out = ["# Gruslys et al. 2016: the cost model's curves and bincheck measured at the same "
           "budgets\n", f"{env}. Times: median of {repeats} interleaved gradients; memory: "
           "tracemalloc peak of one gradient; 'saved' is against store-all's peak in the same run. "
           "The model is derived here (the paper's body was not available): see README.\n",
           model_tables(curves, T_model), claim_table(curves, T_model),
           measured_table(rows, infos)]
    return "\n".join(out)


# --------------------------------------------------------------------------- figure
def plot(rows: list[dict], infos: list[dict], curves: dict, T_model: int) -> bytes:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter

    fig, (ax, bx) = plt.subplots(2, 1, figsize=(12, 13), gridspec_kw={"height_ratios": [1.3, 1]})
    M = len(curves["m"]) - 1
    ms = numpy.arange(1, M + 1)
    lo = min(5, M)
    sel = ms >= lo
    colors = {a: f"C{i}" for i, a in enumerate(ALPHAS)}
    y = lambda key: per_step(curves[key][1:], T_model)[sel]          # noqa: E731
    ax.plot(ms[sel], y("hsm"), color="black", lw=2.4)
    for a in ALPHAS:
        ax.plot(ms[sel], y(("msm", a)), color=colors[a], lw=2.0)
        ax.plot(ms[sel], y(("ism", a)), color=colors[a], lw=1.2, ls="--")
        ax.plot(ms[sel], y(("bincheck", a)), color=colors[a], lw=1.2, ls=":")
    marks = {"tanh": "o", "lstm": "s"}
    cell_colors = CELL_COLORS
    for info in infos:
        rs = [r for r in rows if r["cell"] == info["cell"] and r["status"] == "ok"
              and r["units"] is not None]
        T = rs[0]["seq_len"] if rs else T_model
        if T == T_model:       # bincheck's plan at the measured alpha, from the bytes exactly
            grid = sorted({int(v) for v in numpy.geomspace(1, M, 80)} | set(range(1, 12)))
            grid = [m for m in grid if m >= lo]
            cur = bincheck_mixed_plain(T, grid, info["state_bytes"], info["tape_bytes"])
            ax.plot(grid, per_step(cur, T), color=cell_colors[info["cell"]], lw=1.3, ls="-.")
        ax.plot([r["units"] for r in rs], [r["cost_per_step"] for r in rs], marks[info["cell"]],
                color=cell_colors[info["cell"]], ms=10, mfc="none", mew=2.2)
    ax.axhline(4 / 3, color="gray", lw=1.0, ls=(0, (5, 3)))
    ax.axhline(2.0, color="gray", lw=1.0, ls=(0, (1, 2)))
    ax.axvline(0.05 * T_model, color="gray", lw=1.0)
    ax.annotate(f"5 % of T hidden states = {0.05 * T_model:g}", (0.05 * T_model, 1.0),
                xytext=(4, 4), textcoords="offset points", fontsize=9, color="dimgray")
    for a in ALPHAS:                                   # 95 % of standard BPTT's alpha*T units
        m = round(0.05 * a * T_model)
        if lo <= m <= M:
            ax.plot(m, per_step(curves[("msm", a)][m], T_model), "*", color=colors[a], ms=17,
                    mec="black", mew=0.7, zorder=5)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(0.97, 10)
    ax.set_xlim(lo, M)
    ax.set_yticks([1, 4 / 3, 2, 3, 5, 10])
    ax.set_yticklabels(["1", "4/3", "2", "3", "5", "10"])
    ax.minorticks_off()
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xticks([t for t in (5, 10, 20, 50, 100, 200, 500, 1000) if lo <= t <= M])
    ax.set_xlabel("memory m, in hidden states (x0 included; an internal state costs alpha)")
    ax.set_ylabel("forward operations per time step, C/T  (standard BPTT = 1)")
    ax.set_title(f"(a) cost model derived here, T = {T_model} (the paper's own recurrences were "
                 "not available); bincheck's counted plain evaluations as C/T = 1 + plain/T",
                 fontsize=10)
    ax.grid(alpha=0.3, which="both")
    handles = [Line2D([], [], color="black", lw=2.4, label="HSM: hidden states only (= Revolve)")]
    handles += [Line2D([], [], color=colors[a], lw=2.0, label=f"alpha = {a}") for a in ALPHAS]
    handles += [Line2D([], [], color="gray", lw=2.0, label="MSM: exact mixed policy"),
                Line2D([], [], color="gray", lw=1.2, ls="--", label="ISM: internal states only"),
                Line2D([], [], color="gray", lw=1.2, ls=":",
                       label="bincheck's mixed DP (a tape never restarts)"),
                Line2D([], [], color="gray", marker="*", ls="", ms=13, mec="black",
                       label="MSM at 95 % saved of alpha·T"),
                Line2D([], [], color="gray", lw=1.0, ls=(0, (1, 2)),
                       label=f"C/T = 2: 1/3 more time if a backward = {BETA:g} forwards"),
                Line2D([], [], color="gray", lw=1.0, ls=(0, (5, 3)),
                       label="C/T = 4/3: 1/3 more forward operations")]
    for info in infos:
        handles.append(Line2D([], [], color=cell_colors[info["cell"]], marker=marks[info["cell"]],
                              mfc="none", mew=2.2, ls="-.",
                              label=f"bincheck measured: {info['cell']} (alpha = "
                                    f"{info['alpha']:.2f}), points and its plan curve"))
    ax.legend(handles=handles, fontsize=8.5, loc="upper right", ncol=2, framealpha=0.95)

    for info in infos:             # (b) measured time against memory as a share of store-all's
        rs = sorted((r for r in rows if r["cell"] == info["cell"] and r["status"] == "ok"
                     and r["units"] is not None), key=lambda r: r["saved_pct"])
        if not rs:
            continue
        c = cell_colors[info["cell"]]
        x = [100 - r["saved_pct"] for r in rs]
        bx.plot(x, [r["slowdown"] for r in rs], marks[info["cell"]] + "-", color=c, ms=8, lw=1.8,
                label=f"{info['cell']}: measured (median of interleaved gradients)")
        bx.plot(x, [r["predicted_slowdown"] for r in rs], "--", color=c, lw=1.2,
                label=f"{info['cell']}: bincheck's own prediction (measured step times)")
        bx.plot(x, [r["model_time_beta2"] for r in rs], ":", color=c, lw=1.6,
                label=f"{info['cell']}: the model's F+B time of the same plan (beta = {BETA:g})")
        for r in rs:
            tag = "5 % budget" if r["budget"].startswith("5") else "4/3 budget" \
                if r["budget"].startswith("least") else None
            if tag:
                bx.annotate(f"{tag}: {r['saved_pct']:.1f} % saved, {r['slowdown']:.2f}×",
                            (100 - r["saved_pct"], r["slowdown"]), textcoords="offset points",
                            xytext=(0, -26 if info["cell"] == "lstm" else 18), fontsize=8.5,
                            color=c, ha="center", bbox=dict(fc="white", ec="none", alpha=0.85),
                            arrowprops=dict(arrowstyle="-", color=c, lw=0.8))
    bx.axvline(5.0, color="gray", lw=1.0)
    bx.axhline(4 / 3, color="gray", lw=1.0, ls=(0, (5, 3)))
    bx.axhline(1.0, color="black", lw=0.8)
    bx.set_xscale("log")
    bx.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g} %"))
    bx.set_xticks([t for t in (0.2, 0.5, 1, 2, 5, 10, 20, 50)
                   if any(100 - r["saved_pct"] <= 2.5 * t for r in rows if "saved_pct" in r)
                   and any(100 - r["saved_pct"] >= t / 2.5 for r in rows
                           if "saved_pct" in r and r["units"] is not None)])
    bx.minorticks_off()
    bx.set_xlabel("tracemalloc peak of one gradient, % of store-all's (log scale)")
    bx.set_ylabel("gradient time / store-all's")
    bx.set_title("(b) bincheck measured on this machine at the budgets of (a), the 5 % budget and "
                 "the least memory predicted within 4/3 (vertical: 5 %; dashed: 4/3)",
                 fontsize=10)
    bx.grid(alpha=0.3, which="both")
    bx.legend(fontsize=8.5, loc="upper right")
    fig.suptitle(f"Gruslys et al. 2016, \"95 % of memory at one third more time\" (T = {T_model}):"
                 " derived cost model and bincheck measured", fontsize=12)
    fig.tight_layout()
    return png_bytes(fig)


# --------------------------------------------------------------------------- entry point
def run(out_files: dict, quick: bool, smoke: bool, repeats: int, seed: int, env: str,
        log=print) -> list[dict]:
    """Compute the model and measure part C; put gruslys.{csv,md,png} into ``out_files``."""
    cfg = SMOKE if smoke else QUICK if quick else FULL
    log(f"Gruslys et al.: model curves for T = {cfg.model_len}, m <= {cfg.model_units}")
    t0 = time.perf_counter()
    curves = model_curves(cfg.model_len, cfg.model_units, log=log)
    log(f"  model curves in {time.perf_counter() - t0:.0f} s")
    rows, infos = [], []
    for name in CELL_NAMES:
        log(f"Gruslys et al.: {name}, T = {cfg.seq_len}, H = {cfg.hidden}, B = {cfg.batch}, "
            f"budgets m = {list(cfg.units)} states + 5 % of store-all + least for 4/3")
        rs, info = measure(name, cfg, repeats, seed, log)
        rows += rs
        infos.append(info)
    out_files["gruslys.csv"] = csv_bytes(rows, COLUMNS)
    out_files["gruslys.md"] = markdown(rows, infos, curves, cfg.model_len, repeats, env).encode()
    out_files["gruslys.png"] = plot(rows, infos, curves, cfg.model_len)
    return rows
