"""Command line: ``python -m bincheck plan SEQ_LEN NUM_CKPTS`` prints a plan's summary;
``python -m bincheck plan SEQ_LEN --memory 50MB --state-bytes 256KB`` plans within bytes.
``--actions`` lists the actions, ``--draw`` draws them in the terminal (one row per action) and
``--plot FILE`` draws the Revolve diagram into an image (matplotlib).

Planning only: it needs neither autograd nor numpy (``--plot`` needs matplotlib).
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from .schedule.budget import Sizes, format_bytes, memory_for, parse_bytes, plan
from .schedule.render import MAX_TEXT_STEPS, draw_text
from .schedule.validate import short_repr

_DIGITS = re.compile(r"[0-9]+")


def _positive_int(text: str) -> int:
    # Plain ASCII decimal digits only: int() would also take " 12", "+12", "1_000" and other
    # scripts' digits, none of which a user means as a step count.
    if not _DIGITS.fullmatch(text) or int(text) < 1:
        raise argparse.ArgumentTypeError(
            f"expected a positive integer in decimal digits, got {short_repr(text, 40)}")
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
                   "(time vs state index) into FILE: .png, .svg or .pdf (needs matplotlib)")
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
    return parser, p


def main(argv: list[str] | None = None) -> int:
    parser, sub = _parsers()
    args = parser.parse_args(argv)
    sized = any(v is not None for v in (args.memory, args.state_bytes, args.tape_bytes,
                                        args.step_seconds, args.taped_step_seconds,
                                        args.max_slowdown)) or args.work_bytes
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
        from .schedule.render import plot
        try:
            plot(schedule, args.plot)
        except ImportError as err:
            print(f"python -m bincheck: {err}", file=sys.stderr)
            return 1
        except (OSError, ValueError) as err:
            print(f"python -m bincheck: cannot draw into {args.plot!r}: {err}", file=sys.stderr)
            return 1
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
