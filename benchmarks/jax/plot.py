"""The figure: gradient time against XLA temporaries, both relative to lax.scan, one panel per
cell (matplotlib; no jax needed, so ``--replot`` works from the JSON alone)."""

from __future__ import annotations

import io
import math
import textwrap

from ..labels import place_labels

Y_CAP = 4.0          # times above this are drawn on a dashed line at it, their value in the label

# one look per kind of strategy, the same in every panel
STYLE = {
    "scan": dict(marker="s", color="black"),
    "scan-remat": dict(marker="X", color="tab:red"),
    "nested": dict(marker="P", color="tab:purple"),
    "eqx": dict(marker="^", color="tab:green"),
    "num_ckpts": dict(marker="o", color="tab:blue"),
    "memory": dict(marker="D", color="tab:orange"),
}
LEGEND = {
    "scan": "lax.scan (store-all)",
    "scan-remat": "lax.scan of jax.checkpoint(step)",
    "nested": "nested √T remat",
    "eqx": "Equinox checkpointed while_loop (label: C)",
    "num_ckpts": "bincheck num_ckpts=s",
    "memory": "bincheck memory= (label: budget)",
}


def _style_key(r) -> str:
    if r.kind != "bincheck":
        return r.kind
    return "num_ckpts" if r.memory_budget is None else "memory"


def plot_png(rows, title: str) -> bytes | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
        from matplotlib.lines import Line2D
    except ImportError:
        return None
    ok = [r for r in rows if r.status == "ok" and r.rel_time is not None and r.temp_rel]
    cells = list(dict.fromkeys(r.cell for r in ok))
    if not cells:
        return None
    n = len(cells)
    present = [k for k in STYLE if any(_style_key(r) == k for r in ok)]
    width = max(9.0, 5.0 * n + 0.8)
    ncol = 4 if width >= 14 else 2
    legend_rows = math.ceil((len(present) + 1) / ncol)
    top_in, ax_in, bottom_in = 1.2, 4.4, 0.75 + 0.19 * legend_rows + 0.15
    height = top_in + ax_in + bottom_in
    fig, axes = plt.subplots(1, n, figsize=(width, height), squeeze=False, dpi=110)
    fig.subplots_adjust(left=0.7 / width, right=1 - 0.25 / width, top=1 - top_in / height,
                        bottom=bottom_in / height, wspace=0.15)
    fig.suptitle(title, fontsize=10.5, y=1 - 0.1 / height, va="top")
    caption = ("x: XLA temporaries of the compiled gradient (memory_analysis) / lax.scan's, log "
               "scale; y: gradient time / lax.scan's, the median of the per-round ratios (above "
               "4: on the dashed line, the value in the label). Hollow grey circle joined to a "
               "bincheck point: that run's bound, the plan's plain steps × plain step + T × "
               "(taped step + backward), per-step costs measured in the same rounds.")
    fig.text(0.5, 1 - 0.42 / height, "\n".join(textwrap.wrap(caption, int(width * 15))),
             ha="center", va="top", fontsize=7.5, color="0.3")
    xs = [r.temp_rel for r in ok]
    ys = [r.rel_time for r in ok] + [r.rel_time / r.time_over_bound for r in ok
                                     if r.time_over_bound]
    xlim = (min(xs) / 1.6, max(xs) * 1.6)
    ylim = (min(0.9, min(ys) - 0.1), min(max(ys), Y_CAP) * 1.08 + 0.05)

    def y_of(v: float) -> float:         # off the scale: drawn on the cap, value in the label
        return min(v, Y_CAP)
    for ax, cell in zip(axes[0], cells):
        mine = [r for r in ok if r.cell == cell]
        ax.set_xscale("log")
        ax.set_xlim(*xlim)
        ax.set_ylim(*ylim)
        ax.grid(alpha=0.3, which="both")
        ax.axhline(1.0, color="0.6", lw=0.8, ls=":")
        ax.axvline(1.0, color="0.6", lw=0.8, ls=":")
        r0 = mine[0]
        ax.set_title(f"{cell}: T={r0.seq_len}, H={r0.hidden}, B={r0.batch}, I={r0.input_size}",
                     fontsize=9)
        ax.set_xlabel("XLA temporaries relative to lax.scan (log scale)", fontsize=8)
        ticks = [t for t in (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2)
                 if xlim[0] <= t <= xlim[1]]
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        if ax is axes[0][0]:
            ax.set_ylabel("gradient time relative to lax.scan", fontsize=8)
        ax.tick_params(labelsize=7.5)
        items, bounds = [], []
        if max(ys) > Y_CAP:
            ax.axhline(Y_CAP, color="0.75", lw=0.8, ls="--")
        for r in mine:
            st = STYLE[_style_key(r)]
            y = y_of(r.rel_time)
            if r.time_over_bound:
                yb = y_of(r.rel_time / r.time_over_bound)
                ax.plot([r.temp_rel, r.temp_rel], [yb, y], color="0.7", lw=0.8, zorder=1)
                ax.plot(r.temp_rel, yb, "o", mfc="none", mec="0.55", ms=5, zorder=2)
                bounds.append((r.temp_rel, yb))
            ax.plot(r.temp_rel, y, st["marker"], color=st["color"], ms=6.5,
                    mec="white", mew=0.5, zorder=3)
            label = (r.label if r.rel_time <= Y_CAP
                     else f"{r.label} ({r.rel_time:.1f}×, off scale)")
            items.append((r.temp_rel, y, label))
        fig.canvas.draw()
        place_labels(fig, ax, items, bounds)
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
