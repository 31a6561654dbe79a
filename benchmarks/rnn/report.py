"""Results files: CSV (one row per run), a markdown table, a PNG plot. Written atomically."""

from __future__ import annotations

import csv
import io
import os
import tempfile
from collections.abc import Iterable
from dataclasses import fields

from bincheck import plan

from .harness import Row


def write_atomic(path: str, data: bytes) -> None:
    """Write to a temporary file in the same folder, then rename: never a half-written file."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def rows_from_csv(path: str) -> list[Row]:
    """Read rows back from a results.csv (to redraw the plot or the table)."""
    rows = []
    types = {f.name: f.type for f in fields(Row)}
    with open(path, newline="") as f:
        for rec in csv.DictReader(f):
            kw = {}
            for k, v in rec.items():
                t = str(types.get(k, ""))
                if k == "times_s":
                    kw[k] = [float(x) for x in v.split()]
                elif v == "":
                    kw[k] = None
                elif "int" in t:
                    kw[k] = int(v)
                elif "float" in t:
                    kw[k] = float(v)
                else:
                    kw[k] = v
            rows.append(Row(**kw))
    return rows


def csv_bytes(rows: Iterable[Row]) -> bytes:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=[f.name for f in fields(Row)], lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v)
                         for k, v in row.record().items()})
    return buf.getvalue().encode()


def _fmt(value, spec, missing="–"):
    return missing if value is None else format(value, spec)


def _bookkeeping(r: Row) -> str:
    if r.bookkeeping_pct is None:
        return "–"
    lib = "" if r.library_overhead_pct is None else f" ({r.library_overhead_pct:.1f} %)"
    return f"{r.bookkeeping_pct:.1f} %{lib}"


def _evals(plain, taped, pred_plain, pred_taped, T) -> str:
    if plain is None or taped is None:
        return "–"
    pred = "" if pred_plain is None else f" ({pred_plain / T:.3f}, {pred_taped / T:.3f})"
    return f"{plain / T:.3f}, {taped / T:.3f}{pred}"


LOSS_TITLES = {
    "final": "loss on the final state",
    "char-lm": "char-LM: cross-entropy of the next character at every step (in output_fn), V=96",
    # rows of results files written before the char-LM replaced it
    "per-step": "loss on every step, hidden states stacked with with_outputs=True "
                "(the method the char-LM rows replace)",
}


def problem_key(r: Row) -> tuple:
    return (r.cell, r.loss, r.seq_len, r.hidden, r.batch)


def markdown(rows: list[Row]) -> str:
    """One table per problem, shaped like the published ones."""
    out = []
    problems = list(dict.fromkeys(problem_key(r) for r in rows))
    for key in problems:
        cell, loss, T, H, B = key
        per_step = any(r.predicted_out_taped is not None for r in rows if problem_key(r) == key)
        out.append(f"\n**{cell}, {LOSS_TITLES.get(loss, loss)}, T={T}, H={H}, B={B}, float64, "
                   f"gradient w.r.t. params**\n")
        extra = " | per-step loss evals/step plain, taped: measured (predicted)" \
            if per_step else ""
        out.append("| strategy | num_ckpts | memory saved (tracemalloc) | RSS saved | slowdown "
                   "| time (s) | plain evals/step measured (predicted) | taped evals/step "
                   f"| bookkeeping: all (library){extra} |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if per_step else ""))
        for r in rows:
            if problem_key(r) != key:
                continue
            if r.status != "ok":
                out.append(f"| {r.strategy} | {_fmt(r.num_ckpts, 'd')} | **{r.status}** "
                           f"| | | | | | |" + (" |" if per_step else ""))
                continue
            rss = "–" if r.rss_saved_pct is None else f"{r.rss_saved_pct:.1f} %"
            line = (f"| {r.strategy} | {_fmt(r.num_ckpts, 'd')} "
                    f"| {r.memory_saved_pct:.1f} % | {rss} "
                    f"| {r.slowdown:.2f}× | {r.time_s:.3f} "
                    f"| {r.plain_evals / T:.3f} ({r.predicted_plain / T:.3f}) "
                    f"| {r.taped_evals / T:.3f} ({r.predicted_taped / T:.3f}) "
                    f"| {_bookkeeping(r)} |")
            if per_step:
                line += " " + _evals(r.out_plain_evals, r.out_taped_evals,
                                     r.predicted_out_plain, r.predicted_out_taped, T) + " |"
            out.append(line)
    return "\n".join(out) + "\n"


def predicted_curve(rows: list[Row]):
    """Memory saved vs slowdown predicted for bincheck over num_ckpts, for each problem.

    Time model: the plan's plain evaluations × the measured plain-step cost plus seq_len × the
    measured cost of a taped step with its backward pass, against store-all's measured time.
    Memory model: num_ckpts states plus what a bincheck gradient holds whatever num_ckpts is
    (parameter cotangents, one step's tape), that fixed part fitted from the measured bincheck
    peaks, against store-all's measured peak.
    """
    curves = {}
    for ref in rows:
        if ref.strategy != "store-all" or ref.status != "ok":
            continue
        key = (ref.cell, ref.loss, ref.seq_len, ref.hidden, ref.batch)
        ours = [r for r in rows if r.strategy == "bincheck" and r.status == "ok"
                and (r.cell, r.loss, r.seq_len, r.hidden, r.batch) == key]
        if not ours:
            continue
        T = ref.seq_len
        state_mib = ref.batch * ref.hidden * 8 * (2 if ref.cell == "lstm" else 1) / 2**20
        fixed_mib = sum(r.tracemalloc_peak_mib - r.num_ckpts * state_mib for r in ours) / len(ours)
        taped_ms = sum(r.taped_step_ms for r in ours) / len(ours)
        xs, ys = [], []
        for s in sorted({max(2, round(T ** (k / 24))) for k in range(0, 25)}):
            if s > T:
                continue
            p = plan(T, s)
            t = (p.plain_steps * ours[0].plain_step_ms + T * taped_ms) / 1e3
            mem = s * state_mib + fixed_mib
            xs.append(t / ref.time_s)
            ys.append(100.0 * (1.0 - mem / ref.tracemalloc_peak_mib))
        curves[key] = (xs, ys)
    return curves


def plot_png(rows: list[Row]) -> bytes | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(11, 6))
    markers = {"store-all": "s", "autograd-checkpoint": "x", "sqrt": "^", "bincheck": "o"}
    colors = {}
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for key, (xs, ys) in predicted_curve(rows).items():
        colors[key] = palette[len(colors) % len(palette)]
        ax.plot(xs, ys, "-", color=colors[key], alpha=0.5,
                label=f"bincheck predicted ({key[0]}, {key[1]})")
    seen = set()
    for r in rows:
        if r.status != "ok":
            continue
        key = (r.cell, r.loss, r.seq_len, r.hidden, r.batch)
        color = colors.setdefault(key, palette[len(colors) % len(palette)])
        label = f"{r.strategy} ({r.cell}, {r.loss})"
        ax.plot(r.slowdown, r.memory_saved_pct, markers.get(r.strategy, "o"), color=color,
                label=None if label in seen else label)
        seen.add(label)
        if r.num_ckpts is not None and r.loss == "final":
            ax.annotate(f"{r.num_ckpts}", (r.slowdown, r.memory_saved_pct), fontsize=6,
                        xytext=(2, -7), textcoords="offset points")
    ax.set_xlabel("slowdown vs store-all (×)")
    ax.set_ylabel("peak memory saved vs store-all (%, tracemalloc)")
    ax.set_title("Memory saved vs slowdown: measured points (bincheck labelled with num_ckpts), "
                 "predicted curves", fontsize=9)
    ax.set_xlim(0.5, 2.2)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()
