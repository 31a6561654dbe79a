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
    from benchmarks.rnn import report
    path = tmp_path / "results.csv"
    report.write_atomic(str(path), b"old")

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(report.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        report.write_atomic(str(path), b"new, half written")
    assert path.read_bytes() == b"old"                   # the old file is intact
    assert os.listdir(tmp_path) == ["results.csv"]       # and no temporary is left behind
