"""Part B: Siskind & Pearlmutter, "Divide-and-conquer checkpointing for arbitrary programs with no
user annotation" (Optimization Methods & Software 33(4-6), 2018; arXiv 1708.06799).

Their point: checkpointing that splits the computation at the boundaries a user annotates (a DO
loop's iterations, for Tapenade's binomial directive) cannot bound memory when one iteration of
the annotated loop is itself long: the nested-loop example (Listing 1: n = 100003 outer
iterations, an inner loop whose length l(x, i) is small on most iterations and O(n) on a few)
tapes a whole long inner loop at once, O(n) space. Splitting by the count of primitive steps
instead gives logarithmic space (their Fig. 5 and the text around it).

The example here (the exact listing was not in the material available to us; see README): the
state is a vector x of ``DIM`` floats; an atomic step is one inner iteration
``x <- tanh(w * x + phase(i, j))`` (unit cost); outer iteration ``i`` runs ``l(i)`` of them. The
scaled inner-length rule: ``l(i) = 1`` except on ``HEAVY`` = 3 outer iterations at seeded random
positions, where ``l(i) = n // 3``; so the total work is W ~ 2n atomic steps and the longest inner
loop is n/3. Gradient of sum(x_final**2) w.r.t. w and x0, three ways:

* ``store-all``: the plain Python while loop over atomic steps under autograd;
* ``outer binomial``: ``binomial_checkpoint`` over the n OUTER iterations (``num_ckpts`` = s), each
  outer step running its whole inner loop inside ``fn`` (taped whole when it is reversed);
* ``flat while loop``: ``checkpointed_while_loop`` over the W atomic steps, the counters (i, j)
  in the state (integer leaves, carried along), ``num_ckpts`` = s.

s = ceil(log2 n) for both checkpointed ones (logarithmic space, as in their claim). Measured per n:
peak memory (tracemalloc, one gradient), step evaluations (an instrumented atomic step counts
plain and taped calls), wall time of one untraced gradient (indicative), and the gradients, which
must agree (max relative error <= 1e-10).
"""

from __future__ import annotations

import math

import autograd.numpy as np
import numpy
from autograd import grad
from autograd.tracer import isbox

from bincheck import binomial_checkpoint, checkpointed_while_loop

from .common import csv_bytes, loglog_slope, max_rel_err, md_table, peak_mib, png_bytes, timed

DIM = 8
HEAVY = 3
STRATEGIES = ("store-all", "outer binomial", "flat while loop")
FULL_NS = [100, 316, 1000, 3162, 10000, 31623, 100000]
QUICK_NS = [100, 316, 1000, 3162, 10000]
SMOKE_NS = [40, 80, 160]


def num_ckpts(n: int) -> int:
    return max(2, math.ceil(math.log2(n)))


