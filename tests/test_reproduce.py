"""benchmarks.reproduce end to end: usage errors, and a tiny run of each part whose results must
show the properties the benchmark exists to show (equal gradients, memory ordering, growth)."""

import csv
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "benchmarks.reproduce", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args", [["--only", "gruslys,bogus"], ["--only", ","], ["--repeats", "2"],
                                  ["--seed", "-1"], ["--blas-threads", "0"],
                                  ["--quick", "--smoke"], ["--bogus"]])
def test_bad_arguments_give_a_usage_error(args):
    out = _run(*args)
    assert out.returncode == 2, out.stderr
    assert "usage:" in out.stderr and "Traceback" not in out.stderr


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("reproduce")
    out = _run("--smoke", "--out", str(out_dir))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]

    def read(name):
        with open(out_dir / name, newline="") as f:
            return list(csv.DictReader(f))
    return out_dir, read


def test_every_output_is_written(smoke):
    out_dir, _ = smoke
    names = sorted(os.listdir(out_dir))
    assert names == ["gruslys.csv", "gruslys.md", "gruslys.png", "sargent.csv", "sargent.md",
                     "sargent.png", "sargent_mismatch.csv", "siskind.csv", "siskind.md",
                     "siskind.png"]
    for name in names:
        assert not name.startswith(".tmp-")              # nothing half-written left behind
        assert (out_dir / name).stat().st_size > 0
    for name in ("sargent.png", "siskind.png", "gruslys.png"):
        assert (out_dir / name).read_bytes()[:4] == b"\x89PNG"


def test_sargent_gradients_counts_and_memory(smoke):
    _, read = smoke
    rows = read("sargent.csv")
    assert {r["setting"] for r in rows} == {"lstm", "rnn"}
    for r in rows:
        assert r["status"] == "ok"
        assert float(r["grad_max_rel_err"]) <= 1e-10
        assert int(r["taped_evals"]) == int(r["seq_len"])
        if r["num_ckpts"]:                                   # bincheck: counts match the plan
            assert int(r["plain_evals"]) == int(r["predicted_plain"])
            assert int(r["peak_snapshots"]) <= int(r["num_ckpts"])
            assert float(r["time_s"]) > 0
    for setting in ("lstm", "rnn"):
        peak = {(r["num_ckpts"], r["placement"]): float(r["peak_mib"])
                for r in rows if r["setting"] == setting}
        for (k, placement), mib in peak.items():
            if k:                                             # bincheck below its store-all
                assert mib < peak[("", placement)], (setting, k, placement)


def test_sargent_mismatch_is_shown(smoke):
    _, read = smoke
    rows = {r["comparison"]: r for r in read("sargent_mismatch.csv")}
    both = rows["the two scripts"]
    assert float(both["max_abs_diff_shared"]) > 1e-8          # different functions
    assert float(both["loss_a"]) != float(both["loss_b"])
    assert float(both["init_grad_norm_a"]) > 0.0             # normal_lstm.py learns the init
    assert float(both["init_grad_norm_b"]) == 0.0            # checkpointed_lstm.py does not
    assert float(rows["the swap alone"]["max_abs_diff_shared"]) > 1e-8


def _slope(xs, ys):
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def test_siskind_memory_ordering_and_growth(smoke):
    _, read = smoke
    rows = read("siskind.csv")
    by = {}
    for r in rows:
        assert r["status"] == "ok" and float(r["grad_max_rel_err"]) <= 1e-10
        by.setdefault(r["strategy"], []).append(r)
    ns = [int(r["n"]) for r in by["store-all"]]
    assert len(ns) >= 3
    last = {s: rs[-1] for s, rs in by.items()}
    # memory: both checkpointed runs below store-all; in states, flat < outer < store-all
    assert float(last["flat while loop"]["peak_mib"]) < float(last["store-all"]["peak_mib"])
    assert float(last["outer binomial"]["peak_mib"]) < float(last["store-all"]["peak_mib"])
    held = {s: int(r["held_states"]) for s, r in last.items()}
    assert held["flat while loop"] < held["outer binomial"] < held["store-all"]
    assert held["flat while loop"] <= int(last["flat while loop"]["num_ckpts"]) + 1
    # growth orders: store-all memory and the outer one's held states grow ~ n; the flat loop's
    # held states ~ log n; every evaluation count grows at least linearly
    col = lambda s, c: [float(r[c]) for r in by[s]]                          # noqa: E731
    assert _slope(ns, col("store-all", "peak_mib")) > 0.7
    assert _slope(ns, col("outer binomial", "held_states")) > 0.7
    assert 0.0 < _slope(ns, col("flat while loop", "held_states")) < 0.4
    assert _slope(ns, col("flat while loop", "peak_mib")) < _slope(ns, col("store-all", "peak_mib"))
    for s in by:
        evals = [a + b for a, b in zip(col(s, "plain_evals"), col(s, "taped_evals"))]
        assert _slope(ns, evals) >= 0.95
    assert all(int(r["plain_evals"]) == 0 for r in by["store-all"])
    assert all(float(r["evals_per_step"]) > 1.0 for r in by["flat while loop"])


