"""Measuring one step: the sizes and times a byte budget is planned with.

One probe runs step 0 plain and taped, twice each, and pulls a cotangent through the tape
``1 + BACKWARD_RUNS`` times, timing only warm calls: of each step's two calls the faster is
kept (the first runs cold: caches, lazily built code paths; the faster of a cold and a warm call
is never slower than the warm one, and two calls of ``fn`` are all a probe makes of each kind);
the first pull-back is discarded and the median of the others kept (pull-backs do not call
``fn``: a first, cold one measured 2.7x a warm one on a tanh cell and can be far more for a VJP
with a slow first call, where it used to be the only one timed). Bytes are counted from the
real data, without ``tracemalloc`` (which a user may be running; its peak cannot be restored):

* ``tape_bytes``: the array bytes one step's tape holds alive — everything reachable from its
  nodes' VJP closures, arrays owned by the caller (params, inputs) excluded — plus its input
  state, which a kept tape holds too, plus ``NODE_BYTES`` of Python objects per node;
* ``state_bytes``: the state's array bytes after step 0, plus the Python objects of a snapshot;
* with a disk tier, ``write_seconds`` / ``read_seconds``: writing the state after step 0 to a
  store in the loop's disk directory and reading it back (the faster of two tries);
* ``work_bytes``: the working set of a reverse step: one step's tape, the most cotangent bytes
  alive at once during its backward (counted as the backward runs), ``WORK_STATES`` states, and
  ``INTERPRETER_BYTES`` for CPython's free lists;
* beside the sizes (``Probe``), the nodes step 0's tape built and the bytes of the arrays they
  computed, as every taped segment counts them (``tape.Meter``), against which
  ``budgets.TapeGuard`` checks later steps.

Counting the same way whether or not ``tracemalloc`` runs keeps plans reproducible;
``tests/test_budget.py`` checks a gradient's ``tracemalloc`` peak against the budget.
"""

from __future__ import annotations

import statistics
import time
import types
from functools import partial
from typing import Any, NamedTuple

import numpy as np
from autograd.core import add_outgrads, vspace
from autograd.util import toposort

from ..runtime import disk as disk_tier
from ..schedule.budget import Sizes
from ..tree import flatten
from .boundary import differentiable
from .steps import PlainStepper
from .tape import _Sink, count_only, tape_segment


# Python objects per tape node (the node, its box, its VJP closure and cells): measured with
# tracemalloc at 0.95-1.15 KiB per node on tanh, LSTM and GRU cells of several sizes.
NODE_BYTES = 1200
# State-sized arrays alive beside the tapes during a gradient: the live state, the state being
# computed, the adjoint, the output cotangent autograd hands to the sweep, and the zero-filled
# cotangent autograd builds for the primitive's output tuple.
WORK_STATES = 5
# Python objects of a stored snapshot (a read-only view header per leaf, the store's entry):
# measured ~300 B for a one-leaf state.
SNAPSHOT_BYTES, SNAPSHOT_LEAF_BYTES = 192, 160
# CPython's free lists (tuples, frames, ...) fill up during autograd's backward and stay
# allocated until a full gc.collect(): measured 140-270 KiB after a gradient. Reserved from the
# budget so that a tracemalloc peak stays within it.
INTERPRETER_BYTES = 256 * 1024
# Pull-backs of step 0's tape timed after a first, discarded one (the median is kept).
BACKWARD_RUNS = 3


class Probe(NamedTuple):
    """What :func:`probe` measured: the sizes a budget is planned with, and step 0's tape as
    every taped segment counts it (``tape.Meter``): its nodes and the array bytes they
    computed."""

    sizes: Sizes
    step_nodes: int
    step_array_bytes: int


