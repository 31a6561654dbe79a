"""The figure: time against peak memory, both relative to store-all, one panel per cell."""

from __future__ import annotations

import io
import math
import textwrap

from ..labels import place_labels
from .harness import Row

# one look per kind of strategy, the same in every panel
STYLE = {
    "store-all": dict(marker="s", color="black"),
    "per-step": dict(marker="X", color="tab:red"),
    "seq-reentrant": dict(marker="^", color="tab:green"),
    "seq-nonreentrant": dict(marker="v", color="tab:olive"),
    "nested": dict(marker="P", color="tab:purple"),
    "num_ckpts": dict(marker="o", color="tab:blue"),
    "memory": dict(marker="D", color="tab:orange"),
}
LEGEND = {
    "store-all": "store-all (plain loop)",
    "per-step": "checkpoint per step (non-reentrant)",
    "seq-reentrant": "checkpoint_sequential √T, reentrant",
    "seq-nonreentrant": "checkpoint_sequential √T, non-reentrant",
    "nested": "nested: √T segments × per-step",
    "num_ckpts": "bincheck num_ckpts=s",
    "memory": "bincheck memory= (label: budget)",
}


def _style_key(r: Row) -> str:
    if r.kind != "bincheck":
        return r.kind
    return "num_ckpts" if r.memory_budget is None else "memory"


def plot_png(rows: list[Row], title: str,
             meter: str = "profiler allocation events") -> bytes | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
        from matplotlib.lines import Line2D
    except ImportError:
        return None
    ok = [r for r in rows if r.status == "ok" and r.rel_time is not None]
    cells = list(dict.fromkeys(r.cell for r in ok))
    if not cells:
        return None
    n = len(cells)
    present = [k for k in STYLE if any(_style_key(r) == k for r in ok)]
    width = max(9.0, 5.0 * n + 0.8)
    ncol = 4 if width >= 14 else 2
    legend_rows = math.ceil((len(present) + 1) / ncol)
    top_in, ax_in, bottom_in = 1.2, 4.2, 0.75 + 0.19 * legend_rows + 0.15
    height = top_in + ax_in + bottom_in
    fig, axes = plt.subplots(1, n, figsize=(width, height), squeeze=False, dpi=110)
    fig.subplots_adjust(left=0.7 / width, right=1 - 0.25 / width, top=1 - top_in / height,
                        bottom=bottom_in / height, wspace=0.15)
    fig.suptitle(title, fontsize=10.5, y=1 - 0.1 / height, va="top")
    caption = (f"x: metered peak ({meter}) / store-all's, log scale; y: time / "
               "store-all's, the median of the per-round ratios. Hollow grey circle joined to a "
               "bincheck point: that run's "
               "bound, the plan's plain steps × plain step + T × (taped step + backward into "
               "the parameters' running sums), "
               "per-step costs measured in the same run.")
    fig.text(0.5, 1 - 0.42 / height, "\n".join(textwrap.wrap(caption, int(width * 15))),
             ha="center", va="top", fontsize=7.5, color="0.3")
    xs = [r.peak_rel for r in ok]
    ys = [r.rel_time for r in ok] + [r.bound_s / r.time_s * r.rel_time for r in ok
                                     if r.bound_s]
    xlim = (min(xs) / 1.5, max(xs) * 1.5)
    ylim = (min(0.9, min(ys) - 0.1), max(ys) * 1.08 + 0.05)
    for ax, cell in zip(axes[0], cells):
        mine = [r for r in ok if r.cell == cell]
        ax.set_xscale("log")
        ax.set_xlim(*xlim)
        ax.set_ylim(*ylim)
        ax.grid(alpha=0.3, which="both")
        ax.axhline(1.0, color="0.6", lw=0.8, ls=":")
        ax.axvline(1.0, color="0.6", lw=0.8, ls=":")
        r0 = mine[0]
        ax.set_title(f"{cell}: T={r0.seq_len}, H={r0.hidden}, B={r0.batch}", fontsize=9)
        ax.set_xlabel("peak memory relative to store-all (log scale)", fontsize=8)
        ticks = [t for t in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2) if xlim[0] <= t <= xlim[1]]
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        if ax is axes[0][0]:
            ax.set_ylabel("time relative to store-all", fontsize=8)
        ax.tick_params(labelsize=7.5)
        items, bounds = [], []
        for r in mine:
            st = STYLE[_style_key(r)]
            if r.bound_s:
                yb = r.rel_time * r.bound_s / r.time_s
                ax.plot([r.peak_rel, r.peak_rel], [yb, r.rel_time], color="0.7", lw=0.8,
                        zorder=1)
                ax.plot(r.peak_rel, yb, "o", mfc="none", mec="0.55", ms=5, zorder=2)
                bounds.append((r.peak_rel, yb))
            ax.plot(r.peak_rel, r.rel_time, st["marker"], color=st["color"], ms=6.5,
                    mec="white", mew=0.5, zorder=3)
            items.append((r.peak_rel, r.rel_time, r.label))
        fig.canvas.draw()
        place_labels(fig, ax, items, bounds, rings=(1.0, 2.2, 3.6, 5.0))
    handles = [Line2D([], [], ls="", marker=STYLE[k]["marker"], color=STYLE[k]["color"],
                      label=LEGEND[k]) for k in present]
    handles.append(Line2D([], [], ls="", marker="o", mfc="none", mec="0.55",
                          label="bound of a bincheck run"))
    fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=7.5, frameon=False,
               bbox_to_anchor=(0.5, 0.1 / height))
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
