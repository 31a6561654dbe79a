"""Recording any autograd program as a compact trace of primitive ops, and its live sets.

:func:`record` runs ``f`` once on boxes of a trace of its own whose nodes (:class:`RecNode`) write
each primitive call into a :class:`Trace` instead of building a graph: what autograd would
differentiate is exactly what is recorded, and Python control flow, ``float()`` of a box and
anything autograd does not trace just run (their results are baked into the trace, as they are
into autograd's graph). No traced value is kept: an op is its *template* (the primitive, the
positions of its traced arguments, its constant arguments by reference, its keyword arguments;
repeated code shares templates) and its parents' value ids, in typed arrays:

* ``tmpl``: the op's template, 4 bytes; ``parents``: its traced arguments' value ids, 4 bytes
  each, found from ``start[k]`` (4 bytes an op), then the numbers of its constants that its
  template leaves open (``xs[t]``'s index: one template for every ``t``; :mod:`.constants`);
* ``last``: each value's last use (the op index, ``n`` for the program's outputs, -1 never),
  4 bytes a value, and the live bytes at every cut (the chain's ``cuts``);
* ``dep``: whether a value depends on an input being differentiated, a byte a value: what plain
  autograd boxes (an integer array made from a traced float is one) and no other (a value of
  the undifferentiated inputs alone is a constant to it).

Values are numbered ``0..n_in-1`` for the program's inputs, then ``n_in + k`` for op ``k``'s
result. A cut ``c`` lies before op ``c``; the values *live* at it are those defined before it
(not inputs: they are held anyway) and used at or after it, Dauvergne and Hascoet's snapshot.
"""

from __future__ import annotations

import sys
import time
import zlib
from array import array
from typing import Any, Callable

import numpy as np
from autograd.core import VJPNode
from autograd.tracer import Node, isbox, new_box, notrace_primitives, trace_stack

from ..tree import flatten
from .boundary import refuse_hidden_boxes
from .constants import THRESHOLD, column, shape_of
from .constants import bases as spec_bases
from .kept import INPUT_VIEW, closure_keeps, held_until, view_owner


class ClosureError(ValueError):
    """``f`` reached a value being differentiated without receiving it as an argument."""


def boxable(v: Any) -> bool:
    """A float or complex value (an array or a number), or a tuple / list / dict holding one
    (``np.split``, ``slogdet`` return tuples): what a trace boxes and differentiates."""
    return any(_float_leaf(x) for x in flatten(v)[0])


def _float_leaf(v: Any) -> bool:
    if isinstance(v, (float, complex)) and not isinstance(v, bool):
        return True
    dtype = getattr(v, "dtype", None)
    return dtype is not None and dtype.kind in "fc"


def fingerprint(v: Any) -> tuple:
    """Two sums that change when a value does (``verify=True``); of a leaf holding NaN or inf (a
    ``np.where``-masked ``log``), its finite entries' and where its NaNs, +inf and -inf are: the
    same NaNs replayed are the same value (NaN != NaN), as ``array_equal(equal_nan=True)``."""
    return tuple(_sums(np.asarray(x)) for x in flatten(v)[0])


def _sums(x: np.ndarray) -> tuple:
    if x.dtype.kind not in "fciu":
        return ()
    if x.dtype.kind in "fc" and not np.isfinite(x).all():
        finite = np.isfinite(x)
        where = tuple(zlib.crc32(np.packbits(m)) for m in
                      (np.isnan(x), np.isinf(x) & (np.real(x) > 0), np.isinf(x) & (np.real(x) < 0)))
        return (*_sums(np.where(finite, x, 0)), *where)
    return np.sum(x).item(), np.sum(np.abs(x)).item()


# CPython 3.11 keeps up to this many freed tuples of each length (1 to 19) for reuse
TUPLE_FREE_LIST = 2000


def key_tuple_bytes(keys: dict) -> tuple[int, int]:
    """Bytes of the tuples of ``keys`` (the recording's template keys, nested): all of them
    (alive together until the recording ends: 1 MB for 3000 distinct closed-over arrays), and
    what they keep traced once freed: CPython's free lists hold freed tuples of up to 19 items,
    TUPLE_FREE_LIST of each length, and tracemalloc still counts them (an implicit Euler
    solver's 1549 keys: ~150 kB)."""
    count = [0] * 20
    size = [0] * 20
    total = 0
    for key in keys:                 # a key's nested tuples, walked with no set (its ints and
        stack = [key]                # entries would themselves raise the recording's peak)
        while stack:
            t = stack.pop()
            if type(t) is tuple:
                stack.extend(t)
                b = sys.getsizeof(t)           # the GC header included
                total += b
                if 0 < len(t) < 20:
                    count[len(t)] += 1
                    size[len(t)] = b
    return total, sum(min(c, TUPLE_FREE_LIST) * b for c, b in zip(count, size))


