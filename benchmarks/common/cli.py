"""Command-line helpers: the machine's load, the checkout's commit, argument checks."""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from typing import Callable


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as /proc/loadavg gives them ("unknown" elsewhere)."""
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"


def library_version(paths: tuple[str, ...] = ("bincheck",)) -> tuple[str, list[str]]:
    """The checkout's commit, with "+dirty" when ``paths`` (what the benchmark runs) have
    uncommitted changes, and the files that differ."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", *paths],
                               capture_output=True, text=True, timeout=10).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return "unknown", []
    dirty = [line[3:] for line in dirty if line.strip()]
    return (head or "unknown") + ("+dirty" if dirty else ""), dirty


def parse_list(p: argparse.ArgumentParser, option: str, text: str,
               allowed: tuple[str, ...]) -> list[str]:
    """A comma-separated subset of ``allowed``, or a usage error naming them."""
    items = [c.strip() for c in text.split(",") if c.strip()]
    bad = [c for c in items if c not in allowed]
    if bad or not items:
        p.error(f"{option}: expected a subset of {','.join(allowed)}; got {text!r}")
    return items


def check_rounds(p: argparse.ArgumentParser, rounds: int) -> int:
    if rounds < 3:
        p.error(f"--rounds must be at least 3 (the time is a median); got {rounds}")
    return rounds


def out_folder(out: str | None, smoke: bool, results: str, prefix: str) -> str:
    """``--out``, else a temporary folder for a smoke run, else the committed results folder."""
    if out is not None:
        return out
    return tempfile.mkdtemp(prefix=prefix) if smoke else results


def replot(path: str, out: str, read: Callable, write: Callable) -> int:
    """``--replot``: the report and the plot again from a results JSON (``read(path)`` gives
    what ``write(out, name, ...)`` takes after the name), named as that JSON; no runs."""
    name = os.path.splitext(os.path.basename(path))[0]
    print(write(out, name, *read(path)))
    return 0
