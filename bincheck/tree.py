"""Minimal pytrees: nested tuple / list / dict (and namedtuple) containers of array leaves.

The loop is one autograd primitive whose positional arguments are the *leaves* of params, state and
inputs. Passing leaves, not containers, is what lets autograd see a box nested in a user's tuple
(autograd only inspects a primitive's top-level arguments) and avoids its container boxes.
Dict keys keep their insertion order (a step may rely on ``params.values()``); :func:`conform`
reorders a dict-bearing tree to a given structure when only the key order differs. ``None`` is an
empty subtree (no leaves).
"""

from __future__ import annotations

from typing import Any

# A treedef is a hashable nested tuple: LEAF, (NONE,), or (kind, aux, (child treedefs...)).
LEAF = "*"
_NONE = ("None",)


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
    if t is dict:
        keys = tuple(x)
        return (dict, keys, tuple(_flatten(x[k], leaves) for k in keys))
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
    if t is dict:
        return {k: map_leaves(fn, v) for k, v in tree.items()}
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
    if kind is dict:
        return {k: _build(c, it) for k, c in zip(aux, children)}
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
    if kind is dict and type(tree) is dict and set(tree) == set(aux):
        return {k: conform(tree[k], c) for k, c in zip(aux, children)}
    if type(tree) is kind and kind is not dict and len(tree) == len(children):
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
    if kind is dict:
        return "{" + ", ".join(f"{k!r}: {describe(c)}" for k, c in zip(aux, children)) + "}"
    inner = ", ".join(describe(c) for c in children)
    if kind is list:
        return f"[{inner}]"
    if kind is tuple:
        return f"({inner}{',' if len(children) == 1 else ''})"
    return f"{kind.__name__}({inner})"
