"""Command line: ``python -m bincheck plan SEQ_LEN NUM_CKPTS`` prints a plan's summary."""

from __future__ import annotations

import argparse
import sys

from .schedule.binomial import plan


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bincheck",
                                     description="Binomial checkpointing schedules.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="summarise the optimal schedule for SEQ_LEN steps")
    p.add_argument("seq_len", type=_positive_int, help="number of steps")
    p.add_argument("num_ckpts", type=_positive_int,
                   help="states held at once, the initial state included")
    p.add_argument("--actions", action="store_true", help="also list every action (small plans)")
    args = parser.parse_args(argv)
    schedule = plan(args.seq_len, args.num_ckpts)
    print(schedule)
    if args.actions:
        for action in schedule:
            print(" ", action)
    return 0


if __name__ == "__main__":
    sys.exit(main())
