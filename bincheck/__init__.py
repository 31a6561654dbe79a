"""bincheck: optimal binomial checkpointing for long loops differentiated with HIPS autograd.

The planning layer (``plan``, ``simulate``, the actions, ``EqualSegments``) and the runtime
(``Executor``, ``LoopStats``) need only the standard library and numpy; the loops themselves
(``binomial_checkpoint``, ``checkpointed_while_loop``, ...) import autograd, lazily, on first use.
"""

from typing import Any

from .runtime import Executor, LoopStats, ProgramStats
from .schedule import (Advance, BudgetPlan, Cost, EqualSegments, Free, Plan, Restore, Reverse,
                       ScheduleError, Sizes, Snapshot, memory_for, optimal_plain_steps,
                       parse_bytes, plan, simulate)

_AUTOGRAD_NAMES = ("binomial_checkpoint", "checkpointed_while_loop", "CheckpointedLoop",
                   "WhileLoop", "NondeterministicStepError", "checkpoint_program",
                   "CheckpointedProgram")

__all__ = ["binomial_checkpoint", "checkpointed_while_loop", "WhileLoop",
           "NondeterministicStepError", "CheckpointedLoop", "LoopStats", "EqualSegments", "plan",
           "Plan", "optimal_plain_steps", "simulate", "Cost", "ScheduleError", "Executor",
           "Advance", "Snapshot", "Restore", "Free", "Reverse", "BudgetPlan", "Sizes",
           "memory_for", "parse_bytes", "checkpoint_program", "CheckpointedProgram",
           "ProgramStats"]
__version__ = "0.2.0"


def __getattr__(name: str) -> Any:
    if name in _AUTOGRAD_NAMES:
        from . import autograd as adapter     # the only import of autograd, deferred
        value = getattr(adapter, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bincheck' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_AUTOGRAD_NAMES))
