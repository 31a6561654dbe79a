"""The fields every loop benchmark's row starts with (benchmarks.torch and benchmarks.jax)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LoopRow:
    """One strategy on one RNN cell; a benchmark's row adds its meters and times."""
    cell: str
    seq_len: int
    hidden: int
    batch: int
    input_size: int
    strategy: str
    kind: str
    label: str                          # short label on the plot
    num_ckpts: int | None = None
    memory_budget: int | None = None    # memory= bytes
    budget_of: str | None = None        # the peer or fraction the budget was taken from
    status: str = "ok"
    note: str | None = None             # a refusal's full message
    max_rel_err: float | None = None
