"""Pictures of a schedule: a terminal rendering (stdlib only) and the classic Revolve diagram.

Both follow the action stream through a :class:`~bincheck.schedule.simulate.Tracker`, so what is
drawn is what the executor would run, and an invalid stream raises
:class:`~bincheck.schedule.simulate.ScheduleError` instead of being drawn.

:func:`draw_text` prints one row per action, time running down the page and one column per state
index (``python -m bincheck plan 10 3 --draw``). :func:`plot` draws the figure of Griewank &
Walther's papers: x is time, counted in step evaluations (plain and taped), y the state index;
advances climb, restores jump back down to a checkpoint, each ``Reverse`` tapes its steps (a
climb of its own colour) and moves the adjoint down, so the adjoint's position over time is the
descending staircase (``python -m bincheck plan 20 4 --plot schedule.png``). Matplotlib is
imported only there, and only its object-oriented API (no pyplot, no global backend change).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from .actions import Action, Advance, Free, Restore, Reverse, Snapshot
from .simulate import Tracker
from .validate import check_positive_int

# One character per state index in the terminal rendering (see LEGEND).
LEGEND = ("columns: state index; o checkpoint in RAM   d checkpoint on disk   . not yet reversed\n"
          "S snapshot   D snapshot to disk   R restore   x free   -> advance (plain steps)\n"
          "< reverse one step   <== reverse a segment taped whole")

MAX_TEXT_STEPS = 200
MAX_PLOT_ACTIONS = 200_000


def _seq_len(schedule: Any, seq_len: int | None) -> int:
    n = getattr(schedule, "seq_len", None) if seq_len is None else seq_len
    if n is None:
        raise TypeError("pass a schedule with a seq_len attribute (bincheck.plan(...)), or "
                        "seq_len=...")
    return check_positive_int("seq_len", n)


def _label(action: Action) -> str:
    kind = type(action)
    if kind is Advance or kind is Reverse:
        return f"{kind.__name__}({action.start}, {action.stop})"
    if kind is Snapshot and action.storage != "ram":
        return f"Snapshot({action.index}, {action.storage})"
    return f"{kind.__name__}({action.index})"


def draw_text(schedule: Iterable[Action], seq_len: int | None = None) -> str:
    """The schedule as text: one row per action, one column per state index ``0..seq_len``.

    Each row shows, after its action: the checkpoints held (``o`` in RAM, ``d`` on disk), the
    states whose steps are not yet reversed (``.``), and the action itself (see ``LEGEND``).
    The ``plain`` and ``taped`` columns count step evaluations so far. At most
    ``MAX_TEXT_STEPS`` steps (wider plans: :func:`plot`).
    """
    n = _seq_len(schedule, seq_len)
    if n > MAX_TEXT_STEPS:
        raise ValueError(f"a terminal drawing has one column per step; {n} steps is more than "
                         f"{MAX_TEXT_STEPS}: draw it with --plot FILE (matplotlib) instead")
    tracker = Tracker(n)
    width = max(24, len(_label(Reverse(n, n))) + 2)
    tens = "".join(str(i // 10 % 10) if i % 10 == 0 and i >= 10 else " " for i in range(n + 1))
    units = "".join(str(i % 10) if i % 5 == 0 else " " for i in range(n + 1))
    lines = [LEGEND, ""]
    if n >= 10:
        lines.append(f"{'':>4} {'':>5} {'':>5}  {'':<{width}} {tens}".rstrip())
    lines.append(f"{'#':>4} {'plain':>5} {'taped':>5}  {'action':<{width}} {units}".rstrip())
    for k, action in enumerate(schedule, 1):
        tracker.apply(action)
        cells = ["." if i < tracker.adjoint_index else " " for i in range(n + 1)]
        for i in tracker.stored:
            cells[i] = "o" if i in tracker.ram else "d"
        kind = type(action)
        if kind is Advance:
            for i in range(action.start + 1, action.stop):
                cells[i] = "-"
            if action.stop > action.start:
                cells[action.stop] = ">"
        elif kind is Reverse:
            for i in range(action.start + 1, action.stop):
                cells[i] = "="
            cells[action.start] = "<"
        elif kind is Snapshot:
            cells[action.index] = "S" if action.storage == "ram" else "D"
        elif kind is Restore:
            cells[action.index] = "R"
        elif kind is Free:
            cells[action.index] = "x"
        lines.append(f"{k:>4} {tracker.plain_steps:>5} {tracker.taped_steps:>5}  "
                     f"{_label(action):<{width}} {''.join(cells).rstrip()}")
    tracker.finish()
    return "\n".join(lines)


def _segments(schedule: Iterable[Action], n: int) -> dict:
    """Line segments of the Revolve diagram, by kind, and the snapshot markers."""
    tracker = Tracker(n)
    t, y = 0, 0                     # the pen: time so far, where the live state is
    out: dict[str, list] = {"advance": [], "taped": [], "restore": [], "adjoint": [],
                            "ram": [], "disk": []}
    held: dict[int, tuple[int, str]] = {}
    bars: dict[str, list] = {"ram": [], "disk": []}
    adjoint_t, first_reverse = None, None
    for count, action in enumerate(schedule):
        if count >= MAX_PLOT_ACTIONS:
            raise ValueError(f"more than {MAX_PLOT_ACTIONS} actions: too many to draw")
        tracker.apply(action)
        kind = type(action)
        if kind is Advance:
            k = action.stop - action.start
            if k:
                out["advance"].append(((t, action.start), (t + k, action.stop)))
            t, y = t + k, action.stop
        elif kind is Reverse:
            k = action.stop - action.start
            out["taped"].append(((t, action.start), (t + k, action.stop)))
            t += k
            if first_reverse is None:
                first_reverse = t
            else:               # the adjoint waited at action.stop since its last move
                out["adjoint"].append(((adjoint_t, action.stop), (t, action.stop)))
            out["adjoint"].append(((t, action.stop), (t, action.start)))
            adjoint_t, y = t, action.start
        elif kind is Restore:
            if y != action.index:
                out["restore"].append(((t, y), (t, action.index)))
            y = action.index
        elif kind is Snapshot:
            held[action.index] = (t, action.storage)
            out[action.storage].append((t, action.index))
        elif kind is Free:
            start, storage = held.pop(action.index)
            bars[storage].append(((start, action.index), (t, action.index)))
    tracker.finish()
    out["bars"] = bars
    out["time"] = t
    out["tracker"] = tracker
    return out


def plot(schedule: Iterable[Action], path: str | os.PathLike, seq_len: int | None = None,
         title: str | None = None) -> None:
    """Draw the schedule as the classic Revolve diagram into ``path`` (PNG, SVG or PDF, by its
    extension). Needs matplotlib (``pip install "bincheck[bench]"`` or ``pip install
    matplotlib``); raises ImportError saying so if it is missing.

    x: time in step evaluations (a plain step or a taped step each count one); y: state index.
    Blue lines climb with plain steps, green lines with taped steps (a segment taped whole is a
    longer green line), dashed grey lines are restores, the red staircase is the adjoint moving
    down as steps are reversed; markers are snapshots (circles in RAM, squares on disk), the
    faint bars show how long each checkpoint is held.
    """
    n = _seq_len(schedule, seq_len)
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.collections import LineCollection
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
    except ImportError as err:
        raise ImportError(f"drawing a schedule needs matplotlib ({err}); install it with "
                          f"pip install \"bincheck[bench]\" or pip install matplotlib") from None
    seg = _segments(schedule, n)
    tracker = seg["tracker"]
    fig = Figure(figsize=(9.5, 5.2), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    colours = {"advance": "#1f77b4", "taped": "#2ca02c", "restore": "#7f7f7f",
               "adjoint": "#d62728", "ram": "#1f77b4", "disk": "#ff7f0e"}
    few = n <= 60
    ax.add_collection(LineCollection(seg["bars"]["ram"], colors=colours["ram"], alpha=0.18,
                                     linewidths=4 if few else 2))
    ax.add_collection(LineCollection(seg["bars"]["disk"], colors=colours["disk"], alpha=0.25,
                                     linewidths=4 if few else 2))
    ax.add_collection(LineCollection(seg["restore"], colors=colours["restore"],
                                     linestyles=(0, (2, 2)), linewidths=1))
    ax.add_collection(LineCollection(seg["advance"], colors=colours["advance"], linewidths=1.6))
    ax.add_collection(LineCollection(seg["taped"], colors=colours["taped"], linewidths=3))
    ax.add_collection(LineCollection(seg["adjoint"], colors=colours["adjoint"], linewidths=2))
    size = 30 if few else 8
    for storage, marker in (("ram", "o"), ("disk", "s")):
        if seg[storage] and n <= 200:       # beyond that the held bars say it all
            xs, ys = zip(*seg[storage])
            ax.scatter(xs, ys, s=size, marker=marker, color=colours[storage], zorder=3,
                       edgecolors="white", linewidths=0.5)
    ax.set_xlim(-0.5, seg["time"] + 0.5)
    ax.set_ylim(-0.5, n + 0.5)
    ax.set_xlabel("time (step evaluations: plain and taped)")
    ax.set_ylabel("state index")
    if n <= 40:
        ax.set_yticks(range(0, n + 1, 1 if n <= 20 else 2))
    ax.grid(True, alpha=0.25, linewidth=0.5)
    handles = [Line2D([], [], color=colours["advance"], lw=1.6, label="advance (plain steps)"),
               Line2D([], [], color=colours["taped"], lw=3, label="taped steps"),
               Line2D([], [], color=colours["adjoint"], lw=2, label="adjoint (steps reversed)"),
               Line2D([], [], color=colours["restore"], lw=1, ls=(0, (2, 2)), label="restore"),
               Line2D([], [], color=colours["ram"], marker="o", lw=4, alpha=0.6,
                      label="checkpoint in RAM (held)")]
    if seg["disk"]:
        handles.append(Line2D([], [], color=colours["disk"], marker="s", lw=4, alpha=0.6,
                              label="checkpoint on disk (held)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
              fontsize=9)
    if title is None:
        title = str(schedule).splitlines()[0]
    counts = (f"{tracker.plain_steps} plain + {tracker.taped_steps} taped evaluations, "
              f"at most {tracker.peak_checkpoints} checkpoints in RAM")
    if tracker.disk_writes:
        counts += f", {tracker.disk_writes} disk writes, {tracker.disk_reads} reads"
    ax.set_title(f"{title}\n{counts}", fontsize=10)
    fig.tight_layout()
    fig.savefig(os.fspath(path))
