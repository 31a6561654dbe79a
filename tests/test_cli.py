import subprocess
import sys


def run(*args):
    return subprocess.run([sys.executable, "-m", "bincheck", *args], capture_output=True, text=True)


def test_plan_summary():
    out = run("plan", "1000", "50")
    assert out.returncode == 0, out.stderr
    assert "1000 steps" in out.stdout and "1948" in out.stdout and "peak states held  : 50" in out.stdout


def test_plan_lists_actions():
    out = run("plan", "3", "2", "--actions")
    assert out.returncode == 0
    assert "Snapshot(index=0)" in out.stdout and "Reverse(start=0, stop=1)" in out.stdout


def test_bad_arguments_give_usage_error():
    for args in (("plan", "10", "0"), ("plan", "ten", "3"), ("plan",)):
        out = run(*args)
        assert out.returncode == 2
        assert "usage:" in out.stderr and "Traceback" not in out.stderr
