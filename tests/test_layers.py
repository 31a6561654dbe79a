"""The layering holds: planning works without autograd, imports flow one way, modules stay small."""

import ast
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "bincheck")

BLOCK_AUTOGRAD = textwrap.dedent("""
    import importlib.abc, sys
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "autograd" or name.startswith("autograd."):
                raise ImportError("autograd is blocked for this test")
    sys.meta_path.insert(0, Block())
""")


def run_blocked(code, blocked="autograd"):
    prelude = BLOCK_AUTOGRAD.replace('"autograd"', repr(blocked)).replace(
        '"autograd."', repr(blocked + "."))
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_bincheck_and_its_autograd_front_end_never_import_torch():
    out = run_blocked("""
        import numpy, autograd.numpy as anp
        from autograd import grad
        import bincheck
        loop = bincheck.binomial_checkpoint(lambda p, h, x: anp.tanh(h * p + x), 10, 3)
        g = grad(lambda p: anp.sum(loop(p, numpy.ones(2), numpy.ones((10, 2)))))(0.5)
        assert "torch" not in sys.modules and "jax" not in sys.modules
        print("ok", g)
    """, blocked="torch")
    assert out.returncode == 0, out.stderr
    assert "ok" in out.stdout


def test_the_torch_front_end_needs_no_autograd():
    pytest.importorskip("torch")
    out = run_blocked("""
        import torch
        import bincheck.torch as bt
        p = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
        loop = bt.binomial_checkpoint(lambda p, h, x: torch.tanh(h * p + x), 10, 3)
        loop(p, torch.ones(2, dtype=torch.float64), torch.ones(10, 2, dtype=torch.float64)).sum().backward()
        assert "autograd" not in sys.modules
        print("ok", float(p.grad))
    """)
    assert out.returncode == 0, out.stderr
    assert "ok" in out.stdout


def test_planning_works_without_autograd():
    out = run_blocked("""
        import bincheck.schedule
        import bincheck
        p = bincheck.plan(1000, 50)
        assert bincheck.simulate(p).plain_steps == 1948
        assert bincheck.simulate(bincheck.EqualSegments(10, 3)).taped_steps == 10
        import runpy
        sys.argv = ["bincheck", "plan", "1000", "50"]
        try:
            runpy.run_module("bincheck", run_name="__main__")
        except SystemExit as stop:
            assert stop.code == 0, stop.code
        assert "autograd" not in sys.modules
        try:
            from bincheck import binomial_checkpoint
        except ImportError as err:
            print("loops need autograd:", err)
    """)
    assert out.returncode == 0, out.stderr
    assert "1948" in out.stdout
    assert "loops need autograd: autograd is blocked" in out.stdout