def value_nbytes(v: Any) -> int:
    """Bytes a value holds (arrays: ``nbytes``; numbers 8; containers: their leaves)."""
    if isinstance(v, np.ndarray):
        return int(v.nbytes)
    leaves = flatten(v)[0]
    if len(leaves) != 1 or leaves[0] is not v:
        return sum(value_nbytes(x) for x in leaves)
    return int(getattr(v, "nbytes", 8))


_NO_KW: dict = {}                      # shared by the templates without keyword arguments
_SCALARS = (bool, int, float, complex, str, type(None), type(Ellipsis), np.generic)


def _const_key(a: Any) -> Any:
    """What identifies a constant argument in a template key: numbers, strings and numpy
    scalars by value and type (so repeated code shares templates whatever objects hold the
    same constant; a float zero by its sign too), slices and tuples of them (indices such as
    ``z[:n]``, ``x[1:, None]``) likewise, anything else (arrays) by identity."""
    if isinstance(a, _SCALARS):
        if isinstance(a, np.generic):
            return (type(a), a.tobytes())
        return (type(a), a, repr(a)) if type(a) is float and a == 0.0 else (type(a), a)
    if type(a) is slice:
        keys = (_const_key(a.start), _const_key(a.stop), _const_key(a.step))
    elif type(a) is tuple:
        keys = tuple(_const_key(x) for x in a)
    else:
        return (id(a),)
    if any(len(k) == 1 for k in keys):          # an element known by identity: the whole too
        return (id(a),)
    return (type(a), keys)


