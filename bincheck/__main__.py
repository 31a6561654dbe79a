"""Command line: ``python -m bincheck plan SEQ_LEN NUM_CKPTS`` prints a plan's summary;
``python -m bincheck plan SEQ_LEN --memory 50MB --state-bytes 256KB`` plans within bytes (add
``--disk --step-seconds ... --write-seconds ... --read-seconds ...`` for a disk tier).
``--actions`` lists the actions, ``--draw`` draws them in the terminal (one row per action) and
``--plot FILE`` paints the Revolve diagram into an image with matplotlib (:func:`plot`).

Planning only: it needs neither autograd nor numpy. matplotlib is imported only by :func:`plot`,
here rather than in ``bincheck.schedule`` (whose modules import the standard library only: it
lays the diagram out, :func:`bincheck.schedule.render.diagram`).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Iterable

from .schedule.budget import BudgetPlan, Sizes, format_bytes, memory_for, parse_bytes, plan
from .schedule.actions import Action
from .schedule.render import MAX_TEXT_STEPS, diagram, draw_text
from .schedule.validate import short_repr

_DIGITS = re.compile(r"[0-9]+")


_MAX_DIGITS = 18       # a step count beyond 10**18 is a typo, and int() refuses 4300+ digits


def _positive_int(text: str) -> int:
    # Plain ASCII decimal digits only: int() would also take " 12", "+12", "1_000" and other
    # scripts' digits, none of which a user means as a step count. Only ArgumentTypeError may
    # leave: argparse would print any other error with this function's name and the whole text.
    if not _DIGITS.fullmatch(text) or int(text[:_MAX_DIGITS + 1]) < 1:
        raise argparse.ArgumentTypeError(
            f"expected a positive integer in decimal digits, got {short_repr(text, 40)}")
    if len(text.lstrip("0")) > _MAX_DIGITS:
        raise argparse.ArgumentTypeError(
            f"expected a positive integer of at most {_MAX_DIGITS} digits, got "
            f"{short_repr(text, 40)} ({len(text)} digits)")
    return int(text)


def _bytes(text: str) -> int:
    try:
        return parse_bytes(text, "size")
    except (TypeError, ValueError) as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got "
                                         f"{short_repr(text, 40)}")
    return value


def _parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    parser = argparse.ArgumentParser(prog="python -m bincheck",
                                     description="Optimal checkpointing schedules.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="summarise the optimal schedule for SEQ_LEN steps",
                       description="Summarise the optimal schedule for SEQ_LEN steps, holding "
                                   "NUM_CKPTS states or within --memory bytes.")
    p.add_argument("seq_len", type=_positive_int, help="number of steps")
    p.add_argument("num_ckpts", type=_positive_int, nargs="?",
                   help="checkpoints: states held at once, the initial state included (or give "
                        "--memory)")
    p.add_argument("--actions", action="store_true", help="also list every action (small plans)")
    p.add_argument("--draw", action="store_true", help="also draw the schedule in the terminal: "
                   "one row per action, one column per state index (at most "
                   f"{MAX_TEXT_STEPS} steps)")
    p.add_argument("--plot", metavar="FILE", help="draw the schedule as the Revolve diagram "
                   "(time vs state index) into FILE: .png, .svg or .pdf (no extension: .png; a "
                   "directory: DIR/schedule.png; needs matplotlib)")
    g = p.add_argument_group("planning within bytes (sizes as 256KB, 1.5GiB, ...)")
    g.add_argument("--memory", type=_bytes, help="bytes for snapshots, kept tapes and the "
                   "working set (instead of NUM_CKPTS)")
    g.add_argument("--state-bytes", type=_bytes, help="bytes of one state")
    g.add_argument("--tape-bytes", type=_bytes, help="bytes one step's tape keeps (omit: "
                   "store states only)")
    g.add_argument("--work-bytes", type=_bytes, default=0, help="working set: one step's tape "
                   "and its backward, the live state and adjoint (default 0)")
    g.add_argument("--step-seconds", type=_seconds, help="time of a plain step")
    g.add_argument("--taped-step-seconds", type=_seconds, help="time to tape a step and pull "
                   "a cotangent through it")
    g.add_argument("--max-slowdown", type=_seconds, help="print the least --memory predicted "
                   "to stay within this many times store-all (needs the step times)")
    d = p.add_argument_group("a disk tier (with --memory: states beyond RAM go to disk)")
    d.add_argument("--disk", action="store_true", help="plan with a disk tier, as "
                   "binomial_checkpoint(..., memory=..., disk=True); needs --step-seconds, "
                   "--write-seconds and --read-seconds (loop.preview measures them)")
    d.add_argument("--write-seconds", type=_seconds, help="time to write one state to disk")
    d.add_argument("--read-seconds", type=_seconds, help="time to read one state back")
    return parser, p


def plot_path(path: str) -> str:
    """Where ``--plot PATH`` writes: ``PATH/schedule.png`` for a directory, ``PATH.png`` without
    an extension (what matplotlib would write anyway), else ``PATH``."""
    if os.path.isdir(path):
        return os.path.join(path, "schedule.png")
    return path if os.path.splitext(path)[1] else path + ".png"


def main(argv: list[str] | None = None) -> int:
    parser, sub = _parsers()
    args = parser.parse_args(argv)
    sized = any(v is not None for v in (args.memory, args.state_bytes, args.tape_bytes,
                                        args.step_seconds, args.taped_step_seconds,
                                        args.max_slowdown, args.write_seconds,
                                        args.read_seconds)) or args.work_bytes or args.disk
    try:
        if args.max_slowdown is not None:
            if args.state_bytes is None:
                sub.error("--max-slowdown needs --state-bytes and the step times")
            sizes = Sizes(args.state_bytes, args.tape_bytes, args.work_bytes, args.step_seconds,
                          args.taped_step_seconds)
            need = memory_for(args.seq_len, args.max_slowdown, sizes)
            print(f"memory for at most {args.max_slowdown:g}x store-all over {args.seq_len} "
                  f"steps: {format_bytes(need)} ({need} bytes)")
            args.memory = need
        if args.num_ckpts is not None and sized:
            sub.error("give NUM_CKPTS or the --memory options, not both")
        if args.num_ckpts is None and args.memory is None:
            sub.error("give NUM_CKPTS, or --memory with --state-bytes")
        if args.memory is not None:
            if args.state_bytes is None:
                sub.error("--memory needs --state-bytes (the bytes of one state)")
            if args.disk:
                missing = [f"--{n.replace('_', '-')}" for n in ("step_seconds", "write_seconds",
                                                                "read_seconds")
                           if getattr(args, n) is None]
                if missing:
                    sub.error(f"--disk prices writes and reads against a plain step: it needs "
                              f"{', '.join(missing)} (loop.preview measures them)")
                schedule = BudgetPlan(args.seq_len, args.memory, Sizes(
                    args.state_bytes, args.tape_bytes, args.work_bytes, args.step_seconds,
                    args.taped_step_seconds, args.write_seconds, args.read_seconds), disk=True)
            else:
                if args.write_seconds is not None or args.read_seconds is not None:
                    sub.error("--write-seconds and --read-seconds price the disk tier: add --disk")
                schedule = plan(args.seq_len, memory=args.memory, state_bytes=args.state_bytes,
                                tape_bytes=args.tape_bytes, work_bytes=args.work_bytes,
                                step_seconds=args.step_seconds,
                                taped_step_seconds=args.taped_step_seconds)
        else:
            schedule = plan(args.seq_len, args.num_ckpts)
        if args.draw and args.seq_len > MAX_TEXT_STEPS:
            sub.error(f"--draw has one column per step, at most {MAX_TEXT_STEPS} steps; use "
                      f"--plot FILE for {args.seq_len} steps")
    except ValueError as err:
        sub.error(str(err))
    try:
        print(schedule)
        if args.actions:
            for action in schedule:
                print(" ", action)
        if args.draw:
            print()
            print(draw_text(schedule))
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (``... | head``): stop quietly, as Unix tools do. Point stdout at
        # devnull so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    if args.plot is not None:
        target = plot_path(args.plot)
        try:
            plot(schedule, target)
        except ImportError as err:
            print(f"python -m bincheck: {err}", file=sys.stderr)
            return 1
        except (OSError, ValueError) as err:
            print(f"python -m bincheck: cannot draw into {target!r}: {err}", file=sys.stderr)
            return 1
        print(f"wrote {target}")
    return 0


def plot(schedule: Iterable[Action], path: str | os.PathLike, seq_len: int | None = None,
         title: str | None = None) -> None:
    """Paint the Revolve diagram of ``schedule`` into ``path`` (PNG, SVG or PDF, by its
    extension). Needs matplotlib (``pip install "bincheck[bench]"`` or ``pip install
    matplotlib``); raises ImportError saying so if it is missing.

    x: time in step evaluations (a plain step or a taped step each count one); y: state index.
    Blue lines climb with plain steps, green lines with taped steps (a segment taped whole is a
    longer green line), dashed grey lines are restores, the red staircase is the adjoint moving
    down as steps are reversed; markers are snapshots (circles in RAM, squares on disk), the
    faint bars show how long each checkpoint is held. Uses matplotlib's object-oriented API
    only (no pyplot, no change of the global backend).
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.collections import LineCollection
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
    except ImportError as err:
        raise ImportError(f"drawing a schedule needs matplotlib ({err}); install it with "
                          f"pip install \"bincheck[bench]\" or pip install matplotlib") from None
    d = diagram(schedule, seq_len)
    n = d.seq_len
    fig = Figure(figsize=(9.5, 5.2), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    colour = {"advance": "#1f77b4", "taped": "#2ca02c", "restore": "#7f7f7f",
              "adjoint": "#d62728", "ram": "#1f77b4", "disk": "#ff7f0e"}
    few = n <= 60
    for storage, alpha in (("ram", 0.18), ("disk", 0.25)):
        ax.add_collection(LineCollection(d.held[storage], colors=colour[storage], alpha=alpha,
                                         linewidths=4 if few else 2))
    ax.add_collection(LineCollection(d.restore, colors=colour["restore"],
                                     linestyles=(0, (2, 2)), linewidths=1))
    ax.add_collection(LineCollection(d.advance, colors=colour["advance"], linewidths=1.6))
    ax.add_collection(LineCollection(d.taped, colors=colour["taped"], linewidths=3))
    ax.add_collection(LineCollection(d.adjoint, colors=colour["adjoint"], linewidths=2))
    for storage, marker in (("ram", "o"), ("disk", "s")):
        if d.snapshots[storage] and n <= 200:   # beyond that the held bars say it all
            xs, ys = zip(*d.snapshots[storage])
            ax.scatter(xs, ys, s=30 if few else 8, marker=marker, color=colour[storage],
                       zorder=3, edgecolors="white", linewidths=0.5)
    ax.set_xlim(-0.5, d.time + 0.5)
    ax.set_ylim(-0.5, n + 0.5)
    ax.set_xlabel("time (step evaluations: plain and taped)")
    ax.set_ylabel("state index")
    if n <= 40:
        ax.set_yticks(range(0, n + 1, 1 if n <= 20 else 2))
    ax.grid(True, alpha=0.25, linewidth=0.5)
    handles = [Line2D([], [], color=colour["advance"], lw=1.6, label="advance (plain steps)"),
               Line2D([], [], color=colour["taped"], lw=3, label="taped steps"),
               Line2D([], [], color=colour["adjoint"], lw=2, label="adjoint (steps reversed)"),
               Line2D([], [], color=colour["restore"], lw=1, ls=(0, (2, 2)), label="restore"),
               Line2D([], [], color=colour["ram"], marker="o", lw=4, alpha=0.6,
                      label="checkpoint in RAM (held)")]
    if d.snapshots["disk"]:
        handles.append(Line2D([], [], color=colour["disk"], marker="s", lw=4, alpha=0.6,
                              label="checkpoint on disk (held)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
              fontsize=9)
    counts = (f"{d.plain_steps} plain + {d.taped_steps} taped evaluations, at most "
              f"{d.peak_checkpoints} checkpoints in RAM")
    if d.disk_writes:
        counts += f", {d.disk_writes} disk writes, {d.disk_reads} reads"
    ax.set_title(f"{title or d.title}\n{counts}", fontsize=10)
    fig.tight_layout()
    fig.savefig(os.fspath(path))


if __name__ == "__main__":
    sys.exit(main())
