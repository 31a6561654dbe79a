"""Where snapshots live while a schedule runs.

A store maps state indices to states. The executor is its only user: ``Snapshot`` puts, ``Restore``
gets, ``Free`` pops. :class:`MemoryStore` keeps references (a snapshot costs no copy: the states it
holds are read-only views, so nothing can write into them).
"""

from __future__ import annotations

from typing import Any, Protocol


class Store(Protocol):
    def put(self, index: int, state: Any) -> None: ...
    def get(self, index: int) -> Any: ...
    def pop(self, index: int) -> Any: ...
    def __contains__(self, index: object) -> bool: ...


class MemoryStore:
    """Snapshots kept in RAM, by reference."""

    __slots__ = ("_states",)

    def __init__(self) -> None:
        self._states: dict[int, Any] = {}

    def put(self, index: int, state: Any) -> None:
        self._states[index] = state

    def get(self, index: int) -> Any:
        return self._states[index]

    def pop(self, index: int) -> Any:
        return self._states.pop(index)

    def __contains__(self, index: object) -> bool:
        return index in self._states

    def __len__(self) -> int:
        return len(self._states)
