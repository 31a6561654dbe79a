"""Minimal pytrees: nested tuple / list / dict (and namedtuple, OrderedDict, defaultdict)
containers of array leaves.

The loop is one autograd primitive whose positional arguments are the *leaves* of params, state and
inputs. Passing leaves, not containers, is what lets autograd see a box nested in a user's tuple
(autograd only inspects a primitive's top-level arguments) and avoids its container boxes.
Dict keys keep their insertion order (a step may rely on ``params.values()``); :func:`conform`
reorders a dict-bearing tree to a given structure when only the key order differs. ``None`` is an
empty subtree (no leaves). ``OrderedDict`` and ``defaultdict`` (its ``default_factory`` kept) are
containers as JAX's pytrees have them; other subclasses of dict, list and tuple are leaves.
"""

from __future__ import annotations

import gc
from collections import OrderedDict, defaultdict
from types import FunctionType, ModuleType
from typing import Any, Callable

# A treedef is a hashable nested tuple: LEAF, (NONE,), or (kind, aux, (child treedefs...)).
LEAF = "*"
_NONE = ("None",)


class DefaultDictOf:
    """The kind of a ``defaultdict`` in a treedef: rebuilds one with its ``default_factory``
    (two are the same structure where their factories are the same object)."""

    __slots__ = ("factory",)
    __name__ = "defaultdict"

    def __init__(self, factory: Any) -> None:
        self.factory = factory

    def __call__(self, items: Any) -> defaultdict:
        return defaultdict(self.factory, items)

    def __eq__(self, other: Any) -> bool:
        return type(other) is DefaultDictOf and other.factory is self.factory

    def __hash__(self) -> int:
        return hash((DefaultDictOf, id(self.factory)))

    def __repr__(self) -> str:         # describe() spells one defaultdict(float)({'a': leaf})
        return f"defaultdict({getattr(self.factory, '__name__', self.factory)!s})"


def is_dict_kind(kind: Any) -> bool:
    """Whether a treedef's kind is a mapping's (its aux is the keys)."""
    return kind is dict or kind is OrderedDict or type(kind) is DefaultDictOf


def _dict_kind(x: Any) -> Any:
    """The treedef kind of a dict, OrderedDict or defaultdict; None for anything else."""
    t = type(x)
    if t is dict or t is OrderedDict:
        return t
    return DefaultDictOf(x.default_factory) if t is defaultdict else None


def flatten(tree: Any) -> tuple[list[Any], Any]:
    t = type(tree)
    if t is tuple or t is list:
        for c in tree:
            if c is None or isinstance(c, (tuple, list, dict)):
                break
        else:                   # a flat tuple or list of leaves (an LSTM's (h, c)): no recursion
            return list(tree), (t, None, (LEAF,) * len(tree))
    leaves: list[Any] = []
    return leaves, _flatten(tree, leaves)


def _flatten(x: Any, leaves: list[Any]) -> Any:
    t = type(x)
    if t is tuple or t is list:
        return (t, None, tuple(_flatten(c, leaves) for c in x))
    kind = _dict_kind(x)
    if kind is not None:
        keys = tuple(x)
        return (kind, keys, tuple(_flatten(x[k], leaves) for k in keys))
    if x is None:
        return _NONE
    if isinstance(x, tuple) and hasattr(x, "_fields"):     # namedtuple
        return (t, None, tuple(_flatten(c, leaves) for c in x))
    leaves.append(x)
    return LEAF


def map_leaves(fn: Any, tree: Any) -> Any:
    """The tree with ``fn`` applied to every leaf (the same containers, rebuilt)."""
    t = type(tree)
    if t is tuple or t is list:
        return t(map_leaves(fn, c) for c in tree)
    kind = _dict_kind(tree)
    if kind is not None:
        return kind((k, map_leaves(fn, v)) for k, v in tree.items())
    if tree is None:
        return None
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return t(*(map_leaves(fn, c) for c in tree))
    return fn(tree)


def unflatten(treedef: Any, leaves: list[Any]) -> Any:
    kind = treedef[0] if type(treedef) is tuple and len(treedef) == 3 else None
    if (kind is tuple or kind is list) and len(leaves) == len(treedef[2]) and \
            all(c is LEAF for c in treedef[2]):
        return kind(leaves)                 # a flat tuple or list: no recursion
    it = iter(leaves)
    return _build(treedef, it)


def _build(treedef: Any, it) -> Any:
    if treedef is LEAF:
        return next(it)
    if treedef is _NONE or treedef == _NONE:
        return None
    kind, aux, children = treedef
    if is_dict_kind(kind):
        return kind((k, _build(c, it)) for k, c in zip(aux, children))
    if kind is tuple or kind is list:
        return kind(_build(c, it) for c in children)
    return kind(*(_build(c, it) for c in children))


def num_leaves(treedef: Any) -> int:
    """How many leaves a structure has."""
    if treedef is LEAF:
        return 1
    if treedef == _NONE:
        return 0
    return sum(num_leaves(c) for c in treedef[2])


def conform(tree: Any, treedef: Any) -> Any:
    """``tree`` with its dicts' keys in ``treedef``'s order where the key sets agree.

    Anything else is returned unchanged (the caller's structure check then reports it).
    """
    if treedef is LEAF or treedef == _NONE:
        return tree
    kind, aux, children = treedef
    if is_dict_kind(kind):
        if _dict_kind(tree) == kind and set(tree) == set(aux):
            return kind((k, conform(tree[k], c)) for k, c in zip(aux, children))
        return tree
    if type(tree) is kind and len(tree) == len(children):
        items = [conform(v, c) for v, c in zip(tree, children)]
        return kind(*items) if hasattr(kind, "_fields") else kind(items)
    return tree


def describe(treedef: Any) -> str:
    """A short human spelling of a structure, for error messages."""
    if treedef is LEAF:
        return "leaf"
    if treedef == _NONE:
        return "None"
    kind, aux, children = treedef
    if is_dict_kind(kind):
        inner = "{" + ", ".join(f"{k!r}: {describe(c)}" for k, c in zip(aux, children)) + "}"
        if kind is dict:
            return inner
        return f"OrderedDict({inner})" if kind is OrderedDict else f"{kind!r}({inner})"
    inner = ", ".join(describe(c) for c in children)
    if kind is list:
        return f"[{inner}]"
    if kind is tuple:
        return f"({inner}{',' if len(children) == 1 else ''})"
    return f"{kind.__name__}({inner})"


# What holds no object a structure check looks for: not looked inside (types and modules would
# lead to everything a program can reach)
_ATOMS = (type(None), bool, int, float, complex, str, bytes, range, slice, type(Ellipsis), type,
          ModuleType)


def reaches(leaf: Any, pred: Callable[[Any], bool], limit: int = 10_000) -> bool | None:
    """Whether an object for which ``pred`` holds is reachable from ``leaf`` (a leaf of no
    known container: a user's object, a subclass of dict or list) through what it refers to
    (``gc.get_referents``: attributes, items, closure cells; a function's globals excepted);
    None where that is more than ``limit`` objects (it cannot tell)."""
    seen: set = set()
    stack = [leaf]
    while stack:
        o = stack.pop()
        if isinstance(o, _ATOMS) or id(o) in seen:
            continue
        if pred(o):
            return True
        seen.add(id(o))
        if len(seen) > limit:
            return None
        if type(o) is FunctionType:
            stack.extend((o.__closure__ or ()) + (o.__defaults__ or ()) +
                         tuple((o.__kwdefaults__ or {}).values()))
        else:
            stack.extend(gc.get_referents(o))
    return False
