"""The markdown report: a table per workload, then issue 31's targets (pending while bincheck's
rows are)."""

from __future__ import annotations

import json

from ..common.files import rows_of
from ..common.ratios import paired
from ..common.report import cells_of, targets_section
from ..common.report import fmt as _f
from ..common.report import mib as _mib
from .harness import Row, share

PEER_KINDS = ("per-block", "sequential", "compile", "binomial")


def rows_from_json(path: str) -> tuple[dict, list[Row]]:
    with open(path) as f:
        data = json.load(f)
    rows = rows_of(Row, data["rows"])
    for r in rows:                  # runs written before share_rel was a field
        ref = next((s for s in rows if s.workload == r.workload and s.kind == "store-all"), None)
        if r.share_rel is None and r.metered_peak is not None and ref is not None:
            r.share_rel = share(r) / share(ref)
    return data["meta"], rows


def _measured(r: Row) -> bool:
    return r.status == "ok" and r.time_s is not None


def table(rows: list[Row]) -> str:
    out = []
    for name in cells_of(rows, "workload"):
        mine = [r for r in rows if r.workload == name]
        out.append(f"\n**{name}**: {mine[0].describe}; float32, CPU\n")
        out.append("| strategy | grad max rel err | compile s | metered peak MiB | "
                   "peak / store-all | peak − grads MiB | that / store-all | time s | "
                   "time / store-all | note |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for r in mine:
            if not _measured(r):
                out.append(f"| {r.strategy} | {_f(r.max_rel_err, '.1e')} | "
                           f"{_f(r.compile_s, '.1f')} | | | | | | | **{r.status}**"
                           + (f": {r.note}" if r.note else "") + " |")
                continue
            out.append(f"| {r.strategy} | {_f(r.max_rel_err, '.1e')} | {_f(r.compile_s, '.1f')} "
                       f"| {_mib(r.metered_peak)} | {_f(r.peak_rel, '.3f')} "
                       f"| {_mib(share(r))} | {_f(r.share_rel, '.3f')} "
                       f"| {_f(r.time_s, '.4f')} | {_f(r.rel_time, '.2f')}× "
                       f"| {r.note or ''} |")
    return "\n".join(out) + "\n"


def targets(rows: list[Row]) -> list[tuple[str, str, bool | None, str]]:
    """(target, workload, passed, numbers) for issue 31's (a)–(d); None: not measured."""
    res = []
    for name in cells_of(rows, "workload"):
        mine = [r for r in rows if r.workload == name]
        ours = [r for r in mine if r.kind == "bincheck" and _measured(r)]
        pending = next((r for r in mine if r.kind == "bincheck" and r.status == "pending"), None)
        if pending is not None:
            res.append(("a–d", name, None, pending.note or "pending"))
            continue
        peers = [r for r in mine if r.kind in PEER_KINDS and _measured(r)]
        for peer in peers:
            at = next((r for r in ours if r.budget_of == peer.label), None)
            if at is None:
                res.append(("a", name, False, f"{peer.label}: no bincheck run at its peak"))
                continue
            ratio = paired(at.times_s, peer.times_s)
            held = at.metered_peak <= peer.metered_peak
            res.append(("a", name, ratio <= 1.0 and held,
                        f"{peer.label}: {peer.time_s:.4f} s at {_mib(peer.metered_peak)} MiB; "
                        f"bincheck {at.time_s:.4f} s at {_mib(at.metered_peak)} MiB "
                        f"({ratio:.2f}×, per-round ratio)"))
            beaten = [r for r in ours if r.metered_peak <= peer.metered_peak
                      and r.rel_time is not None and peer.rel_time is not None
                      and r.rel_time <= peer.rel_time]
            res.append(("b", name, bool(beaten),
                         f"{peer.label} at ({peer.peak_rel:.3f}, {peer.rel_time:.2f}×): "
                         + (f"{beaten[0].label} at ({beaten[0].peak_rel:.3f}, "
                            f"{beaten[0].rel_time:.2f}×)" if beaten else
                            "no bincheck point at or below it")))
        if name == "rnn":
            for ref in (r for r in peers if r.kind == "binomial"):
                at = next((r for r in ours if r.budget_of == ref.label), None)
                if at is not None:
                    ratio = paired(at.times_s, ref.times_s)
                    res.append(("c", name, ratio <= 1.15,
                                f"{ref.label}: bincheck at its peak {ratio:.2f}× its time"))
        for r in ours:
            per_op = (None if not r.ops or r.record_s is None else 1e6 * r.record_s / r.ops)
            b_op = (None if not r.ops or r.trace_bytes is None else r.trace_bytes / r.ops)
            pred = (None if not r.predicted_peak or r.metered_peak is None else
                    r.metered_peak / r.predicted_peak)
            res.append(("d", name, None,
                        f"{r.label}: planning {_f(r.plan_s, '.3f')} s, the recorded forward "
                        f"{_f(r.record_s, '.3f')} s over {_f(r.ops, 'd')} ops "
                        f"({_f(per_op, '.1f')} µs an op), trace {_f(b_op, '.0f')} B an op, "
                        f"measured / predicted peak {_f(pred, '.2f')}"))
    return res


TARGET_TEXT = {
    "a": "(a) at each peer's measured peak, bincheck takes ≤ 1.0× that peer's time (and holds "
         "the peak)",
    "b": "(b) bincheck's Pareto curve is never above a peer's point: some bincheck run is at or "
         "below it in both peak and time",
    "c": "(c) RNN: time ≤ 1.15× bt.binomial_checkpoint's at its peak",
    "d": "(d) planning time, the recorded forward's time and trace bytes per op, and the "
         "measured / predicted peak, reported",
}


def meta_md(meta: dict) -> str:
    return (f"Run {meta['date']} ({meta['mode']}), torch {meta['torch']}, bincheck at "
            f"{meta['bincheck_commit']}, {meta['threads']} thread(s), load average at start "
            f"{meta['load_start']}, at end {meta['load_end']}"
            + ("" if meta.get("seconds") is None else f"; {meta['seconds']:.0f} s") + ".\n\n"
            f"torch.compile: {meta['compile']}. bincheck.torch: {meta['bincheck']}.\n\n"
            "Peak: torch-allocated CPU bytes during one gradient (forward and backward) above "
            "those live at its start, from the profiler's allocation events; the parameters' "
            "gradients are allocated in it (set to None before). \"Peak − grads\": that peak "
            "less the parameters' gradients' bytes, the share checkpointing changes (plotted). "
            "Time: median of interleaved rounds; ratios: median of the per-round ratios.\n")


def markdown(meta: dict, rows: list[Row]) -> str:
    return (meta_md(meta) + table(rows)
            + targets_section(targets(rows), TARGET_TEXT, head="workload"))


def write_table(out: str, name: str, title: str, columns: list, rows: list[dict]) -> None:
    """``rows`` to ``out/name.csv`` (as they are) and ``out/name.md`` (a table of ``columns``:
    ``(heading, right-aligned, cell-of-row)``), the machine and load in the title."""
    import csv
    import os

    from ..common.files import write_atomic
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, name + ".csv"), "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    lines = [f"# {title} ({os.uname().nodename}, 1 thread, load {os.getloadavg()[0]:.1f})", "",
             "| " + " | ".join(h for h, _, _ in columns) + " |",
             "|" + "|".join("---:" if right else "---" for _, right, _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(r) for _, _, cell in columns) + " |" for r in rows]
    write_atomic(os.path.join(out, name + ".md"), ("\n".join(lines) + "\n").encode())
