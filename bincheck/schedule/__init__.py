"""Framework-free planning: action vocabulary, offline plans, symbolic simulator, byte budgets."""

from .actions import Action, Advance, Free, Restore, Reverse, Snapshot
from .binomial import Plan, beta, optimal_plain_steps, repetitions, split
from .budget import (BudgetPlan, MemoryBudget, Sizes, format_bytes, memory_for, parse_bytes,
                     plan)
from .chain import Chain, ChainCost, ChainPlan, chain_cost
from .mixed import MixedPlan
from .segments import EqualSegments
from .simulate import Cost, ScheduleError, Tracker, simulate

__all__ = ["Action", "Advance", "Free", "Restore", "Reverse", "Snapshot", "Plan", "beta",
           "optimal_plain_steps", "plan", "EqualSegments", "repetitions", "split", "Cost",
           "ScheduleError", "Tracker", "simulate", "BudgetPlan", "MixedPlan", "Sizes",
           "memory_for", "parse_bytes", "format_bytes", "MemoryBudget", "Chain", "ChainPlan",
           "ChainCost", "chain_cost"]
