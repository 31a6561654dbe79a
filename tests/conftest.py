import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading

import pytest

# torch on one thread, in this process and in every subprocess the tests start (the docs'
# examples, the README's blocks, the layer checks): their tensors are small, and on a 2-core
# machine a second intra-op thread only contends with XLA's threads and with whatever else runs
# there (a docs example took 10 s instead of 4 under load). The benchmarks' smoke runs and the
# DDP workers already ran with one, and test_benchmark_cli set it for this process midway; the
# tests check values, counts and memory, none the thread count. A value already set is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)                       # shared test helpers (models.py)
sys.path.insert(0, os.path.dirname(HERE))      # the repository root (benchmarks package)


@pytest.fixture
def cheap_disk(monkeypatch):
    """Disk I/O priced as nearly free, so that a budgeted loop with ``disk=...`` does use the disk:
    for tests of the disk store itself (files, checksums, cleanup), not of whether it pays."""
    from bincheck.runtime import disk
    monkeypatch.setattr(disk, "disk_seconds", lambda *args, **kwargs: (1e-9, 1e-9))


@pytest.fixture(autouse=True)
def segment_prices_by_evaluations(monkeypatch):
    """bincheck.jax keeps static segments only where they are faster at measured prices
    (``prices.step_prices`` times compiled sweeps): a plan chosen by timing would make tests
    depend on the machine's load. Every test gets prices proportional to the step's
    evaluations instead (a step run plain and taped: 2; a recomputation: 1), so that segments
    are kept exactly where they save ``SEGMENT_MIN_GAIN`` of the evaluations. Tests of the
    pricing itself replace these (tests/test_jax_segments_pay.py)."""
    prices = sys.modules.get("bincheck.jax.prices")
    if prices is not None:
        by_evaluations = prices.Prices(2.0, 1.0)
        monkeypatch.setattr(prices, "step_prices",
                            lambda flat, L, x_wanted: (by_evaluations, by_evaluations))
    yield


# --- subprocess runs started early, checked last -------------------------------------------
# The benchmarks' smoke runs and the docs' examples are subprocesses (two minutes in all on a
# 2-core machine). A test marked ``@pytest.mark.background("argv_of")`` names a function of its
# module, ``argv_of(out, **params) -> argv`` (after ``python``); its subprocess starts when the
# tests are collected, one at a time on a thread, so that it runs on the second core while the
# rest of the suite runs on the first, and the test itself runs last, taking the finished run
# from the ``background`` fixture.

class _Background:
    def __init__(self):
        self.jobs = {}
        self.proc = None
        self.stopping = False
        self.thread = None

    def add(self, nodeid, argv, cwd, env):
        out = tempfile.mkdtemp(prefix="bincheck-test-")
        self.jobs[nodeid] = dict(argv=argv(out), cwd=cwd or out, env=env, out=out,
                                 result=None, done=threading.Event())

    def start(self):
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        for job in self.jobs.values():
            try:
                if self.stopping:
                    raise RuntimeError("the test session ended first")
                self.proc = subprocess.Popen([sys.executable, *job["argv"]], cwd=job["cwd"],
                                            env=job["env"], stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True)
                stdout, stderr = self.proc.communicate(timeout=900)
                job["result"] = subprocess.CompletedProcess(job["argv"], self.proc.returncode,
                                                            stdout, stderr)
            except BaseException as e:          # the test that waits for it raises it
                job["result"] = e
                if self.proc is not None and self.proc.poll() is None:
                    self.proc.kill()            # (timed out: no process left behind)
                    self.proc.communicate()
            finally:
                job["done"].set()

    def result(self, nodeid):
        job = self.jobs[nodeid]
        assert job["done"].wait(1800), f"{nodeid}: its subprocess did not finish"
        if isinstance(job["result"], BaseException):
            raise job["result"]
        return job["result"], pathlib.Path(job["out"])

    def stop(self):
        self.stopping = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.thread is not None:
            self.thread.join(60)
        for job in self.jobs.values():
            shutil.rmtree(job["out"], ignore_errors=True)


_background = _Background()


def pytest_configure(config):
    config.addinivalue_line("markers", "background(argv_of): the test's subprocess starts at "
                            "collection and runs beside the suite; the test runs last")


@pytest.hookimpl(trylast=True)          # after -k / -m deselected what they deselect
def pytest_collection_modifyitems(config, items):
    marked = [item for item in items if item.get_closest_marker("background")]
    for item in marked:
        argv_of = getattr(item.module, item.get_closest_marker("background").args[0])
        params = item.callspec.params if hasattr(item, "callspec") else {}
        # the repository root, or (``BACKGROUND_CWD = None``) the run's own folder
        cwd = getattr(item.module, "BACKGROUND_CWD", os.path.dirname(HERE))
        env = getattr(item.module, "background_env", lambda: dict(os.environ))()
        _background.add(item.nodeid, lambda out: argv_of(out, **params), cwd, env)
    if marked:
        items[:] = [item for item in items if item not in marked] + marked
        if not config.option.collectonly:
            _background.start()


def pytest_unconfigure(config):
    _background.stop()


@pytest.fixture
def background(request):
    """The finished subprocess of a test marked ``background``: ``(CompletedProcess, out)``,
    ``out`` the folder its ``argv_of`` was given (removed at the session's end)."""
    return _background.result(request.node.nodeid)