def inner_lengths(n: int, seed: int) -> numpy.ndarray:
    """l(i): 1 on most outer iterations, n // HEAVY on HEAVY seeded random ones."""
    lengths = numpy.ones(n, dtype=int)
    heavy = numpy.random.RandomState(seed).choice(n, size=HEAVY, replace=False)
    lengths[heavy] = max(1, n // HEAVY)
    return lengths


class Counter:
    """Counts atomic steps evaluated on plain arrays vs under autograd's tape."""

    def __init__(self):
        self.plain = self.taped = 0

    def step(self, w, x, i, j):
        if isbox(w) or isbox(x):
            self.taped += 1
        else:
            self.plain += 1
        return np.tanh(w * x + 0.1 * ((7 * i + 3 * j) % 11) / 11.0)


class Problem:
    def __init__(self, n: int, seed: int):
        self.n, self.L = n, [int(v) for v in inner_lengths(n, seed)]
        self.work = sum(self.L)
        rs = numpy.random.RandomState(seed)
        self.w = 0.5 + 0.4 * rs.rand(DIM)          # |w| < 1: a contraction, gradients stay sane
        self.x0 = rs.randn(DIM)
        self.s = num_ckpts(n)

    def build(self, strategy: str, counter: Counter):
        """Returns (loss(w, x0), loop or None)."""
        n, L = self.n, self.L

        def body(w, st):                       # one atomic step; (i, j) = outer, inner counters
            i, j, x = st
            x = counter.step(w, x, i, j)
            return (i + 1, 0, x) if j + 1 == L[i] else (i, j + 1, x)

        def cond(w, st):
            return st[0] < n

        if strategy == "store-all":
            def loss(w, x0):
                st = (0, 0, x0)
                while cond(w, st):
                    st = body(w, st)
                return np.sum(st[2] ** 2)
            return loss, None
        if strategy == "flat while loop":
            loop = checkpointed_while_loop(cond, body, self.s)
            return (lambda w, x0: np.sum(loop(w, (0, 0, x0))[2] ** 2)), loop
        if strategy == "outer binomial":
            def outer(w, x, i):                 # one outer iteration: its whole inner loop
                i = int(i)
                for j in range(L[i]):
                    x = counter.step(w, x, i, j)
                return x
            loop = binomial_checkpoint(outer, n, self.s)
            idx = numpy.arange(n)
            return (lambda w, x0: np.sum(loop(w, x0, idx) ** 2)), loop
        raise ValueError(strategy)


def measure(ns: list[int], seed: int = 0, log=print) -> list[dict]:
    rows = []
    for n in ns:
        prob = Problem(n, seed)
        ref = None
        for strategy in STRATEGIES:
            counter = Counter()
            loss, loop = prob.build(strategy, counter)
            g = grad(loss, (0, 1))
            wall, value = timed(lambda: g(prob.w, prob.x0))
            plain, taped = counter.plain, counter.taped
            if ref is None:
                ref = value
            err = max_rel_err(value, ref)
            mem, _ = peak_mib(lambda: g(prob.w, prob.x0))
            row = dict(n=n, work=prob.work, longest_inner=max(prob.L), num_ckpts=prob.s,
                       strategy=strategy, status="ok" if err <= 1e-10 else
                       "FAILED: gradient differs from store-all",
                       peak_mib=mem, plain_evals=plain, taped_evals=taped,
                       evals_per_step=(plain + taped) / prob.work,
                       peak_snapshots=loop.stats.peak_snapshots if loop is not None else None,
                       # what must be held at once, in atomic states: snapshots + one tape
                       held_states=(prob.work if loop is None else
                                    loop.stats.peak_snapshots + (max(prob.L) if strategy ==
                                                                 "outer binomial" else 1)),
                       time_s=wall, grad_max_rel_err=err)
            rows.append(row)
            log(f"  n={n} (W={prob.work}, s={prob.s}) {strategy}: {mem:.2f} MiB, "
                f"{plain} plain + {taped} taped steps, {wall:.2f} s, err {err:.1e}")
    return rows


COLUMNS = ["n", "work", "longest_inner", "num_ckpts", "strategy", "status", "peak_mib",
           "plain_evals", "taped_evals", "evals_per_step", "peak_snapshots", "held_states",
           "time_s", "grad_max_rel_err"]


def slopes(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Fitted growth orders (log-log slopes vs n) per strategy."""
    out = {}
    for s in STRATEGIES:
        rs = [r for r in rows if r["strategy"] == s and r["status"] == "ok"]
        if len(rs) < 2:
            continue
        ns = [r["n"] for r in rs]
        out[s] = {"peak_mib": loglog_slope(ns, [r["peak_mib"] for r in rs]),
                  "evals": loglog_slope(ns, [r["plain_evals"] + r["taped_evals"] for r in rs]),
                  "held_states": loglog_slope(ns, [r["held_states"] for r in rs])}
        if all(r["plain_evals"] > 0 for r in rs):
            out[s]["plain_evals"] = loglog_slope(ns, [r["plain_evals"] for r in rs])
    return out


def markdown(rows: list[dict], sl: dict, env: str) -> str:
    out = ["# Siskind & Pearlmutter's nested loop: splitting by steps vs by outer iterations\n",
           f"{env}. Outer iterations n; W = total atomic steps (~2n); the longest inner loop is "
           f"n/{HEAVY}; s = num_ckpts = ceil(log2 n). Memory = tracemalloc peak of one gradient; "
           f"evaluations = atomic steps run (plain + taped) per gradient; time = one untraced "
           f"gradient (indicative only); all gradients agree with store-all (last column).\n"]
    out.append(md_table(
        ["n", "W", "s", "strategy", "peak MiB", "plain evals", "taped evals", "evals / W",
         "states held (snapshots + tape)", "time (s)", "grad max rel err"],
        [[r["n"], r["work"], r["num_ckpts"],
          r["strategy"] if r["status"] == "ok" else f"{r['strategy']} — {r['status']}",
          f"{r['peak_mib']:.3f}", r["plain_evals"], r["taped_evals"], f"{r['evals_per_step']:.2f}",
          r["held_states"], f"{r['time_s']:.2f}", f"{r['grad_max_rel_err']:.1e}"] for r in rows],
        "rrrlrrrrrrr"))
    out.append("\nFitted growth orders (slope of log y against log n, over all n):\n")
    out.append(md_table(
        ["strategy", "peak memory", "states held", "evaluations (plain + taped)", "plain evals"],
        [[s, f"{v['peak_mib']:.2f}", f"{v['held_states']:.2f}", f"{v['evals']:.2f}",
          f"{v['plain_evals']:.2f}" if "plain_evals" in v else "– (none)"]
         for s, v in sl.items()]))
    return "\n".join(out)


def plot(rows: list[dict], sl: dict) -> bytes:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a3, a2) = plt.subplots(1, 3, figsize=(18, 5.4))
    style = {"store-all": ("s-", "C3"), "outer binomial": ("^-", "C1"),
             "flat while loop": ("o-", "C0")}
    for s in STRATEGIES:
        rs = [r for r in rows if r["strategy"] == s and r["status"] == "ok"]
        if not rs:
            continue
        ns = [r["n"] for r in rs]
        m, c = style[s]
        k = sl.get(s, {})
        a1.loglog(ns, [r["peak_mib"] for r in rs], m, color=c,
                  label=f"{s} (slope {k.get('peak_mib', float('nan')):.2f})")
        a3.loglog(ns, [r["held_states"] for r in rs], m, color=c,
                  label=f"{s} (slope {k.get('held_states', float('nan')):.2f})")
        a2.loglog(ns, [r["plain_evals"] + r["taped_evals"] for r in rs], m, color=c,
                  label=f"{s} (slope {k.get('evals', float('nan')):.2f})")
    ns = numpy.array(sorted({r["n"] for r in rows}), float)
    if len(ns):
        ref_mem = [r["peak_mib"] for r in rows if r["strategy"] == "store-all" and r["n"] == ns[0]]
        if ref_mem:
            a1.loglog(ns, ref_mem[0] * ns / ns[0], ":", color="gray", label="O(n) reference")
        flat0 = [r["peak_mib"] for r in rows if r["strategy"] == "flat while loop"
                 and r["n"] == ns[0]]
        if flat0:
            a1.loglog(ns, flat0[0] * numpy.log2(ns) / numpy.log2(ns[0]), "--", color="gray",
                      label="O(log n) reference")
        w0 = [r["work"] for r in rows if r["n"] == ns[0]][0]
        a2.loglog(ns, w0 * ns / ns[0], ":", color="gray", label="W ~ 2n (no recomputation)")
    a1.set_title("peak memory of one gradient (tracemalloc)", fontsize=10)
    a1.set_ylabel("MiB")
    a3.set_title("states held at once (snapshots + longest tape, in atomic steps)", fontsize=10)
    a3.set_ylabel("states")
    a2.set_title("atomic steps evaluated per gradient (plain + taped)", fontsize=10)
    a2.set_ylabel("evaluations")
    for a in (a1, a3, a2):
        a.set_xlabel("outer iterations n (W ~ 2n atomic steps, longest inner loop n/3)")
        a.grid(alpha=0.3, which="both")
        a.legend(fontsize=8)
    fig.suptitle("Nested loop of Siskind & Pearlmutter: s = ceil(log2 n) snapshots; fitted "
                 "log-log slopes in the legends", fontsize=10)
    fig.tight_layout()
    return png_bytes(fig)


def run(out_files: dict, quick: bool, smoke: bool, seed: int, env: str, log=print) -> list[dict]:
    ns = SMOKE_NS if smoke else QUICK_NS if quick else FULL_NS
    log(f"Siskind & Pearlmutter nested loop: n in {ns}")
    rows = measure(ns, seed, log)
    sl = slopes(rows)
    for s, v in sl.items():
        log("  slopes " + s + ": " + ", ".join(f"{k} {x:.2f}" for k, x in v.items()))
    out_files["siskind.csv"] = csv_bytes(rows, COLUMNS)
    out_files["siskind.md"] = markdown(rows, sl, env).encode()
    out_files["siskind.png"] = plot(rows, sl)
    return rows
