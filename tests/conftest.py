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
