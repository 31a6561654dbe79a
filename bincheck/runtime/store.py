"""Where snapshots live while a schedule runs.

A store maps state indices to states. The executor is its only user: ``Snapshot`` puts, ``Restore``
gets, ``Free`` pops. :class:`MemoryStore` keeps references (a snapshot costs no copy: the states it
holds are read-only views, so nothing can write into them).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import numpy as np

from ..tree import flatten


class Store(Protocol):
    def put(self, index: int, state: Any, storage: str = "ram") -> None: ...
    def get(self, index: int) -> Any: ...
    def pop(self, index: int) -> Any: ...
    def __contains__(self, index: object) -> bool: ...


def state_nbytes(state: Any) -> int:
    """Array bytes of a numpy state (its leaves' ``nbytes``)."""
    return sum(int(np.asarray(v).nbytes) for v in flatten(state)[0])


class MemoryStore:
    """Snapshots kept in RAM by reference (counting the array bytes they hold), and on disk in a
    :class:`~bincheck.runtime.disk.DiskStore` when the schedule says ``storage="disk"``.

    ``size`` measures a state in bytes: ``state_nbytes`` for numpy states; a front end for
    another framework passes its own (the only framework-specific part of this store)."""

    __slots__ = ("_states", "nbytes", "peak_nbytes", "disk", "size")

    def __init__(self, disk: Any = None, size: Callable[[Any], int] = state_nbytes) -> None:
        self._states: dict[int, tuple[Any, int]] = {}
        self.nbytes = self.peak_nbytes = 0
        self.disk = disk
        self.size = size

    def put(self, index: int, state: Any, storage: str = "ram", nbytes: int | None = None) -> None:
        """Keep ``state`` as state ``index`` (``nbytes``: its size, when the caller measured it)."""
        if storage == "disk":
            if self.disk is None:
                raise ValueError(f"the schedule stores state {index} on disk, but this loop "
                                 f"has no disk (pass disk=True or disk='/some/dir')")
            self.disk.put(index, state)
            return
        size = self.size(state) if nbytes is None else nbytes
        self._states[index] = (state, size)
        self.nbytes += size
        self.peak_nbytes = max(self.peak_nbytes, self.nbytes)

    def _on_disk(self, index: int) -> Any:
        if self.disk is None:
            raise KeyError(f"no checkpoint of state {index}")
        return self.disk

    def get(self, index: int) -> Any:
        entry = self._states.get(index)
        return self._on_disk(index).get(index) if entry is None else entry[0]

    def pop(self, index: int) -> Any:
        entry = self._states.pop(index, None)
        if entry is None:
            self._on_disk(index).pop(index)
            return None
        self.nbytes -= entry[1]
        return entry[0]

    @property
    def reads_ahead(self) -> bool:
        """Whether :meth:`prefetch` can start a read (a disk tier with a background worker)."""
        return self.disk is not None and getattr(self.disk, "background", False)

    def prefetch(self, index: int) -> None:
        """The schedule restores ``index`` next: start reading it if it is on disk."""
        if index not in self._states and self.disk is not None and index in self.disk:
            self.disk.prefetch(index)

    def __contains__(self, index: object) -> bool:
        return index in self._states or (self.disk is not None and index in self.disk)

    def __len__(self) -> int:
        return len(self._states)
