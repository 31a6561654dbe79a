import os
import sys

import pytest

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
