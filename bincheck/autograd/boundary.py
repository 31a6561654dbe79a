"""User trees <-> the primitive's arguments, and the per-call context.

Two levels of leaves. The *arguments* of the loop primitive are the user's trees flattened through
plain containers only: a container that autograd boxed as a whole (``grad`` w.r.t. a dict of
weights gives a ``DictBox``) stays one argument, so its cotangent goes back as one dict and autograd
never scatters per-key cotangents into zero-filled copies of the whole dict. Inside the primitive
everything is flattened down to array leaves (:class:`Group`).

Under a tape, ``autograd.builtins.tuple/list/dict`` give ``SequenceBox`` / ``DictBox`` where the
plain step gives a real container, so a taped state can look like one leaf where the plain state
has several. :func:`expand_boxes` turns such boxes into plain containers of element boxes (indexing
a container box is itself a taped operation, so cotangents flow back exactly); every place that
pairs taped leaves with cotangents goes through it and checks the counts.
"""

from __future__ import annotations

import warnings
from typing import Any

from autograd.builtins import DictBox, SequenceBox
from autograd.core import VJPNode, vspace
from autograd.extend import defvjp, primitive
from autograd.tracer import isbox
from numpy import broadcast_to, float64, ndarray, shape

# leaves that hold no box (a numpy scalar, a float array)
_PLAIN = frozenset({ndarray, float, int, bool, complex, str, type(None)})

from ..runtime.stats import LoopStats
from ..tree import LEAF, flatten, map_leaves, num_leaves, reaches, unflatten


class InternalError(RuntimeError):
    """A bincheck invariant failed: a bug in bincheck, never a user error. Please report it."""


def values(tree: Any) -> Any:
    """The tree with container boxes replaced by their values (for shape checks only)."""
    return map_leaves(_value_of, tree)


def _value_of(leaf: Any) -> Any:
    t = type(leaf)
    return values(leaf._value) if t is SequenceBox or t is DictBox else leaf


CONTAINERS = ("arrays and numbers, in (nested) tuples, lists, namedtuples, dicts, OrderedDicts "
              "and defaultdicts")


def refuse_hidden_boxes(leaves: list, what: str, traces: Any = None) -> None:
    """Raise a TypeError where a leaf that is not itself a box holds one of ``traces`` (the
    differentiation under way; any, if None) inside an object of the user's or a subclass of
    dict or list: its cotangent could not be handed over, and a structure bincheck cannot see
    into must never drop a cotangent silently. A box of a finished differentiation (a logged
    loss) is no cotangent. An object too large to search is warned about, not refused."""
    def live(o: Any) -> bool:
        return isbox(o) and (traces is None or o._trace in traces)
    for v in leaves:
        if isbox(v) or type(v) in _PLAIN:
            continue
        found = reaches(v, live)
        name = f"{type(v).__module__}.{type(v).__qualname__}"
        if found is None:
            warnings.warn(f"{what} a {name} too large to search for values being "
                          f"differentiated: a cotangent of one inside it would be lost. "
                          f"Supported: {CONTAINERS}", stacklevel=3)
        elif found:
            raise TypeError(f"{what} a {name} that holds a value being differentiated; "
                            f"bincheck cannot look inside it, so its cotangent would be lost. "
                            f"Supported: {CONTAINERS}")


def expand_boxes(tree: Any) -> Any:
    """The tree with every container box replaced by a plain container of its element boxes."""
    return map_leaves(_expand_box, tree)


def _expand_box(leaf: Any) -> Any:
    t = type(leaf)
    if t is SequenceBox:
        return expand_boxes(type(leaf._value)(leaf[i] for i in range(len(leaf._value))))
    if t is DictBox:
        return expand_boxes({k: leaf[k] for k in leaf._value})
    return leaf


def reverse_traced(arg: Any) -> bool:
    """Whether ``arg`` is boxed by a reverse-mode trace, at any nesting level."""
    while isbox(arg):
        if isinstance(arg._node, VJPNode):
            return True
        arg = arg._value
    return False


def differentiable(value: Any) -> bool:
    """Float or complex leaves are traced; integer leaves (step counters, indices) are not."""
    if isinstance(value, (float, complex)):
        return True
    dtype = getattr(value, "dtype", None)
    return dtype is not None and dtype.kind in "fc"


@primitive
def as_carried(carrier: Any, value: Any) -> Any:
    """``value``, an integer array made from a traced float that a primitive returns, boxed by
    autograd with a float ``carrier`` from the primitive's outputs for a parent: autograd's
    tuple of outputs cannot sum a float cotangent into an integer slot, so the float slot
    stands for it and the cotangent passes through unchanged (``astype``'s VJP casts it)."""
    return value


defvjp(as_carried, lambda ans, carrier, value: lambda g: g)


def carrier_of(value: Any) -> Any:
    """The float stand-in of a traced integer output (zero bytes: a broadcast zero)."""
    return broadcast_to(float64(0.0), shape(value))


def zeros(value: Any) -> Any:
    """The zero cotangent of a state leaf; None for an integer leaf (it has none)."""
    return vspace(value).zeros() if differentiable(value) else None