# --------------------------------------------------------------------------- part C (Gruslys)
def test_gruslys_measured_rows(smoke):
    _, read = smoke
    rows = read("gruslys.csv")
    assert {r["cell"] for r in rows} == {"tanh", "lstm"}
    for cell in ("tanh", "lstm"):
        rs = [r for r in rows if r["cell"] == cell]
        ref = rs[0]
        assert ref["budget"] == "store-all" and ref["status"] == "ok"
        ok = [r for r in rs[1:] if r["status"] == "ok"]
        assert len(ok) >= 2                                  # at least the m = ... budgets
        for r in rs[1:]:
            assert r["status"] == "ok" or r["status"].startswith("refused")
        for r in ok:
            assert float(r["grad_max_rel_err"]) <= 1e-10
            assert int(r["plain_evals"]) == int(r["predicted_plain"])       # counted = plan
            assert int(r["taped_evals"]) == int(r["seq_len"])
            assert float(r["cost_per_step"]) == 1 + int(r["plain_evals"]) / int(r["seq_len"])
            assert float(r["peak_mib"]) < float(ref["peak_mib"])
            assert r["within_budget"] == "True"          # peak minus the returned gradient
            assert float(r["time_s"]) > 0 and float(r["alpha"]) > 1


def _exhaustive(n, M, a, hidden=True, tapes=True, keep_h0=False):
    """Fewest plain forwards over every action sequence (Dijkstra): plain advance, taped advance
    keeping the internal state (a units; a restart point), tape-and-reverse of the frontier step,
    reverse from a kept internal state, store / drop a hidden state (1 unit), restore. x0 starts
    live and unstored; with keep_h0 it is stored for good (ISM's h0)."""
    import heapq
    import itertools
    start = (0, frozenset(), frozenset([0]) if keep_h0 else frozenset(), n)
    dist, queue, tick = {start: 0}, [(0, 0, start)], itertools.count()
    while queue:
        d, _, state = heapq.heappop(queue)
        if dist[state] < d:
            continue
        cur, kept, held, f = state
        if f == 0:
            return d
        used = a * len(kept) + len(held)
        moves = []
        if 0 <= cur < f:
            moves.append((1, (cur + 1, kept, held, f)))
            if tapes and cur not in kept and used + a <= M:
                moves.append((0, (cur + 1, kept | {cur}, held, f)))
            if cur == f - 1:
                moves.append((0, (-1, kept, held, f - 1)))
            if (hidden or cur == 0) and cur not in held and used + 1 <= M:
                moves.append((0, (cur, kept, held | {cur}, f)))
        if f - 1 in kept:
            moves.append((0, (-1, kept - {f - 1}, held, f - 1)))
        moves += [(0, (cur, kept, held - {h}, f)) for h in held if not (keep_h0 and h == 0)]
        moves += [(0, (r, kept, held, f)) for r in {i + 1 for i in kept} | held if r != cur]
        for cost, nxt in moves:
            if d + cost < dist.get(nxt, math.inf):
                dist[nxt] = d + cost
                heapq.heappush(queue, (d + cost, next(tick), nxt))
    return math.inf


def test_gruslys_model_recursions_are_exact():
    from bincheck.schedule.binomial import optimal_plain_steps

    from benchmarks.reproduce import gruslys as g
    for a in (1, 2, 3):
        for n in range(1, 7):
            msm = g.msm_plain(n, a, 6)
            ism = g.ism_plain(n, 6)
            for M in range(1, 7):
                assert msm[M] == _exhaustive(n, M, a), (n, M, a)
                k = (M - 1) // a
                assert ism[min(k, len(ism) - 1)] == _exhaustive(n, M, a, hidden=False,
                                                                keep_h0=True), (n, M, a)
    T, M = 40, 40
    hsm = g.msm_plain(T, 1, M, tapes=False)
    assert all(hsm[m] == optimal_plain_steps(T, m) == g.hsm_plain(T, m) for m in range(1, M + 1))
    curves = g.model_curves(T, M, alphas=(1, 3), log=lambda *_: None)
    for a in (1, 3):
        for m in range(1, M + 1):
            msm, mixed, ism = (curves[(k, a)][m] for k in ("msm", "bincheck", "ism"))
            assert msm <= mixed <= curves["hsm"][m] and msm <= ism
    assert curves[("msm", 1)][T] == curves[("bincheck", 1)][T] == 0     # alpha*T units: no rerun
