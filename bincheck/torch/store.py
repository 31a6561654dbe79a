"""Where a torch loop's snapshots live: RAM by reference (guarded), or disk as raw bytes.

A snapshot is a reference to the tensors a step returned (no copy), so anything that writes into
them in place would corrupt it. torch has no read-only tensors, but every tensor has a version
counter that each in-place operation bumps (views share their base's counter): the store records
the versions at ``put`` and checks them at ``get``, so a snapshot that changed is an error naming
the state, never a wrong gradient. With ``preserve_rng_state`` each snapshot also keeps the RNG
state at that point of the loop and restores it with the state, so that recomputed steps draw the
random numbers (dropout) the forward drew.

The disk tier reuses :class:`bincheck.runtime.disk.DiskStore` (private directory, CRC32 per file,
cleanup on success, error and interrupt) with :class:`TensorCodec`: each tensor is written as its
raw bytes (a uint8 ``.npy`` file, never a pickle) with dtype, shape and device kept in memory, so
dtypes numpy lacks (bfloat16, float8) round-trip exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..runtime.store import MemoryStore
from ..tree import flatten


def storage_bytes(leaves: list, seen: set | None = None) -> int:
    """Bytes of the distinct storages under ``leaves`` (a view costs its whole storage: that is
    what holding it keeps alive). ``seen`` (storage pointers) is skipped and updated."""
    if seen is None and len(leaves) == 1:               # one tensor: nothing to deduplicate
        v = leaves[0]
        if isinstance(v, torch.Tensor) and v.layout == torch.strided:
            return v.untyped_storage().nbytes()
        return 0
    seen = set() if seen is None else seen
    total = 0
    for v in leaves:
        if isinstance(v, torch.Tensor) and v.layout == torch.strided:
            storage = v.untyped_storage()
            ptr = storage.data_ptr()
            if ptr not in seen:
                seen.add(ptr)
                total += storage.nbytes()
    return total


def tensor_nbytes(state: Any) -> int:
    return storage_bytes(flatten(state)[0])


class Rng:
    """The RNG states a loop's steps draw from: the CPU generator's and those of the CUDA devices
    the loop's tensors live on (as ``torch.utils.checkpoint`` keeps them).

    :meth:`get` hands back the previous state's very object while the generators have not moved
    (a step that draws no random numbers), so snapshots of such a loop share one RNG state
    instead of holding a copy each. Once a whole forward has left the generators where they were
    (:meth:`settle`), every snapshot of its replays holds that same state: it is ``still``, and
    snapshots take it without querying the generators (a query and a 5 KiB comparison cost
    about as much as a snapshot's every other bookkeeping together). Restores still set it: a
    step may draw and leave the generators unmoved (a mask drawn under ``fork_rng``), and its
    replays must draw from the forward's state, not from wherever the caller's stream is when
    the backward runs."""

    __slots__ = ("devices", "_last", "still")

    def __init__(self, devices: list[int]) -> None:
        self.devices = devices
        self._last: tuple | None = None
        self.still = False

    def settle(self, first: tuple) -> None:
        """End of the forward: ``still`` if the generators are where they were at ``first``
        (this object's :meth:`get` at the forward's start)."""
        self.still = self.get() is first

    def get(self) -> tuple:
        if self.still:
            return self._last
        cpu, cuda = torch.get_rng_state(), [torch.cuda.get_rng_state(d) for d in self.devices]
        last = self._last
        if last is not None and torch.equal(cpu, last[0]) and \
                all(torch.equal(a, b) for a, b in zip(cuda, last[1])):
            return last
        self._last = (cpu, cuda)
        return self._last

    @staticmethod
    def set(saved: tuple, devices: list[int]) -> None:
        cpu, cuda = saved
        torch.set_rng_state(cpu)
        for d, s in zip(devices, cuda):
            torch.cuda.set_rng_state(s, d)

    def nbytes(self) -> int:
        cpu, cuda = self.get()
        return int(cpu.numel()) + sum(int(s.numel()) for s in cuda)


class Buffers:
    """The buffers of the module a loop receives as ``params`` (BatchNorm's running statistics,
    counters), kept beside each snapshot as its RNG state is, so that every recomputed step sees
    and updates them as the forward did, and each step's update lands once.

    A snapshot keeps the buffers' values at that point of the loop: :meth:`get` hands back the
    previous values' very object while the buffers still equal them (compared by value: BatchNorm
    updates its statistics without moving their version counters), so a loop whose steps leave
    the buffers alone holds one copy. A restore (:meth:`set`) installs copies in the module's
    buffer dicts instead of writing into the module's own buffers: a graph may have saved them
    (BatchNorm saves its statistics for its backward), and an in-place write would break it. The backward puts the module's own tensors back when it ends
    (:meth:`objects`, :meth:`install`): they hold what the forward left, as the plain loop's
    would."""

    __slots__ = ("slots", "_last", "_ours")

    def __init__(self, slots: list) -> None:
        self.slots = slots               # (owner module, buffer name, index of the distinct one)
        self._last: tuple | None = None
        self._ours: list | None = None   # the copies this object installed, while installed

    @classmethod
    def of(cls, module: Any) -> "Buffers | None":
        """The buffers of ``module`` (None if it has none)."""
        index: dict[int, int] = {}
        slots = []
        for name, b in module.named_buffers(remove_duplicate=False):
            if b is None:
                continue
            owner, _, attr = name.rpartition(".")
            slots.append((module.get_submodule(owner), attr, index.setdefault(id(b), len(index))))
        return cls(slots) if slots else None

    def objects(self) -> list:
        """The tensors the module holds now, distinct ones once (in ``slots`` order)."""
        out: dict[int, Any] = {}
        for owner, attr, k in self.slots:
            out.setdefault(k, owner._buffers[attr])
        return [out[k] for k in range(len(out))]

    def get(self) -> tuple:
        now, last = self.objects(), self._last
        if last is None:
            self._last = tuple(a.detach().clone() for a in now)
            return self._last
        same = [a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
                for a, b in zip(now, last)]
        if all(same):
            return last
        # the unchanged ones are shared with the previous values
        self._last = tuple(b if eq else a.detach().clone() for a, b, eq in zip(now, last, same))
        return self._last

    def set(self, saved: tuple) -> None:
        """Give the module the values ``saved``: the first time, in copies installed in place
        of its own tensors (which are not written); later, written into those copies (the same
        objects: a compiled step's guards keep holding; no graph holds them at a restore)."""
        ours = self._ours
        if ours is None or not all(owner._buffers[attr] is ours[k]
                                   for owner, attr, k in self.slots):
            ours = self._ours = self._copies()
            for owner, attr, k in self.slots:
                owner._buffers[attr] = ours[k]
        with torch.no_grad():
            for mine, value in zip(ours, saved):
                mine.copy_(value)
        self._last = saved

    def _copies(self) -> list:
        """Copies of the module's buffers that alias each other as they do: one copy of each
        storage, each buffer a tensor over it with its own offset, shape and strides (a
        buffer that is a view of another stays one)."""
        storages: dict = {}
        out = []
        for b in self.objects():
            storage = b.untyped_storage()
            copy = storages.get(storage.data_ptr())
            if copy is None:
                copy = storages[storage.data_ptr()] = storage.clone()
            t = torch.empty(0, dtype=b.dtype, device=b.device)
            t.set_(copy, b.storage_offset(), b.size(), b.stride())
            out.append(t)
        return out

    def install(self, objects: list) -> None:
        """Put ``objects`` (from :meth:`objects`) back in the module."""
        for owner, attr, k in self.slots:
            owner._buffers[attr] = objects[k]
        self._last = self._ours = None

    @staticmethod
    def nbytes(saved: tuple) -> int:
        return storage_bytes(list(saved))


class TorchStore(MemoryStore):
    """:class:`~bincheck.runtime.store.MemoryStore` for tensors, with a version guard per
    snapshot and, with ``rng``, the RNG state kept beside each one (see the module docstring)."""

    __slots__ = ("_guard", "rng", "_rng_refs", "_rng_bytes", "buffers", "given")

    def __init__(self, disk: Any = None, rng: Rng | None = None,
                 buffers: Buffers | None = None) -> None:
        super().__init__(disk, tensor_nbytes)
        self._guard: dict[int, tuple] = {}
        self.rng = rng
        self._rng_refs: dict[int, int] = {}          # id of a kept RNG state -> snapshots
        self._rng_bytes = 0 if rng is None else rng.nbytes()
        self.buffers = buffers
        # what the next snapshots keep instead of the generators' and buffers' current state
        # (a while loop's forward has run one step past the state it stores: see ambient())
        self.given: tuple | None = None

    @property
    def watches(self) -> bool:
        return self.rng is not None or self.buffers is not None

    def ambient(self) -> tuple:
        """The RNG state and buffer values now, as a snapshot would keep them."""
        return (None if self.rng is None else self.rng.get(),
                None if self.buffers is None else self.buffers.get())

    def set_ambient(self, ambient: tuple) -> None:
        rng, bufs = ambient
        if rng is not None:
            Rng.set(rng, self.rng.devices)
        if bufs is not None:
            self.buffers.set(bufs)

    def _hold(self, obj: Any, nbytes: int) -> None:
        """Count a snapshot's reference to an RNG state or buffer values, held once."""
        refs = self._rng_refs.get(id(obj), 0)
        self._rng_refs[id(obj)] = refs + 1
        if not refs:
            self.nbytes += nbytes

    def _release(self, obj: Any, nbytes: int) -> None:
        refs = self._rng_refs.pop(id(obj)) - 1
        if refs:
            self._rng_refs[id(obj)] = refs
        else:
            self.nbytes -= nbytes

    def put(self, index: int, state: Any, storage: str = "ram") -> None:
        leaves = [state] if isinstance(state, torch.Tensor) else flatten(state)[0]
        rng, bufs = self.given or (self.rng, self.buffers)
        if self.given is None:
            rng = None if rng is None else rng.get()
            bufs = None if bufs is None else bufs.get()
        if rng is not None:                  # a distinct RNG state is held once, and counted
            self._hold(rng, self._rng_bytes)
        if bufs is not None:
            self._hold(bufs, Buffers.nbytes(bufs))
        if self.buffers is not None:
            rng = (rng, bufs)
        if storage == "disk":
            super().put(index, state, storage)
            self._guard[index] = (None, None, rng)
            return
        # MemoryStore.put's RAM branch, inline (a snapshot per reversed step, on the hot path)
        size = storage_bytes(leaves)
        self._states[index] = (state, size)
        self.nbytes += size
        if self.nbytes > self.peak_nbytes:
            self.peak_nbytes = self.nbytes
        self._guard[index] = (leaves, [v._version for v in leaves], rng)

    @property
    def working_rng_bytes(self) -> int:
        """The bytes of one RNG state: the one all snapshots share when the steps draw no random
        numbers, which a byte budget counts in the working set, not per snapshot."""
        return self._rng_bytes

    def get(self, index: int) -> Any:
        entry = self._states.get(index)
        state = super().get(index) if entry is None else entry[0]
        leaves, versions, rng = self._guard[index]
        if self.buffers is not None:
            rng, bufs = rng
            self.buffers.set(bufs)
        if versions is not None:
            if [v._version for v in leaves] != versions:
                raise RuntimeError(
                    f"checkpoint of state {index} (the state before step {index}) was modified "
                    f"in place after it was stored: a step function, output_fn or the caller "
                    f"wrote into a tensor that bincheck keeps by reference. Update out of place "
                    f"(h = h + ... instead of h += ..., torch.cat instead of h[i] = ...)")
        if rng is not None:
            if rng[1]:                                  # CUDA generators too
                Rng.set(rng, self.rng.devices)
            else:
                torch.set_rng_state(rng[0])
        return state

    def pop(self, index: int) -> Any:
        _, _, rng = self._guard.pop(index, (None, None, None))
        if self.buffers is not None and rng is not None:
            rng, bufs = rng
            self._release(bufs, Buffers.nbytes(bufs))
        if rng is not None:
            self._release(rng, self._rng_bytes)
        entry = self._states.pop(index, None)
        if entry is None:
            return super().pop(index)                   # on disk: the disk store frees it
        self.nbytes -= entry[1]
        return entry[0]


class TensorCodec:
    """Tensors to and from numeric numpy arrays for :class:`~bincheck.runtime.disk.DiskStore`:
    the raw bytes as uint8, with dtype, shape and device kept as metadata (no pickle)."""

    @staticmethod
    def encode(leaf: Any, what: str) -> tuple[np.ndarray, Any]:
        if not isinstance(leaf, torch.Tensor):
            raise TypeError(f"only tensors go to disk; {what} is a {type(leaf).__name__}")
        raw = leaf.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
        return raw, (leaf.dtype, tuple(leaf.shape), leaf.device)

    @staticmethod
    def decode(array: np.ndarray, meta: Any) -> torch.Tensor:
        dtype, shape, device = meta
        return torch.from_numpy(array).view(dtype).reshape(shape).to(device)


TENSORS = TensorCodec()
