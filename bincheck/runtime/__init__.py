"""Running schedules on real states, independent of any AD framework (numpy at most).

:class:`Executor` replays a schedule's actions through a *stepper* (what a step is) and a *store*
(where snapshots live), with optional *observers* (e.g. a determinism check); :class:`LoopStats`
is what one gradient did. The autograd adapter supplies the stepper; nothing here imports it.
"""

from .errors import NondeterministicStepError
from .executor import Executor, Observer, Stepper
from .stats import LoopStats, ProgramStats
from .store import MemoryStore, Store

__all__ = ["NondeterministicStepError", "Executor", "Observer", "Stepper", "LoopStats", "ProgramStats",
           "MemoryStore", "Store"]
