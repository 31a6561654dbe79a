"""What every front end's loop object shares, whatever its framework.

:class:`Configured`: a loop is configuration, frozen once built; only its published results
(``stats``, ``last_plan``) are replaced, whole, when a call completes. :class:`SizeCache`: with a
memory budget, a step is measured once per argument signature (the measurement itself is the
front end's) and each plan made once per (length, budget, sizes). :class:`ActionCache`: the
actions of the schedule a loop ran last, replayed from a tuple by the next call.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from typing import Any, Callable, Hashable

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
    """The actions of the schedule a loop ran last, as a tuple when there are at most ``LIMIT``.

    A loop called again with the same schedule object (its fixed ``num_ckpts`` plan, or a
    budget's plan, which :class:`SizeCache` makes once) iterates the tuple instead of running
    the planner's generator again: about 1 % of a tanh RNN gradient's time at T=1000 (5k
    actions, 0.3 MB held). Longer schedules stream on every call, as planning must cost what the
    schedule needs and never hold more. One cache per loop object; the pair it holds is replaced
    whole, so concurrent calls read either the old or the new one."""

    LIMIT = 1 << 16

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: tuple | None = None          # (schedule, its actions or None: too many)

    def actions(self, schedule: Any) -> Iterator:
        last = self._last
        if last is not None and last[0] is schedule:
            return iter(schedule) if last[1] is None else iter(last[1])
        stream = iter(schedule)
        head = tuple(itertools.islice(stream, self.LIMIT + 1))
        if len(head) > self.LIMIT:
            self._last = (schedule, None)
            return itertools.chain(head, stream)
        self._last = (schedule, head)
        return iter(head)
