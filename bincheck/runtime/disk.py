"""Snapshots on disk: one private directory per call, one ``.npy`` file per array leaf.

Only numeric arrays go to disk, written and read with numpy's own ``.npy`` format and
``allow_pickle=False`` (no pickle of user objects). Each file's size and a CRC32 of its data are
kept in memory and checked when it is read: a truncated or corrupted file raises
:class:`CorruptSnapshotError` (never a wrong gradient). dtypes are preserved, integer leaves
round-trip exactly; shapes (0-d included) are kept, Python scalars come back as the same Python
type and numpy scalars as numpy scalars of their dtype.

Lifetime: a file is removed as soon as its snapshot is freed; the directory is removed by
:meth:`DiskStore.close`, which the loop calls after the sweep, after any exception (including
KeyboardInterrupt) in the forward or the reverse, and which a finalizer also runs if the store is
garbage-collected or the interpreter exits first. Failures to create or write (an unwritable
directory, a full disk) raise an OSError naming the path and leave nothing behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import weakref
import zlib
from typing import Any

import numpy as np

from ..tree import flatten, unflatten


class CorruptSnapshotError(OSError):
    """A snapshot file on disk does not hold what was written (truncated or altered)."""


def _check_dir(base: str | None) -> str:
    if base is None:
        return tempfile.gettempdir()
    base = os.fspath(base)
    if not os.path.isdir(base):
        raise FileNotFoundError(f"disk={base!r}: no such directory (bincheck writes its "
                                f"snapshots into a private subdirectory of an existing one)")
    return base


class NumpyCodec:
    """How numpy leaves go to disk and come back exactly: a Python scalar as its type, a numpy
    scalar as a numpy scalar of its dtype, an array (0-d included) as a read-only array of its
    shape. A front end for another framework supplies its own codec (``encode(leaf, what) ->
    (numeric ndarray, meta)``, ``decode(ndarray, meta) -> leaf``): the store itself only ever
    sees numeric numpy arrays."""

    @staticmethod
    def encode(leaf: Any, what: str) -> tuple[np.ndarray, Any]:
        kind = type(leaf) if type(leaf) in (bool, int, float, complex) else \
            np.generic if isinstance(leaf, np.generic) else None
        array = np.asarray(leaf)
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        if array.dtype.kind not in "biufc":
            raise TypeError(f"only numeric arrays go to disk; {what} has dtype {array.dtype}")
        return array, kind

    @staticmethod
    def decode(array: np.ndarray, kind: Any) -> Any:
        if kind is np.generic:
            return array[()]
        if kind is not None:
            return kind(array.item())
        array.setflags(write=False)
        return array


NUMPY = NumpyCodec()


class DiskStore:
    """States written to files under a private directory (see the module docstring)."""

    def __init__(self, base: str | None = None, codec: Any = NUMPY) -> None:
        self.codec = codec
        parent = _check_dir(base)
        try:
            self.path = tempfile.mkdtemp(prefix="bincheck-", dir=parent)
        except OSError as err:
            raise OSError(err.errno, f"bincheck could not create a snapshot directory in "
                                     f"{parent!r}: {err.strerror}", parent) from None
        self._entries: dict[int, tuple] = {}
        self.bytes_written = self.bytes_read = 0
        self._finalizer = weakref.finalize(self, shutil.rmtree, self.path, True)

    def put(self, index: int, state: Any) -> None:
        leaves, treedef = flatten(state)
        files = []
        try:
            for k, leaf in enumerate(leaves):
                files.append(self._write(index, k, leaf))
        except BaseException:
            for name, *_ in files:
                _remove(name)
            raise
        self._entries[index] = (treedef, files)

    def _write(self, index: int, k: int, leaf: Any) -> tuple:
        array, meta = self.codec.encode(leaf, f"state leaf {k} of snapshot {index}")
        name = os.path.join(self.path, f"{index}-{k}.npy")
        try:
            with open(name, "wb") as f:
                np.save(f, array, allow_pickle=False)
        except OSError as err:
            _remove(name)
            raise OSError(err.errno, f"bincheck could not write snapshot file {name!r}: "
                                     f"{err.strerror}", name) from None
        size = os.path.getsize(name)
        self.bytes_written += array.nbytes
        return name, size, zlib.crc32(array.tobytes()), array.dtype, array.shape, meta

    def get(self, index: int) -> Any:
        treedef, files = self._entries[index]
        return unflatten(treedef, [self._read(*entry) for entry in files])

    def _read(self, name: str, size: int, crc: int, dtype: Any, shape: tuple,
              meta: Any) -> Any:
        try:
            actual = os.path.getsize(name)
            with open(name, "rb") as f:
                array = np.load(f, allow_pickle=False)
        except (OSError, ValueError, EOFError) as err:
            raise CorruptSnapshotError(f"snapshot file {name!r} cannot be read back "
                                       f"({err}): refusing to compute a gradient from it") from None
        if actual != size or array.dtype != dtype or array.shape != shape or \
                zlib.crc32(array.tobytes()) != crc:
            raise CorruptSnapshotError(
                f"snapshot file {name!r} changed since it was written (size {actual} vs {size} "
                f"bytes, or its checksum): refusing to compute a gradient from it")
        self.bytes_read += array.nbytes
        return self.codec.decode(array, meta)

    def pop(self, index: int) -> None:
        for name, *_ in self._entries.pop(index)[1]:
            _remove(name)

    def __contains__(self, index: object) -> bool:
        return index in self._entries

    def close(self) -> None:
        """Remove every file and the directory (idempotent)."""
        self._entries.clear()
        self._finalizer()


def open_disk(disk: bool | str | None, codec: Any = NUMPY) -> DiskStore | None:
    """A call's disk store: None without a disk tier, else a private directory (in the system's
    temporary directory for ``disk=True``, inside ``disk`` for a path)."""
    if disk is None or disk is False:
        return None
    return DiskStore(None if disk is True else disk, codec)


def disk_seconds(state: Any, base: Any, codec: Any = NUMPY) -> tuple[float, float]:
    """Seconds to write ``state`` to a disk store under ``base`` and to read it back (the faster
    of two tries each)."""
    store = open_disk(base, codec)
    try:
        writes, reads = [], []
        for i in range(2):
            t0 = time.perf_counter()
            store.put(i, state)
            t1 = time.perf_counter()
            store.get(i)
            writes.append(t1 - t0)
            reads.append(time.perf_counter() - t1)
        return min(writes), min(reads)
    finally:
        store.close()


def _remove(name: str) -> None:
    try:
        os.remove(name)
    except FileNotFoundError:
        pass
