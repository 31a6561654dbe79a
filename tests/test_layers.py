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
    third_party = {n for n in imports_of(path) if not n.startswith(".")} - set(sys.stdlib_module_names)
    assert not {n.split(".")[0] for n in third_party} - set(sys.stdlib_module_names), third_party


@pytest.mark.parametrize("path", modules("autograd") + modules("torch"))
def test_each_front_end_imports_only_its_own_framework(path):
    own = os.path.basename(os.path.dirname(path))
    for name in imports_of(path):
        top = name.lstrip(".").split(".")[0] if not name.startswith("..") else \
            name[2:].split(".")[0]
        assert top not in {"autograd", "torch", "jax"} - {own}, (path, name)


@pytest.mark.parametrize("path", modules("runtime"))
def test_runtime_layer_imports_no_framework(path):
    for name in imports_of(path):
        top = name.lstrip(".").split(".")[0]
        assert top not in ("autograd", "torch", "jax"), (path, name)
        assert not name.startswith("..autograd"), (path, name)


@pytest.mark.parametrize("package", ["autograd", "torch"])
def test_adapter_imports_flow_one_way(package):
    """Within each front end: no cycles, and the lower modules never import the front ends."""
    graph = {}
    for path in modules(package):
        mod = os.path.basename(path)[:-3]
        graph[mod] = {n[1:] for n in imports_of(path) if n.startswith(".") and not
                      n.startswith("..")} - {""}
    lower = ("tangent", "primitives", "sweep") if package == "autograd" else \
        ("function", "sweep", "steps", "store", "probe", "boundary", "context")
    assert "loops" not in set().union(*(graph[m] for m in lower))
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
