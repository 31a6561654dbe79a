"""``python -m benchmarks.reproduce``: published checkpointing claims, reproduced side by side.

Parts: ``sargent`` (his LSTM and RNN settings like for like, and the mismatch between his two
LSTM scripts), ``siskind`` (Siskind & Pearlmutter's nested loop: peak memory and evaluations
vs n) and ``gruslys`` (Gruslys et al.'s cost model for T = 1000 next to bincheck measured at the
same budgets). ``--quick`` runs in a few minutes on 2 cores; see benchmarks/reproduce/README.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

PARTS = ("sargent", "siskind", "gruslys")
THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _parts(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list of parts")
    for item in items:
        if item not in PARTS:
            raise argparse.ArgumentTypeError(f"{item!r} is not one of {', '.join(PARTS)}")
    return list(dict.fromkeys(items))


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}; got {value}")
        return value
    return parse


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.reproduce",
        description="Reproduce published checkpointing claims side by side with bincheck: "
                    "Sargent's autograd LSTM/RNN settings, Siskind & Pearlmutter's nested "
                    "loop and Gruslys et al.'s memory/time curves. Writes <part>.csv, <part>.md "
                    "and <part>.png into --out.")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true",
                      help="a few minutes on 2 cores: 3 timing repeats; nested loop up to n=1e4; "
                           "Gruslys cells at H=64, B=16 (default: 5 repeats, n up to 1e5, "
                           "H=256, B=32)")
    size.add_argument("--smoke", action="store_true",
                      help="seconds: tiny sizes for tests; the numbers mean nothing")
    p.add_argument("--out", default=os.path.join("benchmarks", "reproduce", "out"),
                   help="output folder (default: benchmarks/reproduce/out)")
    p.add_argument("--only", type=_parts, default=list(PARTS),
                   help=f"comma-separated subset of {','.join(PARTS)} (default: all)")
    p.add_argument("--repeats", type=_int_at_least(3),
                   help="timed gradients per variant in parts sargent and gruslys (median; >= 3)")
    p.add_argument("--seed", type=_int_at_least(0), default=0, help="RNG seed (default 0)")
    p.add_argument("--blas-threads", type=_int_at_least(1), default=1,
                   help="BLAS threads (default 1: on a shared 2-core machine OpenBLAS threads "
                        "spin-wait; set before numpy loads)")
    args = p.parse_args(argv)
    if args.repeats is None:
        args.repeats = 3 if (args.quick or args.smoke) else 5
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    for var in THREAD_VARS:                    # before numpy is imported anywhere
        os.environ[var] = str(args.blas_threads)
    import platform

    import numpy

    from . import gruslys, sargent, siskind
    from .common import write_outputs

    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "n/a"
    env = (f"Run: `python -m benchmarks.reproduce{' --' + mode if mode != 'full' else ''}` "
           f"({mode}), {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, load average "
           f"at start {load}, Python {platform.python_version()}, numpy {numpy.__version__}, "
           f"BLAS threads {args.blas_threads}, seed {args.seed}; timings are from a shared "
           f"machine and are not final")
    print(env + "\n", flush=True)
    log = lambda msg: print(msg, flush=True)     # noqa: E731
    t0 = time.perf_counter()
    failed = 0
    for part in args.only:
        files: dict[str, bytes] = {}
        if part == "sargent":
            rows = sargent.run(files, args.quick, args.smoke, args.repeats, args.seed, env, log)
        elif part == "siskind":
            rows = siskind.run(files, args.quick, args.smoke, args.seed, env, log)
        else:
            rows = gruslys.run(files, args.quick, args.smoke, args.repeats, args.seed, env, log)
        failed += sum(r["status"].startswith("FAILED") for r in rows)
        for path in write_outputs(args.out, files):
            log(f"wrote {path}")
        md = files.get(f"{part}.md")
        if md:
            print("\n" + md.decode())
    print(f"done in {time.perf_counter() - t0:.0f} s"
          f"{'' if not failed else f'; {failed} FAILED (gradient or count mismatch)'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
