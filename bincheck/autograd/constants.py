"""The constant arguments of recorded ops: in the op's template, or in the trace's column.

A recorded op is its template (the primitive, its constant arguments, its keyword arguments) and
its parents' value ids (:mod:`.trace`). Repeated code shares a template when its constants are
equal, so a constant that changes every iteration (``xs[t]``'s index ``t``, a view ``xs[t]`` of a
closed-over array, a time ``t * h``) would make a template per op: about 200 bytes where the op
itself costs 20. Once :data:`THRESHOLD` templates differ only in such numbers, the trace makes one
template with their places left open and writes each op's numbers after its parent ids, as 4-byte
words of the same column (:func:`shape_of` says what can be opened, :func:`build` rebuilds it):

* a Python ``int`` (one word if it fits in 32 bits, else two) or ``float`` (two words: its bits,
  so ``-0.0`` and NaNs are kept), also inside tuples and slices (``x[t, :]``, ``x[t:t + 2]``);
* a view of an array that owns its memory (``xs[t]`` of a closed-over ``xs``): its byte offset
  into that array (two words); the template holds the array, the view is rebuilt over the same
  memory with the same dtype, shape and strides.

Rebuilt constants are the same numbers and the same memory, so a replay computes what the
recorded run did, bit for bit.
"""

from __future__ import annotations

import struct
from typing import Any, Iterator

import numpy as np

THRESHOLD = 4          # value templates of one shape before its numbers go to the column
_BY_VALUE = (bool, complex, str, type(None), type(Ellipsis), np.generic)


def shape_of(a: Any, key_of) -> tuple | None:
    """``a`` with its per-op numbers taken out: ``(key, spec, format, values)``, where ``key``
    (hashable) and ``spec`` (to :func:`build` it) describe what stays, ``format`` is the
    :mod:`struct` codes of the numbers and ``values`` the numbers; None where ``a`` is kept
    whole. ``key_of`` keys a part kept by value (the trace's own key function)."""
    t = type(a)
    if t is int:
        if -2 ** 31 <= a < 2 ** 31:
            return "i", "i", "i", (a,)
        return ("q", "q", "q", (a,)) if -2 ** 63 <= a < 2 ** 63 else None
    if t is float:
        return "d", "d", "d", (a,)
    if t is slice or t is tuple:
        parts = [shape_of(x, key_of) for x in ((a.start, a.stop, a.step) if t is slice else a)]
        if any(p is None for p in parts):
            return None
        return ((t, tuple(p[0] for p in parts)), (t, tuple(p[1] for p in parts)),
                "".join(p[2] for p in parts), tuple(v for p in parts for v in p[3]))
    if isinstance(a, _BY_VALUE):
        key = key_of(a)
        return (None if len(key) == 1 else ("=", key)), ("=", a), "", ()
    if t is np.ndarray:
        base = a.base
        if type(base) is np.ndarray and base.base is None and base.flags.c_contiguous:
            offset = a.ctypes.data - base.ctypes.data
            return (("view", id(base), a.dtype.str, a.shape, a.strides),
                    ("view", base, a.dtype, a.shape, a.strides), "q", (offset,))
    return None


def build(spec: Any, values: Iterator) -> Any:
    """The constant ``spec`` describes, its numbers taken from ``values`` in order."""
    if type(spec) is str:
        return next(values)
    tag = spec[0]
    if tag == "=":
        return spec[1]
    if tag is tuple:
        return tuple(build(s, values) for s in spec[1])
    if tag is slice:
        return slice(*(build(s, values) for s in spec[1]))
    _, base, dtype, shape, strides = spec           # "view"
    return np.ndarray(shape, dtype, buffer=base, offset=next(values), strides=strides)


def column(places: list) -> tuple:
    """A template's open places ``[(argument position, spec, format)]``: ``(struct, ((position,
    spec), ...), words)`` that :meth:`~.trace.Trace.add` packs and the replay unpacks."""
    packer = struct.Struct("=" + "".join(f for _, _, f in places))
    return packer, tuple((i, s) for i, s, _ in places), packer.size // 4


def bases(spec: Any) -> Iterator:
    """The arrays a spec holds (views' bases)."""
    if type(spec) is tuple and spec:
        if spec[0] == "view":
            yield spec[1]
        elif spec[0] is tuple or spec[0] is slice:
            for s in spec[1]:
                yield from bases(s)
