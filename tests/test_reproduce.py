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


@pytest.mark.parametrize("args", [["--only", "gruslys"], ["--only", ","], ["--repeats", "2"],
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
    assert names == ["sargent.csv", "sargent.md", "sargent.png", "sargent_mismatch.csv",
                     "siskind.csv", "siskind.md", "siskind.png"]
    for name in names:
        assert not name.startswith(".tmp-")              # nothing half-written left behind
        assert (out_dir / name).stat().st_size > 0
    assert (out_dir / "sargent.png").read_bytes()[:4] == b"\x89PNG"


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
