"""The figure: time against metered peak, both relative to store-all, one panel per workload,
every peer's point and bincheck's curve (matplotlib only, so ``--replot`` works from the JSON)."""

from __future__ import annotations

import textwrap

from ..common.plot import Point, panels_png
from ..common.report import cells_of
from .harness import Row

Y_CAP = 4.0

STYLE = {
    "store-all": dict(marker="s", color="black"),
    "per-block": dict(marker="X", color="tab:red"),
    "sequential": dict(marker="v", color="tab:olive"),
    "compile": dict(marker="^", color="tab:green"),
    "binomial": dict(marker="P", color="tab:purple"),
    "bincheck": dict(marker="D", color="tab:orange"),
}
LEGEND = {
    "store-all": "store-all",
    "per-block": "checkpoint per block (non-reentrant)",
    "sequential": "checkpoint_sequential √n segments",
    "compile": "torch.compile (label: activation_memory_budget)",
    "binomial": "bt.binomial_checkpoint (RNN)",
    "bincheck": "bincheck.torch memory= (its curve)",
}


def plot_png(rows: list[Row], title: str) -> bytes | None:
    ok = [r for r in rows if r.status == "ok" and r.rel_time is not None and r.share_rel]
    panels = []
    for name in cells_of(ok, "workload"):
        mine = [r for r in ok if r.workload == name]
        ref = next((r for r in mine if r.kind == "store-all"), mine[0])
        head = (f"{mine[0].describe}; store-all {ref.metered_peak / 2**20:.1f} MiB "
                f"({(ref.metered_peak - ref.grad_bytes) / 2**20:.1f} MiB beyond the gradients), "
                f"{ref.time_s * 1e3:.0f} ms")
        panels.append(("\n".join(textwrap.wrap(head, 64)),
                       [Point(r.share_rel, r.rel_time, r.kind, r.label) for r in mine]))
    caption = ("x: metered peak of one gradient (profiler allocation events) less the "
               "parameters' gradients, / store-all's, log scale; y: time / store-all's, the "
               "median of the per-round ratios (above 4: on the dashed line, the value in the "
               "label). One thread, float32, CPU.")
    return panels_png(panels, title=title, caption=caption, style=STYLE, legend=LEGEND,
                      xlabel="peak less the gradients, relative to store-all (log scale)",
                      ylabel="time relative to store-all",
                      xticks=(0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1, 1.5, 2, 3, 5, 10, 20,
                              50),
                      y_cap=Y_CAP, bound_legend=None, joined=("bincheck",), shared=False)
