"""The wheel: it carries py.typed, the LICENSE and every subpackage, and installed (not editable)
into a fresh virtual environment it imports and runs from outside the repository.

Built without build isolation (``setuptools`` and ``wheel`` come with the ``test`` extra), from a
copy of the sources so that ``build/`` and ``*.egg-info`` never land in the checkout. The fresh
venv has no pip of its own; the running interpreter's pip installs into it (``pip --python``),
with ``--no-deps``. numpy and autograd are reached through a ``.pth`` file naming this
interpreter's site-packages (``--system-site-packages`` alone would give the base Python's, not
the test venv's); the installed wheel comes first on ``sys.path``.
"""

import os
import shutil
import site
import subprocess
import sys
import textwrap
import venv
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ["bincheck", "setup.cfg", "pyproject.toml", "README.md", "LICENSE", "MANIFEST.in",
           "CHANGELOG.md"]


def clean_env():
    env = dict(os.environ)
    for var in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PIP_REQUIRE_VIRTUALENV"):
        env.pop(var, None)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    pytest.importorskip("setuptools")
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        path = os.path.join(ROOT, name)
        if os.path.isdir(path):
            shutil.copytree(path, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif os.path.exists(path):
            shutil.copy(path, src / name)
    out = tmp_path_factory.mktemp("dist")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps",
                            "--no-build-isolation", "--no-index", "-w", str(out), "-q"],
                           capture_output=True, text=True, env=clean_env(), timeout=300)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-3000:]
    wheels = [f for f in os.listdir(out) if f.endswith(".whl")]
    assert len(wheels) == 1, wheels
    return out / wheels[0]


def test_wheel_contents(wheel):
    import bincheck
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        dist_info = {n.split("/")[0] for n in names if ".dist-info/" in n}
        assert len(dist_info) == 1
        metadata = z.read(f"{dist_info.pop()}/METADATA").decode()
    assert "bincheck/py.typed" in names
    assert any(n.endswith(".dist-info/LICENSE") or n.endswith(".dist-info/licenses/LICENSE")
               for n in names), sorted(n for n in names if "dist-info" in n)
    packages = {os.path.relpath(d, ROOT).replace(os.sep, "/")
                for d, _, files in os.walk(os.path.join(ROOT, "bincheck"))
                if "__init__.py" in files}
    assert packages >= {"bincheck", "bincheck/schedule", "bincheck/runtime", "bincheck/autograd"}
    for pkg in packages:
        assert f"{pkg}/__init__.py" in names, pkg
    source_modules = {os.path.relpath(os.path.join(d, f), ROOT).replace(os.sep, "/")
                      for d, _, files in os.walk(os.path.join(ROOT, "bincheck"))
                      for f in files if f.endswith(".py")}
    assert source_modules <= names, source_modules - names
    assert not any(n.startswith(("tests/", "benchmarks/", "docs/")) for n in names)
    assert f"Version: {bincheck.__version__}" in metadata
    for line in ("License: MIT", "Requires-Python: >=3.10",
                 "Classifier: License :: OSI Approved :: MIT License",
                 "Classifier: Programming Language :: Python :: 3.10",
                 "Classifier: Programming Language :: Python :: 3.11",
                 "Classifier: Programming Language :: Python :: 3.12",
                 "Classifier: Typing :: Typed", "Description-Content-Type: text/markdown"):
        assert line in metadata, line
    assert "binomial_checkpoint" in metadata            # the README as long description
    assert "Project-URL" not in metadata                # none exists yet: invent none


SMOKE = textwrap.dedent("""
    import os, sys
    import numpy
    import autograd.numpy as np
    from autograd import grad
    import bincheck
    from bincheck import binomial_checkpoint

    assert bincheck.__file__.startswith(sys.prefix), (bincheck.__file__, sys.prefix)
    assert os.path.exists(os.path.join(os.path.dirname(bincheck.__file__), "py.typed"))
    cell = lambda W, h, x: np.tanh(np.dot(h, W) + x)
    rng = numpy.random.RandomState(0)
    W, h0, xs = rng.randn(3, 3) * 0.5, rng.randn(2, 3), rng.randn(12, 2, 3)
    loop = binomial_checkpoint(cell, 12, num_ckpts=3)
    g = grad(lambda W: np.sum(loop(W, h0, xs) ** 2))(W)

    def plain(W):
        h = h0
        for x in xs:
            h = cell(W, h, x)
        return np.sum(h ** 2)

    assert numpy.allclose(g, grad(plain)(W), rtol=1e-10)
    assert loop.stats.plain_steps == bincheck.plan(12, 3).plain_steps
    print("smoke ok", bincheck.__version__)
""")


def test_installed_wheel_works_from_a_fresh_venv(wheel, tmp_path):
    target = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(target)
    python = str(target / ("Scripts" if os.name == "nt" else "bin") / "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                              "['purelib'])"], capture_output=True, text=True,
                             env=clean_env()).stdout.strip()
    # numpy and autograd from the interpreter running the tests (never its bincheck: .pth lines
    # only append directories, so the editable install's finder there is not activated).
    with open(os.path.join(purelib, "test-deps.pth"), "w") as f:
        f.write("\n".join(site.getsitepackages()) + "\n")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install",
                              "--no-deps", "--no-index", "-q", str(wheel)],
                             capture_output=True, text=True, env=clean_env(), timeout=300)
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-3000:]
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    smoke = subprocess.run([python, "-c", SMOKE], cwd=outside, capture_output=True, text=True,
                           env=clean_env(), timeout=300)
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr[-3000:]
    assert smoke.stdout.startswith("smoke ok")
    cli = subprocess.run([python, "-m", "bincheck", "plan", "10", "3"], cwd=outside,
                         capture_output=True, text=True, env=clean_env(), timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.splitlines()[0] == \
        "binomial plan: 10 steps, 3 checkpoints (the initial state included)"
    assert "plain evaluations : 15" in cli.stdout