class Trace:
    """The recorded ops of one call (see the module docstring)."""

    __slots__ = ("n_in", "templates", "_keys", "tmpl", "parents", "start", "arity", "out_bytes",
                 "seconds", "last", "outputs", "consts_bytes", "_t", "dep", "prints", "owner",
                 "plan_limit", "watch", "taping", "keeps", "freed_bytes", "keys_bytes")

    def __init__(self, n_in: int, plan_limit: int | None = None,
                 wanted: set | None = None) -> None:
        self.n_in = n_in
        # the per-op times and bytes are kept while the trace has at most ``plan_limit`` ops
        # (None: always); beyond it the plan needs none (Revolve over the ops), so they are
        # dropped and no longer recorded: the recording then holds the trace alone
        self.plan_limit = plan_limit
        self.watch: Callable[[int, Any], None] | None = None   # told of each op's result
        self.taping: Callable | None = None     # told of each op: (k, value, fun, args, kwargs,
                                                # argnums, parent ids)
        # (fun, argnums, args with None for traced and open places, kwargs, column or None)
        self.templates: list[tuple] = []
        self._keys: dict = {}
        self.tmpl, self.parents, self.start = array("I"), array("i"), array("I")
        self.out_bytes = array("q")            # per op: its result's bytes (for the plan)
        self.seconds = array("d")              # per op: time since the previous op recorded
        # per op, where its result is a view (or holds views) of an earlier result's array: that
        # result's value id (its storage lives while the view does: kept.held_until, and a tape
        # keeping the view keeps it), INPUT_VIEW of an input's, else -1 (for the plan)
        self.owner = array("i")
        self.last = array("i")
        self.arity: list[int] = []
        self.outputs: list[int] = []
        self.consts_bytes = 0
        self.freed_bytes = 0                   # tuples the recording freed, still traced
        self.keys_bytes = 0                    # its template keys' tuples, alive until then
        # per value: it depends on an input being differentiated (``wanted``; None: all)
        self.dep = array("b", [wanted is None or i in wanted for i in range(n_in)])
        self.keeps: list = []                  # per template: what its VJP keeps (.kept)
        self.prints: dict | None = None        # verify=True: op -> fingerprint of its result
        self._t = time.perf_counter()

    @property
    def n(self) -> int:
        return len(self.tmpl)

    def add(self, value: Any, fun: Callable, args: tuple, kwargs: dict, argnums: tuple,
            parent_ids: list) -> int:
        columns = self.seconds is not None
        if columns:
            now = time.perf_counter()
            self.seconds.append(now - self._t)
            self._t = now
        consts = [(i, a) for i, a in enumerate(args) if i not in argnums]
        for i, a in consts + list(kwargs.items()):
            if isbox(a):
                raise ClosureError(
                    f"the program reaches a value that is being differentiated (shape "
                    f"{np.shape(a._value)}) without receiving it as an argument: its gradient "
                    f"would be lost. Pass it to the checkpointed function as an argument")
        kw_key = tuple((k, _const_key(v)) for k, v in kwargs.items())
        key = (fun, argnums, tuple((i, _const_key(a)) for i, a in consts), kw_key)
        index = self._keys.get(key)
        words = b""
        if index is None:
            index, words = self._new_template(key, fun, args, kwargs, argnums, consts, kw_key)
        self.tmpl.append(index)
        self.start.append(len(self.parents))
        self.parents.extend(parent_ids)
        if words:
            self.parents.frombytes(words)
        dep = self.dep
        differentiated = any(dep[p] for p in parent_ids)
        if columns:
            owner = view_owner(value, args, argnums, parent_ids, self.n_in, self.owner)
            self.owner.append(owner)
            # a view of an input holds no bytes of its own, but a cotangent if differentiated
            self.out_bytes.append(0 if owner == INPUT_VIEW and not differentiated else
                                  value_nbytes(value))
            if index == len(self.keeps):          # a new template: what its VJP keeps
                self.keeps.append(closure_keeps(fun, argnums, value, args, kwargs))
            if self.plan_limit is not None and len(self.tmpl) > self.plan_limit:
                self.out_bytes = self.seconds = self.owner = None
                self.keeps = []
        dep.append(differentiated)
        if self.prints is not None:
            self.prints[self.n - 1] = fingerprint(value)
        if self.watch is not None:
            self.watch(self.n - 1, value)
        if self.taping is not None:
            self.taping(self.n - 1, value, fun, args, kwargs, argnums, parent_ids)
        return self.n_in + self.n - 1

    def _new_template(self, key: tuple, fun: Callable, args: tuple, kwargs: dict,
                      argnums: tuple, consts: list, kw_key: tuple) -> tuple[int, bytes]:
        """The template of an op whose key is new, and the words its numbers take in the
        column: a template of its own while its shape (its constants with their numbers taken
        out) has had fewer than THRESHOLD, else the shape's template with its numbers open
        (:mod:`.constants`)."""
        shapes = [(i, shape_of(a, _const_key)) for i, a in consts]
        if consts and all(sh is not None for _, sh in shapes):
            shape_key = ("shape", fun, argnums, tuple((i, sh[0]) for i, sh in shapes), kw_key)
            seen = self._keys.get(shape_key, 0)
            if type(seen) is tuple:                  # the column's template exists
                index, packer = seen
                return index, packer.pack(*(v for _, sh in shapes for v in sh[3]))
            if seen >= THRESHOLD:
                places = [(i, sh[1], sh[2]) for i, sh in shapes if sh[2]]
                col = column(places)
                index = len(self.templates)
                template = tuple(None if i in argnums else a for i, a in enumerate(args))
                open_ = {i for i, _, _ in places}
                template = tuple(None if i in open_ else a for i, a in enumerate(template))
                self.templates.append((fun, argnums, template,
                                       dict(kwargs) if kwargs else _NO_KW, col))
                self._keys[shape_key] = (index, col[0])
                return index, col[0].pack(*(v for _, sh in shapes for v in sh[3]))
            self._keys[shape_key] = seen + 1
        index = self._keys[key] = len(self.templates)
        template = tuple(None if i in argnums else a for i, a in enumerate(args))
        self.templates.append((fun, argnums, template, dict(kwargs) if kwargs else _NO_KW,
                               None))
        return index, b""

    def finish(self, outputs: list[int]) -> None:
        """The program's output value ids: compute every value's last use."""
        n, n_in = self.n, self.n_in
        self.outputs = outputs
        last = array("i", [-1]) * (n_in + n)
        parents, start, tmpl = self.parents, self.start, self.tmpl
        self.arity = arity = [len(t[1]) for t in self.templates]    # parents per template
        for k in range(n):
            s0 = start[k]
            for p in parents[s0:s0 + arity[tmpl[k]]]:
                last[p] = k
        for o in outputs:
            last[o] = n
        self.last = last
        self.keys_bytes, self.freed_bytes = key_tuple_bytes(self._keys)
        self._keys = {}
        self.consts_bytes = self._owned_constants()

    def _owned_constants(self) -> int:
        """Bytes of the constant arrays only the trace keeps alive (a dropout mask drawn in
        ``f``), by their base array; a constant the caller holds too (a closed-over input
        array, or views of it) costs the trace only its views' headers. Counted by
        references: a base whose
        reference count exceeds the trace's own references to it and its views is held
        elsewhere."""
        bases: dict = {}
        views: dict = {}
        for _, _, template, kwargs, col in self.templates:
            held = (*template, *kwargs.values(),
                    *(b for _, spec in (col[1] if col else ()) for b in spec_bases(spec)))
            for a in held:
                if not isinstance(a, np.ndarray):
                    continue
                base = a
                while isinstance(base.base, np.ndarray):
                    views[id(base)] = base
                    base = base.base
                entry = bases.setdefault(id(base), [base, 0])
                entry[1] += a is base                 # the template refers to it directly
        for v in views.values():                      # each view refers to its own base
            if id(v.base) in bases:
                bases[id(v.base)][1] += 1
        # the views' own headers (a view per op of xs[t] before the column takes over)
        total = sum(sys.getsizeof(v) for v in views.values())
        for base, refs in bases.values():
            # getrefcount's argument, this loop's name, the dict's list: three more
            if sys.getrefcount(base) - 3 <= refs:
                total += int(base.nbytes)
        return total

    def cut_bytes(self, per_value: int = 0) -> np.ndarray:
        """Bytes live at each cut ``0..n`` (inputs excluded; see the module docstring), each
        value counted ``per_value`` bytes more (a snapshot's reference to it); an array viewed
        by a later value is live while that value is."""
        n = self.n
        last = held_until(self)
        ops = np.arange(n)
        alive = last > ops                       # live from cut k+1 through cut last[k]
        out = np.frombuffer(self.out_bytes, dtype=np.int64)[alive] + per_value
        diff = np.zeros(n + 2, dtype=np.int64)
        np.add.at(diff, ops[alive] + 1, out)
        np.add.at(diff, last[alive] + 1, -out)
        return np.cumsum(diff[:n + 1])

    def parents_of(self, k: int) -> Any:
        s0 = self.start[k]
        return self.parents[s0:s0 + self.arity[self.tmpl[k]]]

    @property
    def nbytes(self) -> int:
        """What the trace holds: its arrays and the constants its templates keep."""
        arrays = (self.tmpl, self.parents, self.start, self.last, self.dep)
        return sum(a.itemsize * len(a) for a in arrays) + self.consts_bytes + \
            sum(sys.getsizeof(t) + sys.getsizeof(t[2]) + sys.getsizeof(t[3]) + 8 +
                (sys.getsizeof(t[4][0]) + 64 * len(t[4][1]) if t[4] else 0)
                for t in self.templates) + sys.getsizeof(self.templates) + \
            sys.getsizeof(self.arity) + 160 * len(self.keeps)   # .kept's flags: ~150 B each

    def release_plan_columns(self) -> None:
        """Drop what only the planner needed (per-op bytes, times and owners)."""
        self.out_bytes = self.seconds = self.owner = None
        self.keeps = []


