"""Command line: ``python -m bincheck plan SEQ_LEN NUM_CKPTS`` prints a plan's summary.

Planning only: it needs neither autograd nor numpy.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from .schedule.binomial import plan
from .schedule.validate import short_repr

_DIGITS = re.compile(r"[0-9]+")


def _positive_int(text: str) -> int:
    # Plain ASCII decimal digits only: int() would also take " 12", "+12", "1_000" and other
    # scripts' digits, none of which a user means as a step count.
    if not _DIGITS.fullmatch(text) or int(text) < 1:
        raise argparse.ArgumentTypeError(
            f"expected a positive integer in decimal digits, got {short_repr(text, 40)}")
    return int(text)


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
    try:
        print(schedule)
        if args.actions:
            for action in schedule:
                print(" ", action)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (``... | head``): stop quietly, as Unix tools do. Point stdout at
        # devnull so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
