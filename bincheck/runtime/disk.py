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
from concurrent.futures import Future, ThreadPoolExecutor
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
    """States written to files under a private directory (see the module docstring).

    With ``background=True`` (what a loop uses) one worker thread does the file I/O: ``put``
    copies the state's arrays and hands them to the worker (write-behind: at most one write in
    flight, so the caller waits only when the disk is slower than the steps between two
    writes), and :meth:`prefetch` starts reading a snapshot the schedule will restore next
    (read-ahead: at most one), so the read overlaps the computation before it. A write's error
    (a full disk) is raised by the first call after it has happened, or by the next ``put`` or
    a ``get`` / ``pop`` of that snapshot, whichever comes first. ``io_seconds`` is the time the
    I/O jobs took (wall time on the worker, so GIL waits included), ``wait_seconds`` the part
    of it the caller waited for: ``1 - wait_seconds / io_seconds`` of the I/O overlapped
    computation.
    """

    def __init__(self, base: str | None = None, codec: Any = NUMPY,
                 background: bool = False) -> None:
        self.codec = codec
        parent = _check_dir(base)
        try:
            self.path = tempfile.mkdtemp(prefix="bincheck-", dir=parent)
        except OSError as err:
            raise OSError(err.errno, f"bincheck could not create a snapshot directory in "
                                     f"{parent!r}: {err.strerror}", parent) from None
        self._entries: dict[int, tuple] = {}    # index -> (treedef, files | Future of files)
        self.bytes_written = self.bytes_read = 0
        self.io_seconds = self.wait_seconds = 0.0
        self.background = background
        self._pool: ThreadPoolExecutor | None = None
        self._writing: Future | None = None      # the write in flight
        self._ahead: tuple[int, Future] | None = None   # the read ahead: (index, leaves)
        self._finalizer = weakref.finalize(self, shutil.rmtree, self.path, True)

    # -------------------------------------------------------------------------- the caller's
    def put(self, index: int, state: Any) -> None:
        leaves, treedef = flatten(state)
        arrays = [self.codec.encode(leaf, f"state leaf {k} of snapshot {index}")
                  for k, leaf in enumerate(leaves)]
        if not self.background:
            self._entries[index] = (treedef, self._timed(self._write_all, index, arrays))
            self.bytes_written += sum(a.nbytes for a, _ in arrays)
            return
        self._settle_write()                    # at most one write in flight
        # Behind: an array the caller can still write to (the leaf itself, or a view of its
        # memory such as a CPU tensor's) is copied first, so that the next steps, or an fn
        # writing in place, cannot change what is being written; a private copy the codec
        # made, or a read-only array (the autograd front end's states, written from the
        # reference as a RAM snapshot holds them), is not copied again.
        arrays = [(a.copy() if a.flags.writeable and (a is leaf or not a.flags.owndata) else a,
                   meta) for (a, meta), leaf in zip(arrays, leaves)]
        self._writing = self._submit(self._write_all, index, arrays)
        self.bytes_written += sum(a.nbytes for a, _ in arrays)
        self._entries[index] = (treedef, self._writing)

    def prefetch(self, index: int) -> None:
        """Start reading snapshot ``index`` in the background (the next :meth:`get` of it takes
        the result). Does nothing without a background worker or if it is already being read."""
        self._poll()
        if not self.background or index not in self._entries or \
                (self._ahead is not None and self._ahead[0] == index):
            return
        self._drop_ahead()
        files = self._entries[index][1]
        self._ahead = (index, self._submit(self._read_all, files))

    def get(self, index: int) -> Any:
        self._poll()
        files = self._files(index)          # waits for its write; raises the write's error
        if self._ahead is not None and self._ahead[0] == index:
            future, self._ahead = self._ahead[1], None
            arrays = self._result(future)
        else:
            arrays = self._timed(self._read_all, files)
        self.bytes_read += sum(a.nbytes for a in arrays)
        return unflatten(self._entries[index][0],
                         [self.codec.decode(a, entry[5]) for a, entry in zip(arrays, files)])

    def pop(self, index: int) -> None:
        self._poll()
        if self._ahead is not None and self._ahead[0] == index:
            self._drop_ahead()
        files = self._files(index)          # waits for its write; raises the write's error
        del self._entries[index]
        for entry in files:
            _remove(entry[0])

    def __contains__(self, index: object) -> bool:
        return index in self._entries

    def close(self) -> None:
        """Stop the worker (the job it is running is finished, queued ones are cancelled),
        remove every file and the directory (idempotent; raises nothing a pending write
        raised)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        self._writing = self._ahead = None
        self._entries.clear()
        self._finalizer()

    # ------------------------------------------------------------------------------ helpers
    def _submit(self, job: Any, *args: Any) -> Future:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="bincheck-disk")
        return self._pool.submit(self._timed_job, job, *args)

    @staticmethod
    def _timed_job(job: Any, *args: Any) -> tuple:
        t0 = time.perf_counter()
        return job(*args), time.perf_counter() - t0

    def _timed(self, job: Any, *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return job(*args)
        finally:
            spent = time.perf_counter() - t0
            self.io_seconds += spent
            self.wait_seconds += spent

    def _result(self, future: Future) -> Any:
        t0 = time.perf_counter()
        try:
            value, spent = future.result()
        finally:
            self.wait_seconds += time.perf_counter() - t0
        self.io_seconds += spent
        return value

    def _poll(self) -> None:
        """Settle a write that has finished, raising its error now (never later than needed)."""
        if self._writing is not None and self._writing.done():
            self._settle_write()

    def _settle_write(self) -> None:
        writing, self._writing = self._writing, None
        if writing is not None:
            for index, (treedef, files) in self._entries.items():
                if files is writing:
                    self._entries[index] = (treedef, self._result(writing))
                    break
            else:                               # its snapshot was popped: pop waited for it
                self._result(writing)

    def _files(self, index: int) -> list:
        treedef, files = self._entries[index]
        if isinstance(files, Future):
            if files is self._writing:
                self._settle_write()
            else:                               # pragma: no cover - one write in flight
                self._entries[index] = (treedef, self._result(files))
            files = self._entries[index][1]
        return files

    def _drop_ahead(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None and not ahead[1].cancel():
            try:                                # finish it so that at most one read is held
                self._result(ahead[1])
            except Exception:                   # the get that needs it reads and raises again
                pass

    # ------------------------------------------------------------------- the worker's (or not)
    def _write_all(self, index: int, arrays: list) -> list:
        files = []
        try:
            for k, (array, meta) in enumerate(arrays):
                files.append(self._write(index, k, array, meta))
        except BaseException:
            for name, *_ in files:
                _remove(name)
            raise
        return files

    def _write(self, index: int, k: int, array: np.ndarray, meta: Any) -> tuple:
        name = os.path.join(self.path, f"{index}-{k}.npy")
        try:
            with open(name, "wb") as f:
                np.save(f, array, allow_pickle=False)
        except OSError as err:
            _remove(name)
            raise OSError(err.errno, f"bincheck could not write snapshot file {name!r}: "
                                     f"{err.strerror}", name) from None
        size = os.path.getsize(name)
        return name, size, zlib.crc32(np.ascontiguousarray(array)), array.dtype, array.shape, meta

    def _read_all(self, files: Any) -> list:
        if isinstance(files, Future):   # written by this worker before: done (FIFO)
            files = files.result()[0]
        return [self._read(*entry[:5]) for entry in files]

    @staticmethod
    def _read(name: str, size: int, crc: int, dtype: Any, shape: tuple) -> np.ndarray:
        try:
            actual = os.path.getsize(name)
            with open(name, "rb") as f:
                array = np.load(f, allow_pickle=False)
        except (OSError, ValueError, EOFError) as err:
            raise CorruptSnapshotError(f"snapshot file {name!r} cannot be read back "
                                       f"({err}): refusing to compute a gradient from it") from None
        if actual != size or array.dtype != dtype or array.shape != shape or \
                zlib.crc32(np.ascontiguousarray(array)) != crc:
            raise CorruptSnapshotError(
                f"snapshot file {name!r} changed since it was written (size {actual} vs {size} "
                f"bytes, or its checksum): refusing to compute a gradient from it")
        return array


def open_disk(disk: bool | str | None, codec: Any = NUMPY,
              background: bool = True) -> DiskStore | None:
    """A call's disk store: None without a disk tier, else a private directory (in the system's
    temporary directory for ``disk=True``, inside ``disk`` for a path), with a background
    worker for write-behind and read-ahead."""
    if disk is None or disk is False:
        return None
    return DiskStore(None if disk is True else disk, codec, background)


# Enough bytes per probe that the write is priced by what the disk sustains, not by one write
# the page cache absorbs; small states take more copies (at most PROBE_MAX_FILES).
PROBE_BYTES = 32 * 2**20
PROBE_MAX_FILES = 256


def disk_seconds(state: Any, base: Any, codec: Any = NUMPY) -> tuple[float, float]:
    """Seconds to write ``state`` to a disk store under ``base`` and to read it back, at the
    disk's sustained throughput: ``k`` copies (about 32 MiB; 2 to 256 copies) written as a loop
    writes them, then fsync'ed, the fsyncs timed with the writes; then read back after asking
    the kernel to drop them from its cache. The mean per state, checksums included."""
    store = DiskStore(None if base is True else base, codec)
    try:
        leaves = flatten(state)[0]
        arrays = [codec.encode(leaf, f"state leaf {k}") for k, leaf in enumerate(leaves)]
        nbytes = max(1, sum(a.nbytes for a, _ in arrays))
        k = max(2, min(PROBE_MAX_FILES, -(-PROBE_BYTES // nbytes)))
        t0 = time.perf_counter()
        written = [store._write_all(i, arrays) for i in range(k)]
        names = [entry[0] for files in written for entry in files]
        for name in names:
            _sync(name)
        t1 = time.perf_counter()
        for name in names:
            _drop_cache(name)
        t2 = time.perf_counter()
        for files in written:
            store._read_all(files)
        t3 = time.perf_counter()
        return (t1 - t0) / k, (t3 - t2) / k
    finally:
        store.close()


def _sync(name: str) -> None:
    fd = os.open(name, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _drop_cache(name: str) -> None:
    """Ask the kernel to forget a file's cached pages (POSIX; elsewhere reads stay cached)."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:                          # pragma: no cover - not POSIX
        return
    fd = os.open(name, os.O_RDONLY)
    try:
        advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _remove(name: str) -> None:
    try:
        os.remove(name)
    except FileNotFoundError:
        pass