def _base(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def array_bytes(tree: Any) -> int:
    return sum(int(np.asarray(v).nbytes) for v in flatten(tree)[0])


def held_arrays(roots: list, exclude: set) -> int:
    """Bytes of the distinct arrays reachable from ``roots`` (closures, partials, containers),
    counting each underlying buffer once and skipping buffers whose id is in ``exclude``."""
    seen_obj: set = set()
    seen_buf: set = set(exclude)
    total, stack = 0, list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen_obj:
            continue
        seen_obj.add(id(obj))
        if isinstance(obj, np.ndarray):
            base = _base(obj)
            if id(base) not in seen_buf:
                seen_buf.add(id(base))
                total += base.nbytes
        elif isinstance(obj, types.FunctionType):
            stack.extend(c.cell_contents for c in (obj.__closure__ or ())
                         if _filled(c))
            stack.extend(obj.__defaults__ or ())
        elif isinstance(obj, partial):
            stack.append(obj.func)
            stack.extend(obj.args)
            stack.extend(obj.keywords.values())
        elif isinstance(obj, (tuple, list)):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
    return total


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:                  # an empty cell
        return False
    return True


def _backward_peak(ends: list, cotangents: list) -> int:
    """Run a backward from ``ends`` and return the most cotangent bytes alive at once."""
    sink = _Sink(ends, cotangents)
    outgrads: dict = {sink: (None, False)}
    alive = peak = 0
    for node in toposort(sink):
        g, _ = outgrads.pop(node)
        alive -= _nbytes(g)
        if node.vjp is None or not node.parents:
            continue
        new = node.vjp(g)
        for parent, ingrad in zip(node.parents, new):
            old = outgrads.get(parent)
            alive -= _nbytes(old[0]) if old else 0
            outgrads[parent] = add_outgrads(old, ingrad)
            alive += _nbytes(outgrads[parent][0])
            peak = max(peak, alive + _nbytes(g))
    return peak


def _nbytes(g: Any) -> int:
    if g is None:
        return 0
    if isinstance(g, np.ndarray):
        return g.nbytes
    return sum(_nbytes(v) for v in g) if isinstance(g, (tuple, list)) else 8


def probe(stepper: PlainStepper, state0: Any, p_box: list, x_box: list,
          disk: Any = None) -> Probe:
    """Sizes and times of one step, from step 0 of ``stepper``'s loop (four evaluations of fn).

    ``stepper`` must be the probe's own (its outputs buffer, if any, has length 1)."""
    p_leaves, p_def = flatten(stepper.params)
    plain_times, taped_times = [], []
    for _ in range(2):                  # the first run of each is cold: keep the faster
        t0 = time.perf_counter()
        state1 = stepper.step(state0, 0)
        t1 = time.perf_counter()
        seg = tape_segment(stepper, p_def, p_leaves, p_box, state0, True, x_box, 0, 1,
                           guard=count_only)
        t2 = time.perf_counter()
        plain_times.append(t1 - t0)
        taped_times.append(t2 - t1)
    adjoint = [vspace(v).ones() if differentiable(v) else None for v in flatten(state1)[0]]
    g_ys = [vspace(b).ones() for b in stepper.ys.bufs] if seg.y_nodes else None
    ends, cots = seg.ends(adjoint, g_ys)
    owned = {id(_base(v)) for v in p_leaves + stepper.x_leaves + flatten(state0)[0]
             if isinstance(v, np.ndarray)}
    state_bytes = array_bytes(state1) + SNAPSHOT_BYTES + SNAPSHOT_LEAF_BYTES * \
        len(flatten(state1)[0])
    nodes = [n for n in toposort(_SinkView(ends)) if hasattr(n, "vjp")]
    tape_bytes = held_arrays([n.vjp for n in nodes], owned) + state_bytes + \
        NODE_BYTES * len(nodes)
    backward_peak = _backward_peak(ends, cots)          # the first pull-back: cold, not timed
    backward_times = []
    for _ in range(BACKWARD_RUNS):
        t3 = time.perf_counter()
        _backward_peak(ends, cots)
        backward_times.append(time.perf_counter() - t3)
    work = tape_bytes + backward_peak + WORK_STATES * state_bytes + INTERPRETER_BYTES
    write_s, read_s = disk_tier.disk_seconds(state1, disk) if disk not in (None, False) else (None, None)
    return Probe(Sizes(state_bytes, tape_bytes, work, max(min(plain_times), 1e-9),
                       max(min(taped_times) + statistics.median(backward_times), 1e-9),
                       write_s, read_s),
                 seg.meter.nodes, seg.meter.nbytes)


class _SinkView:
    """Parents-only view of the tape's ends, for walking its nodes without running it."""

    __slots__ = ("parents",)

    def __init__(self, ends: list) -> None:
        self.parents = ends
