"""Replays a schedule's actions on real states; knows nothing about autograd.

Validation is delegated to the schedule layer's :class:`~bincheck.schedule.simulate.Tracker`, so a
faulty planner fails loudly at the offending action instead of producing a wrong gradient, and the
invariants are stated once. What this class adds is the states themselves: the live state and a
:class:`~bincheck.runtime.store.Store` of snapshots. *How* a step is run comes from the stepper
handed to :meth:`Executor.run` (plain steps in the forward; plain steps and taped segments in the
reverse), so one executor serves both phases without anything being rebound on it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

from ..schedule.actions import Action, Advance, Free, Restore, Reverse, Snapshot
from ..schedule.simulate import Tracker
from .store import MemoryStore, Store


LOOKAHEAD = 8          # actions held back at most while looking for the next Restore


class Stepper(Protocol):
    def advance(self, state: Any, start: int, stop: int) -> Any:
        """The state at ``stop`` computed from ``state`` (at ``start``) with plain steps."""

    def reverse(self, state: Any, start: int, stop: int) -> None:
        """Tape steps ``start..stop-1`` from ``state`` and pull the adjoint back to ``start``."""


class Observer(Protocol):
    def before(self, action: Action, executor: "Executor") -> None: ...
    def after(self, action: Action, executor: "Executor") -> None: ...


class Executor:
    """Runs actions on real states: the live state, and snapshots in ``store``."""

    __slots__ = ("live", "store", "tracker")

    def __init__(self, seq_len: int | None, init_state: Any, store: Store | None = None,
                 tracker: Tracker | None = None) -> None:
        self.live = init_state
        self.store = MemoryStore() if store is None else store
        self.tracker = Tracker(seq_len) if tracker is None else tracker

    def run(self, actions: Iterable[Action] | Iterator[Action], stepper: Stepper,
            observers: Sequence[Observer] = (), until: type | None = None) -> Action | None:
        """Apply ``actions`` in order. With ``until``, stop at the first action of that type and
        return it unapplied (the caller continues from it); otherwise return None. With a store
        that reads ahead (a disk tier) and no ``until``, each disk read starts before the step or
        segment that precedes its ``Restore`` (``_ahead``)."""
        if until is None and getattr(self.store, "reads_ahead", False):
            actions = self._ahead(iter(actions))
        for action in actions:
            if type(action) is until:
                return action
            if observers:
                for obs in observers:
                    obs.before(action, self)
                self.apply(action, stepper)
                for obs in observers:
                    obs.after(action, self)
            else:
                self.apply(action, stepper)
        return None

    def _ahead(self, actions: Iterator[Action]) -> Iterator[Action]:
        """``actions``, telling the store which snapshot the next ``Restore`` reads before the
        step or segment that precedes it runs, so that a disk read overlaps that computation.
        Looks past ``Free`` actions only (a few; nothing else is held back)."""
        held: deque = deque()
        while True:
            current = held.popleft() if held else next(actions, None)
            if current is None:
                return
            if type(current) is Reverse or type(current) is Advance:
                while len(held) < LOOKAHEAD and all(type(a) is Free for a in held):
                    nxt = next(actions, None)
                    if nxt is None:
                        break
                    held.append(nxt)
                following = next((a for a in held if type(a) is not Free), None)
                if type(following) is Restore:
                    self.store.prefetch(following.index)
            yield current

    def apply(self, action: Action, stepper: Stepper) -> None:
        self.tracker.apply(action)          # raises before any work if the action is invalid
        kind = type(action)
        if kind is Advance:
            if action.stop > action.start:
                self.live = stepper.advance(self.live, action.start, action.stop)
        elif kind is Reverse:
            live, self.live = self.live, None   # the tape consumes it; hold no extra reference
            stepper.reverse(live, action.start, action.stop)
        elif kind is Snapshot:
            self.store.put(action.index, self.live, action.storage)
        elif kind is Restore:
            self.live = self.store.get(action.index)
        elif kind is Free:
            self.store.pop(action.index)
