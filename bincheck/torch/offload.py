"""``offload=True``: a pinned host-memory tier below a CUDA device's memory.

The tier takes the place the disk takes for CPU tensors: the byte budget plans the device's bytes
with the same two-tier planner (Disk-Revolve with a RAM part, ``BudgetPlan``), priced with the
copy times measured on the loop's own state, and the snapshots it sends down live in
:class:`HostTier` instead of files.

How the copies run (:class:`CudaCopies`):

* a snapshot goes down on a side stream that first waits for the compute stream, into pinned host
  memory, with ``non_blocking`` copies, so the steps after it run while it is copied; its device
  tensors are marked as used by the side stream (``record_stream``) so the caching allocator does
  not hand their memory out before the copy has read it;
* the executor knows which snapshot the schedule restores next and asks for it before the step or
  segment that precedes the ``Restore`` (``prefetch``): the copy up runs on the side stream during
  that computation, and the ``Restore`` only makes the compute stream wait for its event;
* a snapshot is a copy, so a write into a state after it was stored cannot change it once the
  copy has run. Until the copy is known to have finished, its tensors' version counters are
  checked, and a write before then raises the error a RAM snapshot raises.

:class:`SyncCopies` does the same with plain synchronous copies between CPU tensors. It is what
the tier's tests run on a machine without a GPU (:func:`copies_for` hands out the copier), not
something a user selects: ``offload=True`` on CPU states is an error, since CPU memory is already
host memory (``disk=`` is the tier below it).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from ..runtime import disk as disk_tier
from ..tree import flatten, unflatten
from .store import TENSORS

REPS = 3             # copies timed per direction when the tier is priced
PIPELINED = 4        # CUDA: copies (and steps, when probed) timed back to back between waits


class Offload:
    """The ``offload=True`` setting a loop keeps (the tier itself is opened per call)."""

    where = "in pinned host memory"         # for the budget's and the plan's descriptions
    labels = ("host offload", where, "device memory")

    def __repr__(self) -> str:
        return "offload=True"


OFFLOAD = Offload()


def check_offload(offload: Any, memory: Any, disk: Any) -> Offload | None:
    """None (no host tier) or :data:`OFFLOAD`; needs ``memory`` and excludes ``disk``."""
    if isinstance(offload, np.bool_):
        offload = bool(offload)
    if offload is None or offload is False:
        return None
    if offload is not True:
        raise TypeError(f"offload must be None, False or True (a pinned host-memory tier for "
                        f"CUDA states); got {offload!r} of type {type(offload).__name__}")
    if memory is None:
        raise TypeError("offload=True needs memory=... (the device's budget; states beyond it "
                        "go to pinned host memory)")
    if disk is not None and disk is not False:
        raise ValueError(f"offload=True and disk={disk!r} together: a three-tier plan (device, "
                         f"host, disk) is not available; pass one of them")
    return OFFLOAD


def _tensors(leaves: list, what: str) -> list:
    for k, v in enumerate(leaves):
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"offload=True keeps tensors only; leaf {k} of {what} is a "
                            f"{type(v).__name__}")
    return leaves


class SyncCopies:
    """Synchronous copies between CPU tensors (see the module docstring: for tests)."""

    def down(self, leaves: list) -> tuple[list, Any]:
        return [v.detach().clone() for v in leaves], None

    def up(self, hosts: list) -> tuple[list, Any]:
        return [h.clone() for h in hosts], None

    def use(self, event: Any, leaves: list) -> None:
        pass

    def done(self, event: Any) -> bool:
        return True

    def settle(self, event: Any) -> None:
        pass


class CudaCopies:
    """Copies between one CUDA device and pinned host memory on a side stream."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.side = torch.cuda.Stream(device)

    def down(self, leaves: list) -> tuple[list, Any]:
        compute = torch.cuda.current_stream(self.device)
        self.side.wait_stream(compute)
        hosts = []
        with torch.cuda.stream(self.side):
            for v in leaves:
                if v.device.type != "cuda":
                    hosts.append(v.detach().clone())
                    continue
                host = torch.empty_like(v, device="cpu", pin_memory=True)   # strides kept
                host.copy_(v.detach(), non_blocking=True)
                v.record_stream(self.side)
                hosts.append(host)
            event = self.side.record_event()
        return hosts, event

    def up(self, hosts: list) -> tuple[list, Any]:
        with torch.cuda.stream(self.side):
            leaves = [h.to(self.device, non_blocking=True) if h.is_pinned() else h.clone()
                      for h in hosts]
            event = self.side.record_event()
        return leaves, event

    def use(self, event: Any, leaves: list) -> None:
        compute = torch.cuda.current_stream(self.device)
        compute.wait_event(event)
        for v in leaves:                 # allocated on the side stream, used and freed here
            if v.device.type == "cuda":
                v.record_stream(compute)

    def done(self, event: Any) -> bool:
        return event.query()

    def settle(self, event: Any) -> None:
        event.synchronize()


def copies_for(leaves: list) -> Any:
    """The copier for a loop whose states are ``leaves``: :class:`CudaCopies` for states on one
    CUDA device; anything else is an error naming the devices."""
    devices = {v.device for v in leaves if isinstance(v, torch.Tensor)}
    cuda = [d for d in devices if d.type == "cuda"]
    if len(cuda) == 1 and len(devices) == 1:
        return CudaCopies(cuda[0])
    names = ", ".join(sorted(str(d) for d in devices)) or "no tensors"
    raise ValueError(f"offload=True moves CUDA states to pinned host memory, so the state must "
                     f"be on one CUDA device; it is on {names} (for CPU states, disk=... is the "
                     f"tier below memory)")


