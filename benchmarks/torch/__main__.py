"""``python -m benchmarks.torch``: bincheck.torch against torch's checkpointing, time vs memory.

Quick default (about 2 minutes on 2 cores): the tanh cell, T=1000, H=256, B=32, I=256, every
strategy, 3 timed rounds. ``--full``: tanh, LSTM and GRU, 5 rounds, budgets at 5 % and 2 % of
store-all. ``--smoke``: tiny sizes, a few seconds, for the test suite (writes to a temporary
folder unless ``--out`` is given). One thread (``torch.set_num_threads(1)``), float32, CPU.

``--device cuda`` runs the same on the current CUDA device: times synchronised, peaks from CUDA's
caching allocator, and the ``memory=`` fractions once more with ``offload=True`` (states beyond
the budget in pinned host memory). Its results are named ``<mode>-cuda.*``. ``--hidden`` and
``--batch`` change the sizes (the name then says them).
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
    "smoke": dict(cells=["tanh", "lstm"], seq_len=20, hidden=16, batch=4, input_size=16,
                  num_ckpts=[3, 5], fractions=[0.05], rounds=3),
    "quick": dict(cells=["tanh"], seq_len=1000, hidden=256, batch=32, input_size=256,
                  num_ckpts=[10, 20, 50], fractions=[0.05], rounds=3),
    "full": dict(cells=["tanh", "lstm", "gru"], seq_len=1000, hidden=256, batch=32,
                 input_size=256, num_ckpts=[10, 20, 50], fractions=[0.05, 0.02], rounds=5),
}
RESULTS = os.path.join("benchmarks", "torch", "results")


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.torch",
        description="Gradient time and metered peak memory of bincheck.torch and torch's "
                    "checkpointing (store-all, checkpoint per step, checkpoint_sequential, "
                    "nested checkpoint) on RNN cells, CPU, float32, one thread. Without "
                    "options: the quick run (tanh, T=1000, H=256, B=32).")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--full", action="store_true",
                      help="tanh, LSTM and GRU; 5 rounds; memory= at 5 %% and 2 %% of store-all")
    mode.add_argument("--smoke", action="store_true",
                      help="tiny sizes (T=20, H=16), seconds; for the test suite")
    p.add_argument("--cells", help="comma-separated subset of tanh,lstm,gru")
    p.add_argument("--rounds", type=int, help="timed rounds (median; at least 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of parameters and inputs")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the tensors live (cuda: the current CUDA device; adds memory= "
                        "runs with offload=True)")
    p.add_argument("--hidden", type=int, help="hidden size H (default: the mode's)")
    p.add_argument("--batch", type=int, help="batch size B (default: the mode's)")
    p.add_argument("--out", help=f"output folder (default {RESULTS}; --smoke: a temporary one)")
    p.add_argument("--replot", metavar="JSON",
                   help="redraw the table and the plot from an earlier results JSON; no runs")
    args = p.parse_args(argv)
    args.mode = "full" if args.full else "smoke" if args.smoke else "quick"
    cfg = dict(MODES[args.mode])
    if args.cells:
        cfg["cells"] = parse_list(p, "--cells", args.cells, ("tanh", "lstm", "gru"))
    if args.rounds is not None:
        cfg["rounds"] = check_rounds(p, args.rounds)
    for key in ("hidden", "batch"):
        value = getattr(args, key)
        if value is not None:
            if value < 1:
                p.error(f"--{key} must be at least 1; got {value}")
            cfg[key] = value
    args.cfg = cfg
    args.name = args.mode + ("-cuda" if args.device == "cuda" else "") + "".join(
        f"-{k[0].upper()}{getattr(args, k)}" for k in ("hidden", "batch")
        if getattr(args, k) is not None)
    return args


def _out(args) -> str:
    """The results folder: ``--out``, else a new temporary one for a smoke run (made only once the
    run is known to go ahead: a refused ``--device cuda`` left an empty one behind), else
    RESULTS."""
    return out_folder(args.out, args.smoke, RESULTS, "bincheck-torch-smoke-")


def write_all(out: str, name: str, meta: dict, rows) -> str:
    where = (f"{meta['device_name']} float32" if meta.get("device_name") else
             f"CPU float32, {meta['threads']} thread(s)")
    meter = ("CUDA caching allocator" if meta.get("device_name") else
             "profiler allocation events")
    from ..common.files import csv_bytes, json_bytes, write_files
    from .harness import Row
    from .plot import plot_png
    from .report import markdown
    text = markdown(meta, rows)
    png = plot_png(rows, f"bincheck.torch vs torch checkpointing, {meta['mode']} run "
                         f"{meta['date'][:10]}, {where}", meter)
    write_files(out, name, {"json": json_bytes(meta, rows), "csv": csv_bytes(rows, Row),
                            "md": text.encode(), "png": png})
    return text


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.replot:
        from .report import rows_from_json
        return replot(args.replot, _out(args), rows_from_json, write_all)
    import torch
    from tqdm import tqdm

    from .harness import expected_ticks, run_cell
    from .strategies import Problem

    torch.set_num_threads(1)
    cfg = args.cfg
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False)",
              file=sys.stderr)
        return 2
    args.out = _out(args)
    meta = dict(date=datetime.datetime.now().isoformat(timespec="seconds"), mode=args.mode,
                ratios="per-round",
                torch=torch.__version__, bincheck_commit=library_version()[0],
                threads=torch.get_num_threads(), device=args.device,
                device_name=(torch.cuda.get_device_name() if args.device == "cuda" else None),
                python=platform.python_version(), machine=platform.machine(),
                cpus=os.cpu_count(), load_start=load_average(), load_end=None, seconds=None,
                config={k: v for k, v in cfg.items()}, seed=args.seed)
    t0 = time.perf_counter()
    rows = []
    total = len(cfg["cells"]) * expected_ticks(cfg["num_ckpts"], cfg["fractions"],
                                               cfg["rounds"], args.device == "cuda")
    with tqdm(total=total, desc="benchmark", unit="run", file=sys.stderr) as bar:
        for cell in cfg["cells"]:
            bar.set_postfix_str(cell)
            prob = Problem(cell, cfg["seq_len"], cfg["hidden"], cfg["batch"],
                           cfg["input_size"], args.seed, args.device)
            rows += run_cell(prob, cfg["num_ckpts"], cfg["fractions"], cfg["rounds"], bar)
            meta.update(load_end=load_average(), seconds=time.perf_counter() - t0)
            write_all(args.out, args.name, meta, rows)     # whole files after every cell
    print(write_all(args.out, args.name, meta, rows))
    failed = [r for r in rows if r.status.startswith("FAILED")]
    print(f"{len(rows)} runs in {meta['seconds']:.0f} s; results in {args.out}/{args.name}.*"
          + (f"; {len(failed)} FAILED (gradient mismatch)" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
