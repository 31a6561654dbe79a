"""``python -m benchmarks.jax.segments_pay``: do kept segments pay? (issue 29 items 9 and 10)

Side by side, in the same interleaved rounds, at nested √T remat's XLA temporaries (and, on
the stencil, at a larger budget too): nested remat itself (the peer), ``memory=`` with
``keep_segments=False`` (states only), the default (segments where they pay at measured
prices), and ``keep_segments=True`` with the price check switched off (``loops.pays``
replaced by ``True``: what the planner chose by evaluations alone before, with the lengths
chosen as now). Problems:

* ``tanh``: the benchmark's tanh RNN cell, T=1000, H=256, B=32, I=256 (item 10's side by side);
* ``stencil``: a stand-in for jax-cfd (item 9; jax-cfd is not installed here): three 128x128
  float32 fields (u, v, c) advanced by an explicit advection-diffusion step (centred
  differences and the Laplacian by rolls, a tanh and a linear drag, a forcing field), about
  thirty array ops per step, no per-step inputs (a dummy one); T=500; loss = sum of the
  squared fields.

XLA on one core as the main benchmark (``pin_xla``). Per strategy: compile s (trace, lower,
compile), XLA temporaries, the plan, the gradient's max relative error against ``lax.scan``;
per round the time of each; medians, and ratios as medians of per-round ratios. The measured
prices and the predicted times the planner used are recorded. Writes
``segments-pay.json`` and ``segments-pay.md`` to ``--out`` (default benchmarks/jax/results).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import statistics
import sys
import time

from ..common.cli import library_version, load_average
from .__main__ import LIBRARY, pin_xla


def stencil_problem(N: int = 128, T: int = 500):
    import jax
    import jax.numpy as jnp

    def lap(f):
        return (jnp.roll(f, 1, 0) + jnp.roll(f, -1, 0) + jnp.roll(f, 1, 1)
                + jnp.roll(f, -1, 1) - 4 * f)

    def ddx(f):
        return (jnp.roll(f, -1, 1) - jnp.roll(f, 1, 1)) * 0.5

    def ddy(f):
        return (jnp.roll(f, -1, 0) - jnp.roll(f, 1, 0)) * 0.5

    def step(p, s, x):
        u, v, c = s
        dt = 0.1

        def adv(f):
            return u * ddx(f) + v * ddy(f)
        u2 = u + dt * (-adv(u) + p["nu"] * lap(u) + p["F"] - 0.3 * jnp.tanh(u) - 0.2 * u)
        v2 = v + dt * (-adv(v) + p["nu"] * lap(v) - 0.3 * jnp.tanh(v) - 0.2 * v)
        c2 = c + dt * (-adv(c) + p["kappa"] * lap(c))
        return (u2, v2, c2)
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    params = {"nu": jnp.float32(0.2), "kappa": jnp.float32(0.1),
              "F": 0.1 * jax.random.normal(k[0], (N, N), jnp.float32)}
    s0 = tuple(0.1 * jax.random.normal(kk, (N, N), jnp.float32) for kk in k[1:])
    xs = jnp.zeros((T, 1), jnp.float32)         # a dummy input per step (nested's scan needs xs)

    def loss(s):
        return sum(jnp.sum(a ** 2) for a in s)
    return dict(name="stencil", step=step, T=T, args=(params, s0, xs), loss=loss,
                describe=f"stand-in for jax-cfd: 3 fields {N}x{N} float32, T={T}")


def tanh_problem(T: int = 1000, H: int = 256):
    from .problem import Problem
    prob = Problem("tanh", T, H, 32, H)
    return dict(name="tanh", step=prob.step, T=T, args=prob.args, loss=prob.loss,
                describe=f"tanh RNN, {prob.describe()}")


def run_problem(prob: dict, budgets: list, rounds: int) -> dict:
    import jax
    from jax import lax

    import bincheck.jax as bj
    from .strategies import nearest_divisor

    step, T, args, loss = prob["step"], prob["T"], prob["args"], prob["loss"]
    d = nearest_divisor(T)

    def scan_f(p, s0, xs):
        return lax.scan(lambda s, x: (step(p, s, x), None), s0, xs)[0]

    def nested_f(p, s0, xs):
        @jax.checkpoint
        def segment(s, xk):
            return lax.scan(lambda s, x: (step(p, s, x), None), s, xk)[0], None
        xs2 = jax.tree.map(lambda v: v.reshape((T // d, d) + v.shape[1:]), xs)
        return lax.scan(segment, s0, xs2)[0]

    def compile_grad(f):
        t0 = time.perf_counter()
        c = jax.jit(jax.grad(lambda p, s, x: loss(f(p, s, x)))).lower(*args).compile()
        return c, time.perf_counter() - t0

    def max_rel(g, ref):
        import numpy as np
        return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))
                         / max(float(np.max(np.abs(np.asarray(b)))), 1e-30))
                   for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(ref)))
    ref_c, _ = compile_grad(scan_f)
    ref = ref_c(*args)
    scan_temp = ref_c.memory_analysis().temp_size_in_bytes
    del ref_c
    nested_c, nested_s = compile_grad(nested_f)
    nested_temp = nested_c.memory_analysis().temp_size_in_bytes
    rows = [dict(strategy=f"nested remat {T // d}x{d}", kind="nested", budget_of=None,
                 compile_s=nested_s, temp_bytes=nested_temp,
                 max_rel_err=max_rel(nested_c(*args), ref), times_s=[])]
    live = [(nested_c, rows[0])]
    from bincheck.jax import loops, prices
    real_prices, real_pays = prices.step_prices, loops.pays
    for what in budgets:
        memory = nested_temp if what == "nested" else int(float(what) * scan_temp)
        label = "nested" if what == "nested" else f"{100 * float(what):g} % of lax.scan"
        for kind, ks in (("states only", False), ("by evaluations", True), ("default", None)):
            priced: list = []

            def recording(flat, L, x_wanted):
                out = real_prices(flat, L, x_wanted)
                priced.append(dict(L=L, states=(out[0].step, out[0].recompute),
                                   segments=(out[1].step, out[1].recompute)))
                return out
            prices.step_prices = recording
            if kind == "by evaluations":         # the price check off: evaluations alone
                loops.pays = lambda *a: True
            try:
                loop = bj.binomial_checkpoint(step, T, memory=memory, keep_segments=ks)
                c, cs = compile_grad(lambda p, s, x, loop=loop: loop(p, s, x))
            finally:
                prices.step_prices, loops.pays = real_prices, real_pays
            plan = loop.plan
            row = dict(strategy=f"bincheck memory={label} {kind}", kind=kind, budget_of=label,
                       memory=memory, compile_s=cs,
                       temp_bytes=c.memory_analysis().temp_size_in_bytes,
                       segment_len=getattr(plan, "segment_len", 1),
                       checkpoints=plan.checkpoints, plain_steps=plan.plain_steps,
                       prices=priced, max_rel_err=max_rel(c(*args), ref), times_s=[])
            mine = {r["kind"]: r for r in rows if r["budget_of"] == label}
            ev = mine.get("by evaluations")
            if priced and ev is not None and ev["segment_len"] == priced[0]["L"]:
                L = priced[0]["L"]
                so, sg = (prices.Prices(*priced[0][k]) for k in ("states", "segments"))
                row["predicted_states_only_s"] = so.time(T, mine["states only"]["plain_steps"],
                                                         T - 1)
                row["predicted_segments_s"] = sg.time(T, ev["plain_steps"], T - L)
            rows.append(row)
            live.append((c, row))
            print(f"  {row['strategy']}: L={row['segment_len']}, plain {row['plain_steps']}, "
                  f"temp {row['temp_bytes'] / 2**20:.3f} of {memory / 2**20:.3f} MiB, compile "
                  f"{cs:.2f} s, prices {priced}", file=sys.stderr, flush=True)
    loads = [load_average()]
    for k in range(rounds):
        gc.collect()
        gc.disable()
        try:
            for c, row in (live if k % 2 == 0 else live[::-1]):
                t0 = time.perf_counter()
                jax.block_until_ready(c(*args))
                row["times_s"].append(time.perf_counter() - t0)
        finally:
            gc.enable()
        loads.append(load_average())
    nested_times = rows[0]["times_s"]
    for row in rows:
        row["time_s"] = statistics.median(row["times_s"])
        row["vs_nested"] = statistics.median(t / n for t, n in zip(row["times_s"], nested_times))
        so = next((r for r in rows if r["budget_of"] == row["budget_of"]
                   and r["kind"] == "states only"), None)
        if so is not None:
            row["vs_states_only"] = statistics.median(
                t / s for t, s in zip(row["times_s"], so["times_s"]))
    return dict(problem=prob["name"], describe=prob["describe"], scan_temp_bytes=scan_temp,
                rows=rows, loads=loads)


def markdown(meta: dict, results: list) -> str:
    out = [f"Run {meta['date']}, jax {meta['jax']}, bincheck at {meta['commit']}, XLA_FLAGS="
           f"\"{meta['xla_flags']}\", CPUs {meta['cpus']}; load average at start "
           f"{meta['load_start']}, at end {meta['load_end']}; {meta['seconds']:.0f} s; "
           f"{meta['rounds']} rounds, interleaved, the order reversed every other round. "
           "Ratios are medians of per-round ratios.", ""]
    for res in results:
        out += [f"**{res['problem']}**: {res['describe']}; load during the rounds "
                f"{res['loads'][0]} .. {res['loads'][-1]}", "",
                "| strategy | L | checkpoints | plain evals | XLA temp MiB | budget MiB | "
                "compile s | grad max rel err | time s (median) | / nested | / states only "
                "| predicted segments / states only |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in res["rows"]:
            pred = (f"{r['predicted_segments_s'] / r['predicted_states_only_s']:.3f}"
                    if r.get("predicted_segments_s") else "–")
            budget = f"{r['memory'] / 2**20:.3f}" if r.get("memory") else "–"
            vs_so = f"{r['vs_states_only']:.3f}×" if "vs_states_only" in r else "–"
            out.append(
                f"| {r['strategy']} | {r.get('segment_len', '–')} "
                f"| {r.get('checkpoints', '–')} | {r.get('plain_steps', '–')} "
                f"| {r['temp_bytes'] / 2**20:.3f} | {budget} | "
                f"{r['compile_s']:.2f} | {r['max_rel_err']:.1e} | {r['time_s']:.3f} | "
                f"{r['vs_nested']:.3f}× | {vs_so} | {pred} |")
        out.append("")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.jax.segments_pay")
    p.add_argument("--problems", default="tanh,stencil")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out", default=os.path.join("benchmarks", "jax", "results"))
    p.add_argument("--name", default="segments-pay")
    args = p.parse_args(argv)
    xla_flags, cpus = pin_xla()
    import jax
    commit, dirty = library_version(LIBRARY)
    meta = dict(date=datetime.datetime.now().isoformat(timespec="seconds"), jax=jax.__version__,
                commit=commit + (f" ({', '.join(dirty)} modified)" if dirty else ""),
                xla_flags=xla_flags, cpus=cpus, load_start=load_average(),
                rounds=args.rounds)
    t0 = time.perf_counter()
    results = []
    for name in args.problems.split(","):
        prob = tanh_problem() if name == "tanh" else stencil_problem()
        budgets = ["nested"] if name == "tanh" else ["nested", "0.15"]
        print(f"{name}: {prob['describe']}", file=sys.stderr, flush=True)
        results.append(run_problem(prob, budgets, args.rounds))
    meta.update(load_end=load_average(), seconds=time.perf_counter() - t0)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{args.name}.json"), "w") as f:
        json.dump(dict(meta=meta, results=results), f, indent=1)
    text = markdown(meta, results)
    with open(os.path.join(args.out, f"{args.name}.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
