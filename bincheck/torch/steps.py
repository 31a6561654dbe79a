"""Steps of a torch loop: plain (no graph), taped (a graph over a whole segment), checked.

Plain steps run under ``no_grad``. Each one is checked: the state it returns must have the
structure, shapes, dtypes and devices of the initial state (so that any snapshot can stand in for
any state), and it must not have written into its state or input in place (their version
counters must not move: a snapshot is a reference, and an in-place update would corrupt it and,
for state 0, the caller's tensor). A taped segment runs ``fn`` under ``enable_grad`` from detached
copies of the state's leaves, with the parameter aliases (:mod:`.boundary`), and records what its
pullback needs (:class:`Segment`). ``output_fn`` runs once per step on plain values, the first
time a step is reached (never in replays), and once more under the tape when its step is reversed.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

from ..runtime.errors import NondeterministicStepError
from ..runtime.stats import LoopStats
from ..tree import LEAF, conform, describe, flatten, unflatten
from .boundary import Args, differentiable


def foreign_leaves(roots: list, ours: set) -> list:
    """The tensors requiring grad that the graph of ``roots`` reaches and that are not among
    ``ours`` (ids of the leaves a taped step may differentiate: the parameter aliases, the
    detached input state and the taped input slices). The walk stops at leaves, so it visits
    the step's own graph only, unless the step closed over a tensor with a graph of its own
    (then it reports the outside leaves that graph reaches)."""
    found: dict = {}
    stack, seen = [], set()
    for r in roots:
        if isinstance(r, torch.Tensor) and r.requires_grad:
            if r.grad_fn is not None:
                stack.append(r.grad_fn)
            elif id(r) not in ours:
                found[id(r)] = r
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        var = getattr(node, "variable", None)          # AccumulateGrad: a leaf
        if var is not None:
            if id(var) not in ours:
                found[id(var)] = var
            continue
        stack.extend(n for n, _ in node.next_functions)
    return list(found.values())


class Segment:
    """Steps ``start..stop-1`` taped in one graph: the detached input leaves (``ins``), the output
    leaves, each step's output state (with ``output_fn``) and the input slices taped for
    gradients (``xs[t]``: leaf index -> slice)."""

    __slots__ = ("start", "stop", "ins", "outs", "states", "xs", "ys")

    def __init__(self, start: int, stop: int, ins: list, outs: list, states: list,
                 xs: dict, ys: dict | None = None) -> None:
        self.start, self.stop, self.ins, self.outs = start, stop, ins, outs
        self.states, self.xs = states, xs
        self.ys = ys or {}              # step -> output_fn's leaves, taped in order with fn


class Outputs:
    """Per-step outputs of ``output_fn``, recorded in step order, stacked at the end."""

    __slots__ = ("items", "y_def", "keep_graph")

    def __init__(self, keep_graph: bool = False) -> None:
        self.items: list[list] = []
        self.y_def: Any = None
        self.keep_graph = keep_graph

    @property
    def count(self) -> int:
        return len(self.items)

    def add(self, t: int, y: Any) -> None:
        leaves, y_def = flatten(y)
        if self.y_def is None:
            self.y_def = y_def
        elif y_def != self.y_def:
            raise ValueError(f"output_fn must return the same structure at every step; step {t} "
                             f"returned {describe(y_def)}, step 0 {describe(self.y_def)}")
        for k, v in enumerate(leaves):
            if not isinstance(v, torch.Tensor):
                raise TypeError(f"output_fn must return a tensor or a tuple/list/dict of "
                                f"tensors; step {t} returned a {type(v).__name__} (leaf {k})")
        self.items.append(leaves if self.keep_graph else [v.detach() for v in leaves])

    def stacked(self) -> list:
        if not self.items:
            return []
        return [torch.stack(col) for col in zip(*self.items)]


class Fingerprints:
    """``verify=True``: a fingerprint of every state the first time it is computed, compared with
    every later computation of the same state (a replay, or the taped evaluation)."""

    RTOL = 1e-6

    def __init__(self) -> None:
        self.seen: dict[int, list] = {}

    def check(self, index: Any, leaves: list, how: str) -> None:
        """``index``: a state's index, or ``("y", t)`` for step ``t``'s ``output_fn`` result."""
        prints = [(float(v.detach().double().sum()), float(v.detach().double().abs().sum()))
                  for v in leaves]
        old = self.seen.setdefault(index, prints)
        for (a, a_abs), (b, b_abs) in zip(old, prints):
            if abs(a - b) > self.RTOL * max(a_abs, b_abs, 1e-30) or \
                    abs(a_abs - b_abs) > self.RTOL * max(a_abs, b_abs, 1e-30):
                what, fn = (f"output_fn's result at step {index[1]}", "output_fn") \
                    if isinstance(index, tuple) else \
                    (f"state {index} (after step {index - 1})", "fn")
                raise NondeterministicStepError(
                    f"verify=True: {what} differs when recomputed ({how}): {fn} is not a "
                    f"deterministic function of (params, state, x). Random draws are reproduced "
                    f"only from torch's default generators (preserve_rng_state=True); other "
                    f"randomness or state outside the arguments makes the gradient wrong")


class Steps:
    """The stepper of one call: plain ``advance`` and taped ``tape`` (see the module docstring)."""

    __slots__ = ("fn", "output_fn", "args", "stats", "ys", "label", "meta", "aliases",
                 "x_want", "verifier", "x_versions", "track", "checked", "rng", "out_draws")

    def __init__(self, fn: Callable, output_fn: Callable | None, args: Args, stats: LoopStats,
                 ys: Outputs | None, verify: bool = False, label: str = "fn") -> None:
        self.fn, self.output_fn, self.args, self.stats, self.ys = fn, output_fn, args, stats, ys
        self.label = label
        self.meta = [(v.shape, v.dtype, v.device) for v in args.s]
        self.aliases: list | None = None        # set once a gradient is wanted
        self.x_want: list[int] = []             # input leaves whose cotangent is wanted
        self.verifier = Fingerprints() if verify else None
        # Inference tensors have no version counter (nothing can be stored under
        # inference_mode anyway: no gradient follows).
        self.track = not torch.is_inference_mode_enabled() and not any(
            v.is_inference() for v in args.s + args.x)
        self.x_versions = [v._version for v in args.x] if self.track else []
        self.checked: set = set()        # who ("fn", "output_fn") was checked for closures
        self.rng: Any = None             # the call's Rng (preserve_rng_state), to watch output_fn
        self.out_draws = False           # output_fn drew random numbers in the forward

    def check_closure(self, roots: list, ins: list, xs: dict, who: str) -> None:
        """Refuse a taped ``who`` whose graph reaches a tensor requiring grad that is not one of
        the Function's inputs: its gradient would be silently lost (a custom Function sees
        only its inputs). Run once per call and function, on its first taped evaluation."""
        self.checked.add(who)
        ours = {id(v) for v in ins}
        ours.update(id(a) for a in self.aliases or () if isinstance(a, torch.Tensor))
        ours.update(id(v) for d in xs.values() for v in d.values())
        leaves = foreign_leaves(roots, ours)
        if not leaves:
            return
        shapes = ", ".join(f"shape {tuple(v.shape)} {v.dtype}" for v in leaves[:6])
        more = f" and {len(leaves) - 6} more" if len(leaves) > 6 else ""
        raise ValueError(
            f"{self.label if who == 'fn' else who} closes over {len(leaves)} tensor(s) that "
            f"require grad and are not among the loop's arguments ({shapes}{more}): their "
            f"gradient would be lost, since bincheck differentiates only what it is passed. "
            f"Pass them (or the module holding them) in params, or detach them if they need no "
            f"gradient")

    # ----------------------------------------------------------------------------- plain
    def advance(self, state: Any, start: int, stop: int) -> Any:
        t0 = time.perf_counter()
        step = self.step
        if torch.is_grad_enabled():
            with torch.no_grad():
                for t in range(start, stop):
                    state = step(state, t)
        else:                        # a backward runs without grad mode: no context to enter
            for t in range(start, stop):
                state = step(state, t)
        self.stats.plain_seconds += time.perf_counter() - t0
        self.stats.plain_steps += stop - start
        return state

    def step(self, state: Any, t: int) -> Any:
        args = self.args
        xl = args.x
        x = None if not xl else xl[0][t] if args.x_def is LEAF else args.x_at(t)
        if not self.track:
            out = self.fn(args.given, state, x)          # args.call_with(None, ...)
        elif args.s_def is LEAF:                         # one tensor: one version to compare
            version = state._version
            out = self.fn(args.given, state, x)
            if state._version != version or (xl and self.x_moved()):
                raise self.in_place_error(t)
        else:
            leaves = flatten(state)[0]
            versions = [v._version for v in leaves]
            out = self.fn(args.given, state, x)
            if [v._version for v in leaves] != versions or (xl and self.x_moved()):
                raise self.in_place_error(t)
        out, new = self.check(out, t)
        if self.verifier is not None:
            self.verifier.check(t + 1, new, "plain")
        ys = self.ys
        if ys is not None and self.output_fn is not None:
            if t == ys.count:                      # first reached: the forward's output
                self.first_output(args.given, out, x, t)
            elif self.out_draws:                   # a replay draws what the forward drew
                args.call_with(None, self.output_fn, out, x)
        return out

    def first_output(self, params: Any, state: Any, x: Any, t: int) -> list:
        """``output_fn`` at step ``t``, reached for the first time (in the forward): recorded,
        fingerprinted, and watched for random draws. Its leaves (taped if grad mode is on)."""
        rng = self.rng
        before = rng.get() if rng is not None and not self.out_draws else None
        y = self.output_fn(params, state, x)
        if before is not None and rng.get() is not before:
            # output_fn draws: replays must draw as the forward did, fn's and output_fn's
            # numbers interleaved as in the plain loop, so replays run it too (plain)
            self.out_draws = True
        self.ys.add(t, y)
        leaves = flatten(y)[0]
        if self.verifier is not None:
            self.verifier.check(("y", t), leaves, "first")
        return leaves

    def x_moved(self) -> bool:
        """Whether an input leaf was written in place since the call began."""
        xl, versions = self.args.x, self.x_versions
        if len(xl) == 1:
            return xl[0]._version != versions[0]
        return [v._version for v in xl] != versions

    def in_place_error(self, t: int, stop: int | None = None) -> RuntimeError:
        where = f"at step {t}" if stop is None or stop == t + 1 else \
            f"in one of steps {t}..{stop - 1} (taped together)"
        return RuntimeError(
            f"{self.label} wrote into its state or input in place {where}. bincheck keeps "
            f"states by reference (snapshots), and the caller's tensors must stay intact: update "
            f"out of place (h = h + ... instead of h += ..., torch.cat or torch.where instead of "
            f"h[i] = ...)")

    def check(self, out: Any, t: int) -> tuple[Any, list]:
        """``out`` conformed to the state's structure, and its leaves; raises naming step ``t``
        if the structure, a shape, a dtype or a device changed."""
        args = self.args
        if args.s_def is LEAF and isinstance(out, torch.Tensor):
            shape, dtype, device = self.meta[0]
            if out.shape == shape and out.dtype == dtype and out.device == device:
                return out, [out]                        # the common case, checked at once
            leaves = [out]
        else:
            leaves, new_def = flatten(out)
            if new_def != args.s_def:
                out = conform(out, args.s_def)
                leaves, new_def = flatten(out)
            if new_def != args.s_def:
                raise ValueError(f"{self.label} must return a state with the structure of its "
                                 f"input state; step {t} got {describe(args.s_def)} and returned "
                                 f"{describe(new_def)}")
        for k, (v, (shape, dtype, device)) in enumerate(zip(leaves, self.meta)):
            if not isinstance(v, torch.Tensor) or v.shape != shape or v.dtype != dtype or \
                    v.device != device:
                got = f"{type(v).__name__}" if not isinstance(v, torch.Tensor) else \
                    f"shape {tuple(v.shape)}, {v.dtype} on {v.device}"
                raise ValueError(f"{self.label} must return state tensors of the shapes, dtypes "
                                 f"and devices it received; at step {t} state leaf {k} was shape "
                                 f"{tuple(shape)}, {dtype} on {device} and it returned {got}")
        return out, leaves

    # ----------------------------------------------------------------------------- taped
    def x_taped(self, t: int, xs: dict) -> Any:
        args = self.args
        if not args.x:
            return None
        if not self.x_want and args.x_def is LEAF:
            return args.x[0][t]
        leaves = [leaf[t] for leaf in args.x]
        if self.x_want:
            slices = xs[t] = {}
            for k in self.x_want:
                leaves[k] = slices[k] = leaves[k].detach().requires_grad_()
        return leaves[0] if args.x_def is LEAF else unflatten(args.x_def, leaves)

    def tape(self, state: Any, start: int, stop: int, box_state: bool) -> Segment:
        """Tape steps ``start..stop-1`` from ``state`` in one graph (``box_state``: the input
        state's cotangent is wanted)."""
        t0 = time.perf_counter()
        args = self.args
        single = args.s_def is LEAF
        leaves = [state] if single else flatten(state)[0]
        ins = [v.detach().requires_grad_(box_state and differentiable(v)) for v in leaves]
        states: list = []
        xs: dict = {}
        fn, check, x_taped, verifier = self.fn, self.check, self.x_taped, self.verifier
        keep = self.output_fn is not None
        ys, y_taped = self.ys, {}

        def body(params: Any, st: Any) -> Any:
            for t in range(start, stop):
                x = x_taped(t, xs)
                st, new = check(fn(params, st, x), t)
                if verifier is not None:
                    verifier.check(t + 1, new, "taped")
                if keep:
                    states.append(st)
                    # output_fn runs here, between fn's steps, where it is first reached (the
                    # forward) or where it draws random numbers (the stream's order)
                    if ys is not None and t == ys.count:
                        y_taped[t] = self.first_output(params, st, x, t)
                    elif ys is not None and self.out_draws:
                        y_taped[t] = self.replayed_output(params, st, x, t)
            return st

        # ins share their version counters with leaves (detach): a write through either shows
        track = self.track
        if track:
            versions = [v._version for v in leaves]
        state_in = ins[0] if single else args.state(ins)
        with torch.enable_grad():
            if stop - start == 1 and verifier is None and not keep:     # one step: no loop
                out = check(args.call_with(self.aliases, fn, state_in, x_taped(start, xs)),
                            start)[0]
            else:
                out = args.call_with(self.aliases, body, state_in)
        if track and ([v._version for v in leaves] != versions or (args.x and self.x_moved())):
            raise self.in_place_error(start, stop)
        outs = [out] if single else flatten(out)[0]
        if "fn" not in self.checked:
            self.check_closure(outs, ins, xs, "fn")
        if y_taped and "output_fn" not in self.checked:
            self.check_closure([y for ls in y_taped.values() for y in ls], ins, xs, "output_fn")
        stats = self.stats
        stats.tape_seconds += time.perf_counter() - t0
        stats.taped_steps += stop - start
        return Segment(start, stop, ins, outs, states, xs, y_taped)

    def replayed_output(self, params: Any, state: Any, x: Any, t: int) -> list:
        """``output_fn`` at step ``t`` again (taped if grad mode is on), fingerprinted."""
        leaves = flatten(self.output_fn(params, state, x))[0]
        if self.verifier is not None:
            self.verifier.check(("y", t), leaves, "taped")
        return leaves

    def taped_outputs(self, seg: Segment) -> list:
        """``output_fn`` under the tape for every step of ``seg``: per step, its output leaves
        (those taped with the segment, where it ran between the steps, as they are)."""
        args, done = self.args, seg.ys

        def body(params: Any) -> list:
            return [done[t] if t in done else self.replayed_output(params, st, self.x_of(seg, t), t)
                    for t, st in zip(range(seg.start, seg.stop), seg.states)]
        if len(done) == seg.stop - seg.start:
            return [done[t] for t in range(seg.start, seg.stop)]
        with torch.enable_grad():
            out = args.call_with(self.aliases, body)
        if "output_fn" not in self.checked:
            self.check_closure([y for ls in out for y in ls], seg.ins,
                               seg.xs, "output_fn")
        return out

    def x_of(self, seg: Segment, t: int) -> Any:
        """Step ``t``'s input as the segment taped it (the same slices, so that gradients from
        ``output_fn`` and from ``fn`` meet)."""
        args = self.args
        if not args.x:
            return None
        leaves = [leaf[t] for leaf in args.x]
        for k, v in seg.xs.get(t, {}).items():
            leaves[k] = v
        return leaves[0] if args.x_def is LEAF else unflatten(args.x_def, leaves)
