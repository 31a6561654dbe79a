"""Ratios between two timed strategies on a shared machine (every benchmark in benchmarks/).

The development VM's speed moves within minutes (the same plain step measured 0.145 and 0.19 ms
a few seconds apart on 2026-11-24), so a ratio of two medians taken over different moments
mixes the machine's state into the comparison. The harnesses interleave the strategies, one
gradient each per round; a ratio is the median over rounds of the ratio *within* a round.
"""

from __future__ import annotations

import statistics
from typing import Sequence


def paired(a: Sequence[float], b: Sequence[float]) -> float:
    """``a`` over ``b``: the median over rounds of ``a[k] / b[k]``."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired ratio needs one time per round on both sides; got {len(a)} "
                         f"and {len(b)}")
    return statistics.median(x / y for x, y in zip(a, b))
