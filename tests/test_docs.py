"""The documentation under docs/: it builds with warnings as errors and no dead reference, and
no example in it is untested.

* ``docs/examples/*.py`` run, each in a fresh interpreter (their assertions compare the
  checkpointed results with the plain loop's), and every one is included in a page;
* every ``$ python -m bincheck ...`` line of a ``console`` block runs and prints what the page
  shows under it;
* the docstrings' ``>>>`` examples pass doctest;
* a page holds no other code: only ``literalinclude`` of an example, ``console`` blocks and
  ``text`` blocks (formulas, diagrams).
"""

import doctest
import importlib
import os
import pkgutil
import re
import shlex
import subprocess
import sys

import pytest

import bincheck

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
EXAMPLES = sorted(f for f in os.listdir(os.path.join(DOCS, "examples")) if f.endswith(".py"))
PAGES = sorted(f for f in os.listdir(DOCS) if f.endswith(".rst"))
DIRECTIVE = re.compile(r"^\s*\.\. ([\w:-]+)::\s*(.*?)\s*$")


def env():
    e = dict(os.environ, PYTHONPATH=ROOT, COLUMNS="100", OPENBLAS_NUM_THREADS="1")
    e.pop("PYTHONSTARTUP", None)
    return e


def page(name):
    with open(os.path.join(DOCS, name), encoding="utf-8") as f:
        return f.read().splitlines()


def console_blocks():
    """(page, line, command, expected output lines) for every command in a console block."""
    found = []
    for name in PAGES:
        lines = page(name)
        for i, line in enumerate(lines):
            m = DIRECTIVE.match(line)
            if not (m and m.group(1) == "code-block" and m.group(2) == "console"):
                continue
            j = i + 1
            while j < len(lines) and lines[j].lstrip().startswith(":"):
                j += 1                                  # directive options
            body, indent = [], None
            for text in lines[j:]:
                if text.strip():
                    width = len(text) - len(text.lstrip())
                    if indent is None:
                        indent = width
                    if width < indent:
                        break
                body.append(text[indent:] if indent and text.strip() else text.strip())
            while body and not body[-1]:
                body.pop()
            while body and not body[0]:
                body.pop(0)
            command = None
            for text in body:
                if text.startswith("$ "):
                    command = [text[2:], []]
                    found.append((name, i + 1, *command))
                else:
                    assert command is not None, f"{name}:{i + 1}: output before any command"
                    command[1].append(text.rstrip())
    return found


def test_sphinx_build_has_no_warnings(tmp_path):
    # -n (nitpicky): every cross-reference resolves (24 were dead, among them the page on what
    # verify=True checks); only standard-library types are exempt (docs/conf.py)
    out = subprocess.run([sys.executable, "-m", "sphinx", "-n", "-W", "--keep-going", "-E", "-q",
                          "-b", "html", "-d", str(tmp_path / "doctrees"), DOCS,
                          str(tmp_path / "html")],
                         capture_output=True, text=True, env=env(), timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for name in PAGES:
        assert (tmp_path / "html" / name.replace(".rst", ".html")).exists()
    assert (tmp_path / "html" / "_images" / "schedule.png").exists()
    api = (tmp_path / "html" / "api.html").read_text(encoding="utf-8")
    wanted = [
        "bincheck.binomial_checkpoint", "bincheck.checkpointed_while_loop",
        "bincheck.CheckpointedLoop", "bincheck.CheckpointedLoop.preview",
        "bincheck.CheckpointedLoop.measure", "bincheck.CheckpointedLoop.memory_for",
        "bincheck.CheckpointedLoop.plan", "bincheck.CheckpointedLoop.predicted_plain_steps",
        "bincheck.CheckpointedLoop.stats", "bincheck.WhileLoop", "bincheck.WhileLoop.num_steps",
        "bincheck.LoopStats", "bincheck.LoopStats.peak_checkpoints",
        "bincheck.Advance", "bincheck.Snapshot", "bincheck.Restore", "bincheck.Free",
        "bincheck.Reverse", "bincheck.Executor", "bincheck.Executor.run", "bincheck.plan",
        "bincheck.Plan", "bincheck.BudgetPlan", "bincheck.Sizes", "bincheck.memory_for",
        "bincheck.parse_bytes", "bincheck.simulate", "bincheck.Cost", "bincheck.EqualSegments",
        "bincheck.schedule.MixedPlan", "bincheck.schedule.disk.DiskPlan",
        "bincheck.NondeterministicStepError", "bincheck.autograd.InternalError",
        "bincheck.runtime.disk.CorruptSnapshotError", "bincheck.schedule.render.diagram",
        "bincheck.__main__.plot"]
    wanted += [f"bincheck.LoopStats.{f}" for f in bincheck.LoopStats.__dataclass_fields__]
    missing = [w for w in wanted if f'id="{w}"' not in api]
    assert not missing, f"not in the API reference: {missing}"


BACKGROUND_CWD = None                   # an example runs in a folder of its own
background_env = env


def example(out, name):
    return [os.path.join(DOCS, "examples", name)]


@pytest.mark.background("example")
@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs(name, background):
    out, _ = background
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]


def test_pages_hold_only_tested_code():
    included = set()
    for name in PAGES:
        lines = page(name)
        for i, line in enumerate(lines, 1):
            where = f"docs/{name}:{i}"
            assert ">>>" not in line, f"{where}: put examples in docs/examples/ instead"
            m = DIRECTIVE.match(line)
            if m:
                kind, arg = m.groups()
                if kind in ("code-block", "code", "sourcecode"):
                    assert arg in ("console", "text"), f"{where}: untested {arg} block"
                elif kind == "literalinclude":
                    assert arg.startswith("examples/") and arg.endswith(".py"), where
                    assert os.path.exists(os.path.join(DOCS, arg)), where
                    included.add(arg[len("examples/"):])
            elif line.rstrip().endswith("::") and not line.lstrip().startswith(".."):
                raise AssertionError(f"{where}: a literal block; use literalinclude, or a "
                                     f"console or text code-block")
    assert included == set(EXAMPLES), f"examples no page shows: {set(EXAMPLES) - included}"


CONSOLE = console_blocks()


def test_console_blocks_found():
    assert len(CONSOLE) >= 4


@pytest.mark.parametrize("where,command,expected", [(f"{p}:{line}", c, e)
                                                    for p, line, c, e in CONSOLE])
def test_console_command_prints_what_the_page_shows(where, command, expected, tmp_path):
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "bincheck"], f"{where}: only bincheck commands are run"
    out = subprocess.run([sys.executable, *argv[1:]], cwd=tmp_path, capture_output=True,
                         text=True, env=env(), timeout=120)
    assert out.returncode == 0, f"{where}: {out.stderr}"
    assert [line.rstrip() for line in out.stdout.rstrip("\n").splitlines()] == expected, where


def test_docstring_examples_pass():
    attempted = 0
    for info in pkgutil.walk_packages(bincheck.__path__, "bincheck."):
        if info.name == "bincheck.__main__":
            continue
        module = importlib.import_module(info.name)
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, info.name
        attempted += result.attempted
    assert attempted >= 2
