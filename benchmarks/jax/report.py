"""Results files: JSON (metadata and rows), a markdown table with the targets, for both parts."""

from __future__ import annotations

import json
from typing import Any

from ..common.files import rows_of
from ..common.ratios import paired as paired_times
from ..common.report import cells_of, targets_section
from ..common.report import fmt as _f
from ..common.report import mib

PEERS = ("scan-remat", "nested", "eqx")     # as strategies.PEERS (not imported: no jax here)


def _segment(r) -> str:
    """`` + L-step segments`` for a bincheck memory= run that keeps taped segments."""
    leaf = getattr(r, "plan_segment", None)
    return f" + {leaf}-step segments" if leaf and leaf > 1 else ""


def rows_from_json(path: str) -> tuple[dict, list, list]:
    from .rows import Row, WhileRow
    with open(path) as f:
        data = json.load(f)
    return (data["meta"], rows_of(Row, data.get("rows", [])),
            rows_of(WhileRow, data.get("while_rows", [])))


def paired(a: Any, b: Any) -> float:
    """Row a's time over row b's: :func:`benchmarks.common.ratios.paired` of their rounds."""
    return paired_times(a.times_s, b.times_s)


def _mib(v: Any, spec: str = ".3f") -> str:
    return mib(v, spec)


def _evals(r: Any) -> str:
    if r.evals is None:
        return "–"
    return f"{r.evals}" + ("" if r.expected_evals is None else f" ({r.expected_evals})")


