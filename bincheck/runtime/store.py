"""Where snapshots live while a schedule runs.

A store maps state indices to states. The executor is its only user: ``Snapshot`` puts, ``Restore``
gets, ``Free`` pops. :class:`MemoryStore` keeps references (a snapshot costs no copy: the states it
holds are read-only views, so nothing can write into them).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from ..tree import flatten


class Store(Protocol):
    def put(self, index: int, state: Any) -> None: ...
    def get(self, index: int) -> Any: ...
    def pop(self, index: int) -> Any: ...
    def __contains__(self, index: object) -> bool: ...


def state_nbytes(state: Any) -> int:
    """Array bytes of a state (its leaves' ``nbytes``)."""
    return sum(int(np.asarray(v).nbytes) for v in flatten(state)[0])


class MemoryStore:
    """Snapshots kept in RAM, by reference; counts the array bytes they hold."""

    __slots__ = ("_states", "nbytes", "peak_nbytes")

    def __init__(self) -> None:
        self._states: dict[int, tuple[Any, int]] = {}
        self.nbytes = self.peak_nbytes = 0

    def put(self, index: int, state: Any) -> None:
        size = state_nbytes(state)
        self._states[index] = (state, size)
        self.nbytes += size
        self.peak_nbytes = max(self.peak_nbytes, self.nbytes)

    def get(self, index: int) -> Any:
        return self._states[index][0]

    def pop(self, index: int) -> Any:
        state, size = self._states.pop(index)
        self.nbytes -= size
        return state

    def __contains__(self, index: object) -> bool:
        return index in self._states

    def __len__(self) -> int:
        return len(self._states)
