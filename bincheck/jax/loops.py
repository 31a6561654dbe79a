"""The JAX front end's loops: :func:`binomial_checkpoint` and the ``lax.scan`` drop-in :func:`scan`.

A loop object is configuration only (frozen once built). Every call is traced: the plan is made
and compiled into tables in Python at trace time (cached per plan), and the traced program that
replays them has a size independent of ``seq_len``. There is no per-call ``stats`` attribute (a
jitted call has no Python state); the counts are static and come from ``loop.plan``.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..runtime.front import Configured
from ..schedule.binomial import Plan
from ..schedule.mixed import FixedLeafPlan
from ..schedule.budget import BudgetPlan, MemoryBudget, parse_bytes
from ..schedule.validate import (check_bool, check_callable, check_int, check_positive_int,
                                 exactly_one_budget)
from .boundary import Flat
from .sizes import measure, measure_sweep
from .forward import checkpointed as build
from .prices import pays
from .segments import BlockFlat, StaticSegmentsPlan, choose_measured
from .tables import Tables, compile_plan, revolve_tables



class _Pair:
    """``f(carry, x) -> (carry, y)`` of :func:`scan`, which computes the output with the step."""

    def __init__(self, f: Callable) -> None:
        self.f = f
        self.__name__ = getattr(f, "__name__", "f")

    def __call__(self, params: Any, state: Any, x: Any) -> Any:
        return self.f(state, x)[0]


class CheckpointedLoop(Configured):
    """``loop(params, init_state, inputs)``: see :func:`binomial_checkpoint`."""

    _published = ("last_plan",)

    def __init__(self, fn: Callable, schedule: Any, output_fn: Callable | None = None,
                 keep_segments: bool | str = False) -> None:
        check_callable("fn", fn, "fn(params, state, x) -> new_state")
        if output_fn is not None:
            check_callable("output_fn", output_fn, "output_fn(params, new_state, x) -> y")
        self.fn, self.schedule, self.seq_len = fn, schedule, schedule.seq_len
        self.output_fn, self.keep_segments = output_fn, keep_segments
        self.last_plan = None
        self._tables: dict = {}
        self._sizes: dict = {}
        # (argument signature, inputs differentiated) -> (L, plan of super-steps) or None
        self._static: dict = {}
        self._lock = threading.Lock()
        self._freeze()

    def __repr__(self) -> str:
        name = getattr(self.fn, "__name__", repr(self.fn))
        return f"bincheck.jax.CheckpointedLoop({name}, {self.schedule!r})"

    @property
    def plan(self) -> Any:
        """The schedule: fixed, or with a memory budget the plan of the last trace or preview
        (with kept segments considered: of the last gradient traced, or preview)."""
        return self.last_plan if isinstance(self.schedule, MemoryBudget) else self.schedule

    def _flat(self, params: Any, init_state: Any, inputs: Any) -> Flat:
        words = (("f", "xs", "length", "init") if isinstance(self.fn, _Pair) else
                 ("fn", "inputs", "seq_len", "init_state"))
        return Flat(self.whole, params, init_state, inputs, self.seq_len, words)

    def __call__(self, params: Any, init_state: Any, inputs: Any = None) -> Any:
        flat = self._flat(params, init_state, inputs)
        # below a budget's minimum: raises, naming it; with segments the reverse mode publishes
        # the plan it chooses
        plan = self.plan_for(flat, publish=not self._segments)
        return self._run(flat, plan, self._route(flat, plan) if self._segments else None)

    @property
    def _segments(self) -> bool:
        return self.keep_segments is True and isinstance(self.schedule, MemoryBudget)

    def _run(self, flat: Flat, plan: Any, route: Any = None) -> Any:
        """The checkpointed loop on ``flat``'s leaves with ``plan``'s tables (and ``route``'s
        static segments)."""
        tables = self.tables_for(plan)
        loop = build(flat, tables, route=route)
        new, ys = loop(flat.p, flat.h, flat.x, tuple(jnp.asarray(a) for a in tables.arrays()))
        state = jax.tree.unflatten(flat.h_def, new)
        if self.output_fn is None and not isinstance(self.fn, _Pair):
            return state
        return state, jax.tree.unflatten(flat.y_def, ys)

    def _route(self, flat: Flat, states_only: BudgetPlan) -> Callable:
        """Static segments (where considered): ``route(x_wanted) -> (BlockFlat, tables)``,
        or ``(None, None)`` to store states only, called by the reverse mode once it knows
        whether the inputs are differentiated (their windows' cotangents are part of what a
        segment holds). The same answer for both sweeps of a call; publishes ``last_plan``."""
        picked: dict = {}

        def route(x_wanted: bool) -> tuple:
            if x_wanted not in picked:
                found = self._segments_for(flat, states_only, x_wanted)
                if found is None:
                    picked[x_wanted], plan = (None, None), states_only
                else:
                    L, inner = found
                    picked[x_wanted] = (BlockFlat(flat, L), self.tables_for(inner, L))
                    plan = StaticSegmentsPlan(self.seq_len, L, inner)
                self.last_plan = plan
            return picked[x_wanted]
        return route

    def _segments_for(self, flat: Flat, states_only: BudgetPlan,
                      x_wanted: bool) -> tuple[int, BudgetPlan] | None:
        """``(L, plan of the super-steps)`` with the fewest evaluations (:mod:`.segments`), or
        None where no length saves ``SEGMENT_MIN_GAIN`` of them. Chosen once per argument
        signature and ``x_wanted``; each candidate's sizes are measured from a compiled sweep
        (:func:`.sizes.measure_sweep`)."""
        key = (flat.signature(), x_wanted)
        if key in self._static:
            return self._static[key]

        def plan_for_sizes(L: int, sizes: Any) -> Any:
            try:
                return BudgetPlan(self.seq_len // L, self.schedule.memory, sizes, static=True)
            except ValueError:                      # the budget is below this length's minimum
                return None
        found = choose_measured(self.seq_len, states_only.plain_steps,
                                lambda L: measure_sweep(BlockFlat(flat, L), x_wanted),
                                plan_for_sizes,
                                self.schedule.memory // states_only.sizes.state_bytes)
        if found is not None and not pays(flat, self.seq_len, found[0],
                                          found[0] * found[1].plain_steps,
                                          states_only.plain_steps, x_wanted):
            found = None                # fewer evaluations, but not less time at their price
        with self._lock:
            return self._static.setdefault(key, found)

    def whole(self, params: Any, state: Any, x: Any) -> tuple[Any, Any]:
        """One step and its output: ``(new_state, y or None)``."""
        if isinstance(self.fn, _Pair):
            return self.fn.f(state, x)
        new = self.fn(params, state, x)
        return new, (self.output_fn(params, new, x) if self.output_fn is not None else None)

    def sizes_for(self, flat: Flat) -> Any:
        """Sizes measured from shapes, once per argument signature."""
        key = flat.signature()
        sizes = self._sizes.get(key)
        if sizes is None:
            sizes = measure(flat, self.keep_segments == "masked")
            # what XLA holds beside the slots in the sweep itself, where it exceeds the sum of
            # parts (loop-invariant buffers hoisted out of the sweep's loops: see measure_sweep)
            swept = measure_sweep(flat, x_wanted=False)
            sizes = replace(sizes, work_bytes=max(sizes.work_bytes, swept.work_bytes))
            with self._lock:
                sizes = self._sizes.setdefault(key, sizes)
        return sizes

    def plan_for(self, flat: Flat, publish: bool = True) -> Any:
        if not isinstance(self.schedule, MemoryBudget):
            return self.schedule
        sizes = self.sizes_for(flat)
        # static: XLA allocates the slots and the longest taped segment side by side (sizes
        # carry no tape unless keep_segments)
        plan = BudgetPlan(self.seq_len, self.schedule.memory, sizes, static=True)
        if publish:
            self.last_plan = plan
        return plan

    def tables_for(self, plan: Any, L: int = 1) -> Tables:
        """``plan``'s tables (with ``L``: a plan of the ``seq_len / L`` super-steps)."""
        n = self.seq_len // L
        schedule = plan.schedule if isinstance(plan, BudgetPlan) else plan
        if isinstance(schedule, FixedLeafPlan):
            key = (n, schedule.slots, schedule.leaf)
        else:
            key = (n, schedule.num_ckpts, 1)
        tables = self._tables.get(key)
        if tables is None:
            tables = compile_plan(FixedLeafPlan(*key), n, key[2]) if key[2] > 1 \
                else revolve_tables(*key[:2])
            with self._lock:
                tables = self._tables.setdefault(key, tables)
        return tables

    def preview(self, params: Any, init_state: Any, inputs: Any = None, *,
                differentiate_inputs: bool = False) -> Any:
        """Sizes from shapes (``jax.eval_shape`` and compiled steps' ``memory_analysis``;
        nothing runs) and the plan a gradient would use, with its predicted peak bytes. The
        arguments may be arrays or ``jax.ShapeDtypeStruct`` trees. Where kept segments are
        considered the plan depends on whether the gradient differentiates ``inputs`` too
        (``differentiate_inputs``): a segment then also holds its window's cotangent."""
        differentiate_inputs = check_bool("differentiate_inputs", differentiate_inputs)
        found: list = []

        def shapes_only(params: Any, init_state: Any, inputs: Any) -> int:
            flat = self._flat(params, init_state, inputs)
            if isinstance(self.schedule, MemoryBudget):
                plan = self.plan_for(flat)
                if self._segments:
                    x_wanted = differentiate_inputs and any(flat.x_diff)
                    seg = self._segments_for(flat, plan, x_wanted)
                    if seg is not None:
                        plan = StaticSegmentsPlan(self.seq_len, seg[0], seg[1])
                    self.last_plan = plan
                found.append(plan)
            else:
                sizes = measure(flat)
                held = min(self.schedule.num_ckpts, self.seq_len)
                found.append(BudgetPlan(self.seq_len, sizes.work_bytes +
                                        held * sizes.state_bytes,
                                        replace(sizes, tape_bytes=None)))
            return 0
        jax.eval_shape(shapes_only, params, init_state, inputs)
        return found[0]