class HostTier:
    """Snapshots copied to host memory, with the interface of the disk store a
    :class:`~bincheck.runtime.store.MemoryStore` drives (``put``, ``get``, ``pop``,
    ``prefetch``, ``close``; ``background``: it reads ahead)."""

    background = True

    def __init__(self, copies: Any) -> None:
        self.copies = copies
        self._entries: dict[int, list] = {}      # index -> [treedef, hosts, event, guard]
        self._ahead: tuple[int, list, Any] | None = None    # (index, device leaves, event)
        self._down: int | None = None             # the snapshot whose copy down may still run
        self.bytes_written = self.bytes_read = 0
        self.prefetched = 0                       # restores whose copy up was started ahead

    def put(self, index: int, state: Any) -> None:
        # At most one copy down in flight (the budget reserves one state for it, as for a disk
        # write behind): the previous one is waited for, and its device tensors released.
        if self._down is not None and self._down in self._entries:
            self._release(self._down, self._entries[self._down], wait=True)
        leaves, treedef = flatten(state)
        hosts, event = self.copies.down(_tensors(leaves, f"snapshot {index}"))
        # until the copy is known to be done: the leaves and their versions (see module doc)
        guard = (leaves, [v._version for v in leaves])
        self._entries[index] = entry = [treedef, hosts, event, guard]
        self._down = index
        self._release(index, entry, wait=False)          # a copy already done needs no guard
        self.bytes_written += sum(v.numel() * v.element_size() for v in leaves)

    def prefetch(self, index: int) -> None:
        """Start copying snapshot ``index`` up (the next :meth:`get` of it takes the copy)."""
        if index not in self._entries or (self._ahead is not None and self._ahead[0] == index):
            return
        leaves, event = self.copies.up(self._entries[index][1])
        self._ahead = (index, leaves, event)

    def get(self, index: int) -> Any:
        entry = self._entry(index)
        self._release(index, entry, wait=True)
        if self._ahead is not None and self._ahead[0] == index:
            _, leaves, event = self._ahead
            self._ahead = None
            self.prefetched += 1
        else:
            leaves, event = self.copies.up(entry[1])
        self.copies.use(event, leaves)
        self.bytes_read += sum(v.numel() * v.element_size() for v in leaves)
        return unflatten(entry[0], leaves)

    def pop(self, index: int) -> None:
        entry = self._entry(index)
        self._release(index, entry, wait=True)
        if self._ahead is not None and self._ahead[0] == index:
            self._ahead = None
        del self._entries[index]

    def __contains__(self, index: object) -> bool:
        return index in self._entries

    def close(self) -> None:
        """Drop every snapshot (idempotent). Buffers still being copied stay alive until their
        copies finish (the stream marks and the pinned allocator's events see to it)."""
        self._entries.clear()
        self._ahead = self._down = None

    def _entry(self, index: int) -> list:
        entry = self._entries.get(index)
        if entry is None:
            raise KeyError(f"no checkpoint of state {index} in host memory")
        return entry

    def _release(self, index: int, entry: list, wait: bool) -> None:
        """Drop the guard of a finished copy down (with ``wait``, let it finish first), raising
        if its state was written in place meanwhile."""
        guard = entry[3]
        if guard is None:
            return
        if not self.copies.done(entry[2]):
            if not wait:
                return
            self.copies.settle(entry[2])
        entry[3] = None
        if [v._version for v in guard[0]] != guard[1]:
            raise RuntimeError(
                f"checkpoint of state {index} (the state before step {index}) was modified in "
                f"place while it was being copied to host memory: a step function, output_fn "
                f"or the caller wrote into a tensor that bincheck stores. Update out of place "
                f"(h = h + ... instead of h += ...)")


def copy_seconds(state: Any, copies: Any) -> tuple[float, float]:
    """Seconds to copy ``state`` down and back up with ``copies``, the best of :data:`REPS`
    each: what the planner prices a host write and read at. CUDA copies are timed as a loop
    meets them, :data:`PIPELINED` at a time with one wait after the last (as the probe times
    the steps they are weighed against); other copiers one at a time."""
    leaves = _tensors(flatten(state)[0], "the state")
    times = PIPELINED if isinstance(copies, CudaCopies) else 1
    down, up = [], []
    for _ in range(REPS):
        t0 = time.perf_counter()
        sent = [copies.down(leaves) for _ in range(times)]
        copies.settle(sent[-1][1])
        t1 = time.perf_counter()
        back = [copies.up(sent[-1][0]) for _ in range(times)]
        copies.settle(back[-1][1])
        t2 = time.perf_counter()
        down.append((t1 - t0) / times)
        up.append((t2 - t1) / times)
        del sent, back
    return max(min(down), 1e-9), max(min(up), 1e-9)


def planned(tier: Any) -> Any:
    """What a budget plans with: the :class:`Offload` tier (its plan names it), else whether a
    disk is given."""
    return tier if isinstance(tier, Offload) else tier is not None


def open_tier(tier: Any, state: Any) -> Any:
    """A call's second tier: a :class:`HostTier` for ``offload=True``, else its disk store (None
    without a disk)."""
    if isinstance(tier, Offload):
        return HostTier(copies_for(flatten(state)[0]))
    return disk_tier.open_disk(tier, TENSORS)


def tier_seconds(tier: Any, state: Any) -> tuple[Any, Any]:
    """Seconds to store ``state`` in the second tier and to read it back (None, None without
    one): the copies down and up for ``offload=True``, the disk's sustained write and read."""
    if isinstance(tier, Offload):
        return copy_seconds(state, copies_for(flatten(state)[0]))
    if tier is None or tier is False:
        return None, None
    return disk_tier.disk_seconds(state, tier, TENSORS)