def imports_of(path):
    tree = ast.parse(open(path, encoding="utf-8").read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            names.add(base)
            if node.module is None:
                names |= {"." * node.level + a.name for a in node.names}
    return names


def modules(sub):
    folder = os.path.join(PKG, sub)
    return [os.path.join(folder, f) for f in sorted(os.listdir(folder)) if f.endswith(".py")]


@pytest.mark.parametrize("path", modules("schedule"))
def test_schedule_layer_is_stdlib_only(path):
    """The standard library, and numpy (a core dependency) for the chain planner's DP, which
    DESIGN.md's round-4 layering allows: no framework."""
    third_party = {n for n in imports_of(path) if not n.startswith(".")} - set(sys.stdlib_module_names)
    allowed = set(sys.stdlib_module_names) | (
        {"numpy"} if path.endswith(("chain.py", "chain_dp.py")) else set())
    assert not {n.split(".")[0] for n in third_party} - allowed, third_party


@pytest.mark.parametrize("path", modules("autograd") + modules("torch") + modules("jax"))
def test_each_front_end_imports_only_its_own_framework(path):
    own = os.path.basename(os.path.dirname(path))
    for name in imports_of(path):
        top = name.lstrip(".").split(".")[0] if not name.startswith("..") else \
            name[2:].split(".")[0]
        assert top not in {"autograd", "torch", "jax"} - {own}, (path, name)


def absolute(path, name):
    """The absolute module an import in ``path`` names (relative imports resolved)."""
    level = len(name) - len(name.lstrip("."))
    if not level:
        return name
    package = os.path.relpath(os.path.dirname(path), ROOT).split(os.sep)
    base = package[:len(package) - (level - 1)]
    return ".".join(base + ([name[level:]] if name[level:] else []))


def test_only_the_jax_front_end_imports_jax():
    outside = [os.path.join(folder, f) for folder, _, files in os.walk(PKG)
               if os.path.relpath(folder, PKG).split(os.sep)[0] != "jax"
               for f in files if f.endswith(".py")]
    assert len(outside) > 20
    assert absolute(os.path.join(PKG, "__init__.py"), ".jax") == "bincheck.jax"
    for path in outside:
        for name in imports_of(path):
            module = absolute(path, name)
            assert module.split(".")[0] != "jax", (path, name)
            assert not (module + ".").startswith("bincheck.jax."), (path, name)


def test_jax_tables_are_numpy_only():
    """The plan's tables are built with numpy alone (no jax: testable without it)."""
    third_party = {n.split(".")[0] for n in imports_of(os.path.join(PKG, "jax", "tables.py"))
                   if not n.startswith(".")} - set(sys.stdlib_module_names)
    assert third_party <= {"numpy"}, third_party


def test_bincheck_and_its_other_front_ends_work_without_jax():
    out = run_blocked("""
        import bincheck, bincheck.schedule, bincheck.runtime
        assert bincheck.plan(1000, 50).plain_steps == 1948
        dir(bincheck)
        try:
            import autograd.numpy as anp
            from autograd import grad
        except ImportError:
            print("no autograd")
        else:
            loop = bincheck.binomial_checkpoint(lambda p, h, x: anp.tanh(h * p + x), 10, 3)
            print("autograd ok", grad(lambda p: anp.sum(loop(p, anp.ones(2), anp.ones((10, 2)))))(
                0.5))
        try:
            import torch
        except ImportError:
            print("no torch")
        else:
            import bincheck.torch
            print("torch ok")
        assert "jax" not in sys.modules
        try:
            import bincheck.jax
        except ImportError as err:
            print("the jax front end needs jax:", err)
    """, blocked="jax")
    assert out.returncode == 0, out.stderr
    assert "the jax front end needs jax: " in out.stdout      # the block's ImportError
    assert "autograd ok" in out.stdout or "no autograd" in out.stdout


@pytest.mark.parametrize("path", modules("runtime"))
def test_runtime_layer_imports_no_framework(path):
    for name in imports_of(path):
        top = name.lstrip(".").split(".")[0]
        assert top not in ("autograd", "torch", "jax"), (path, name)
        assert not name.startswith("..autograd"), (path, name)


@pytest.mark.parametrize("package", ["autograd", "torch", "jax"])
def test_adapter_imports_flow_one_way(package):
    """Within each front end: no cycles, and the lower modules never import the front ends."""
    graph = {}
    for path in modules(package):
        mod = os.path.basename(path)[:-3]
        graph[mod] = {n[1:] for n in imports_of(path) if n.startswith(".") and not
                      n.startswith("..")} - {""}
    lower = {"autograd": ("tangent", "primitives", "sweep"),
             "torch": ("function", "sweep", "steps", "store", "probe", "boundary", "context",
                       "offload"),
             "jax": ("boundary", "tables", "sweep", "sizes", "revolve")}[package]
    fronts = {"loops", "while_loop"} if package == "jax" else {"loops"}
    assert not fronts & set().union(*(graph.get(m, set()) for m in lower))
    if package == "jax":
        assert graph["tables"] == set()       # the tables import no other jax module
    state = {}

    def visit(m, trail):
        assert state.get(m) != "open", f"import cycle: {' -> '.join(trail + [m])}"
        if state.get(m) == "done":
            return
        state[m] = "open"
        for dep in graph.get(m, ()):
            visit(dep, trail + [m])
        state[m] = "done"
    for m in graph:
        visit(m, [])


def test_modules_hold_one_concept_each():
    for folder, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                lines = sum(1 for _ in open(path, encoding="utf-8"))
                assert lines <= 400, f"{os.path.relpath(path, ROOT)} has {lines} lines"
