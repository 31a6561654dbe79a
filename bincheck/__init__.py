"""bincheck: optimal binomial checkpointing for long loops differentiated with HIPS autograd."""

from .autograd_loop import (CheckpointedLoop, LoopStats, NondeterministicStepError, WhileLoop,
                            binomial_checkpoint, checkpointed_while_loop)
from .executor import Executor
from .schedule import (Advance, Cost, EqualSegments, Free, Plan, Restore, Reverse, ScheduleError, Snapshot,
                       optimal_plain_steps, plan, simulate)

__all__ = ["binomial_checkpoint", "checkpointed_while_loop", "WhileLoop",
           "NondeterministicStepError", "CheckpointedLoop", "LoopStats", "EqualSegments", "plan", "Plan", "optimal_plain_steps",
           "simulate", "Cost", "ScheduleError", "Executor", "Advance", "Snapshot", "Restore",
           "Free", "Reverse"]
__version__ = "0.1.0"
