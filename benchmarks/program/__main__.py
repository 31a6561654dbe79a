"""``python -m benchmarks.program``: issue 31's benchmark, bincheck.torch on whole networks against
store-all, torch's checkpointing and torch.compile's activation memory budget; time vs peak.

Workloads (:mod:`.models`): ResNet-18 (batch 8, 64×64), a GPT-2-like transformer (4 layers,
d=256, 4 heads, sequence 128, batch 4, dropout 0.1), a small U-Net (batch 2, 64×64), a TreeLSTM
on a 63-node random tree, the tanh RNN as a plain loop (T=1000, H=256, B=32). Peers
(:mod:`.strategies`): store-all, ``checkpoint`` per block and ``checkpoint_sequential`` with √n
segments (``use_reentrant=False``), torch.compile with ``activation_memory_budget`` 1.0 (its
default), 0.5, 0.2 and 0.05, and on the RNN ``bt.binomial_checkpoint``. bincheck.torch's own rows
(``checkpoint_module`` / ``checkpoint`` under ``memory=``) run where this checkout has that API,
and are marked pending where it does not.

CPU, float32, one thread (``torch.set_num_threads(1)``; inductor compiles in one process).
Default: the issue's sizes, 5 timed rounds. ``--smoke``: tiny sizes, seconds, for the test suite
(writes to a temporary folder unless ``--out`` is given; torch.compile left out unless
``--compile``). Results: ``<mode>.json``, ``.csv``, ``.md``, ``.png`` in ``--out``.
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

RESULTS = os.path.join("benchmarks", "program", "results")
WORKLOADS = ("resnet18", "gpt", "unet", "treelstm", "rnn")
# torch.compile on the RNN would unroll its T=1000 Python loop into one graph: left out of the
# default run (a ResNet-18 compile took 80-125 s here at load 5); --compile-on rnn runs it
NO_COMPILE = {"rnn": "left out of the default run: dynamo would unroll the T=1000 loop into one "
                     "graph (--compile-on rnn runs it)"}
MODES = {
    "smoke": dict(rounds=3, compile=False, binomial=[3], compile_on=list(WORKLOADS)),
    "quick": dict(rounds=5, compile=True, binomial=[10, 50],
                  compile_on=[w for w in WORKLOADS if w not in NO_COMPILE]),
}


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.program",
        description="Gradient time and metered peak of whole networks (ResNet-18, a GPT-2-like "
                    "transformer, a U-Net, a TreeLSTM, a tanh RNN loop) under store-all, "
                    "torch's checkpoint / checkpoint_sequential, torch.compile's activation "
                    "memory budget and bincheck.torch; CPU, float32, one thread.")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes, seconds; for the test suite (no torch.compile unless "
                        "--compile)")
    p.add_argument("--workloads", help=f"comma-separated subset of {','.join(WORKLOADS)}")
    comp = p.add_mutually_exclusive_group()
    comp.add_argument("--compile", dest="compile", action="store_true", default=None,
                      help="run the torch.compile peers (the default but in --smoke)")
    comp.add_argument("--no-compile", dest="compile", action="store_false",
                      help="leave the torch.compile peers out (their rows say so)")
    p.add_argument("--compile-on", help="the workloads the torch.compile peers run on (default: "
                                        "all but rnn; --smoke: all, with --compile)")
    p.add_argument("--rounds", type=int, help="timed rounds (median; at least 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of parameters, inputs and dropout")
    p.add_argument("--out", help=f"output folder (default {RESULTS}; --smoke: a temporary one)")
    p.add_argument("--name", help="results file name (default: the mode, smoke or quick)")
    p.add_argument("--replot", metavar="JSON",
                   help="redraw the table and the plot from an earlier results JSON; no runs")
    args = p.parse_args(argv)
    args.mode = "smoke" if args.smoke else "quick"
    cfg = dict(MODES[args.mode], workloads=list(WORKLOADS))
    if args.workloads:
        cfg["workloads"] = parse_list(p, "--workloads", args.workloads, WORKLOADS)
    if args.compile_on:
        cfg["compile_on"] = parse_list(p, "--compile-on", args.compile_on, WORKLOADS)
    if args.rounds is not None:
        cfg["rounds"] = check_rounds(p, args.rounds)
    if args.compile is not None:
        cfg["compile"] = args.compile
    args.cfg = cfg
    args.name = args.name or args.mode
    args.out = out_folder(args.out, args.smoke, RESULTS, "bincheck-program-smoke-")
    return args


def write_all(out: str, name: str, meta: dict, rows: list) -> str:
    from ..common.files import csv_bytes, json_bytes, write_files
    from .harness import Row
    from .plot import plot_png
    from .report import markdown
    text = markdown(meta, rows)
    png = plot_png(rows, f"bincheck.torch vs torch's checkpointing and torch.compile, "
                         f"{meta['mode']} run {meta['date'][:10]}, CPU float32, "
                         f"{meta['threads']} thread")
    write_files(out, name, {"json": json_bytes(meta, rows), "csv": csv_bytes(rows, Row),
                            "md": text.encode(), "png": png})
    return text


def configure_compile(enabled: bool) -> str:
    """Inductor on one process, without its caches (compile times are honest): returns what the
    rows and the report say about torch.compile here."""
    if not enabled:
        return "left out (--no-compile, or --smoke without --compile)"
    from .strategies import compile_problem
    problem = compile_problem()
    if problem is not None:
        return f"not run here: {problem}"
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    inductor_config.compile_threads = 1
    inductor_config.fx_graph_cache = False
    functorch_config.enable_autograd_cache = False
    return "inductor, C++ on the CPU, one compile thread, no compile caches"


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.replot:
        from .report import rows_from_json
        return replot(args.replot, args.out, rows_from_json, write_all)
    import torch

    from .harness import run_workload
    from .models import make
    from .strategies import COMPILE_BUDGETS, bincheck_missing

    torch.set_num_threads(1)
    cfg = args.cfg
    compile_state = configure_compile(cfg["compile"])
    meta = dict(date=datetime.datetime.now().isoformat(timespec="seconds"), mode=args.mode,
                torch=torch.__version__, bincheck_commit=library_version()[0],
                threads=torch.get_num_threads(), python=platform.python_version(),
                machine=platform.machine(), cpus=os.cpu_count(), load_start=load_average(),
                load_end=None, seconds=None, compile=compile_state,
                bincheck=bincheck_missing() or "issue 31's API present", config=cfg,
                seed=args.seed)
    compile_skip = None if compile_state.startswith("inductor") else compile_state
    t0 = time.perf_counter()
    rows: list = []

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)
    for name in cfg["workloads"]:
        w = make(name, args.mode, args.seed)
        log(f"{name}: {w.describe}")
        skip = compile_skip or (None if name in cfg["compile_on"] else
                                NO_COMPILE.get(name, "left out (--compile-on)"))
        rows += run_workload(w, cfg["rounds"], args.seed, COMPILE_BUDGETS, cfg["binomial"],
                             skip, log)
        meta.update(load_end=load_average(), seconds=time.perf_counter() - t0)
        write_all(args.out, args.name, meta, rows)          # whole files after every workload
    print(write_all(args.out, args.name, meta, rows))
    failed = [r for r in rows if r.status.startswith("FAILED")]
    print(f"{len(rows)} rows in {meta['seconds']:.0f} s; results in {args.out}/{args.name}.*"
          + (f"; {len(failed)} FAILED (gradient mismatch)" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