def binomial_checkpoint(fn: Callable, seq_len: int, num_ckpts: int | None = None, *,
                        memory: int | str | None = None,
                        output_fn: Callable | None = None,
                        keep_segments: bool | str | None = None) -> CheckpointedLoop:
    """Make ``fn(params, state, x) -> new_state`` a loop over ``seq_len`` steps whose reverse
    mode replays the optimal binomial (Revolve) schedule, for ``jit``, ``grad``, ``vjp``, ``vmap``.

    ``num_ckpts`` counts the states held at once, the initial one included; ``memory`` (int bytes
    or a string such as ``"200MB"``) plans as many as fit beside one step's working set, from
    shapes alone. ``params``, ``state`` and ``inputs`` are pytrees; every ``inputs`` leaf has the
    leading length ``seq_len`` (``inputs=None``: each step gets ``x=None``). With ``output_fn``,
    ``output_fn(params, new_state, x) -> y`` is evaluated at every step and the loop returns
    ``(final_state, ys)`` with the ``y``s stacked along a new leading axis.

    With ``memory``, by default (``keep_segments=None`` or ``True``), taped segments of one
    static length ``L`` are considered too (a divisor of ``seq_len``, at most 64, leaving at
    least three segments): the loop runs as ``seq_len / L`` super-steps, each a ``lax.scan``
    of ``L`` steps, checkpointed like any loop, and each reversed super-step is taped and
    pulled back whole (nested √T remat's shape). The length with the fewest evaluations of
    ``fn`` is a candidate where it saves at least 10 % of them
    (``segments.SEGMENT_MIN_GAIN``); its bytes come from compiled sweeps of at most three
    lengths (``segments.choose_measured``). It is kept only where it is predicted faster than
    states only by ``prices.PRICE_MARGIN`` at prices measured once per argument signature
    (``prices.step_prices``: compiled sweeps of a few dozen steps timed on zeros), else the
    plan stores states only. The reverse mode chooses, knowing whether ``inputs`` are
    differentiated (their windows' cotangents take room), at trace time (``loop.plan``: the
    last gradient's plan); ``fn`` then runs inside a ``lax.scan``. ``keep_segments=False``:
    states only, nothing measured beyond one step. ``keep_segments="masked"``: segments of
    varying lengths (the static mixed policy,
    :class:`~bincheck.schedule.mixed.FixedLeafPlan`), a ``lax.cond`` per step; fewer
    evaluations, but slower on XLA's CPU backend (see the JAX page of the docs).
    """
    exactly_one_budget(num_ckpts, memory)
    seq_len = check_positive_int("seq_len", seq_len)
    if keep_segments is None:       # the default: segments where they pay, within a budget
        keep_segments = memory is not None
    elif isinstance(keep_segments, str):
        if keep_segments != "masked":
            raise TypeError(f"keep_segments must be False, True or 'masked'; got "
                            f"{keep_segments!r}")
    else:
        keep_segments = check_bool("keep_segments", keep_segments)
    if keep_segments and memory is None:
        raise TypeError(f"keep_segments={keep_segments!r} plans within a byte budget: pass "
                        f"memory=... (with "
                        "num_ckpts the plan stores states only)")
    if memory is not None:
        schedule: Any = MemoryBudget(seq_len, parse_bytes(memory))
    else:
        schedule = Plan(seq_len, num_ckpts)
    return CheckpointedLoop(fn, schedule, output_fn, keep_segments)


