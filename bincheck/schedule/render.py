"""Pictures of a schedule, computed with the standard library only: a terminal rendering and the
geometry of the classic Revolve diagram.

Both follow the action stream through a :class:`~bincheck.schedule.simulate.Tracker`, so what is
drawn is what the executor would run, and an invalid stream raises
:class:`~bincheck.schedule.simulate.ScheduleError` instead of being drawn.

:func:`draw_text` prints one row per action, time running down the page and one column per state
index (``python -m bincheck plan 10 3 --draw``). :func:`diagram` lays out the figure of Griewank &
Walther's papers: x is time, counted in step evaluations (plain and taped), y the state index;
advances climb, restores jump back down to a checkpoint, each ``Reverse`` tapes its steps (a
climb of its own colour) and moves the adjoint down, so the adjoint's position over time is the
descending staircase. Painting it needs matplotlib, which this layer does not import: the command
line does (``python -m bincheck plan 20 4 --plot schedule.png``; :func:`bincheck.__main__.plot`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
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
    ``MAX_TEXT_STEPS`` steps (wider plans: ``python -m bincheck plan ... --plot FILE``).
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


Segment = tuple[tuple[int, int], tuple[int, int]]


@dataclass
class Diagram:
    """The Revolve diagram of one schedule, as line segments ``((t0, y0), (t1, y1))`` in (time,
    state index) coordinates, by kind, plus the snapshot markers and the stream's counts."""

    seq_len: int
    time: int = 0                   # total step evaluations, plain and taped
    advance: list[Segment] = field(default_factory=list)     # plain steps, climbing
    taped: list[Segment] = field(default_factory=list)       # taped steps, climbing
    restore: list[Segment] = field(default_factory=list)     # vertical jumps to a checkpoint
    adjoint: list[Segment] = field(default_factory=list)     # the descending staircase
    held: dict[str, list[Segment]] = field(default_factory=lambda: {"ram": [], "disk": []})
    snapshots: dict[str, list[tuple[int, int]]] = field(
        default_factory=lambda: {"ram": [], "disk": []})     # (time, index) of each Snapshot
    plain_steps: int = 0
    taped_steps: int = 0
    peak_checkpoints: int = 0
    disk_writes: int = 0
    disk_reads: int = 0
    title: str = ""


def diagram(schedule: Iterable[Action], seq_len: int | None = None) -> Diagram:
    """Lay out ``schedule`` as the Revolve diagram (see the module docstring).

    Time advances by one per plain step (``Advance``) and per taped step (``Reverse``); a
    ``Reverse(lo, hi)`` climbs from ``lo`` to ``hi`` (the taped steps) and then moves the
    adjoint down from ``hi`` to ``lo``; ``held`` bars run from a ``Snapshot`` to its ``Free``.
    """
    n = _seq_len(schedule, seq_len)
    d = Diagram(n, title=str(schedule).splitlines()[0] if hasattr(schedule, "seq_len")
                else f"{n} steps")
    tracker = Tracker(n)
    t, y = 0, 0                     # the pen: time so far, where the live state is
    since: dict[int, tuple[int, str]] = {}
    adjoint_t = None                # when the adjoint last moved
    for count, action in enumerate(schedule):
        if count >= MAX_PLOT_ACTIONS:
            raise ValueError(f"more than {MAX_PLOT_ACTIONS} actions: too many to draw")
        tracker.apply(action)
        kind = type(action)
        if kind is Advance:
            k = action.stop - action.start
            if k:
                d.advance.append(((t, action.start), (t + k, action.stop)))
            t, y = t + k, action.stop
        elif kind is Reverse:
            k = action.stop - action.start
            d.taped.append(((t, action.start), (t + k, action.stop)))
            t += k
            if adjoint_t is not None:       # the adjoint waited at action.stop since it moved
                d.adjoint.append(((adjoint_t, action.stop), (t, action.stop)))
            d.adjoint.append(((t, action.stop), (t, action.start)))
            adjoint_t, y = t, action.start
        elif kind is Restore:
            if y != action.index:
                d.restore.append(((t, y), (t, action.index)))
            y = action.index
        elif kind is Snapshot:
            since[action.index] = (t, action.storage)
            d.snapshots[action.storage].append((t, action.index))
        elif kind is Free:
            start, storage = since.pop(action.index)
            d.held[storage].append(((start, action.index), (t, action.index)))
    tracker.finish()
    d.time = t
    d.plain_steps, d.taped_steps = tracker.plain_steps, tracker.taped_steps
    d.peak_checkpoints = tracker.peak_checkpoints
    d.disk_writes, d.disk_reads = tracker.disk_writes, tracker.disk_reads
    return d
