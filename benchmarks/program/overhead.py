"""What recording costs per op: the recorded forward of ``bt.checkpoint`` against the plain
forward and against an empty ``TorchDispatchMode`` (torch's own cost of Python dispatch).

``python -m benchmarks.program.overhead [--out DIR] [--name NAME] [--label LABEL]``: the
benchmark's five workloads at their quick sizes (``models.py``), one thread; per workload the
median of 7 interleaved rounds of the plain forward, the forward under a mode that only calls
each op, and ``bincheck.torch.recorder.record`` (the recorder and its saved-tensor hook, no plan),
after 2 warm rounds each. Writes ``results/<name>.{csv,md}`` (default ``overhead``); ``--label``
names the code measured (run it with ``PYTHONPATH`` at another checkout to compare)."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.program import models as M
from benchmarks.program.report import write_table

HERE = os.path.dirname(os.path.abspath(__file__))


class _Calls(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _timed(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def measure(name: str, rounds: int = 7) -> dict:
    from bincheck.torch.recorder import record
    w = M.make(name, "quick")
    forward = (lambda: w.extra["run"](w.inputs[1])) if name == "rnn" else (lambda: w.apply(w.model))

    def in_mode():
        with _Calls():
            forward()

    def recorded():
        record(forward, (), {}, True, lambda saved: None)
    ways = {"plain": forward, "mode": in_mode, "recorded": recorded}
    for _ in range(2):
        for f in ways.values():
            _timed(f)
    times = {k: [] for k in ways}
    for _ in range(rounds):
        for k, f in ways.items():
            times[k].append(_timed(f))
    ops = record(forward, (), {}, True, lambda saved: None)[0].n
    med = {k: statistics.median(v) for k, v in times.items()}
    return dict(workload=name, ops=ops, plain_ms=round(1e3 * med["plain"], 2),
                plain_us_per_op=round(1e6 * med["plain"] / ops, 1),
                mode_us_per_op=round(1e6 * (med["mode"] - med["plain"]) / ops, 1),
                recorder_us_per_op=round(1e6 * (med["recorded"] - med["mode"]) / ops, 1),
                recorded_over_plain=round(med["recorded"] / med["plain"], 2))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--name", default="overhead")
    p.add_argument("--label", default=None, help="the code measured (default: git's HEAD)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    label = args.label or subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                         capture_output=True, text=True).stdout.strip()
    rows = []
    for name in M.NAMES:
        rows.append(dict(code=label, **measure(name)))
        print(rows[-1], flush=True)
    write_table(args.out, args.name, f"Recording's cost per op, bincheck at {label}", [
        ("workload", False, lambda r: r["workload"]),
        ("ops", True, lambda r: str(r["ops"])),
        ("plain forward ms", True, lambda r: str(r["plain_ms"])),
        ("plain µs/op", True, lambda r: str(r["plain_us_per_op"])),
        ("empty mode +µs/op", True, lambda r: str(r["mode_us_per_op"])),
        ("recorder +µs/op", True, lambda r: str(r["recorder_us_per_op"])),
        ("recorded / plain", True, lambda r: str(r["recorded_over_plain"]))], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
