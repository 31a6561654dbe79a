"""``python -m benchmarks.jax``: bincheck.jax against lax.scan, jax.checkpoint remat, nested √T
remat and Equinox's checkpointed while loop; time, XLA temporaries, step evaluations.

Quick default (about 3 minutes on the 2-core VM): tanh, LSTM and GRU cells, T=1000, H=128,
B=32, I=128, 3 timed rounds, then a small bounded-while-loop table. ``--full``: the issue's
H=256, I=256, 5 rounds (the while-loop table at H=256 too). ``--smoke``: tiny sizes, for the test
suite (writes to a temporary folder unless ``--out`` is given). ``--while``: only the while-loop
table (to ``while-<mode>.*``); ``--no-while``: only the RNN one. float32, CPU, XLA on one core:
the process is pinned to one CPU before jax is imported (:func:`pin_xla`); ``--all-cores``
leaves every CPU to XLA (results to ``<mode>-allcores.*``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time

from ..common.cli import (check_rounds, library_version, load_average, out_folder, parse_list,
                          replot)

MODES = {
    "smoke": dict(cells=["lstm"], seq_len=20, hidden=8, batch=2, input_size=8,
                  num_ckpts=[3], fractions=[0.05], rounds=3),
    "quick": dict(cells=["tanh", "lstm", "gru"], seq_len=1000, hidden=128, batch=32,
                  input_size=128, num_ckpts=[10, 20, 50], fractions=[0.05], rounds=3),
    "full": dict(cells=["tanh", "lstm", "gru"], seq_len=1000, hidden=256, batch=32,
                 input_size=256, num_ckpts=[10, 20, 50], fractions=[0.05], rounds=5),
}
WHILE_MODES = {
    "smoke": dict(max_steps=40, hidden=8, batch=2, input_size=8, num_ckpts=[3], rounds=3),
    "quick": dict(max_steps=1000, hidden=32, batch=8, input_size=32, num_ckpts=[10], rounds=3),
    "full": dict(max_steps=1000, hidden=256, batch=32, input_size=256, num_ckpts=[10, 50],
                 rounds=5),
}
RESULTS = os.path.join("benchmarks", "jax", "results")
XLA_ONE_THREAD = ("--xla_cpu_multi_thread_eigen=false",)
INSTALL = 'pip install -e ".[jaxbench]"'
# what bincheck.jax imports: a change elsewhere in bincheck/ does not change these results
LIBRARY = ("bincheck/jax", "bincheck/schedule", "bincheck/runtime", "bincheck/__init__.py")


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.jax",
        description="Gradient time, XLA temporaries and step evaluations of bincheck.jax, "
                    "lax.scan, scan of jax.checkpoint, nested √T remat and Equinox's "
                    "checkpointed while loop on RNN cells, then the bounded-while-loop table; "
                    "CPU, float32, XLA on one core. Without options: the quick run (tanh, "
                    "LSTM, GRU; T=1000, H=128, B=32; a small while-loop table).")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--full", action="store_true",
                      help="the issue's sizes: T=1000, H=256, B=32, I=256; 5 rounds (and the "
                           "while-loop table at H=256)")
    mode.add_argument("--smoke", action="store_true",
                      help="tiny sizes (T=20, H=8), seconds; for the test suite")
    part = p.add_mutually_exclusive_group()
    part.add_argument("--while", dest="while_only", action="store_true",
                      help="only the bounded-while-loop table (n << m and n ~ m), written to "
                           "while-<mode>.*")
    part.add_argument("--no-while", action="store_true", help="only the RNN table")
    p.add_argument("--cells", help="comma-separated subset of tanh,lstm,gru")
    p.add_argument("--keep-segments", action="store_true",
                   help="each bincheck memory= run also with keep_segments=True (kept taped "
                        "segments), side by side; results written to <mode>-segments.*")
    p.add_argument("--all-cores", action="store_true",
                   help="do not pin the process to one CPU: XLA's YNNPACK thread pool uses "
                        "every CPU the process may use (Eigen stays single-threaded); results "
                        "written to <mode>-allcores.*")
    p.add_argument("--rounds", type=int, help="timed rounds (median; at least 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of parameters and inputs")
    p.add_argument("--out", help=f"output folder (default {RESULTS}; --smoke: a temporary one)")
    p.add_argument("--replot", metavar="JSON",
                   help="redraw the table (and the plot) from an earlier results JSON; no runs")
    args = p.parse_args(argv)
    args.mode = "full" if args.full else "smoke" if args.smoke else "quick"
    cfg, wcfg = dict(MODES[args.mode]), dict(WHILE_MODES[args.mode])
    if args.cells:
        cfg["cells"] = parse_list(p, "--cells", args.cells, ("tanh", "lstm", "gru"))
    if args.rounds is not None:
        cfg["rounds"] = wcfg["rounds"] = check_rounds(p, args.rounds)
    args.cfg = None if args.while_only else cfg
    args.while_cfg = None if args.no_while else wcfg
    return args


def _out(args) -> str:
    """``--out``, else a new temporary folder for a smoke run (made once the run goes ahead: one
    refused for a missing peer left an empty one behind), else RESULTS."""
    return out_folder(args.out, args.smoke, RESULTS, "bincheck-jax-smoke-")


def pin_xla(all_cores: bool = False) -> tuple[str, list[int] | None]:
    """XLA on one core, and the CPU backend: set before jax is imported. Returns the flags and
    the CPUs the process may run on.

    ``XLA_FLAGS`` alone do not make XLA single-threaded: jax 0.10's CPU backend runs its
    YNNPACK fusions (the dots) on a thread pool sized from the CPUs the process may use, and
    with two CPUs both were busy (profiles of bincheck and Equinox on 2026-11-24 showed
    ``SlinkyThreadPool::Await``, a thread waiting for the pool's other worker). So the process
    is pinned to one CPU, which sizes that pool to one thread."""
    flags = os.environ.get("XLA_FLAGS", "").split()
    flags += [f for f in XLA_ONE_THREAD if f not in flags]
    os.environ["XLA_FLAGS"] = " ".join(flags)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if not hasattr(os, "sched_getaffinity"):
        print("benchmarks.jax: this platform cannot pin a process to a CPU; XLA uses every core",
              file=sys.stderr)
        return os.environ["XLA_FLAGS"], None
    cpus = sorted(os.sched_getaffinity(0))
    if not all_cores and len(cpus) > 1:
        try:
            os.sched_setaffinity(0, {cpus[-1]})
            cpus = [cpus[-1]]
        except OSError as err:
            print(f"benchmarks.jax: could not pin to CPU {cpus[-1]} ({err}); XLA uses "
                  f"{len(cpus)} CPUs", file=sys.stderr)
    return os.environ["XLA_FLAGS"], cpus


def import_peers():
    """jax and Equinox, or a usable error naming the extra that installs them."""
    try:
        import jax
        import equinox
    except ImportError as err:
        raise SystemExit(f"benchmarks.jax needs jax and Equinox (the peer): {INSTALL}  "
                         f"({err})") from None
    return jax, equinox


def write_all(out: str, name: str, meta: dict, rows: list, while_rows: list | None) -> str:
    from ..common.files import json_bytes, write_files
    from .plot import plot_png
    from .report import cores_label, markdown
    text = markdown(meta, rows, while_rows)
    png = plot_png(rows, f"bincheck.jax vs lax.scan, remat and Equinox, {meta['mode']} run "
                         f"{meta['date'][:10]}, CPU float32, {cores_label(meta)}") if rows else None
    write_files(out, name, {"json": json_bytes(meta, rows, while_rows=while_rows),
                            "md": text.encode(), "png": png})
    return text


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.replot:
        from .report import rows_from_json
        return replot(args.replot, _out(args), rows_from_json, write_all)
    xla_flags, cpus = pin_xla(args.all_cores)
    jax, equinox = import_peers()
    args.out = _out(args)
    name = f"while-{args.mode}" if args.cfg is None else args.mode
    if args.keep_segments and args.cfg is not None:
        name += "-segments"
    if args.all_cores:
        name += "-allcores"
    commit, dirty = library_version(LIBRARY)
    meta = dict(date=datetime.datetime.now().isoformat(timespec="seconds"), mode=args.mode,
                part="while" if args.cfg is None else "rnn" if args.while_cfg is None else
                "all", jax=jax.__version__, equinox=equinox.__version__,
                bincheck_commit=commit, bincheck_dirty=dirty, xla_flags=xla_flags,
                python=platform.python_version(), machine=platform.machine(),
                cpus=os.cpu_count(), cpu_affinity=cpus, load_start=load_average(),
                load_end=None, seconds=None,
                config=args.cfg, while_config=args.while_cfg, seed=args.seed)
    t0 = time.perf_counter()
    rows: list = []
    while_rows = None

    def save() -> str:
        meta.update(load_end=load_average(), seconds=time.perf_counter() - t0)
        return write_all(args.out, name, meta, rows, while_rows)   # whole files every time

    if args.cfg is not None:
        from .harness import run_cell
        from .problem import Problem
        cfg = args.cfg
        for cell in cfg["cells"]:
            prob = Problem(cell, cfg["seq_len"], cfg["hidden"], cfg["batch"],
                           cfg["input_size"], args.seed)
            print(f"{cell}: {prob.describe()}", file=sys.stderr)
            rows += run_cell(prob, cfg["num_ckpts"], cfg["fractions"], cfg["rounds"],
                             keep_segments=args.keep_segments)
            save()
    if args.while_cfg is not None:
        from .whileloop import run_while
        w = args.while_cfg
        print(f"while loop: m={w['max_steps']}, H={w['hidden']}, B={w['batch']}",
              file=sys.stderr)
        while_rows = run_while(w["max_steps"], w["hidden"], w["batch"], w["input_size"],
                               w["num_ckpts"], w["rounds"], args.seed)
    print(save())
    failed = [r for r in rows + (while_rows or []) if r.status.startswith("FAILED")]
    print(f"{len(rows)} RNN runs, {len(while_rows or [])} while-loop strategies in "
          f"{meta['seconds']:.0f} s; results in {args.out}/{name}.*"
          + (f"; {len(failed)} FAILED (gradient mismatch)" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
