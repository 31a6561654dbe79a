import os
import sys

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
