"""Framework-free planning: action vocabulary, offline binomial plan, symbolic simulator."""

from .actions import Action, Advance, Free, Restore, Reverse, Snapshot
from .binomial import Plan, beta, optimal_plain_steps, plan, repetitions, split
from .segments import EqualSegments
from .simulate import Cost, ScheduleError, Tracker, simulate

__all__ = ["Action", "Advance", "Free", "Restore", "Reverse", "Snapshot", "Plan", "beta",
           "optimal_plain_steps", "plan", "EqualSegments", "repetitions", "split", "Cost", "ScheduleError",
           "Tracker", "simulate"]
