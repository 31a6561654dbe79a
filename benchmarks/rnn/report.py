"""Results files: CSV (one row per run), a markdown table, a PNG plot (written atomically by
:func:`benchmarks.common.files.write_atomic`)."""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Iterable
from dataclasses import fields

from bincheck import plan

from .harness import Row


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


CURVE_CAPTION = (
    "Line: bincheck predicted over num_ckpts. Time = the plan's plain evaluations x the measured "
    "plain-step time + (per-step loss) T plain output_fn calls x their measured time + T x the "
    "measured time of a taped step with its backward pass, over store-all's measured time. "
    "Memory = num_ckpts states + a fixed part (gradient, one step's tape, outputs) fitted from the "
    "measured bincheck points, against store-all's measured peak.")


def state_mib(r: Row) -> float:
    return r.batch * r.hidden * 8 * (2 if r.cell == "lstm" else 1) / 2**20


def predicted_curve(rows: list[Row]):
    """Memory saved vs slowdown predicted for bincheck over num_ckpts, for each problem.

    Time model: the plan's plain evaluations × the measured plain-step cost, plus, with a per-step
    loss in ``output_fn``, its plain evaluations (the forward's, all but the last step's: the
    forward tapes the last step) × its measured plain cost, plus seq_len × the measured cost of a
    taped step (with its output_fn) and its backward pass, against store-all's measured time.
    Memory model: num_ckpts states plus what a bincheck gradient holds whatever num_ckpts is
    (parameter cotangents, one step's tape, the stacked per-step outputs), that fixed part fitted
    from the measured bincheck peaks, against store-all's measured peak.
    """
    curves = {}
    for ref in rows:
        if ref.strategy != "store-all" or ref.status != "ok":
            continue
        key = problem_key(ref)
        ours = [r for r in rows if r.strategy == "bincheck" and r.status == "ok"
                and problem_key(r) == key and r.taped_step_ms is not None]
        if not ours:
            continue
        T = ref.seq_len
        fixed_mib = sum(r.tracemalloc_peak_mib - r.num_ckpts * state_mib(r)
                        for r in ours) / len(ours)
        taped_ms = statistics.median(r.taped_step_ms for r in ours)
        output_ms = ours[0].output_step_ms or 0.0       # None: no output_fn (or an older file)
        xs, ys, ss = [], [], []
        for s in sorted({max(2, round(T ** (k / 48))) for k in range(0, 49)}):
            if s > T:
                continue
            p = plan(T, s)
            t = (p.plain_steps * ours[0].plain_step_ms + p.first_reverse_start * output_ms
                 + T * taped_ms) / 1e3
            mem = s * state_mib(ours[0]) + fixed_mib
            xs.append(t / ref.time_s)
            ys.append(100.0 * (1.0 - mem / ref.tracemalloc_peak_mib))
            ss.append(s)
        curves[key] = (xs, ys, ss)
    return curves


# one look per strategy, the same in every panel
STYLE = {
    "store-all": dict(marker="s", color="black", label="store-all (plain autograd loop)"),
    "autograd-checkpoint": dict(marker="X", color="tab:red",
                                label="autograd.checkpoint on every step"),
    "sqrt": dict(marker="^", color="tab:green", label="√T equal segments"),
    "bincheck": dict(marker="o", color="tab:blue", label="bincheck (label: num_ckpts)"),
    "stacked-ys": dict(marker="D", color="tab:orange",
                       label="bincheck, stacked ys (with_outputs=True), loss after the loop"),
}


def _panel_title(key) -> str:
    cell, loss, T, H, B = key
    what = {"final": "loss on the final state", "char-lm": "char-LM, loss at every step",
            "per-step": "loss at every step, stacked ys (old)"}.get(loss, loss)
    return f"{cell}: {what}\nT={T}, H={H}, B={B}"


