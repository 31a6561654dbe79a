import re
import subprocess
import sys

import pytest


def run(*args):
    return subprocess.run([sys.executable, "-m", "bincheck", *args], capture_output=True, text=True)


def test_plan_summary():
    out = run("plan", "1000", "50")
    assert out.returncode == 0, out.stderr
    assert "1000 steps" in out.stdout and "1948" in out.stdout and "peak checkpoints  : 50" in out.stdout


def test_plan_lists_actions():
    out = run("plan", "3", "2", "--actions")
    assert out.returncode == 0
    assert "Snapshot(index=0)" in out.stdout and "Reverse(start=0, stop=1)" in out.stdout


def test_bad_arguments_give_usage_error():
    for args in (("plan", "10", "0"), ("plan", "ten", "3"), ("plan",)):
        out = run(*args)
        assert out.returncode == 2
        assert "usage:" in out.stderr and "Traceback" not in out.stderr


def test_closed_pipe_is_quiet():
    """``python -m bincheck plan ... --actions | head -1`` prints no BrokenPipeError traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "bincheck", "plan", "200000", "3", "--actions"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()                         # the reader goes away, as head does
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert first.startswith(b"binomial plan: 200000 steps")
    assert "Traceback" not in err and "BrokenPipe" not in err


@pytest.mark.parametrize("text", ["1_000", " 12", "+5", "\u0661\u0662", "1e3", "0x10"])
def test_only_plain_decimal_digits_are_integers(text):
    out = run("plan", text, "3")
    assert out.returncode == 2 and "decimal digits" in out.stderr


def test_over_long_argument_is_not_echoed_in_full():
    out = run("plan", "9" * 5000 + "x", "3")
    assert out.returncode == 2 and len(out.stderr) < 1000


def test_old_names_still_work():
    from bincheck import EqualSegments, LoopStats, plan, simulate
    p = plan(10, 3)
    assert p.peak_slots == p.peak_checkpoints == simulate(p).peak_slots == 3
    assert EqualSegments(10, 4).peak_slots == 4
    assert LoopStats(peak_snapshots=5).peak_checkpoints == 5


def test_draw_prints_one_row_per_action():
    out = run("plan", "10", "3", "--draw")
    assert out.returncode == 0, out.stderr
    assert "   7     9     1  Reverse(9, 10)           o...o..o.<" in out.stdout
    out = run("plan", "20", "--memory", "2000", "--state-bytes", "300", "--tape-bytes", "200",
              "--work-bytes", "100", "--draw")
    assert out.returncode == 0, out.stderr
    assert "Reverse(13, 20)          o...o........<======" in out.stdout


def test_draw_refuses_wide_plans():
    out = run("plan", "1000", "10", "--draw")
    assert out.returncode == 2 and "--plot FILE" in out.stderr


def test_plot_writes_an_image(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "schedule.png"
    out = run("plan", "20", "4", "--plot", str(path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip().endswith(f"wrote {path}")
    assert path.read_bytes().startswith(b"\x89PNG") and path.stat().st_size > 5000
    bad = run("plan", "20", "4", "--plot", str(tmp_path / "missing" / "x.png"))
    assert bad.returncode == 1 and "cannot draw into" in bad.stderr and "Traceback" not in bad.stderr


def test_plot_names_the_file_it_writes(tmp_path, capsys, monkeypatch):
    """``--plot schedule`` printed "wrote schedule" but wrote schedule.png; ``--plot DIR`` wrote
    DIR.png beside the directory."""
    pytest.importorskip("matplotlib")
    from bincheck.__main__ import main
    monkeypatch.chdir(tmp_path)
    (tmp_path / "adir").mkdir()
    for arg, written in (("schedule", "schedule.png"),
                         ("adir", str(tmp_path / "adir" / "schedule.png"))):
        assert main(["plan", "20", "4", "--plot", arg if arg == "schedule" else str(tmp_path / arg)]) == 0
        assert capsys.readouterr().out.rstrip().endswith(f"wrote {written}")
        assert (tmp_path / written).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "schedule.png"]


def test_huge_step_count_is_cut_and_names_no_internal_function():
    out = run("plan", "9" * 5000, "3")
    assert out.returncode == 2 and len(out.stderr) < 1000, out.stderr[:300]
    assert "_positive_int" not in out.stderr and "at most 18 digits" in out.stderr


def test_disk_option_plans_with_a_disk_tier():
    args = ("plan", "1000", "--memory", "100KB", "--state-bytes", "10KB", "--disk",
            "--step-seconds", "1e-3", "--write-seconds", "1e-5", "--read-seconds", "1e-5")
    out = run(*args)
    assert out.returncode == 0, out.stderr
    assert "disk (states in RAM and on disk) plan" in out.stdout
    writes = re.search(r"disk +: (\d+) writes, (\d+) reads", out.stdout)
    assert writes and int(writes.group(1)) > 0, out.stdout      # disk pays at these prices
    out = run(*args[:7])
    assert out.returncode == 2 and "--disk" in out.stderr and "--write-seconds" in out.stderr
    out = run(*args[:6], "--write-seconds", "1e-5")
    assert out.returncode == 2 and "add --disk" in out.stderr


def test_loop_stats_repr_uses_todays_name():
    from bincheck import LoopStats
    text = repr(LoopStats(peak_snapshots=5))
    assert "peak_checkpoints=5" in text and "peak_snapshots" not in text
