"""Label placement for the benchmarks' scatter plots (:mod:`benchmarks.common.plot`)."""

from __future__ import annotations


def _overlap(a, b) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return w * h if w > 0 and h > 0 else 0.0


def place_labels(fig, ax, items, others=(), rings=(1.0, 2.2, 3.6, 5.0, 7.0)) -> None:
    """Greedy: each label goes to the first of a ring of offsets around its point that overlaps
    no placed label, no point and stays inside the panel (else the least bad one)."""
    renderer = fig.canvas.get_renderer()
    px = [tuple(ax.transData.transform((x, y))) for x, y, _ in items]
    r = 4.5 * fig.dpi / 72
    pts = [(x - r, y - r, x + r, y + r) for x, y in
           px + [tuple(ax.transData.transform(p)) for p in others]]
    frame = ax.get_window_extent(renderer)
    placed = []
    for (x, y, text), (qx, qy) in sorted(zip(items, px), key=lambda it: -it[1][1]):
        probe = ax.text(0, 0, text, fontsize=7)
        bb = probe.get_window_extent(renderer)
        probe.remove()
        w, h = bb.width, bb.height
        best = None
        for k in rings:
            for dx, dy in ((r * k, -h / 2), (-r * k - w, -h / 2), (-w / 2, r * k),
                           (-w / 2, -r * k - h), (r * k, r * k / 2), (r * k, -r * k / 2 - h),
                           (-r * k - w, r * k / 2), (-r * k - w, -r * k / 2 - h)):
                box = (qx + dx, qy + dy, qx + dx + w, qy + dy + h)
                cost = sum(_overlap(box, o) for o in placed + pts) + 0.01 * k
                if box[0] < frame.x0 or box[2] > frame.x1 or box[1] < frame.y0 or \
                        box[3] > frame.y1:
                    cost += w * h
                if best is None or cost < best[0]:
                    best = (cost, box)
            if best[0] < 1:
                break
        box = best[1]
        placed.append(box)
        ax.annotate(text, (x, y), xytext=(box[0] - qx, box[1] - qy), textcoords="offset pixels",
                    fontsize=7, va="bottom", ha="left", annotation_clip=False,
                    arrowprops=dict(arrowstyle="-", color="0.6", lw=0.5, shrinkA=0, shrinkB=3))