def table(rows: list) -> str:
    out = []
    for cell in cells_of(rows):
        mine = [r for r in rows if r.cell == cell]
        r0 = mine[0]
        costs = next((r for r in mine if r.step_plain_ms is not None), None)
        out.append(f"\n**{cell}**, T={r0.seq_len}, H={r0.hidden}, B={r0.batch}, "
                   f"I={r0.input_size}, float32, CPU"
                   + ("" if costs is None else
                      f"; plain step {costs.step_plain_ms:.4f} ms, taped step + backward "
                      f"{costs.step_taped_ms:.4f} ms") + "\n")
        out.append("| strategy | grad max rel err | compile s | XLA temp MiB | temp / scan | "
                   "budget MiB | checkpoints | step evals counted (expected) | time s | "
                   "min s | time / scan | bound s | time / bound |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in mine:
            budget = _mib(r.memory_budget)
            if r.status != "ok":
                out.append(f"| {r.strategy} | {_f(r.max_rel_err, '.1e')} | | "
                           f"{_mib(r.temp_bytes)} | | {budget} | | | **{r.status}** | | | | |")
                continue
            compile_s = None if r.compile_s is None else r.lower_s + r.compile_s
            out.append(
                f"| {r.strategy} | {_f(r.max_rel_err, '.1e')} | {_f(compile_s, '.2f')} "
                f"| {_mib(r.temp_bytes)} | {_f(r.temp_rel, '.4f')} | {budget} "
                f"| {_f(r.plan_num_ckpts or r.num_ckpts, 'd')}{_segment(r)} | {_evals(r)} "
                f"| {_f(r.time_s, '.3f')} | {_f(min(r.times_s, default=None), '.3f')} "
                f"| {_f(r.rel_time, '.2f')}× "
                f"| {_f(r.bound_s, '.3f')} | {_f(r.time_over_bound, '.2f')} |")
    return "\n".join(out) + "\n"


def targets(rows: list) -> list[tuple[str, str, bool | None, str]]:
    """(target, cell, passed, numbers); passed None: could not be measured."""
    res = []
    for cell in cells_of(rows):
        mine = [r for r in rows if r.cell == cell]
        ok = [r for r in mine if r.status == "ok" and r.time_s is not None]
        ref = mine[0]
        ours_fixed = {r.num_ckpts: r for r in ok if r.kind == "bincheck" and r.memory_budget
                      is None}
        for eq in (r for r in mine if r.kind == "eqx"):
            ours = ours_fixed.get(eq.num_ckpts)
            if eq not in ok or ours is None:
                res.append(("A", cell, None, f"C={eq.num_ckpts}: not both measured"))
                continue
            fewer = ours.evals is not None and eq.evals is not None and ours.evals < eq.evals
            ratio = paired(ours, eq)
            res.append(("A", cell, fewer and ratio < 1,
                        f"C={eq.num_ckpts}: evaluations {_f(ours.evals, 'd')} vs Equinox "
                        f"{_f(eq.evals, 'd')}; time {ours.time_s:.3f} vs {eq.time_s:.3f} s, "
                        f"{ratio:.2f}× (per-round ratio)"))
        for peer in (r for r in ok if r.kind in PEERS):
            # each bincheck run at that peer's bytes: states only, and with --keep-segments
            # also keep_segments=True (a verdict each)
            runs = [r for r in mine if r.kind == "bincheck" and r.budget_of == peer.label]
            for ours in runs or [None]:
                how = " keep_segments" if ours is not None and "keep_segments" in ours.label else ""
                if ours is None or ours.status != "ok" or ours.time_s is None:
                    why = "not run" if ours is None else ours.status
                    res.append(("B", cell, False, f"at {peer.label}'s temp "
                                f"{_mib(peer.temp_bytes)} MiB{how}: {why}"))
                    continue
                ratio = paired(ours, peer)
                res.append(("B", cell, ratio <= 1,
                            f"{peer.label}: {peer.time_s:.3f} s at {_mib(peer.temp_bytes)} MiB; "
                            f"bincheck memory= that{how}: {ours.time_s:.3f} s, {ratio:.2f}× "
                            f"(per-round ratio), at {_mib(ours.temp_bytes)} MiB, "
                            f"{ours.plan_num_ckpts} checkpoints{_segment(ours)}"))
        for r in ok:
            if r.kind == "bincheck" and r.time_over_bound is not None:
                res.append(("C", cell, r.time_over_bound <= 1.05,
                            f"{r.label}: {r.time_s:.3f} s, bound {r.bound_s:.3f} s; "
                            f"{r.time_over_bound:.2f} (per-round ratio)"))
        for r in ok:
            if r.kind == "bincheck" and r.num_ckpts == 50 and ref.temp_bytes:
                saved = 1 - r.temp_bytes / ref.temp_bytes
                res.append(("D", cell, saved >= 0.95,
                            f"s=50: {100 * saved:.2f} % below lax.scan's temp "
                            f"({_mib(r.temp_bytes)} of {_mib(ref.temp_bytes)} MiB)"))
        exact = [r for r in mine if r.kind == "bincheck" and r.evals is not None]
        if exact:
            wrong = [r for r in exact if r.evals != r.expected_evals]
            res.append(("evals", cell, not wrong,
                        f"{len(exact) - len(wrong)}/{len(exact)} bincheck runs evaluate the step "
                        f"plan.plain_steps + T times" + "".join(
                            f"; {r.label}: {r.evals} vs {r.expected_evals}" for r in wrong)))
        within = [r for r in ok if r.kind == "bincheck" and r.memory_budget is not None]
        if within:
            over = [r for r in within if r.temp_bytes > r.memory_budget]
            worst = max(r.temp_bytes / r.memory_budget for r in within)
            res.append(("budget", cell, not over,
                        f"{len(within) - len(over)}/{len(within)} memory= runs' XLA temp within "
                        f"the budget (at most {worst:.3f} of it)" + "".join(
                            f"; {r.label}: {_mib(r.temp_bytes)} MiB > {_mib(r.memory_budget)}"
                            for r in over)))
    return res


TARGET_TEXT = {
    "A": "(A) ahead of Equinox at every equal C: fewer step evaluations and less time",
    "B": "(B) never behind a peer: bincheck memory= at each peer's XLA temp is no slower than "
         "that peer",
    "C": "(C) on the bound: time ≤ 1.05 × (plain steps × plain step + T × (taped step + "
         "backward)), per-step times measured in the same rounds",
    "D": "(D) num_ckpts=50: XLA temp ≥ 95 % below lax.scan's",
    "evals": "(checks) evals: bincheck's counted evaluations equal plan.plain_steps + T; "
             "budget: memory= runs' XLA temp within the budget",
}


def cores_label(meta: dict) -> str:
    """The CPUs the run could use (runs before 2026-11-24 recorded none: XLA_FLAGS alone, which
    left XLA's YNNPACK thread pool on every core)."""
    cpus = meta.get("cpu_affinity")
    if not cpus:
        return f"XLA not pinned ({meta.get('cpus')} CPUs)"
    return f"XLA pinned to CPU {cpus[0]}" if len(cpus) == 1 else f"XLA on {len(cpus)} CPUs"


def meta_md(meta: dict) -> str:
    commit = meta.get("bincheck_commit")
    seconds = meta.get("seconds")
    part = ", while-loop part only" if meta.get("part") == "while" else ""
    return (f"Run {meta['date']} ({meta['mode']}{part}), "
            f"jax {meta.get('jax')}, equinox {meta.get('equinox')}, "
            + (f"bincheck at {commit}" if commit else "")
            + (f" ({', '.join(meta['bincheck_dirty'])} modified)" if meta.get("bincheck_dirty")
               else "") + (", " if commit else "")
            + f"XLA_FLAGS=\"{meta.get('xla_flags')}\", {cores_label(meta)}, load average at start "
            f"{meta['load_start']}, at end {meta['load_end']}"
            + ("" if seconds is None else f"; {seconds:.0f} s") + ".\n")


def markdown(meta: dict, rows: list, while_rows: list | None = None) -> str:
    text = meta_md(meta)
    if rows:
        text += table(rows) + targets_section(targets(rows), TARGET_TEXT)
    if while_rows:
        text += while_table(while_rows) + "\n" + WHILE_TEXT
    return text


WHILE_TEXT = ("Forward: the loss alone (jit, no gradient); gradient: jit(grad(loss)), forward and "
              "backward. One compiled program per strategy serves both n (n is an argument). "
              "Step evals: the step's evaluations in one gradient, counted by a "
              "jax.debug.callback (a step inside an untaken lax.cond branch is not counted).\n")


def while_table(rows: list) -> str:
    if not rows:
        return ""
    r0 = rows[0]
    ns = {k: v["n"] for k, v in r0.runs.items()}
    out = [f"\n**Bounded while loop**, tanh cell, max_steps m={r0.max_steps}, H={r0.hidden}, "
           f"B={r0.batch}, I={r0.input_size}, float32, CPU; n ≪ m: n={ns['small']}, n ≈ m: "
           f"n={ns['large']}\n",
           f"| strategy | compile s | XLA temp MiB (gradient) | n={ns['small']}: forward s | "
           f"gradient s | step evals | n={ns['large']}: forward s | gradient s | step evals | "
           f"grad max rel err |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r.status != "ok":
            out.append(f"| {r.strategy} | | | **{r.status}** | | | | | | |")
            continue
        compile_s = None if r.compile_s is None else r.lower_s + r.compile_s
        errs = [v["max_rel_err"] for v in r.runs.values() if v["max_rel_err"] is not None]
        s, lg = r.runs["small"], r.runs["large"]
        out.append(f"| {r.strategy} | {_f(compile_s, '.2f')} | {_mib(r.temp_bytes)} "
                   f"| {_f(s['fwd_s'], '.4f')} | {_f(s['grad_s'], '.4f')} "
                   f"| {_f(s.get('evals'), 'd')} "
                   f"| {_f(lg['fwd_s'], '.4f')} | {_f(lg['grad_s'], '.4f')} "
                   f"| {_f(lg.get('evals'), 'd')} "
                   f"| {_f(max(errs) if errs else None, '.1e')} |")
    return "\n".join(out) + "\n"

