"""The records of both parts (no jax here: ``--replot`` reads them back without it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..common.rows import LoopRow


@dataclass
class Row(LoopRow):
    lower_s: float | None = None        # trace + lower
    compile_s: float | None = None      # XLA compile
    temp_bytes: int | None = None       # memory_analysis().temp_size_in_bytes
    temp_rel: float | None = None       # / lax.scan's
    evals: int | None = None            # step evaluations, counted
    expected_evals: int | None = None   # by construction (scan T, remat 2T) or plan + T
    plain_steps: int | None = None      # bincheck: the plan's plain evaluations
    taped_steps: int | None = None
    plan_num_ckpts: int | None = None   # bincheck memory=: the slots the budget bought
    plan_peak_bytes: int | None = None  # bincheck memory=: BudgetPlan.peak_bytes
    plan_segment: int | None = None     # bincheck memory=: the longest kept taped segment
    time_s: float | None = None
    times_s: list = field(default_factory=list)
    rel_time: float | None = None       # / lax.scan's
    bound_s: float | None = None        # plain_steps * plain + taped_steps * (taped + backward)
    bounds_s: list = field(default_factory=list)   # the bound from each round's costs
    time_over_bound: float | None = None   # median over rounds of time / that round's bound
    step_plain_ms: float | None = None  # per-step costs, medians over the rounds
    step_taped_ms: float | None = None


@dataclass
class WhileRow:
    strategy: str
    kind: str
    max_steps: int
    hidden: int
    batch: int
    input_size: int
    num_ckpts: int | None = None
    status: str = "ok"
    note: str | None = None
    lower_s: float | None = None        # the gradient's trace + lower
    compile_s: float | None = None      # the gradient's XLA compile
    temp_bytes: int | None = None       # the gradient's memory_analysis().temp_size_in_bytes
    fwd_temp_bytes: int | None = None   # the forward's
    runs: dict = field(default_factory=dict)  # "small"/"large": n, err, fwd_s, grad_s, times