def _scan_loop(f: Callable, xs: Any, length: int | None, num_ckpts: int | None,
               memory: int | str | None,
               keep_segments: bool | str) -> CheckpointedLoop | None:
    """The loop behind :func:`scan` and :func:`scan_plan`, with the length checked."""
    check_callable("f", f, "f(carry, x) -> (carry, y)")
    leaves = jax.tree.leaves(xs)
    if length is None:
        if not leaves:
            raise ValueError("scan needs xs with a leading axis or length=...")
        length = int(np.shape(leaves[0])[0])
    length = check_int("length", length, 0)
    # length 0: nothing to checkpoint (None), the configuration checked all the same
    loop = binomial_checkpoint(_Pair(f), max(length, 1), num_ckpts, memory=memory,
                               keep_segments=keep_segments)
    return loop if length else None


def scan(f: Callable, init: Any, xs: Any = None, length: int | None = None, *,
         num_ckpts: int | None = None, memory: int | str | None = None,
         reverse: bool = False, unroll: int = 1,
         keep_segments: bool | str | None = None) -> tuple[Any, Any]:
    """A drop-in for ``jax.lax.scan(f, init, xs, length)`` whose reverse mode is checkpointed:
    ``f(carry, x) -> (carry, y)``; returns ``(carry, ys)``. Give ``num_ckpts`` or ``memory`` as
    in :func:`binomial_checkpoint` (and ``keep_segments``). Arrays ``f`` closes over are
    differentiated as usual. :func:`scan_plan` shows the plan a gradient of it uses.
    ``length=0`` (or ``xs`` of leading length 0) returns ``init`` and empty ``ys``, as
    ``lax.scan`` does (there is nothing to checkpoint).
    ``unroll`` is accepted for compatibility and ignored."""
    loop = _scan_loop(f, xs, length, num_ckpts, memory, keep_segments)
    if loop is None:
        return lax.scan(f, init, xs, length=0, reverse=reverse)
    if reverse:
        xs = jax.tree.map(lambda v: jnp.flip(v, 0), xs)
    carry, ys = loop(None, init, xs)
    if reverse:
        ys = jax.tree.map(lambda v: jnp.flip(v, 0), ys)
    return carry, ys


