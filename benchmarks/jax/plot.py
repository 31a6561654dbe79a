"""The figure: gradient time against XLA temporaries, both relative to lax.scan, one panel per
cell (matplotlib; no jax needed, so ``--replot`` works from the JSON alone)."""

from __future__ import annotations

from ..common.plot import Point, panels_png
from ..common.report import cells_of

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


def _point(r) -> Point:
    return Point(r.temp_rel, r.rel_time, _style_key(r), r.label,
                 r.rel_time / r.time_over_bound if r.time_over_bound else None)


def plot_png(rows, title: str) -> bytes | None:
    ok = [r for r in rows if r.status == "ok" and r.rel_time is not None and r.temp_rel]
    panels = []
    for cell in cells_of(ok):
        mine = [r for r in ok if r.cell == cell]
        r0 = mine[0]
        panels.append((f"{cell}: T={r0.seq_len}, H={r0.hidden}, B={r0.batch}, "
                       f"I={r0.input_size}", [_point(r) for r in mine]))
    caption = ("x: XLA temporaries of the compiled gradient (memory_analysis) / lax.scan's, log "
               "scale; y: gradient time / lax.scan's, the median of the per-round ratios (above "
               "4: on the dashed line, the value in the label). Hollow grey circle joined to a "
               "bincheck point: that run's bound, the plan's plain steps × plain step + T × "
               "(taped step + backward), per-step costs measured in the same rounds.")
    return panels_png(panels, title=title, caption=caption, style=STYLE, legend=LEGEND,
                      xlabel="XLA temporaries relative to lax.scan (log scale)",
                      ylabel="gradient time relative to lax.scan",
                      xticks=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2),
                      xpad=1.6, ax_height=4.4, y_cap=Y_CAP)
