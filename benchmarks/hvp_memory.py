"""``python -m benchmarks.hvp_memory``: tracemalloc peak of a Hessian-vector product through a
seq_len=1000 tanh RNN, bincheck (num_ckpts=10) vs the plain loop, with the results compared."""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc

import autograd.numpy as np
import numpy
from autograd import hessian_vector_product

from bincheck import binomial_checkpoint


def cell(params, h, x):
    W, U, b = params
    return np.tanh(np.dot(h, W) + np.dot(x, U) + b)


def peak(fn, *args):
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    out = fn(*args)
    wall = time.perf_counter() - t0
    result = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return result, wall, out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.hvp_memory", description=__doc__)
    p.add_argument("--seq-len", type=int, default=1000)
    p.add_argument("--num-ckpts", type=int, default=10)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    a = p.parse_args(argv)
    if min(a.seq_len, a.num_ckpts, a.hidden, a.batch) < 1:
        p.error("all sizes must be positive integers")
    rng = numpy.random.RandomState(0)
    H, B, T = a.hidden, a.batch, a.seq_len
    W, U, b = rng.randn(H, H) * 0.4 / numpy.sqrt(H) * 3, rng.randn(8, H) * 0.4, rng.randn(H) * 0.1
    h0, xs = rng.randn(B, H), rng.randn(T, B, 8)
    loop = binomial_checkpoint(cell, T, a.num_ckpts)

    def plain(params):
        h = h0
        for t in range(T):
            h = cell(params, h, xs[t])
        return h
    f = lambda W: np.sum(loop((W, U, b), h0, xs) ** 2)
    f0 = lambda W: np.sum(plain((W, U, b)) ** 2)
    v = rng.randn(H, H)
    ours, t_ours, r = peak(hessian_vector_product(f), W, v)
    theirs, t_theirs, r0 = peak(hessian_vector_product(f0), W, v)
    err = numpy.max(numpy.abs(r - r0)) / numpy.max(numpy.abs(r0))
    print(f"HVP w.r.t. W, tanh RNN T={T} H={H} B={B}, num_ckpts={a.num_ckpts}")
    print(f"  bincheck : peak {ours / 2**20:8.2f} MiB   {t_ours:6.2f} s (under tracemalloc)")
    print(f"  plain    : peak {theirs / 2**20:8.2f} MiB   {t_theirs:6.2f} s (under tracemalloc)")
    print(f"  memory ratio plain/bincheck: {theirs / ours:.1f}x; max relative difference {err:.1e}")
    return 0 if err < 1e-8 else 1


if __name__ == "__main__":
    sys.exit(main())