def scan_plan(f: Callable, init: Any, xs: Any = None, length: int | None = None, *,
              num_ckpts: int | None = None, memory: int | str | None = None,
              reverse: bool = False, unroll: int = 1, keep_segments: bool | str = False,
              differentiate_inputs: bool = False) -> Any:
    """The plan a gradient of ``scan(f, init, xs, length, ...)`` with the same arguments
    uses, from shapes alone (nothing runs; ``init`` and ``xs`` may be arrays or
    ``jax.ShapeDtypeStruct`` trees), as :meth:`CheckpointedLoop.preview` gives it: a
    :class:`~bincheck.schedule.budget.BudgetPlan` (``checkpoints``, ``plain_steps``,
    ``peak_bytes``, ``sizes``, ``memory``; iterate it for the actions) or, where kept segments
    pay (``memory=`` unless ``keep_segments=False``), a
    :class:`~bincheck.jax.segments.StaticSegmentsPlan`. With
    ``num_ckpts`` its ``memory`` is the predicted peak. ``differentiate_inputs``: whether the
    gradient also differentiates ``xs`` (it matters where kept segments are considered).
    ``length=0``: None (nothing is planned)."""
    loop = _scan_loop(f, xs, length, num_ckpts, memory, keep_segments)
    if loop is None:
        return None
    return loop.preview(None, init, xs, differentiate_inputs=differentiate_inputs)
