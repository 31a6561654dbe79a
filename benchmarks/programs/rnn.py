"""``python -m benchmarks.programs.rnn``: issue 30's benchmark (b), a natural RNN.

A tanh RNN written as a plain Python ``for`` loop (no refactoring), T=1000, H=256, B=32
(``--quick``: T=300), one gradient w.r.t. (W, U, h0): ``checkpoint_program`` with ``memory=``
``binomial_checkpoint``'s measured peak (tracemalloc), beside ``binomial_checkpoint`` on the same
cell written as a step function (num_ckpts 10 and 50) and plain autograd, in interleaved rounds,
one BLAS thread, medians (planning time: of the last timed call). Target: at most 1.15x
binomial_checkpoint's time. Writes ``rnn.md`` (``--quick``: ``rnn-quick.md``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import autograd.numpy as np
import numpy
from autograd import grad

from bincheck import binomial_checkpoint, checkpoint_program

from ..reproduce.common import interleaved_medians, max_rel_err, md_table, peak_mib, write_outputs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.programs.rnn",
                                description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="T=300")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=os.path.join("benchmarks", "programs", "results"))
    args = p.parse_args(argv)
    T, H, B, I = (300 if args.quick else 1000), 256, 32, 256
    rng = numpy.random.RandomState(0)
    W, U = rng.randn(H, H) / numpy.sqrt(H), rng.randn(I, H) / numpy.sqrt(I)
    h0, xs = rng.randn(B, H) * 0.1, rng.randn(T, B, I)

    def natural(W, U, h0):                       # as a user writes it
        h = h0
        for t in range(T):
            h = np.tanh(np.dot(h, W) + np.dot(xs[t], U))
        return np.sum(h ** 2)

    def cell(params, h, x):
        W, U = params
        return np.tanh(np.dot(h, W) + np.dot(x, U))

    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    rows = []
    ref = grad(natural, (0, 1, 2))(W, U, h0)
    for s in (10, 50):
        loop = binomial_checkpoint(cell, T, s)
        hand = lambda W, U, h0, loop=loop: np.sum(loop((W, U), h0, xs) ** 2)  # noqa: E731
        g_hand = grad(hand, (0, 1, 2))
        mem, _ = peak_mib(lambda: g_hand(W, U, h0))
        prog = checkpoint_program(natural, memory=int(mem * 2 ** 20))
        g_prog = grad(prog, (0, 1, 2))
        g_plain = grad(natural, (0, 1, 2))
        times = interleaved_medians([lambda: g_hand(W, U, h0), lambda: g_prog(W, U, h0),
                                     lambda: g_plain(W, U, h0)], args.rounds)
        med = [sorted(t)[len(t) // 2] for t in times]
        ratios = sorted(b / a for a, b in zip(times[0], times[1]))
        plan_s = prog.stats.plan_seconds            # of a timed call (tracemalloc slows it)
        pmem, value = peak_mib(lambda: g_prog(W, U, h0))
        st = prog.stats
        rows.append([s, f"{mem:.2f}", f"{pmem:.2f}", f"{med[0]:.2f}", f"{med[1]:.2f}",
                     f"{med[2]:.2f}", f"{ratios[len(ratios) // 2]:.2f}",
                     f"{st.plain_ops} / {st.taped_ops} of {st.ops}", st.snapshots,
                     f"{st.trace_bytes / st.ops:.0f}", f"{plan_s:.2f}",
                     f"{max_rel_err(value, ref):.1e}"])
        print(rows[-1], flush=True)
    env = (f"Run: `python -m benchmarks.programs.rnn{' --quick' if args.quick else ''}`, "
           f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, load at start {load}, "
           f"BLAS threads 1, {args.rounds} interleaved rounds, T={T}, H={H}, B={B}, I={I}")
    text = ("# A natural RNN: checkpoint_program at binomial_checkpoint's peak\n\n" + env +
            ".\n\n" + md_table(
                ["num_ckpts (binomial)", "binomial peak MiB (the budget)", "program peak MiB",
                 "binomial s", "program s", "plain autograd s", "program / binomial (median "
                 "of rounds)", "program plain / taped ops of ops", "snapshots", "trace B/op",
                 "plan s", "grad max rel err"], rows, "rrrrrrrlrrrr") + "\n")
    print(text)
    for path in write_outputs(args.out, {f"rnn{'-quick' if args.quick else ''}.md":
                                         text.encode()}):
        print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