class Group:
    """One of params / init_state / inputs: its argument leaves and its array leaves."""

    __slots__ = ("arg_def", "n_args", "tree_def", "spans")

    def __init__(self, arg_def: Any, n_args: int) -> None:
        self.arg_def, self.n_args = arg_def, n_args
        self.tree_def = None   # structure of the fully flattened tree (set by expand)
        self.spans = None      # per argument: (first leaf, stop leaf, its own treedef)

    def expand(self, args) -> list:
        """Array leaves of this group, given its argument values (plain, inside the primitive)."""
        leaves, spans = [], []
        for a in args:
            sub, sub_def = flatten(a)
            spans.append((len(leaves), len(leaves) + len(sub), sub_def))
            leaves += sub
        self.spans = spans
        self.tree_def = flatten(unflatten(self.arg_def, list(args)))[1]
        return leaves

    def leaves_of(self, k: int) -> range:
        lo, hi, _ = self.spans[k]
        return range(lo, hi)

    def gather(self, k: int, leaf_cotangents: list) -> Any:
        """The cotangent of argument ``k`` from its array leaves' cotangents."""
        lo, hi, sub_def = self.spans[k]
        if sub_def is LEAF:
            return leaf_cotangents[lo]
        return unflatten(sub_def, leaf_cotangents[lo:hi])


class Pending:
    """A forward's result waiting for the reverse sweep: the executor holding the snapshots, the
    schedule's remaining actions, the plain stepper and the stats of this forward + reverse."""

    __slots__ = ("executor", "actions", "stepper", "stats", "taped")

    def __init__(self, executor: Any, actions: Any, stepper: Any, stats: LoopStats,
                 taped: Any = None) -> None:
        self.executor, self.actions, self.stepper, self.stats = executor, actions, stepper, stats
        self.taped = taped          # the last segment, taped by the forward (a tape.Segment)


class Call:
    """One call of a loop: everything its primitive's forward and its VJP share.

    Loop objects hold configuration only; this object holds the call's state, so one loop can be
    called twice in one loss, from two threads, or from inside its own step. ``pending`` is the
    forward's result waiting for the reverse sweep (executor with snapshots, remaining actions,
    stepper, stats); the sweep takes it, so snapshots are released as soon as they are used.
    """

    __slots__ = ("loop", "groups", "pending", "out_leaves", "n", "stats", "vjp_args",
                 "schedule", "y_def", "guard")

    def __init__(self, loop: Any, groups: list[Group], vjp_args: list[bool]) -> None:
        self.loop, self.groups = loop, groups
        self.vjp_args = vjp_args   # per argument: boxed by a reverse-mode trace (may want a VJP)
        self.schedule: Any = None  # what this call planned with (a plan; a slot count for while)
        self.guard: Any = None     # with a memory budget: checks its taped steps (a TapeGuard)
        self.y_def: Any = None     # structure of the per-step outputs, when the loop has them
        self.pending = None
        self.out_leaves: list | None = None   # the final state's leaves (integer ones included)
        self.n: int | None = None             # number of steps this call ran
        self.stats = LoopStats()

    def take_pending(self, args: tuple) -> Pending:
        """The forward's snapshots, for one reverse sweep. A second VJP of the same call (e.g.
        ``jacobian``) finds them used up and runs the forward again."""
        if self.pending is None:
            self.loop.forward(self, args)
        pending, self.pending = self.pending, None
        return pending

    def boxed_leaves(self, group: int) -> list:
        """Array leaves of ``group`` whose arguments a reverse-mode trace boxed."""
        offset = sum(g.n_args for g in self.groups[:group])
        grp = self.groups[group]
        return [i for k in range(grp.n_args) if self.vjp_args[offset + k]
                for i in grp.leaves_of(k)]

    def split(self, args: tuple) -> tuple:
        n_p, n_s = self.groups[0].n_args, self.groups[1].n_args
        return args[:n_p], args[n_p:n_p + n_s], args[n_p + n_s:]

    # The primitive's output is a flat tuple: the final state's float leaves, then the leaves of
    # the stacked per-step outputs (if any). A flat tuple of arrays is what autograd handles
    # best. Integer state leaves (counters) cannot be boxed at all, so they travel beside the
    # primitive and unpack puts them back.
    def pack(self, out: Any) -> tuple:
        final, ys = out if self.loop.has_outputs else (out, None)
        leaves = flatten(final)[0]
        self.out_leaves = leaves
        packed = tuple(v for v in leaves if differentiable(v))
        if not self.loop.has_outputs:
            return packed
        y_leaves, self.y_def = flatten(ys)
        return packed + tuple(y_leaves)

    @property
    def n_state(self) -> int:
        """How many of the packed items are state leaves (the rest are outputs' leaves)."""
        return sum(differentiable(v) for v in self.out_leaves)

    def unpack(self, packed: Any) -> Any:
        items, n = list(packed), self.n_state
        it = iter(items[:n])
        leaves = [next(it) if differentiable(v) else v for v in self.out_leaves]
        final = unflatten(self.groups[1].tree_def, leaves)
        if not self.loop.has_outputs:
            return final
        return final, unflatten(self.y_def, items[n:])

    def state_cotangent(self, g: Any) -> tuple[list, list | None]:
        """Split the cotangent of :meth:`pack`'s tuple into per-leaf state cotangents and the
        outputs' (one per output leaf)."""
        items, n = list(g), self.n_state
        n_y = num_leaves(self.y_def) if self.loop.has_outputs else 0
        if len(items) != n + n_y:
            raise InternalError(f"the output cotangent has {len(items)} leaves; the output "
                                f"{n} state and {n_y} per-step output leaves")
        it = iter(items[:n])
        g_ys = items[n:] if self.loop.has_outputs else None
        return [next(it) if differentiable(v) else None for v in self.out_leaves], g_ys
