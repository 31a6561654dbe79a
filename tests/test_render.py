"""Schedule pictures: the terminal rendering (golden lines), the Revolve diagram's geometry, and
its painting into a file."""

import pytest

from bincheck import plan
from bincheck.schedule import ScheduleError
from bincheck.schedule.actions import Advance, Reverse, Snapshot
from bincheck.schedule.disk import DiskPlan
from bincheck.__main__ import plot
from bincheck.schedule.render import LEGEND, diagram, draw_text


def rows(text):
    """The action rows of a drawing, keyed by their number."""
    out = {}
    for line in text.splitlines():
        head = line[:4].strip()
        if head.isdigit():
            out[int(head)] = line.rstrip()
    return out


def test_text_golden_lines_plan_10_3():
    text = draw_text(plan(10, 3))
    assert text.startswith(LEGEND)
    lines = text.splitlines()
    assert lines[5] == "   # plain taped  action                   0    5    0"
    assert lines[4].endswith("1")                       # tens of the ruler
    r = rows(text)
    assert len(r) == len(list(plan(10, 3))) == 40
    assert r[1] == "   1     0     0  Snapshot(0)              S........."
    assert r[2] == "   2     4     0  Advance(0, 4)            o--->....."
    assert r[6] == "   6     9     0  Advance(7, 9)            o...o..o->"
    assert r[7] == "   7     9     1  Reverse(9, 10)           o...o..o.<"
    assert r[8] == "   8     9     1  Restore(7)               o...o..R."
    assert r[13] == "  13    10     3  Free(7)                  o...o..x"
    assert r[40] == "  40    15    10  Free(0)                  x"
    # the last row's counts are the plan's
    assert r[39].split()[1:3] == [str(plan(10, 3).plain_steps), "10"]


def test_text_taped_segments_and_disk():
    budget = plan(20, memory=2000, state_bytes=300, tape_bytes=200, work_bytes=100)
    r = rows(draw_text(budget))
    assert r[5] == "   5    13     7  Reverse(13, 20)          o...o........<======"
    assert r[11] == "  11    13    20  Reverse(0, 4)            <==="
    disk = rows(draw_text(DiskPlan(30, 3, 2.0, 2.0)))
    assert disk[1].endswith("Snapshot(0, disk)        D" + "." * 29)
    assert disk[2].endswith("d--->" + "." * 25)


def test_text_refuses_invalid_streams_and_wide_plans():
    with pytest.raises(ScheduleError):
        draw_text([Snapshot(0), Advance(0, 2), Reverse(1, 3)], seq_len=3)
    with pytest.raises(ValueError, match="--plot"):
        draw_text(plan(500, 10))


def test_diagram_geometry_plan_3_2():
    # Snapshot(0) Advance(0,1) Snapshot(1) Advance(1,2) Reverse(2,3) Restore(1) Reverse(1,2)
    # Free(1) Restore(0) Reverse(0,1) Free(0)
    d = diagram(plan(3, 2))
    assert d.title.startswith("binomial plan: 3 steps, 2 checkpoints")
    assert d.time == 5 and (d.plain_steps, d.taped_steps, d.peak_checkpoints) == (2, 3, 2)
    assert d.advance == [((0, 0), (1, 1)), ((1, 1), (2, 2))]
    assert d.taped == [((2, 2), (3, 3)), ((3, 1), (4, 2)), ((4, 0), (5, 1))]
    assert d.adjoint == [((3, 3), (3, 2)), ((3, 2), (4, 2)), ((4, 2), (4, 1)),
                         ((4, 1), (5, 1)), ((5, 1), (5, 0))]
    assert d.restore == [((3, 2), (3, 1)), ((4, 1), (4, 0))]
    assert d.snapshots == {"ram": [(0, 0), (1, 1)], "disk": []}
    assert d.held["ram"] == [((1, 1), (4, 1)), ((0, 0), (5, 0))]
    disk = diagram(DiskPlan(30, 3, 2.0, 2.0))
    assert len(disk.snapshots["disk"]) == disk.disk_writes > 0


def test_png_written(tmp_path):
    pytest.importorskip("matplotlib")
    for name, schedule in (("binomial.png", plan(20, 4)),
                           ("budget.png", plan(20, memory=2000, state_bytes=300, tape_bytes=200)),
                           ("disk.png", DiskPlan(30, 3, 2.0, 2.0)),
                           ("large.svg", plan(3000, 10))):
        path = tmp_path / name
        plot(schedule, path)
        data = path.read_bytes()
        assert len(data) > 5000
        assert data.startswith(b"\x89PNG") if name.endswith(".png") else b"<svg" in data[:2000]


def test_png_needs_matplotlib_says_how(tmp_path, monkeypatch):
    import builtins
    real = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(ImportError, match=r"bincheck\[bench\]"):
        plot(plan(10, 3), tmp_path / "x.png")
