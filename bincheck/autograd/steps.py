"""The checked plain step: ``fn`` on plain arrays, with the checks that keep snapshots trustworthy.

Snapshots are references, not copies: a stored state is the very array a step returned. So every
plain array handed to ``fn`` — params leaves, state leaves, input slices — is a read-only *view*
(``writeable=False``; no copy, and the caller's own arrays and flags are untouched). An in-place
update such as ``s += ...`` then fails at once inside ``fn``; :func:`call_fn` turns numpy's
"read-only" error into a ValueError naming the step and the argument written, instead of the
silently corrupted snapshot (and caller's ``init_state``) it would otherwise be.

Each step's result is also checked against the structure and shapes of the state it received, so
that every snapshot can stand in for any other state of the loop.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
from autograd.tracer import isbox

from ..runtime.stats import LoopStats
from ..tree import LEAF, conform, describe, flatten, map_leaves, unflatten
from .outputs import Outputs

_NAMES = ("params", "state", "inputs")


def readonly(leaf: Any) -> Any:
    """A read-only view of an ndarray (no copy; the array's own flags are left alone)."""
    if isinstance(leaf, np.ndarray):
        view = leaf.view()
        view.setflags(write=False)        # faster than going through .flags
        return view
    return leaf


def freeze(tree: Any) -> Any:
    """The tree with every ndarray leaf replaced by a read-only view."""
    return readonly(tree) if type(tree) is np.ndarray else map_leaves(readonly, tree)


def release(tree: Any) -> Any:
    """A result handed back to the caller: bincheck's read-only views replaced by what they view
    (writable, as the plain loop's result would be), or by a copy when they view part of it."""
    def one(v: Any) -> Any:
        base = getattr(v, "base", None)
        if not isinstance(v, np.ndarray) or v.flags.writeable or not isinstance(base, np.ndarray) \
                or not base.flags.writeable:
            return v
        same = v.shape == base.shape and v.strides == base.strides and v.dtype == base.dtype and \
            v.__array_interface__["data"][0] == base.__array_interface__["data"][0]
        return base if same else v.copy()
    return map_leaves(one, tree)


def _thaw(tree: Any) -> Any:
    """A writable deep copy of the tree's ndarray leaves (for diagnosis only)."""
    return map_leaves(lambda v: v.copy() if isinstance(v, np.ndarray) else v, tree)


def _read_only_error(err: BaseException) -> bool:
    return isinstance(err, ValueError) and "read-only" in str(err)


def call_fn(fn: Callable, args: tuple, t: int, label: str = "fn") -> Any:
    """``fn(*args)``; an in-place write into an argument becomes a ValueError saying which, and a
    TypeError about None while ``x`` is None says that ``inputs`` was None."""
    try:
        return fn(*args)
    except ValueError as err:
        if not _read_only_error(err):
            raise
        raise ValueError(_in_place_message(fn, args, t, label, err)) from err
    except TypeError as err:
        # Forgetting inputs gives "unsupported operand type(s) for *: 'NoneType' and 'float'"
        # from deep inside fn: say where the None came from. (A while loop's body gets no x.)
        if args[2] is not None or label not in ("fn", "output_fn") or "NoneType" not in str(err):
            raise
        raise TypeError(f"{err} (in {label} at step {t}, whose x was None: the loop was called "
                        f"with inputs=None; if {label} uses x, pass inputs, an array or tree of "
                        f"arrays with a leading axis of length seq_len)") from err


def _in_place_message(fn: Callable, args: tuple, t: int, label: str, err: ValueError) -> str:
    # Find the culprit by re-running fn with only one argument read-only and writable copies of
    # the others (copies: the caller's arrays are never handed out writable). This runs only on
    # this error path, so its extra evaluations cost nothing in normal use.
    culprits = []
    for i in range(len(args)):
        trial = [a if j == i else _thaw(a) for j, a in enumerate(args)]
        try:
            fn(*trial)
        except Exception as again:      # noqa: BLE001 - only read-only errors are evidence
            if _read_only_error(again):
                culprits.append(_NAMES[i])
    which = (" and ".join(culprits) + " argument" + ("s" if len(culprits) > 1 else "")
             if culprits else "arguments")
    return (f"{label} wrote into its {which} in place at step {t} (numpy: {err}). bincheck "
            f"hands {label} read-only views of params, state and inputs because stored snapshots "
            f"are references that an in-place update would corrupt, with the caller's arrays. "
            f"Update out of place: write `s = s + ...` instead of `s += ...`, and build a new "
            f"array (e.g. np.where, np.concatenate) instead of assigning `s[i] = ...`.")


class PlainStepper:
    """Runs ``fn`` on plain values for one call: ``advance(state, start, stop)``.

    Holds the call's read-only params and input leaves, the state's structure and shapes (every
    step's result is checked against them), the call's stats and its per-step outputs. With
    ``output_fn``, a step's output is computed only when it is first recorded: never in replays.
    """

    __slots__ = ("fn", "with_outputs", "output_fn", "params", "x_leaves", "x_def", "s_def",
                 "s_shapes", "ys", "stats", "label")

    def __init__(self, fn: Callable, with_outputs: bool, params: Any, state: Any,
                 x_leaves: list, x_def: Any, stats: LoopStats, ys: Outputs | None,
                 label: str = "fn", output_fn: Callable | None = None) -> None:
        self.fn, self.with_outputs, self.label = fn, with_outputs, label
        self.output_fn = output_fn
        self.params = freeze(params)
        s_leaves, self.s_def = flatten(state)
        self.s_shapes = [np.shape(v) for v in s_leaves]
        self.x_leaves = [readonly(v) for v in x_leaves]
        self.x_def = x_def
        self.stats, self.ys = stats, ys

    def x_at(self, t: int, leaves: list | None = None) -> Any:
        leaves = self.x_leaves if leaves is None else leaves
        if self.x_def is LEAF:
            return leaves[0][t]
        return unflatten(self.x_def, [leaf[t] for leaf in leaves])

    def advance(self, state: Any, start: int, stop: int) -> Any:
        t0 = time.perf_counter()
        for t in range(start, stop):
            state = self.step(state, t)
        self.stats.plain_seconds += time.perf_counter() - t0
        self.stats.plain_steps += stop - start
        return state

    def step(self, state: Any, t: int) -> Any:
        x = self.x_at(t)
        out = call_fn(self.fn, (self.params, state, x), t, self.label)
        if self.with_outputs:
            out, y = self.split_output(out, t)
            if self.ys is not None:
                self.ys.add(t, y)
        state = freeze(self.check_state(out, t))
        self.record_output(state, t, x)
        return state

    def record_output(self, state: Any, t: int, x: Any) -> None:
        """With ``output_fn``, compute step ``t``'s output on plain values and record it, the
        first time the step is reached (never in replays). ``state`` must be frozen."""
        if self.output_fn is not None and self.ys is not None and t == self.ys.count:
            y = call_fn(self.output_fn, (self.params, state, x), t, "output_fn")
            if any(isbox(v) for v in flatten(y)[0]):
                raise _closure_error("output_fn")
            self.ys.add(t, y)

    def split_output(self, out: Any, t: int) -> tuple[Any, Any]:
        if not (type(out) in (tuple, list) and len(out) == 2):
            length = f" of length {len(out)}" if isinstance(out, (tuple, list)) else ""
            raise TypeError(
                f"with_outputs=True: fn must return a 2-tuple (new_state, y); step {t} "
                f"returned {type(out).__name__}{length}")
        state, y = out
        if any(isbox(v) for v in flatten(y)[0]):
            raise _closure_error()
        return state, y

    def check_state(self, out: Any, t: int) -> Any:
        """``out`` conformed to the state's structure; raise if structure or shapes changed."""
        leaves, new_def = flatten(out)
        if new_def != self.s_def:
            out = conform(out, self.s_def)     # the same dict keys in another order is fine
            leaves, new_def = flatten(out)
        if new_def != self.s_def:
            raise ValueError(
                f"{self.label} must return a state with the structure of its input state; step "
                f"{t} got {describe(self.s_def)} and returned {describe(new_def)}")
        shapes = [np.shape(leaf) for leaf in leaves]
        if shapes != self.s_shapes:
            raise ValueError(
                f"{self.label} must return state arrays of the shapes it received; step {t} got "
                f"shapes {self.s_shapes} and returned {shapes}")
        if any(isbox(leaf) for leaf in leaves):
            raise _closure_error()
        return out

    def reverse(self, state: Any, start: int, stop: int) -> None:
        raise AssertionError("the forward pass never reverses")   # pragma: no cover


class WhileStepper(PlainStepper):
    """The while loop's stepper. Its forward computes each step itself (``cond_fn`` must see the
    new state before the schedule decides anything), and hands the result over through
    :meth:`hand_over`, so that the schedule's ``Advance(n-1, n)`` does not compute it again."""

    __slots__ = ("handoff",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handoff: dict[int, Any] = {}

    def hand_over(self, start: int, state: Any) -> None:
        self.handoff[start] = state

    def advance(self, state: Any, start: int, stop: int) -> Any:
        if stop == start + 1 and start in self.handoff:
            return self.handoff.pop(start)
        return super().advance(state, start, stop)


def _closure_error(label: str = "fn") -> TypeError:
    return TypeError(
        f"{label} returned an autograd box on plain inputs: it closes over a value that is being "
        f"differentiated. Pass that value through params ({label}(params, state, x)) so the loop "
        f"can checkpoint and differentiate it")
