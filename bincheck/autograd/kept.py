"""What a taped op's VJP keeps: the tape bytes a memory plan charges each op.

Autograd's VJP node keeps only what its VJP maker's closure references: ``tanh``'s keeps its
input, ``add``'s only its operands' shapes, ``exp``'s its result. So a value computed under a tape
stays alive until the pull-back reaches it only if its own op's VJP keeps it (``ans``) or a
consumer's keeps it as an argument; otherwise it is freed after its last use, as in a plain run.

:func:`closure_keeps` finds that out once per template while recording: it builds the op's VJP
as autograd would (``primitive_vjps[fun](argnums, ans, args, kwargs)``) and walks what the
closure references (closure cells, defaults, containers, partials, bound methods; never a
function's globals), naming each array it reaches by its base: the result, an argument, a
constant argument (the trace or its caller holds it anyway), or an
array of its own (``extra`` bytes). Where the walk cannot tell (no VJP, an error, an object it
does not know, too many objects), it says the op keeps its result and all its arguments.

:func:`tape_bytes` then prices each op: ``overhead`` plus its result's bytes where some VJP keeps
it, plus the extra arrays its template's VJP made; and ``back[k]``, what a taped segment holds
beside its tapes while op ``k`` runs: the values computed so far that no VJP keeps and are still
live at cut ``k``, and op ``k``'s result if none keeps it.

A view keeps the array it views alive (``np.outer(x, x)[0]``: 8 MB for an 8 kB row). The
recording notes, per op, whose array its result views (:func:`view_owner`); that array is then
live while any of its views is (:func:`held_until`, for the live bytes at the cuts) and kept
by a tape where a view of it is. A view of an input costs nothing (the caller holds the input)
unless it is differentiated (its cotangent is as large).
"""

from __future__ import annotations

import functools
import types
from typing import Any

import numpy as np
from autograd.core import primitive_vjps

from ..tree import flatten

# (keeps its result, keeps argument i for each traced argument, bytes of arrays of its own)
UNKNOWN = None
_LIMIT = 2000                   # objects walked before giving up (conservative)
_LEAVES = (bool, int, float, complex, str, bytes, type(None), type(Ellipsis), np.generic,
           np.dtype, type, types.ModuleType, types.BuiltinFunctionType, types.CodeType)


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _roots(v: Any) -> list[int]:
    return [id(_root(x)) for x in flatten(v)[0] if isinstance(x, np.ndarray)]


def closure_keeps(fun: Any, argnums: tuple, ans: Any, args: tuple, kwargs: dict) -> Any:
    """``(keeps_ans, keeps_args, extra)`` for one op (see the module docstring), or UNKNOWN."""
    maker = primitive_vjps.get(fun)
    if maker is None:
        return UNKNOWN
    try:
        vjp = maker(argnums, ans, args, kwargs)
    except Exception:                                 # the replay will say what is wrong
        return UNKNOWN
    named: dict[int, int] = {}        # root array id -> -1 (ans), argnum or -2 (a constant: the
    for i, a in enumerate(args):      # trace holds it, or its caller)
        if i not in argnums:
            for r in _roots(a):
                named[r] = -2
    for r in _roots(list(kwargs.values())):
        named[r] = -2
    for i in argnums:
        for r in _roots(args[i]):
            named.setdefault(r, i)
    for r in _roots(ans):
        named[r] = -1
    kept: set = set()
    extra, seen, stack = 0, set(), [vjp]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _LEAVES):
            continue
        seen.add(id(obj))
        if len(seen) > _LIMIT:
            return UNKNOWN
        if isinstance(obj, np.ndarray):
            root = _root(obj)
            if id(root) in named:
                kept.add(named[id(root)])
            elif id(root) not in seen or root is obj:
                seen.add(id(root))
                extra += int(root.nbytes)
            continue
        if isinstance(obj, types.FunctionType):
            stack.extend(c for c in (obj.__closure__ or ()))
            stack.extend(obj.__defaults__ or ())
            stack.extend((obj.__kwdefaults__ or {}).values())
        elif isinstance(obj, types.CellType):
            try:
                stack.append(obj.cell_contents)
            except ValueError:
                pass
        elif isinstance(obj, (tuple, list, set, frozenset)):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, functools.partial):
            stack.extend((obj.func, obj.args, obj.keywords))
        elif isinstance(obj, types.MethodType):
            stack.extend((obj.__self__, obj.__func__))
        else:                                       # an object it does not know
            return UNKNOWN
    return (-1 in kept, tuple(i in kept for i in argnums), extra)


