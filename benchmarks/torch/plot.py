"""The figure: time against peak memory, both relative to store-all, one panel per cell."""

from __future__ import annotations

from ..common.plot import Point, panels_png
from ..common.report import cells_of
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


def _point(r: Row) -> Point:
    return Point(r.peak_rel, r.rel_time, _style_key(r), r.label,
                 r.rel_time * r.bound_s / r.time_s if r.bound_s else None)


def plot_png(rows: list[Row], title: str,
             meter: str = "profiler allocation events") -> bytes | None:
    ok = [r for r in rows if r.status == "ok" and r.rel_time is not None]
    panels = []
    for cell in cells_of(ok):
        mine = [r for r in ok if r.cell == cell]
        r0 = mine[0]
        panels.append((f"{cell}: T={r0.seq_len}, H={r0.hidden}, B={r0.batch}",
                       [_point(r) for r in mine]))
    caption = (f"x: metered peak ({meter}) / store-all's, log scale; y: time / "
               "store-all's, the median of the per-round ratios. Hollow grey circle joined to a "
               "bincheck point: that run's "
               "bound, the plan's plain steps × plain step + T × (taped step + backward into "
               "the parameters' running sums), "
               "per-step costs measured in the same run.")
    return panels_png(panels, title=title, caption=caption, style=STYLE, legend=LEGEND,
                      xlabel="peak memory relative to store-all (log scale)",
                      ylabel="time relative to store-all",
                      xticks=(0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2),
                      rings=(1.0, 2.2, 3.6, 5.0))
