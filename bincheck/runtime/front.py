"""What every front end's loop object shares, whatever its framework.

:class:`Configured`: a loop is configuration, frozen once built; only its published results
(``stats``, ``last_plan``) are replaced, whole, when a call completes. :class:`SizeCache`: with a
memory budget, a step is measured once per argument signature (the measurement itself is the
front end's) and each plan made once per (length, budget, sizes). :class:`ActionCache`: the
actions of the fixed plan a loop ran last, replayed from a tuple by the next call.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from typing import Any, Callable, Hashable

from ..schedule.binomial import Plan
from ..schedule.budget import BudgetPlan, Sizes
from .stats import LoopStats


class Configured:
    """A loop object: set up in ``__init__``, then frozen by :meth:`_freeze`."""

    _published: tuple[str, ...] = ("stats",)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._published and getattr(self, "_frozen", False):
            raise AttributeError(f"{type(self).__name__} is configured once: create a new loop "
                                 f"instead of setting {name!r}")
        object.__setattr__(self, name, value)

    def _freeze(self) -> None:
        self.stats = LoopStats()
        object.__setattr__(self, "_frozen", True)


class SizeCache:
    """Measured :class:`Sizes` per argument signature, and the plans made from them."""

    def __init__(self) -> None:
        self._sizes: dict = {}
        self._plans: dict = {}
        self._lock = threading.Lock()

    def measured(self, key: Hashable, measure: Callable[[], Sizes]) -> Sizes:
        """The sizes cached under ``key``, measured by ``measure()`` the first time."""
        sizes = self._sizes.get(key)
        if sizes is None:
            sizes = measure()
            with self._lock:
                sizes = self._sizes.setdefault(key, sizes)
        return sizes

    def plan(self, seq_len: int, memory: int, sizes: Sizes, disk: bool = False) -> BudgetPlan:
        key = (seq_len, memory, sizes, disk)
        plan = self._plans.get(key)
        if plan is None:
            plan = BudgetPlan(seq_len, memory, sizes, disk)
            with self._lock:
                plan = self._plans.setdefault(key, plan)
        return plan


class ActionCache:
    """The actions of the fixed ``num_ckpts`` plan a loop ran last, as a tuple when there are at
    most ``LIMIT``.

    A loop called again with the same :class:`~bincheck.schedule.binomial.Plan` (same object,
    same length and checkpoint count) iterates the tuple instead of running the planner's
    generator again: about 1 % of a tanh RNN gradient's time at T=1000 (~5k actions, 0.3 MB of
    host memory held by the loop). Only fixed plans are kept: a loop with ``memory=`` holds no
    more than its budget counts, and other schedules may yield different actions per call.
    Longer plans stream on every call. The pair held is replaced whole, so concurrent calls read
    either the old or the new one."""

    LIMIT = 1 << 14

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: tuple | None = None      # (plan, (seq_len, num_ckpts), actions or None)

    def actions(self, schedule: Any) -> Iterator:
        if type(schedule) is not Plan:
            return iter(schedule)
        key = (schedule.seq_len, schedule.num_ckpts)
        last = self._last
        if last is not None and last[0] is schedule and last[1] == key:
            return iter(schedule) if last[2] is None else iter(last[2])
        stream = iter(schedule)
        head = tuple(itertools.islice(stream, self.LIMIT + 1))
        if len(head) > self.LIMIT:
            self._last = (schedule, key, None)
            return itertools.chain(head, stream)
        self._last = (schedule, key, head)
        return iter(head)