def tape_bytes(tr: Any, out_bytes: np.ndarray, overhead: int) -> tuple[np.ndarray, np.ndarray]:
    """Per op: the bytes its tape keeps and ``back`` (see the module docstring)."""
    n, n_in = tr.n, tr.n_in
    keeps, tmpl = tr.keeps, np.frombuffer(tr.tmpl, dtype=np.uint32)
    arity, start, parents = tr.arity, tr.start, tr.parents
    kept = np.zeros(n_in + n, dtype=bool)
    extra = np.zeros(n, dtype=np.int64)
    for k in range(n):
        t = tmpl[k]
        flags = keeps[t] if t < len(keeps) else UNKNOWN
        s0 = start[k]
        ps = parents[s0:s0 + arity[t]]
        if flags is UNKNOWN:
            kept[n_in + k] = True
            for p in ps:
                kept[p] = True
            continue
        ans, args, more = flags
        if ans or more:
            kept[n_in + k] = True
        extra[k] = more
        for p, keep in zip(ps, args):
            if keep:
                kept[p] = True
    if tr.owner is not None:            # a view kept keeps the array it views
        owner = np.frombuffer(tr.owner, dtype=np.int32)
        views = np.flatnonzero(owner >= 0)
        kept[owner[views[kept[n_in + views]]]] = True
    mine = kept[n_in:]
    tape = np.where(mine, out_bytes, 0) + extra + overhead
    # the values no VJP keeps, live at each cut (cut_bytes's sweep over them alone)
    last = held_until(tr)
    ops = np.arange(n)
    alive = (last > ops) & ~mine
    diff = np.zeros(n + 2, dtype=np.int64)
    np.add.at(diff, ops[alive] + 1, out_bytes[alive])
    np.add.at(diff, last[alive] + 1, -out_bytes[alive])
    loose = np.cumsum(diff[:n + 1])
    back = loose[:-1] + np.where(mine, 0, out_bytes)
    return tape.astype(np.int64), back.astype(np.int64)


INPUT_VIEW = -2                 # Trace.owner: a view of an input's array (the caller holds it)


def view_owner(value: Any, args: tuple, argnums: tuple, parent_ids: list, n_in: int,
               owner: Any) -> int:
    """Whose array ``value`` views (through a traced argument that is that array, a view of
    it, or a container of such views): an earlier op's value id (``owner``: the earlier ops'
    answers), INPUT_VIEW (an input's), or -1 (its own array, or another's)."""
    if isinstance(value, np.ndarray):
        if value.base is None:
            return -1
        roots = {id(_root(value))}
    elif isinstance(value, (tuple, list, dict)):
        roots = {id(_root(x)) for x in flatten(value)[0]
                 if isinstance(x, np.ndarray) and x.base is not None}
        if not roots:
            return -1
    else:
        return -1
    for i, p in zip(argnums, parent_ids):
        a = args[i]
        held = [a] if isinstance(a, np.ndarray) else flatten(a)[0]
        if any(isinstance(x, np.ndarray) and id(_root(x)) in roots for x in held):
            if p < n_in:
                return INPUT_VIEW
            return owner[p - n_in] if owner[p - n_in] != -1 else p
    return -1


def held_until(tr: Any) -> np.ndarray:
    """Per op's value: the last op its array is held for, its views' uses included (an array
    lives while a view of it does; the trace's ``last`` frees the value itself)."""
    n_in = tr.n_in
    last = np.frombuffer(tr.last, dtype=np.int32)[n_in:].astype(np.int64)
    if tr.owner is not None:
        owner = np.frombuffer(tr.owner, dtype=np.int32)
        views = np.flatnonzero(owner >= 0)
        np.maximum.at(last, owner[views] - n_in, last[views])
    return last
