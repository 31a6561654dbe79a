"""The benchmark harness's own reliability: usage errors, gradient checks, atomic files."""

import os
import subprocess
import sys

import numpy
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("args", [["--num-ckpts", "0"], ["--cells", "rnn"], ["--hidden", "x"],
                                  ["--repeats", "2"], ["--loss", "sum"], ["--bogus"]])
def test_bad_arguments_give_a_usage_error(args):
    out = subprocess.run([sys.executable, "-m", "benchmarks.rnn", *args], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert "usage:" in out.stderr and "Traceback" not in out.stderr


def test_gradient_mismatch_is_detected():
    from benchmarks.rnn.harness import gradients_agree
    g = {"W": numpy.ones((2, 2)), "b": numpy.ones(2)}
    assert gradients_agree(g, {k: v.copy() for k, v in g.items()}) is None
    bad = {"W": numpy.ones((2, 2)), "b": numpy.array([1.0, 1.0 + 1e-6])}
    assert "mismatch" in gradients_agree(bad, g)


def test_results_are_written_atomically(tmp_path, monkeypatch):
    from benchmarks.common import files as report
    path = tmp_path / "results.csv"
    report.write_atomic(str(path), b"old")
    umask = os.umask(0o022)
    try:
        report.write_atomic(str(tmp_path / "mode.md"), b"x")
    finally:
        os.umask(umask)
    assert (tmp_path / "mode.md").stat().st_mode & 0o777 == 0o644    # not mkstemp's 0600
    os.remove(tmp_path / "mode.md")

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(report.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        report.write_atomic(str(path), b"new, half written")
    assert path.read_bytes() == b"old"                   # the old file is intact
    assert os.listdir(tmp_path) == ["results.csv"]       # and no temporary is left behind


def _csv_rows(path):
    import csv
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_char_lm_end_to_end(tmp_path):
    """A tiny char-LM run: every gradient checked against store-all, and the step and the
    per-step loss (output_fn) evaluated exactly as predicted."""
    T = 12
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.rnn", "--cells", "tanh", "--loss", "char-lm",
         "--seq-len", str(T), "--hidden", "8", "--batch", "2", "--num-ckpts", "3",
         "--no-rss", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = _csv_rows(tmp_path / "results.csv")
    assert [r["strategy"] for r in rows] == ["store-all", "autograd-checkpoint", "sqrt",
                                             "bincheck", "stacked-ys"]
    for r in rows:
        assert r["status"] == "ok", r                   # the gradient check passed
        assert (r["plain_evals"], r["taped_evals"]) == (r["predicted_plain"],
                                                         r["predicted_taped"]), r
        if r["strategy"] != "stacked-ys":               # stacked ys: no output_fn
            assert r["out_taped_evals"] == r["predicted_out_taped"] == str(T), r
            assert r["out_plain_evals"] == r["predicted_out_plain"], r
    by = {r["strategy"]: r for r in rows}
    assert by["bincheck"]["out_plain_evals"] == str(T)      # once plain per step, every plan
    assert by["sqrt"]["out_plain_evals"] == str(T)
    assert by["store-all"]["out_plain_evals"] == "0"
    assert (tmp_path / "results.png").stat().st_size > 0


OLD_CSV = """\
cell,loss,seq_len,hidden,batch,strategy,num_ckpts,status,time_s,slowdown,times_s,\
tracemalloc_peak_mib,memory_saved_pct,rss_peak_mib,rss_saved_pct,plain_evals,taped_evals,\
predicted_plain,predicted_taped,bookkeeping_pct,plain_step_ms,taped_step_ms
tanh,per-step,100,8,2,store-all,,ok,1,1,1 1 1,10,0,10,0,0,100,0,100,,0.1,
tanh,per-step,100,8,2,autograd-checkpoint,,ok,1.5,1.5,1.5 1.5 1.5,15,-50,15,-50,100,199,100,199,,0.1,
tanh,per-step,100,8,2,sqrt,,ok,0.9,0.9,0.9 0.9 0.9,4,60,4,60,100,100,100,100,1,0.1,0.8
tanh,per-step,100,8,2,bincheck,5,ok,1.2,1.2,1.2 1.2 1.2,3,70,3,70,290,100,290,100,1,0.1,0.9
tanh,per-step,100,8,2,bincheck,10,ok,1.1,1.1,1.1 1.1 1.1,3.2,68,3.2,68,210,100,210,100,1,0.1,0.9
"""


@pytest.mark.parametrize("source", ["old", "new"])
def test_replot_writes_table_and_png(tmp_path, source):
    """--replot redraws from a results.csv, the current format or the one before output_fn
    counts (no out_* / output_step_ms / library_overhead_pct columns, loss 'per-step')."""
    pytest.importorskip("matplotlib")
    from benchmarks.rnn.__main__ import main
    from benchmarks.rnn.report import csv_bytes, rows_from_csv
    path = tmp_path / "in.csv"
    path.write_text(OLD_CSV)
    if source == "new":                                  # a round trip through the writer
        rows = rows_from_csv(str(path))
        for r in rows:
            r.loss, r.output_step_ms = "char-lm", 0.05
            r.predicted_out_plain, r.predicted_out_taped = 99, 100
            r.out_plain_evals, r.out_taped_evals = 99, 100
        path.write_bytes(csv_bytes(rows))
    assert main(["--replot", str(path), "--out", str(tmp_path / "out")]) == 0
    png = (tmp_path / "out" / "results.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    table = (tmp_path / "out" / "results.md").read_text()
    assert "| bincheck | 10 | 68.0 % |" in table
    assert ("0.990, 1.000 (0.990, 1.000)" in table) == (source == "new")


def test_generated_text_is_deterministic_and_in_the_vocabulary():
    from benchmarks.rnn.text import VOCAB_SIZE, char_batches, generate_text
    assert generate_text(300, seed=1) == generate_text(300, seed=1) != generate_text(300, seed=2)
    chars, targets = char_batches(50, 4, seed=0)
    assert chars.shape == targets.shape == (50, 4) and VOCAB_SIZE == 96
    assert (chars[1:] == targets[:-1]).all()           # the target is the next character
    assert 0 <= chars.min() and chars.max() < VOCAB_SIZE


def torch_smoke(out):
    return ["-m", "benchmarks.torch", "--smoke", "--out", out]


@pytest.mark.background("torch_smoke")
def test_torch_benchmark_smoke_run(background):
    """python -m benchmarks.torch --smoke: every strategy runs, its gradient checked against
    store-all's, and the results are written."""
    out, tmp_path = background
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    written = set(os.listdir(tmp_path))
    assert {f for f in written if f.endswith((".csv", ".json", ".md"))}, written


def jax_smoke(out):
    return ["-m", "benchmarks.jax", "--smoke", "--out", out]


@pytest.mark.background("jax_smoke")
def test_jax_benchmark_smoke_run(background):
    """python -m benchmarks.jax --smoke: every strategy compiles, its gradient is checked against
    lax.scan's, bincheck's counted step evaluations equal its plan's, and the results are
    written (the RNN table, the while-loop table, the plot)."""
    out, tmp_path = background
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert {"smoke.json", "smoke.md"} <= set(os.listdir(tmp_path))
    import json
    data = json.loads((tmp_path / "smoke.json").read_text())
    rows, while_rows = data["rows"], data["while_rows"]
    assert rows and while_rows
    if hasattr(os, "sched_setaffinity"):    # XLA's thread pool sized to one CPU
        assert len(data["meta"]["cpu_affinity"]) == 1, data["meta"]
    for r in rows:
        assert r["status"] == "ok" or r["status"].startswith("refused"), r
        if r["kind"] == "bincheck" and r["status"] == "ok":
            assert r["evals"] == r["expected_evals"], r
    assert all(not r["status"].startswith("FAILED") for r in while_rows), while_rows


def test_jax_benchmark_names_the_extra_when_equinox_is_missing(monkeypatch):
    from benchmarks.jax.__main__ import import_peers
    monkeypatch.setitem(sys.modules, "equinox", None)       # import equinox raises ImportError
    with pytest.raises(SystemExit, match=r'pip install -e "\.\[jaxbench\]"'):
        import_peers()


def test_torch_benchmark_device_and_size_options(tmp_path):
    """--device cuda names its results <mode>-cuda (sizes added when changed), and refuses
    clearly where torch sees no GPU (CI), leaving no folder behind (it left an empty temporary
    one per run); on a machine with one, the smoke run passes there."""
    pytest.importorskip("torch")
    import torch

    from benchmarks.torch.__main__ import parse_args
    args = parse_args(["--full", "--device", "cuda", "--hidden", "64", "--batch", "2",
                       "--out", "x"])
    assert args.name == "full-cuda-H64-B2" and args.cfg["hidden"] == 64
    assert args.cfg["batch"] == 2 and args.cfg["seq_len"] == 1000
    assert parse_args(["--out", "x"]).name == "quick"
    with pytest.raises(SystemExit):
        parse_args(["--batch", "0"])
    out = subprocess.run([sys.executable, "-m", "benchmarks.torch", "--smoke", "--device", "cuda",
                          "--cells", "tanh"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1",
                                               TMPDIR=str(tmp_path)))
    if torch.cuda.is_available():
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        assert "offload=True" in out.stdout and "smoke-cuda." in out.stdout
    else:
        assert out.returncode == 2 and "torch sees no CUDA device" in out.stderr, out.stderr
        # (torch's own folder there is kept)
        assert not [f for f in os.listdir(tmp_path) if f.startswith("bincheck")]


def programs_smoke(out):
    return ["-m", "benchmarks.programs", "--smoke", "--repeats", "1", "--out", out]


@pytest.mark.background("programs_smoke")
def test_programs_benchmark_smoke_run(background):
    """python -m benchmarks.programs --smoke: every strategy runs, its gradient agrees with
    store-all, and the program at outer binomial's measured peak stays within it."""
    import csv
    out, tmp_path = background
    assert out.returncode == 0, out.stderr[-2000:]
    rows = list(csv.DictReader(open(tmp_path / "programs.csv")))
    assert {r["strategy"] for r in rows} == {"store-all", "outer binomial", "program s",
                                             "program @outer"}
    assert all(float(r["grad_max_rel_err"]) <= 1e-10 for r in rows)
    for n in {r["n"] for r in rows}:
        peak = {r["strategy"]: float(r["peak_mib"]) for r in rows if r["n"] == n}
        assert peak["program @outer"] <= peak["outer binomial"]


def test_live_sets_report(tmp_path):
    """python -m benchmarks.programs.live_sets: three programs, each live set a small share of
    what a tape holds at the same cut."""
    out = subprocess.run([sys.executable, "-m", "benchmarks.programs.live_sets", "--out",
                          str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line for line in (tmp_path / "live-sets.md").read_text().splitlines()
            if line.startswith("| ") and "program" not in line]
    assert len(rows) == 3
    for row in rows:
        assert float(row.strip("| ").split("|")[-1]) < 0.05


def program_smoke(out):
    return ["-m", "benchmarks.program", "--smoke", "--out", out]


@pytest.mark.background("program_smoke")
def test_program_benchmark_smoke_run(background):
    """python -m benchmarks.program --smoke: every eager peer's gradient agrees with store-all's
    on the five workloads, each is metered and timed, torch.compile's rows say why they did not
    run, bincheck's say pending where issue 31's API is missing, and the files are written."""
    import json
    out, tmp_path = background
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert {"smoke.json", "smoke.csv", "smoke.md"} <= set(os.listdir(tmp_path))
    rows = json.loads((tmp_path / "smoke.json").read_text())["rows"]
    assert [w for w in dict.fromkeys(r["workload"] for r in rows)] == [
        "resnet18", "gpt", "unet", "treelstm", "rnn"]
    for r in rows:
        if r["kind"] in ("store-all", "per-block", "sequential", "binomial"):
            assert r["status"] == "ok" and r["max_rel_err"] <= 1e-4, r
            assert r["metered_peak"] > 0 and len(r["times_s"]) == 3, r
        elif r["kind"] == "compile":
            assert r["status"] == "not run" and r["note"], r
    kinds = {(r["workload"], r["kind"]) for r in rows}
    assert ("unet", "sequential") not in kinds and ("resnet18", "sequential") in kinds
    assert ("rnn", "binomial") in kinds


def test_program_benchmark_bincheck_rows_plug_in(monkeypatch):
    """Where bincheck.torch has issue 31's API, its memory= rows run at each peer's peak and at
    fractions of store-all's, with their .stats, and the targets are judged (a stand-in API
    here: the model itself, so the plumbing is what is tested)."""
    torch = pytest.importorskip("torch")
    import types

    import bincheck.torch as bt
    from benchmarks.program.harness import run_workload
    from benchmarks.program.models import make
    from benchmarks.program.report import markdown

    def handles(memory):
        return (types.SimpleNamespace(ops=10, plain_ops=12, taped_ops=10, peak_bytes=memory,
                                      plan_seconds=0.0, record_seconds=0.002, trace_bytes=100),
                types.SimpleNamespace(plan_seconds=0.01, peak_bytes=memory))

    class Stand(torch.nn.Module):
        def __init__(self, model, memory):
            super().__init__()
            self.model = model
            self.stats, self.last_plan = handles(memory)

        def forward(self, *args):
            return self.model(*args)

    class StandFunction:
        def __init__(self, fn, memory):
            self.fn = fn
            self.stats, self.last_plan = handles(memory)

        def __call__(self, *args):
            return self.fn(*args)
    monkeypatch.setattr(bt, "checkpoint_module", Stand, raising=False)
    monkeypatch.setattr(bt, "checkpoint", lambda fn, *a, memory: fn(*a), raising=False)
    monkeypatch.setattr(bt, "checkpoint_function", StandFunction, raising=False)
    torch.set_num_threads(1)
    rows = []
    for name in ("unet", "rnn"):
        rows += run_workload(make(name, "smoke"), 1, 0, (), [3], "left out", lambda s: None)
    ours = [r for r in rows if r.kind == "bincheck"]
    assert ours and all(r.status == "ok" and r.max_rel_err == 0.0 for r in ours)
    assert {r.budget_of for r in ours if r.workload == "rnn"} >= {"per block", "binomial s=3",
                                                                  "50%"}
    assert all(r.ops == 10 and r.plan_s == 0.01 for r in ours)
    text = markdown(dict(date="d", mode="smoke", torch="t", bincheck_commit="c", threads=1,
                         load_start="0", load_end="0", compile="left out", bincheck="present"),
                    rows)
    assert "| a | unet |" in text and "| c | rnn |" in text and "| d | unet |" in text


def ode_smoke(out):
    return ["-m", "benchmarks.programs.ode", "--smoke", "--rounds", "1", "--out", out]


@pytest.mark.background("ode_smoke")
def test_ode_benchmark_smoke_run(background):
    """python -m benchmarks.programs.ode --smoke: the stiff ODE's Newton loop runs a varying
    number of iterations, every program's gradient agrees with plain autograd's, and each
    program holds less than plain autograd's peak."""
    import csv
    out, tmp_path = background
    assert out.returncode == 0, out.stderr[-2000:]
    rows = list(csv.DictReader(open(tmp_path / "ode-smoke.csv")))
    assert [r["strategy"] for r in rows][0] == "plain autograd" and len(rows) == 3
    r0 = rows[0]
    assert int(r0["newton_per_step_min"]) < int(r0["newton_per_step_max"])
    assert int(r0["state_floats"]) >= 20
    for r in rows[1:]:
        assert float(r["grad_max_rel_err"]) <= 1e-10, r
        assert float(r["peak_mib"]) < float(r0["peak_mib"]), r
        assert int(r["taped_ops"]) == int(r["ops"]) > 0, r
    assert (tmp_path / "ode-smoke.md").read_text().startswith("# A stiff ODE")


def test_programs_benchmark_skips_store_all_where_its_tape_would_not_fit(monkeypatch):
    """--full goes to n = 10^5: plain autograd runs only while its peak, predicted linearly
    from the last n measured, fits in a share of the free RAM; above 10^4 only it and the
    program with num_ckpts run, the gradient checked against outer binomial's where plain
    autograd did not run."""
    from benchmarks.programs import __main__ as bench
    monkeypatch.setattr(bench, "available_bytes", lambda: 2 ** 20)      # 1 MiB free
    monkeypatch.setattr(bench, "BIG_N", 130)                            # n=160 as n > 10^4
    # (n from 100: below it outer binomial's peak, program @outer's budget, is below the least
    # a program needs, CPython's free lists included)
    rows = bench.measure([100, 160], 1, log=lambda s: None)
    assert {r["strategy"] for r in rows if r["n"] == 100} == set(bench.STRATEGIES)
    assert [r["strategy"] for r in rows if r["n"] == 160] == ["program s"]
    assert all(r["grad_max_rel_err"] <= 1e-10 for r in rows)
    assert all(r["trace_mib"] > 0 for r in rows if r["strategy"].startswith("program"))


def budgets_smoke(out):
    return ["-m", "benchmarks.program.budgets", "--smoke", "--out", out]


@pytest.mark.background("budgets_smoke")
def test_program_budgets_smoke_run(background):
    """python -m benchmarks.program.budgets --smoke: an MLP's metered peak stays within each
    memory= budget, from the least the planner accepts up, and the files are written."""
    import csv
    out, tmp_path = background
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rows = list(csv.DictReader(open(tmp_path / "budgets-smoke.csv")))
    assert rows and rows[0]["budget"] == "least"
    for r in rows:
        assert int(r["peak"]) <= int(r["budget_bytes"]), r