class RecNode(Node):
    """The node type of the recording trace: each primitive call becomes an op of ``trace``."""

    __slots__ = ("trace", "id")

    def __init__(self, value, fun, args, kwargs, parent_argnums, parents) -> None:
        self.trace = parents[0].trace
        self.id = self.trace.add(value, fun, args, kwargs, tuple(parent_argnums),
                                 [p.id for p in parents])

    def initialize_root(self, trace: Trace, id: int) -> None:
        self.trace, self.id = trace, id


# What reverse mode does not trace (comparisons, shapes, argmax...) the recording does not either:
# the same set, shared, so that later registrations reach both
notrace_primitives[RecNode] = notrace_primitives[VJPNode]


def record(f: Callable, leaves: list, rebuild: Callable[[list], tuple],
           verify: bool = False, plan_limit: int | None = None,
           started: Callable[[Trace], None] | None = None,
           wanted: set | None = None) -> tuple[Trace, Any]:
    """Run ``f(*rebuild(boxed leaves))`` once, recording it: (the trace, (each result leaf's
    value id, -1 for a constant; the result leaves as plain values; the result's structure));
    ``plan_limit``, ``wanted``: see :class:`Trace`; ``started(trace)`` before ``f`` runs."""
    tr = Trace(len(leaves), plan_limit, wanted)
    if started is not None:
        started(tr)
    if verify:
        tr.prints = {}
    with trace_stack.new_trace() as level:
        # the arguments being differentiated (all, for a preview): the others are constants,
        # as they are to autograd (``int()`` of one works)
        boxes = [new_box(v, level, RecNode.new_root(tr, i))
                 if boxable(v) and (wanted is None or i in wanted) else v
                 for i, v in enumerate(leaves)]
        tr._t = time.perf_counter()
        result = f(*rebuild(boxes))
        out_leaves, out_def = flatten(result)
        refuse_hidden_boxes(out_leaves, "checkpoint_program: f returned", {level})
        ids, values = [], []
        for v in out_leaves:
            if isbox(v) and v._trace == level:
                ids.append(v._node.id)
                values.append(v._value)
            elif isbox(v):
                raise ClosureError(
                    f"the program returns a value traced outside it (shape "
                    f"{np.shape(v._value)}): it reached a value being differentiated without "
                    f"receiving it as an argument. Pass that value as an argument")
            else:
                ids.append(-1)
                values.append(v)
    tr.finish([i for i in ids if i >= 0])
    return tr, (ids, values, out_def)
