"""The benchmarks' figure: time against memory, both relative to a reference run, one panel per
problem, one look per kind of strategy, every point labelled (matplotlib; no framework needed,
so ``--replot`` works from a results JSON alone)."""

from __future__ import annotations

import io
import math
import textwrap
from dataclasses import dataclass

from .labels import place_labels

RINGS = (1.0, 2.2, 3.6, 5.0, 7.0)


@dataclass
class Point:
    x: float                    # memory / the reference's
    y: float                    # time / the reference's
    key: str                    # the look: a key of the figure's style
    label: str
    bound: float | None = None  # y of the run's bound: a hollow circle joined to the point


def panels_png(panels: list[tuple[str, list[Point]]], *, title: str, caption: str,
               style: dict[str, dict], legend: dict[str, str], xlabel: str, ylabel: str,
               xticks: tuple[float, ...], xpad: float = 1.5, ax_height: float = 4.2,
               y_cap: float | None = None, rings: tuple[float, ...] = RINGS,
               bound_legend: str | None = "bound of a bincheck run",
               joined: tuple[str, ...] = (), shared: bool = True) -> bytes | None:
    """A PNG of one log-x panel a ``(title, points)`` pair, or None without matplotlib or
    points. Times above ``y_cap`` are drawn on a dashed line at it, their value in the label;
    the points of a key in ``joined`` are joined by a line, in the order of x. ``shared``: one
    scale for every panel (else each panel fits its own points)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
        from matplotlib.lines import Line2D
    except ImportError:
        return None
    panels = [(t, pts) for t, pts in panels if pts]
    if not panels:
        return None
    points = [p for _, pts in panels for p in pts]
    n = len(panels)
    present = [k for k in style if any(p.key == k for p in points)]
    extra = 1 if bound_legend else 0
    width = max(9.0, 5.0 * n + 0.8)
    ncol = 4 if width >= 14 else 2
    legend_rows = math.ceil((len(present) + extra) / ncol)
    top_in, ax_in, bottom_in = 1.2, ax_height, 0.75 + 0.19 * legend_rows + 0.15
    height = top_in + ax_in + bottom_in
    fig, axes = plt.subplots(1, n, figsize=(width, height), squeeze=False, dpi=110)
    fig.subplots_adjust(left=0.7 / width, right=1 - 0.25 / width, top=1 - top_in / height,
                        bottom=bottom_in / height, wspace=0.15)
    fig.suptitle(title, fontsize=10.5, y=1 - 0.1 / height, va="top")
    fig.text(0.5, 1 - 0.42 / height, "\n".join(textwrap.wrap(caption, int(width * 15))),
             ha="center", va="top", fontsize=7.5, color="0.3")

    def limits(pts: list[Point]) -> tuple[tuple[float, float], tuple[float, float], bool]:
        xs = [p.x for p in pts]
        ys = [p.y for p in pts] + [p.bound for p in pts if p.bound]
        top = max(ys) if y_cap is None else min(max(ys), y_cap)
        return ((min(xs) / xpad, max(xs) * xpad), (min(0.9, min(ys) - 0.1), top * 1.08 + 0.05),
                y_cap is not None and max(ys) > y_cap)
    everywhere = limits(points)

    def y_of(v: float) -> float:         # off the scale: drawn on the cap, value in the label
        return v if y_cap is None else min(v, y_cap)
    for ax, (name, mine) in zip(axes[0], panels):
        xlim, ylim, capped = everywhere if shared else limits(mine)
        ax.set_xscale("log")
        ax.set_xlim(*xlim)
        ax.set_ylim(*ylim)
        ax.grid(alpha=0.3, which="both")
        ax.axhline(1.0, color="0.6", lw=0.8, ls=":")
        ax.axvline(1.0, color="0.6", lw=0.8, ls=":")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ticks = [t for t in xticks if xlim[0] <= t <= xlim[1]]
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        if ax is axes[0][0]:
            ax.set_ylabel(ylabel, fontsize=8)
        ax.tick_params(labelsize=7.5)
        items, bounds = [], []
        if capped:
            ax.axhline(y_cap, color="0.75", lw=0.8, ls="--")
        for key in joined:
            line = sorted((p.x, y_of(p.y)) for p in mine if p.key == key)
            if len(line) > 1:
                ax.plot(*zip(*line), color=style[key]["color"], lw=1.0, alpha=0.6, zorder=1)
        for p in mine:
            st = style[p.key]
            y = y_of(p.y)
            if p.bound:
                yb = y_of(p.bound)
                ax.plot([p.x, p.x], [yb, y], color="0.7", lw=0.8, zorder=1)
                ax.plot(p.x, yb, "o", mfc="none", mec="0.55", ms=5, zorder=2)
                bounds.append((p.x, yb))
            ax.plot(p.x, y, st["marker"], color=st["color"], ms=6.5, mec="white", mew=0.5,
                    zorder=3)
            label = p.label if y == p.y else f"{p.label} ({p.y:.1f}×, off scale)"
            items.append((p.x, y, label))
        fig.canvas.draw()
        place_labels(fig, ax, items, bounds, rings=rings)
    handles = [Line2D([], [], ls="", marker=style[k]["marker"], color=style[k]["color"],
                      label=legend[k]) for k in present]
    if bound_legend:
        handles.append(Line2D([], [], ls="", marker="o", mfc="none", mec="0.55",
                              label=bound_legend))
    fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=7.5, frameon=False,
               bbox_to_anchor=(0.5, 0.1 / height))
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
