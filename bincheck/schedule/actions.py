"""The action vocabulary shared by every planner and by the executor.

A schedule is a stream of these small frozen objects. Indices name states: state ``i`` is the state
before step ``i`` (state 0 is the initial state, state ``n`` the final one). Ranges are half-open,
like ``range``. The stream says nothing about *how* a step is evaluated; the executor decides that
through the callables it is given, so the same stream drives autograd, a symbolic simulator, or a
counting mock.

Invariants a valid stream keeps (checked by :class:`~bincheck.schedule.simulate.Tracker`, in front
of every :class:`bincheck.runtime.Executor`):

* ``Advance(start, stop)`` needs the live state at ``start`` and leaves it at ``stop``.
* ``Snapshot(i, storage)`` stores the live state, which must be state ``i``, in RAM or on disk.
* ``Restore(i)`` makes the stored state ``i`` live again (a read, from disk); ``Free(i)`` forgets
  it (deletes its file).
* ``Reverse(start, stop)`` needs the live state at ``start`` and the adjoint at ``stop``; it tapes
  steps ``start..stop-1`` in one trace, pulls the adjoint back to ``start`` and consumes the live
  state (a ``Restore`` must follow before the next ``Advance``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Advance:
    """Run steps ``start..stop-1`` on plain values (no tape)."""

    start: int
    stop: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Keep the live state, which is state ``index``: a reference in RAM (``storage="ram"``) or
    a copy written to disk (``storage="disk"``; restoring it reads the file back)."""

    index: int
    storage: str = "ram"

    def __repr__(self) -> str:
        extra = "" if self.storage == "ram" else f", storage={self.storage!r}"
        return f"Snapshot(index={self.index}{extra})"


@dataclass(frozen=True, slots=True)
class Restore:
    """Make stored state ``index`` the live state."""

    index: int


@dataclass(frozen=True, slots=True)
class Free:
    """Drop stored state ``index``."""

    index: int


@dataclass(frozen=True, slots=True)
class Reverse:
    """Tape steps ``start..stop-1`` from the live state and pull the adjoint back to ``start``."""

    start: int
    stop: int


Action = Advance | Snapshot | Restore | Free | Reverse
