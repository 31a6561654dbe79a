"""The markdown report: a table per cell and the targets (the files: :mod:`benchmarks.common`)."""

from __future__ import annotations

import json

from ..common.files import rows_of
from ..common.ratios import paired
from ..common.report import cells_of, targets_section
from ..common.report import fmt as _f
from ..common.report import mib as _mib
from .harness import Row


def rows_from_json(path: str) -> tuple[dict, list[Row]]:
    with open(path) as f:
        data = json.load(f)
    meta = data["meta"]
    rows = rows_of(Row, data["rows"])
    if meta.get("ratios") != "per-round":       # written before ratios were paired per round
        for r in rows:
            r.ratios = "medians"
    return meta, rows


def table(rows: list[Row]) -> str:
    out = []
    for cell in cells_of(rows):
        mine = [r for r in rows if r.cell == cell]
        r0 = mine[0]
        costs = next((r for r in mine if r.step_plain_ms is not None), None)
        out.append(f"\n**{cell}**, T={r0.seq_len}, H={r0.hidden}, B={r0.batch}, "
                   f"I={r0.input_size}, float32, {'CUDA' if r0.device == 'cuda' else 'CPU'}"
                   + ("" if costs is None else
                      f"; plain step {costs.step_plain_ms:.3f} ms, taped step + backward "
                      f"{costs.step_taped_ms:.3f} ms" + _fresh(costs)) + "\n")
        out.append("| strategy | grad max rel err | metered peak MiB | loop share MiB | "
                   "budget MiB | peak / store-all | time s | time / store-all | plain steps | "
                   "bound s | time / bound | time / bound without the sums |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in mine:
            budget = _mib(r.memory_budget)
            if r.status != "ok":
                out.append(f"| {r.strategy} | {_f(r.max_rel_err, '.1e')} | | | {budget} | "
                           f"**{r.status}** | | | | | | |")
                continue
            out.append(
                f"| {r.strategy} | {_f(r.max_rel_err, '.1e')} | {_mib(r.metered_peak)} "
                f"| {_mib(r.loop_bytes)} | {budget} | {_f(r.peak_rel, '.3f')} "
                f"| {_f(r.time_s, '.3f')} | {_f(r.rel_time, '.2f')}× "
                f"| {_f(r.plain_steps, 'd')} | {_f(r.bound_s, '.3f')} "
                f"| {_f(r.time_over_bound, '.2f')} | {_f(r.time_over_fresh_bound, '.2f')} |")
    return "\n".join(out) + "\n"


def _fresh(costs: Row) -> str:
    if costs.step_taped_fresh_ms is None:
        return ""
    return (f" (the engine's backward into the parameters' running sums; "
            f"{costs.step_taped_fresh_ms:.3f} ms with `autograd.grad` into fresh tensors, the "
            f"older bound \"without the sums\")")


def targets(rows: list[Row]) -> list[tuple[str, str, bool | None, str]]:
    """(target, cell, passed, numbers) for (a)–(d); passed None: could not be measured."""
    res = []
    for cell in cells_of(rows):
        mine = [r for r in rows if r.cell == cell]
        ok = [r for r in mine if r.status == "ok"]
        ref = mine[0]
        peers = [r for r in ok if r.kind not in ("store-all", "bincheck")]
        for peer in peers:
            ours = next((r for r in mine if r.kind == "bincheck" and r.budget_of == peer.label),
                        None)
            if ours is None or ours.status != "ok":
                why = "not run" if ours is None else ours.status
                res.append(("a", cell, False, f"at {peer.label}'s loop share "
                            f"{_mib(peer.loop_bytes)} MiB: {why}"))
                continue
            ratio = paired(ours.times_s, peer.times_s)
            res.append(("a", cell, ratio <= 1.0,
                        f"{peer.label}: {peer.time_s:.3f} s; bincheck at its "
                        f"{_mib(ours.memory_budget)} MiB: {ours.time_s:.3f} s "
                        f"({ratio:.2f}×, per-round ratio)"))
        for r in ok:
            if r.kind == "bincheck" and r.time_over_bound is not None:
                res.append(("b", cell, r.time_over_bound <= 1.05,
                            f"{r.label}: {r.time_s:.3f} s, bound {r.bound_s:.3f} s; "
                            f"{r.time_over_bound:.2f}"
                            + ("" if r.time_over_fresh_bound is None else
                               f" (without the sums: {r.time_over_fresh_bound:.2f})")
                            + (" (per-round ratio)" if r.ratios == "per-round"
                               else " (ratio of medians)")))
        lowest_peer = min((p.loop_bytes for p in peers), default=None)
        for r in mine:
            if r.kind != "bincheck" or r.budget_of is None or not r.budget_of.endswith("%"):
                continue
            below = lowest_peer is not None and r.memory_budget < lowest_peer
            if r.status != "ok":
                res.append(("c", cell, False, f"{r.label} ({_mib(r.memory_budget)} MiB): "
                            f"{r.status}"))
                continue
            res.append(("c", cell, r.loop_bytes <= r.memory_budget,
                        f"{r.label}: loop share {_mib(r.loop_bytes)} MiB, budget "
                        f"{_mib(r.memory_budget)} MiB ({r.loop_bytes / r.memory_budget:.2f}× "
                        f"the budget); the budget is {'below' if below else 'NOT below'} the "
                        f"lowest peer's loop share ({_mib(lowest_peer)} MiB); time "
                        f"{r.time_s:.3f} s = {r.rel_time:.2f}× store-all"))
        for r in ok:
            if r.kind == "bincheck" and r.num_ckpts == 50:
                saved = 1 - r.metered_peak / ref.metered_peak
                res.append(("d", cell, saved >= 0.95,
                            f"s=50 saves {100 * saved:.1f} % of store-all's metered peak "
                            f"({_mib(r.metered_peak)} of {_mib(ref.metered_peak)} MiB)"))
    return res


TARGET_TEXT = {
    "a": "(a) at each peer's measured peak, bincheck's memory= run is no slower than the peer",
    "b": "(b) every bincheck run ≤ 1.05× its bound",
    "c": "(c) at 5 % / 2 % of store-all's peak the metered loop share stays within the budget "
         "(the numbers say whether that budget is below every peer's)",
    "d": "(d) num_ckpts=50 saves ≥ 95 % of store-all's peak",
}


def meta_md(meta: dict) -> str:
    commit = meta.get("bincheck_commit")
    device = meta.get("device_name")
    return (f"Run {meta['date']} ({meta['mode']}), torch {meta['torch']}, "
            + (f"bincheck at {commit}, " if commit else "")
            + (f"on {device} (timed with synchronisation; peaks from CUDA's caching allocator), "
               if device else "") +
            f"{meta['threads']} thread(s), load average at start {meta['load_start']}, "
            f"at end {meta['load_end']}; {meta['seconds']:.0f} s.\n")


def markdown(meta: dict, rows: list[Row]) -> str:
    return meta_md(meta) + table(rows) + targets_section(targets(rows), TARGET_TEXT)
