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


# What a VJP holds at its peak while it runs (its temporaries and the cotangents it returns), in
# multiples of the largest of its op's arguments and result, where that is more than the 3 the
# sweep's working set allows every op (``tanh``'s), rounded up from
# benchmarks/programs/results/vjp-peaks.md (``python -m benchmarks.programs.vjp_peaks``: each
# primitive's VJP under tracemalloc on 1-D float64 arrays, 200x200 matrices for numpy.linalg's):
# ``np.sort``'s VJP holds 7x its array (an argsort, an inverse permutation and a gather),
# ``logsumexp``'s 5x, ``svd``'s 9x its matrix; programs of them held 1.02-1.18x ``memory=``
# before (round 4 session 9's probes). Modules the program never imported are not looked up.
VJP_PEAKS = {
    "autograd.scipy.stats.t": {"cdf": 12.0, "logcdf": 9.7, "pdf": 6.0, "logpdf": 5.0},
    "autograd.scipy.stats.norm": {"logsf": 8.2, "sf": 7.2, "logcdf": 6.4, "cdf": 6.2},
    "autograd.numpy.numpy_wrapper": {"sort": 7.0, "arctan2": 4.0, "angle": 4.0,
                                     "minimum": 3.3, "maximum": 3.3, "fmin": 3.3, "fmax": 3.3,
                                     "min": 3.2, "max": 3.2, "amin": 3.2, "amax": 3.2},
    "autograd.scipy.stats.poisson": {"cdf": 6.4, "pmf": 3.2},
    "autograd.scipy.special": {"polygamma": 5.2, "logsumexp": 5.0, "beta": 5.0, "yn": 4.0,
                               "betainc": 4.0, "betaln": 4.0, "jn": 4.0, "ive": 4.0,
                               "iv": 4.0},
    "autograd.scipy.stats.beta": {"cdf": 4.0, "pdf": 4.0},
    "autograd.scipy.stats.gamma": {"pdf": 4.0},
    "autograd.scipy.stats.chi2": {"pdf": 3.2},
    "autograd.numpy.linalg": {"svd": 9.3, "eigh": 7.5, "eig": 7.1, "pinv": 4.1,
                              "cholesky": 3.1},
}


def _vjp_peaks() -> dict:
    """:data:`VJP_PEAKS` by primitive, of the modules imported."""
    import sys
    found = {}
    for module, peaks in VJP_PEAKS.items():
        mod = sys.modules.get(module)
        for name, times in peaks.items():
            fun = getattr(mod, name, None) if mod is not None else None
            if fun is not None:
                found[fun] = max(times, found.get(fun, 0.0))
    return found


def vjp_peak(tr: Any, out_bytes: np.ndarray, input_bytes: list[int]) -> int:
    """The most one op's VJP holds at once, of the ops whose primitive is in :data:`VJP_PEAKS`
    (its multiple of the largest of the op's traced arguments and its result); 0 if none."""
    peaks = _vjp_peaks()
    times = np.array([peaks.get(t[0], 0.0) for t in tr.templates] or [0.0])
    tmpl = np.frombuffer(tr.tmpl, dtype=np.uint32)
    n_in, most = tr.n_in, 0
    for k in np.flatnonzero(times[tmpl] > 0).tolist():
        t, s0 = int(tmpl[k]), tr.start[k]
        args = [int(out_bytes[p - n_in]) if p >= n_in else
                input_bytes[p] if p < len(input_bytes) else 0
                for p in tr.parents[s0:s0 + tr.arity[t]]]
        most = max(most, int(times[t] * max(args + [int(out_bytes[k])])))
    return most