def _y_range(points: list[tuple[float, float]]) -> tuple[float, float]:
    """The band where the checkpointing strategies lie: their non-negative savings, padded."""
    ys = [y for _, y in points if y >= 0] or [y for _, y in points] or [0.0]
    lo, hi = min(ys), max(ys)
    pad = max(1.0, 0.12 * (hi - lo))
    lo = max(lo - pad, -100.0)
    step = 5.0 if hi - lo > 4 else 1.0
    lo = step * (lo // step)
    return lo, min(100.0, hi + pad) + 0.5 * pad


def _place_labels(fig, ax, items, avoid) -> None:
    """Write each (x, y, text) near its point where it overlaps no other label or point.

    Candidates are tried in order (right, left, above, below, then further out); the first free
    one wins, otherwise the least-overlapping. Works in display pixels, after the layout is fixed.
    """
    renderer = fig.canvas.get_renderer()
    to_px = ax.transData.transform
    placed = []
    pts = [tuple(to_px((x, y))) for x, y in avoid]
    dpi = fig.dpi / 72.0
    for x, y, text in sorted(items, key=lambda it: (it[0], -it[1])):
        px, py = tuple(to_px((x, y)))
        probe = ax.text(0, 0, text, fontsize=7)
        bb = probe.get_window_extent(renderer)
        probe.remove()
        w, h = bb.width, bb.height
        r = 3.6 * dpi                          # marker radius (ms=6 is 3 pt) plus a margin
        best, best_cost = None, None
        for k in (1.3, 2.4, 3.5):
            for dx, dy in ((r * k, -h / 2), (-r * k - w, -h / 2), (-w / 2, r * k),
                           (-w / 2, -r * k - h), (r * k, r * k * 0.6), (r * k, -r * k * 0.6 - h),
                           (-r * k - w, r * k * 0.6), (-r * k - w, -r * k * 0.6 - h)):
                box = (px + dx, py + dy, px + dx + w, py + dy + h)
                cost = sum(_overlap(box, o) for o in placed)
                cost += sum(_overlap(box, (qx - r, qy - r, qx + r, qy + r)) for qx, qy in pts)
                # ambiguous: another point is nearer the label than its own point
                cx, cy = px + dx + w / 2, py + dy + h / 2
                own = math.hypot(cx - px, cy - py)
                cost += 0.5 * w * h * sum(1 for qx, qy in pts if (qx, qy) != (px, py)
                                          and math.hypot(cx - qx, cy - qy) < own + 2)
                axbb = ax.get_window_extent(renderer)
                if box[0] < axbb.x0 or box[2] > axbb.x1 or box[1] < axbb.y0 or box[3] > axbb.y1:
                    cost += w * h                          # outside the panel: avoid
                if best_cost is None or cost < best_cost:
                    best, best_cost = box, cost
                if cost == 0:
                    break
            if best_cost == 0:
                break
        placed.append(best)
        ax.annotate(text, (x, y), xytext=(best[0] - px, best[1] - py),
                    textcoords="offset pixels", fontsize=7, va="bottom", ha="left",
                    annotation_clip=False)


def _overlap(a, b) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return w * h if w > 0 and h > 0 else 0.0


def plot_png(rows: list[Row]) -> bytes | None:
    """Small multiples: one panel per problem, memory saved vs slowdown, the predicted curve."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
    except ImportError:
        return None
    import textwrap

    ok = [r for r in rows if r.status == "ok"]
    keys = list(dict.fromkeys(problem_key(r) for r in ok))
    if not keys:
        return None
    curves = predicted_curve(rows)
    ncols = min(3, len(keys))
    nrows = math.ceil(len(keys) / ncols)
    # the layout in inches: title, caption, then rows of (panel title, axes, x label), legend
    width, ax_h, row_gap = max(4.4 * ncols + 0.6, 9.0), 2.5, 1.0
    present = [s for s in STYLE if any(r.strategy == s for r in ok)]
    legend_cols = 4 if width >= 12 else 2
    legend_rows = math.ceil((len(present) + 2) / legend_cols)
    caption = ("Points: measured (labels: num_ckpts); ▼ on a panel's bottom edge marks a point "
               "below the axis, with its memory saved (store-all is 0 % by definition; "
               "autograd.checkpoint's and stacked ys' savings are in the table). "
               + CURVE_CAPTION)
    lines = textwrap.wrap(caption, width=int((width - 1.0) / 0.056))
    top_in = 0.5 + 0.135 * len(lines) + 0.55
    bottom_in = 0.55 + 0.2 * legend_rows + 0.2
    height = top_in + nrows * ax_h + (nrows - 1) * row_gap + bottom_in
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False, dpi=110)
    fig.subplots_adjust(left=0.6 / width, right=1 - 0.2 / width, top=1 - top_in / height,
                        bottom=bottom_in / height, wspace=0.25, hspace=row_gap / ax_h)
    fig.suptitle("Memory saved vs slowdown against store-all, one panel per problem",
                 y=1 - 0.12 / height, va="top", fontsize=11)
    fig.text(0.5, 1 - 0.45 / height, "\n".join(lines), ha="center", va="top", fontsize=7.5,
             color="0.25", linespacing=1.3)

    xmin = min(r.slowdown for r in ok)
    xmax = max(r.slowdown for r in ok)
    xpad = 0.06 * (xmax - xmin) + 0.05
    xlim = (max(0.0, xmin - xpad), xmax + xpad)
    for ax in axes.flat[len(keys):]:
        ax.set_visible(False)
    later = []
    for ax, key in zip(axes.flat, keys):
        mine = [r for r in ok if problem_key(r) == key]
        # the y-axis spans the checkpointing strategies with bounded memory; anything below
        # (store-all, autograd.checkpoint, stacked ys) is marked on the bottom edge
        band = [(r.slowdown, r.memory_saved_pct) for r in mine
                if r.strategy in ("sqrt", "bincheck")]
        y0, y1 = _y_range(band)
        ax.set_xlim(*xlim)
        ax.set_ylim(y0, y1)
        ax.set_title(_panel_title(key), fontsize=8.5)
        ax.grid(alpha=0.3)
        ax.axvline(1.0, color="0.6", lw=0.8, ls=":")
        ax.tick_params(labelsize=7.5)
        if key in curves:
            xs, ys, _ = curves[key]
            ax.plot(xs, ys, "-", color="tab:blue", alpha=0.45, lw=1.5, zorder=1)
        labels, points, below = [], [], []
        for r in mine:
            st = STYLE.get(r.strategy, dict(marker="o", color="0.5"))
            x, y = r.slowdown, r.memory_saved_pct
            if y < y0:
                below.append((x, y, st))
                continue
            ax.plot(x, y, st["marker"], color=st["color"], ms=6, zorder=3, mec="white", mew=0.5)
            points.append((x, y))
            if r.num_ckpts is not None:
                labels.append((x, y, str(r.num_ckpts)))
        # off-axis points: a marker on the bottom edge and the value above it, the values
        # stacked in rows when two would overlap
        x_per_pt = (xlim[1] - xlim[0]) / (ax.get_position().width * width * 72)
        rows_used: list[list[float]] = []
        for x, y, st in sorted(below, key=lambda b: b[0]):
            ax.plot(x, y0, "v", color=st["color"], ms=7, zorder=3, clip_on=False)
            level = next((k for k, xs_ in enumerate(rows_used)
                          if all(abs(x - u) > 30 * x_per_pt for u in xs_)), len(rows_used))
            if level == len(rows_used):
                rows_used.append([])
            rows_used[level].append(x)
            ax.annotate(f"{y:.0f} %", (x, y0), xytext=(0, 6 + 9 * level),
                        textcoords="offset points", ha="center", fontsize=7, color=st["color"])
            points.append((x, y0 + (0.04 + 0.035 * level) * (y1 - y0)))
        ax.set_xlabel("slowdown vs store-all (×)", fontsize=8)
        ax.set_ylabel("memory saved (%, tracemalloc)", fontsize=8)
        later.append((ax, labels, points))

    fig.canvas.draw()                               # the layout is fixed: place the labels
    for ax, labels, points in later:
        _place_labels(fig, ax, labels, points)

    handles = [Line2D([], [], ls="", marker=STYLE[s]["marker"], color=STYLE[s]["color"],
                      label=STYLE[s]["label"]) for s in present]
    handles.append(Line2D([], [], color="tab:blue", alpha=0.45, lw=1.5,
                          label="bincheck predicted (see the caption)"))
    handles.append(Line2D([], [], ls="", marker="v", color="0.3",
                          label="below the axis (value: memory saved)"))
    fig.legend(handles=handles, loc="lower center", ncol=legend_cols, fontsize=7.5,
               frameon=False, bbox_to_anchor=(0.5, 0.08 / height))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()
