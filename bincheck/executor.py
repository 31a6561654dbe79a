"""Replays a schedule's actions through injected callables; knows nothing about autograd.

Validation is delegated to the schedule layer's :class:`~bincheck.schedule.simulate.Tracker`, so a
faulty planner fails loudly at the offending action instead of producing a wrong gradient, and the
invariants are stated once. What this class adds is the states themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .schedule.actions import Action, Advance, Free, Restore, Reverse, Snapshot
from .schedule.simulate import Tracker


class Executor:
    """Runs actions on real states.

    ``advance(state, start, stop)`` returns the state at ``stop`` computed with plain steps;
    ``reverse(state, start, stop)`` tapes steps ``start..stop-1`` from ``state`` and pulls the
    adjoint (which the caller holds) back to ``start``. ``store`` maps indices to stored states.
    """

    __slots__ = ("advance", "reverse", "live", "store", "tracker")

    def __init__(self, seq_len: int, advance: Callable[[Any, int, int], Any],
                 reverse: Callable[[Any, int, int], None], init_state: Any,
                 tracker: Tracker | None = None) -> None:
        self.advance = advance
        self.reverse = reverse
        self.live = init_state
        self.store: dict[int, Any] = {}
        self.tracker = Tracker(seq_len) if tracker is None else tracker

    def run(self, actions: Iterable[Action]) -> None:
        for action in actions:
            self.apply(action)

    def apply(self, action: Action) -> None:
        self.tracker.apply(action)          # raises before any work if the action is invalid
        kind = type(action)
        if kind is Advance:
            if action.stop > action.start:
                self.live = self.advance(self.live, action.start, action.stop)
        elif kind is Reverse:
            self.reverse(self.live, action.start, action.stop)
            self.live = None                # the tape consumed it; drop the reference
        elif kind is Snapshot:
            self.store[action.index] = self.live
        elif kind is Restore:
            self.live = self.store[action.index]
        elif kind is Free:
            del self.store[action.index]
