"""bincheck against a minimal replay of the same schedule: the library's own overhead.

``python -m benchmarks.torch.replay`` times, on the benchmark's problem (T=1000, H=256, B=32,
I=256, float32, one thread, CPU), a gradient through ``bt.binomial_checkpoint(fn, T, s)`` and
through a hand-written replay of the same plan's actions (``bincheck.plan(T, s)``): a dict of
snapshots, plain steps under ``no_grad``, and for each ``Reverse`` the step taped from a detached
state and the engine's backward into the parameters and that state (``meter.engine_backward``,
as bincheck's sweep calls it); no guards, no RNG
states, no statistics. Both run the same plain and taped steps, so their ratio is what the
library adds. The per-step bound of target (b) (``meter.step_costs``) is measured in the same
rounds. Gradients are checked against store-all's (the plain loop) first. Rounds interleave
the two (the order alternates); ratios are per-round medians. Writes
``benchmarks/torch/results/replay.{json,md}``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

import torch

import bincheck
import bincheck.torch as bt
from bincheck.schedule.actions import Advance, Free, Restore, Reverse, Snapshot

from ..common.cli import load_average
from ..common.files import write_results
from ..common.ratios import paired
from .harness import max_rel_err
from .meter import engine_backward, step_costs
from .strategies import Problem


def hand_replay(prob: Problem, s: int):
    """The gradient by a minimal replay of ``bincheck.plan(T, s)`` (see the module docstring)."""
    actions = list(bincheck.plan(prob.seq_len, s))
    cell, xs, params = prob.cell, prob.xs, prob.params

    def leaves(state):
        return list(state) if prob.lstm else [state]

    def pack(ls):
        return tuple(ls) if prob.lstm else ls[0]

    def gradient():
        store, live, adjoint = {}, prob.state0, None
        for a in actions:
            kind = type(a)
            if kind is Advance:
                with torch.no_grad():
                    for t in range(a.start, a.stop):
                        live = prob.step(cell, live, xs[t])
            elif kind is Snapshot:
                store[a.index] = live
            elif kind is Restore:
                live = store[a.index]
            elif kind is Free:
                del store[a.index]
            elif kind is Reverse:
                ins = [v.detach().requires_grad_() for v in leaves(live)]
                with torch.enable_grad():
                    out = pack(ins)
                    for t in range(a.start, a.stop):
                        out = prob.step(cell, out, xs[t])
                outs = leaves(out)
                if adjoint is None:             # d loss / d final state
                    adjoint = [2 * outs[0].detach()] + [torch.zeros_like(o) for o in outs[1:]]
                engine_backward(outs, adjoint, params + ins)
                adjoint = [v.grad for v in ins]
                live = None
    return gradient


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.torch.replay",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", default="tanh,lstm,gru")
    ap.add_argument("--num-ckpts", default="10,20,50")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=os.path.join("benchmarks", "torch", "results"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    t_start, load_start = time.time(), load_average()
    rows = []
    for cell in args.cells.split(","):
        prob = Problem(cell, 1000, 256, 32, 256)
        prob.zero_grad()
        state = prob.state0
        for t in range(prob.seq_len):                          # store-all: the plain loop
            state = prob.step(prob.cell, state, prob.xs[t])
        prob.loss(state).backward()
        ref = prob.grads()
        cases = []
        for s in (int(v) for v in args.num_ckpts.split(",")):
            loop = bt.binomial_checkpoint(prob.step, prob.seq_len, s)

            def lib(loop=loop):
                prob.loss(loop(prob.cell, prob.state0, prob.xs)).backward()
            hand = hand_replay(prob, s)
            errs = []
            for f in (lib, hand):
                prob.zero_grad()
                f()
                errs.append(max_rel_err(prob.grads(), ref))
            plan = bincheck.plan(prob.seq_len, s)
            cases.append(dict(s=s, lib=lib, hand=hand, errs=errs, plan=plan,
                              t_lib=[], t_hand=[], bounds=[], fresh=[]))
        for k in range(args.rounds):
            plain, taped, fresh = step_costs(prob)
            for case in cases:
                order = (("lib", case["lib"]), ("hand", case["hand"]))
                for name, f in (order if k % 2 == 0 else order[::-1]):
                    prob.zero_grad()
                    gc.collect()
                    t0 = time.perf_counter()
                    f()
                    case[f"t_{name}"].append(time.perf_counter() - t0)
                case["bounds"].append(case["plan"].plain_steps * plain +
                                      prob.seq_len * taped)
                case["fresh"].append(case["plan"].plain_steps * plain + prob.seq_len * fresh)
            print(f"{cell}: round {k + 1}/{args.rounds}", file=sys.stderr, flush=True)
        for case in cases:
            rows.append(dict(
                cell=cell, num_ckpts=case["s"], plain_steps=case["plan"].plain_steps,
                max_rel_err_bincheck=case["errs"][0], max_rel_err_hand=case["errs"][1],
                bincheck_s=statistics.median(case["t_lib"]),
                hand_s=statistics.median(case["t_hand"]),
                bound_s=statistics.median(case["bounds"]),
                bincheck_over_hand=paired(case["t_lib"], case["t_hand"]),
                hand_over_bound=paired(case["t_hand"], case["bounds"]),
                bincheck_over_bound=paired(case["t_lib"], case["bounds"]),
                hand_over_fresh_bound=paired(case["t_hand"], case["fresh"]),
                bincheck_over_fresh_bound=paired(case["t_lib"], case["fresh"]),
                times_bincheck_s=case["t_lib"], times_hand_s=case["t_hand"],
                bounds_s=case["bounds"]))
    meta = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                torch=torch.__version__, threads=1, rounds=args.rounds,
                load_start=load_start, load_end=load_average(),
                seconds=round(time.time() - t_start, 1),
                problem="T=1000, H=256, B=32, I=256, float32, CPU")
    lines = [f"# bincheck against a minimal replay of its plan ({meta['date']})", "",
             f"{meta['problem']}, one thread, torch {meta['torch']}; medians of "
             f"{args.rounds} interleaved rounds, ratios per round; load {meta['load_start']} "
             f"at the start, {meta['load_end']} at the end; {meta['seconds']} s. The bound's "
             f"taped step is the engine's backward into the parameters' running sums, as every "
             f"reverse sweep needs, without `torch.autograd.backward`'s argument checks (the "
             f"replay and bincheck's sweep call the engine the same way); the last column's "
             f"bound times taped steps with `autograd.grad` into fresh tensors, the bound of "
             f"results before 2026-11-24.", "",
             "| cell | num_ckpts | plain steps | grad err bincheck / replay | bincheck s "
             "| replay s | bound s | bincheck / replay | replay / bound | bincheck / bound "
             "| bincheck / bound without the sums |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['cell']} | {r['num_ckpts']} | {r['plain_steps']} "
            f"| {r['max_rel_err_bincheck']:.1e} / {r['max_rel_err_hand']:.1e} "
            f"| {r['bincheck_s']:.3f} | {r['hand_s']:.3f} | {r['bound_s']:.3f} "
            f"| {r['bincheck_over_hand']:.2f}× | {r['hand_over_bound']:.2f}× "
            f"| {r['bincheck_over_bound']:.2f}× | {r['bincheck_over_fresh_bound']:.2f}× |")
    write_results(args.out, "replay", meta, rows, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
